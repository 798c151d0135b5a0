package reload

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// DefaultDebounce is the quiet time [Options.Debounce] defaults to.
const DefaultDebounce = 250 * time.Millisecond

// maxWaitFactor bounds how long a burst can postpone its load: events that
// keep coming (a file written continuously) delay the load by at most
// maxWaitFactor × Debounce after the first event of the burst.
const maxWaitFactor = 10

// defaultRetry is how often a lost watch of the directory is tried again.
const defaultRetry = time.Second

// Options configure a Watcher.
type Options struct {
	// Path is the rule file or directory, as given to config.Load.
	Path string
	// Debounce is how long the files must be quiet before they are loaded:
	// a burst of events, each within Debounce of the previous one, loads
	// once, after the last. A burst that never settles is loaded 10 ×
	// Debounce after its first event all the same. Default DefaultDebounce.
	Debounce time.Duration
	// Apply is called with each new valid rule set, from the goroutine of
	// Run, one call at a time; not when the set's hash equals that of the
	// rules in force. Required.
	Apply func(*config.Rules)
	// Reject is called, from the goroutine of Run, with the error of a set
	// that does not load; the last good rules stay in force. Optional.
	Reject func(err error)
	// Logger receives "rules reloaded" (info, with path, hash, files and
	// domains) and "rules rejected" (error, with the error) records, and
	// warnings about the watch itself. Default: discard.
	Logger *slog.Logger
	// Current is the rule set already serving, whose hash the first load
	// is compared with. When nil, the first valid set loaded is applied.
	Current *config.Rules
	// Config says how the path is read (config.LoadOptions). With
	// Reference, the directory is read recursively, so every directory
	// below it is watched too (not those behind symbolic links, nor those
	// starting with ".", which it does not read); a new one is watched
	// from the load its creation triggers.
	Config config.Options
}

// Watcher reloads rule files when they change. Build it with [New] and run
// it with [Watcher.Run]; its counters may be read from any goroutine.
type Watcher struct {
	path string
	dir  string // the directory watched
	file string // base name of the rule file; "" when path is a directory
	// links are the symbolic links on the path (a runtime root such as
	// /srv/runtime_data/current swapped to a new directory); each one's
	// directory is watched too, and its replacement reloads.
	links    []string
	debounce time.Duration
	maxWait  time.Duration
	retry    time.Duration
	apply    func(*config.Rules)
	reject   func(error)
	log      *slog.Logger
	fsw      *fsnotify.Watcher
	opts     config.Options
	// subdirs are the directories below dir watched, with opts.Reference;
	// only Run's goroutine uses it after New.
	subdirs map[string]bool

	// hash is the hash of the rules in force; only Run's goroutine uses it.
	hash string

	reloads    atomic.Uint64
	rejections atomic.Uint64
	// loads counts the loads that read the path, once they have read it
	// and before what they read is applied or rejected; for tests: a
	// change made after it rose is seen by a later load.
	loads      atomic.Uint64
	lastReload atomic.Int64 // Unix nanoseconds; 0 when none
}

// New validates opts and starts watching the directory of opts.Path. The
// watch is released when [Watcher.Run] returns.
func New(opts Options) (*Watcher, error) {
	if opts.Path == "" {
		return nil, errors.New("reload: empty path")
	}
	if opts.Apply == nil {
		return nil, errors.New("reload: nil Apply")
	}
	if opts.Debounce < 0 {
		return nil, fmt.Errorf("reload: negative debounce %v", opts.Debounce)
	}
	if opts.Debounce == 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.Reject == nil {
		opts.Reject = func(error) {}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{
		path:     opts.Path,
		debounce: opts.Debounce,
		maxWait:  maxWaitFactor * opts.Debounce,
		retry:    defaultRetry,
		apply:    opts.Apply,
		reject:   opts.Reject,
		log:      opts.Logger,
		opts:     opts.Config,
		subdirs:  make(map[string]bool),
	}
	if opts.Current != nil {
		w.hash = opts.Current.Hash()
	}
	info, err := os.Stat(opts.Path)
	if err != nil {
		return nil, fmt.Errorf("reload: %w", err)
	}
	if info.IsDir() {
		w.dir = filepath.Clean(opts.Path)
	} else {
		w.dir, w.file = filepath.Split(filepath.Clean(opts.Path))
		w.dir = filepath.Clean(w.dir)
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("reload: %w", err)
	}
	if err := fsw.Add(w.dir); err != nil {
		fsw.Close()
		return nil, fmt.Errorf("reload: watching %s: %w", w.dir, err)
	}
	for _, link := range linksOn(w.dir) {
		if err := fsw.Add(filepath.Dir(link)); err != nil {
			fsw.Close()
			return nil, fmt.Errorf("reload: watching the link %s: %w", link, err)
		}
		w.links = append(w.links, link)
	}
	w.fsw = fsw
	w.watchSubdirs()
	return w, nil
}

// watchSubdirs watches, with opts.Reference and a directory path, every
// directory below it that config.LoadOptions reads: not those starting
// with ".", nor symbolic links.
func (w *Watcher) watchSubdirs() {
	if !w.opts.Reference || w.file != "" {
		return
	}
	_ = filepath.WalkDir(w.dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil || p == w.dir:
			return nil
		case !d.IsDir():
			return nil
		case strings.HasPrefix(d.Name(), "."):
			return filepath.SkipDir
		}
		if !w.subdirs[p] {
			if err := w.fsw.Add(p); err != nil {
				w.log.Warn("rules subdirectory not watched: edits in it need a restart", "dir", p, "error", err)
				return filepath.SkipDir
			}
			w.subdirs[p] = true
		}
		return nil
	})
}

// linksOn returns the symbolic links among dir and its parent
// directories, as dir names them (not resolved).
func linksOn(dir string) []string {
	var links []string
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			links = append(links, p)
		}
		if parent := filepath.Dir(p); parent == p {
			return links
		}
	}
}

// Reloads returns the number of rule sets applied.
func (w *Watcher) Reloads() uint64 { return w.reloads.Load() }

// Rejections returns the number of rule sets rejected.
func (w *Watcher) Rejections() uint64 { return w.rejections.Load() }

// LastReload returns when a rule set was last applied, or the zero time
// when none was.
func (w *Watcher) LastReload() time.Time {
	n := w.lastReload.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Run reloads the rules on every settled change until ctx is done, then
// releases the watch and returns nil. It also loads the path once a
// Debounce after it starts, which catches changes made between the
// caller's own config.Load and New. Call Run once: a Watcher whose Run is
// never called holds its fsnotify watch until the process exits.
func (w *Watcher) Run(ctx context.Context) error {
	defer w.fsw.Close()
	r := &runState{w: w, timer: time.NewTimer(w.debounce), pending: true, burstStart: time.Now(), watching: true}
	defer r.timer.Stop()
	defer r.stopRetry()
	events, errs := w.fsw.Events, w.fsw.Errors
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			r.event(ev)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			w.log.Warn("watching rules", "dir", w.dir, "error", err)
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				r.schedule()
			}
		case <-r.retryC:
			r.rewatch()
		case <-r.timer.C:
			r.pending = false
			if r.watching {
				w.load()
			}
		}
	}
}

// runState is the state of the loop of [Watcher.Run], on its goroutine.
type runState struct {
	w *Watcher
	// timer fires the load of a burst of events; pending is set from its
	// first event, at burstStart, until the load.
	timer      *time.Timer
	pending    bool
	burstStart time.Time
	// watching is false while the directory watched is gone; retry then
	// ticks on retryC, every Watcher.retry, to watch it again.
	watching bool
	retry    *time.Ticker
	retryC   <-chan time.Time
}

// schedule sets the load of the burst an event belongs to (or starts) for
// a Debounce from now, and at most maxWait after the burst's first event.
func (r *runState) schedule() {
	now := time.Now()
	if !r.pending {
		r.pending, r.burstStart = true, now
	}
	d := min(r.w.debounce, max(r.burstStart.Add(r.w.maxWait).Sub(now), 0))
	r.timer.Reset(d)
}

// startRetry starts trying, every Watcher.retry, to watch the directory
// again.
func (r *runState) startRetry() {
	r.retry = time.NewTicker(r.w.retry)
	r.retryC = r.retry.C
}

// stopRetry stops trying to watch the directory again.
func (r *runState) stopRetry() {
	if r.retry != nil {
		r.retry.Stop()
		r.retry, r.retryC = nil, nil
	}
}

// rewatch tries to watch the directory again; once it does, it stops
// retrying and schedules a load.
func (r *runState) rewatch() bool {
	if err := r.w.fsw.Add(r.w.dir); err != nil {
		return false
	}
	r.watching = true
	r.stopRetry()
	r.w.log.Info("watching rules again", "dir", r.w.dir)
	r.schedule()
	return true
}

// event handles one event of the watch: a link on the path replaced, a
// subdirectory or the directory itself gone, or a file config.Load reads
// changed, which schedules a load. Events on other names are ignored.
func (r *runState) event(ev fsnotify.Event) {
	w := r.w
	name := filepath.Clean(ev.Name)
	if slices.Contains(w.links, name) {
		if ev.Has(fsnotify.Create) && r.watching {
			r.linkReplaced(name)
		}
		return
	}
	if parent := filepath.Dir(name); name != w.dir && parent != w.dir && !w.subdirs[parent] {
		return // another name in a link's directory
	}
	if w.subdirs[name] && ev.Has(fsnotify.Remove|fsnotify.Rename) {
		delete(w.subdirs, name) // fsnotify drops its watch
		r.schedule()
		return
	}
	if name == w.dir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
		if r.watching {
			r.watching = false
			w.log.Warn("rules directory gone; keeping the rules in force", "dir", w.dir, "op", ev.Op.String(), "retry_every", w.retry)
			_ = w.fsw.Remove(w.dir) // gone already on most systems
			if !r.rewatch() {
				r.startRetry()
			}
		}
		return
	}
	if w.relevant(ev.Name) {
		r.schedule()
	}
}

// linkReplaced follows link, a link on the path created anew: the
// directory watched is the old target's. It watches the new one, and
// schedules its load; when the new target is gone already, it keeps the
// rules in force and retries.
func (r *runState) linkReplaced(link string) {
	w := r.w
	_ = w.fsw.Remove(w.dir)
	if err := w.fsw.Add(w.dir); err != nil {
		r.watching = false
		w.log.Warn("rules directory gone after a link swap; keeping the rules in force", "dir", w.dir, "link", link, "retry_every", w.retry)
		r.startRetry()
		return
	}
	w.log.Info("a link on the rules path was replaced; loading its new target", "link", link)
	r.schedule()
}

// relevant reports whether an event on name may change what config.Load
// reads.
func (w *Watcher) relevant(name string) bool {
	base := filepath.Base(name)
	if strings.HasPrefix(base, "..") { // a ConfigMap swap
		return true
	}
	if w.file != "" {
		return base == w.file
	}
	if w.opts.Reference { // every file is read, and every directory
		return !strings.HasPrefix(base, ".")
	}
	ext := filepath.Ext(base)
	return !strings.HasPrefix(base, ".") && (ext == ".yaml" || ext == ".yml")
}

// load loads the path and applies or rejects what it finds.
func (w *Watcher) load() {
	w.watchSubdirs() // directories made since the last load
	// Files unchanged since the rules in force were loaded (a touch, a
	// chmod, Run's first load) are not parsed again: hashing them takes
	// milliseconds where parsing 100,000 descriptors takes seconds, and
	// half a gigabyte.
	if h, err := config.HashOf(w.path, w.opts); err == nil && h == w.hash {
		w.loads.Add(1)
		return
	}
	start := time.Now()
	rules, err := config.LoadOptions(w.path, w.opts)
	took := time.Since(start)
	w.loads.Add(1)
	if err != nil {
		w.rejections.Add(1)
		w.log.Error("rules rejected", "path", w.path, "error", err)
		w.reject(err)
		return
	}
	if rules.Hash() == w.hash {
		return
	}
	w.hash = rules.Hash()
	w.reloads.Add(1)
	w.lastReload.Store(time.Now().UnixNano())
	w.log.Info("rules reloaded", "path", w.path, "hash", rules.Hash(),
		"files", len(rules.Files()), "domains", len(rules.Domains()), "rules", rules.NumRules(), "took", took.Round(time.Millisecond))
	for _, warning := range rules.Warnings() {
		w.log.Warn("rules: " + warning.Error())
	}
	w.apply(rules)
}
