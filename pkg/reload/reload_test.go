package reload

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// wait bounds every wait for something the watcher does.
const wait = 5 * time.Second

// testDebounce keeps the tests quick; nothing asserts on timing.
const testDebounce = 50 * time.Millisecond

// rule is a rule file of domain with one key-only rule on "user".
func rule(domain, name string, perHour int) string {
	return fmt.Sprintf(`domain: %s
descriptors:
  - key: user
    rate_limit:
      name: %s
      requests_per_unit: %d
      unit: hour
`, domain, name, perHour)
}

// writeAtomic replaces path by renaming a new file over it, as editors and
// deploy tools do, so the watcher never sees a half-written file. The
// temporary name starts with "." so neither config.Load nor the watcher
// cares about it.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// syncBuffer is a log destination safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// harness runs a Watcher and delivers its callbacks into channels.
type harness struct {
	w        *Watcher
	applied  chan *config.Rules
	rejected chan error
	logs     *syncBuffer
}

// setup adjusts a harness before its Watcher runs.
type setup struct {
	options func(*Options)      // before New
	watcher func(*Watcher)      // after New, before Run
	apply   func(*config.Rules) // called by Apply before the harness sees the set
	config  config.Options      // how the path is read, from the start
}

// start loads path, as the server does at startup, and runs a Watcher on
// it until the test ends. It returns once the watcher's first load has
// read the path: a change the test makes then is seen by a later load.
func start(t *testing.T, path string, s setup) *harness {
	t.Helper()
	current, err := config.LoadOptions(path, s.config)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{
		applied:  make(chan *config.Rules, 100),
		rejected: make(chan error, 100),
		logs:     &syncBuffer{},
	}
	opts := Options{
		Path:     path,
		Debounce: testDebounce,
		Apply: func(r *config.Rules) {
			if s.apply != nil {
				s.apply(r)
			}
			h.applied <- r
		},
		Reject:  func(err error) { h.rejected <- err },
		Logger:  slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Current: current,
		Config:  s.config,
	}
	if s.options != nil {
		s.options(&opts)
	}
	h.w, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if s.watcher != nil {
		s.watcher(h.w)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return within %v of its context's end", wait)
		}
		if t.Failed() {
			t.Logf("watcher logs:\n%s", h.logs)
		}
	})
	waitFor(t, wait, "the first load", func() bool { return h.w.loads.Load() >= 1 })
	return h
}

func (h *harness) nextApply(t *testing.T) *config.Rules {
	t.Helper()
	select {
	case r := <-h.applied:
		return r
	case err := <-h.rejected:
		t.Fatalf("rejected, want applied: %v", err)
	case <-time.After(wait):
		t.Fatalf("nothing applied within %v", wait)
	}
	return nil
}

func (h *harness) nextReject(t *testing.T) error {
	t.Helper()
	select {
	case err := <-h.rejected:
		return err
	case r := <-h.applied:
		t.Fatalf("applied %v, want rejected", r.Files())
	case <-time.After(wait):
		t.Fatalf("nothing rejected within %v", wait)
	}
	return nil
}

// applyWhere waits for an applied set that satisfies ok, skipping others,
// and returns it with how many sets were applied in all.
func (h *harness) applyWhere(t *testing.T, ok func(*config.Rules) bool) (*config.Rules, int) {
	t.Helper()
	n := 0
	timeout := time.After(wait)
	for {
		select {
		case r := <-h.applied:
			n++
			if ok(r) {
				return r, n
			}
		case <-timeout:
			t.Fatalf("no matching rule set applied within %v (%d others)", wait, n)
		}
	}
}

func (h *harness) noApply(t *testing.T) {
	t.Helper()
	select {
	case r := <-h.applied:
		t.Fatalf("applied %v, want nothing applied", r.Files())
	default:
	}
}

// perHour returns the limit of domain's rule, or -1 when there is none.
func perHour(r *config.Rules, domain string) int {
	d := r.Domain(domain)
	if d == nil || len(d.Rules()) == 0 {
		return -1
	}
	return int(d.Rules()[0].RequestsPerUnit)
}

func domains(r *config.Rules) []string {
	var names []string
	for _, d := range r.Domains() {
		names = append(names, d.Name)
	}
	return names
}

func TestEditApplies(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	writeAtomic(t, file, rule("api", "per_user", 10))
	h := start(t, dir, setup{})
	old := h.w.hash
	if !h.w.LastReload().IsZero() {
		t.Fatalf("LastReload() = %v before any reload, want zero", h.w.LastReload())
	}

	before := time.Now()
	writeAtomic(t, file, rule("api", "per_user", 20))
	r := h.nextApply(t)
	if got := perHour(r, "api"); got != 20 {
		t.Fatalf("applied requests_per_unit %d, want 20", got)
	}
	if r.Hash() == old {
		t.Fatalf("applied the old hash %s", old)
	}
	if got := h.w.Reloads(); got != 1 {
		t.Fatalf("Reloads() = %d, want 1", got)
	}
	if got := h.w.Rejections(); got != 0 {
		t.Fatalf("Rejections() = %d, want 0", got)
	}
	if last := h.w.LastReload(); last.Before(before) || last.After(time.Now()) {
		t.Fatalf("LastReload() = %v, want between %v and now", last, before)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "rules reloaded") || !strings.Contains(logs, "hash="+r.Hash()) {
		t.Fatalf("logs lack the reload with hash %s:\n%s", r.Hash(), logs)
	}
}

func TestFilePathEditedInPlaceAndReplaced(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	writeAtomic(t, file, rule("api", "per_user", 10))
	// A neighbour the watcher must not load: the path names one file.
	writeAtomic(t, filepath.Join(dir, "other.yaml"), rule("other", "per_user", 1))
	h := start(t, file, setup{})

	// In place, as "echo > file" does.
	if err := os.WriteFile(file, []byte(rule("api", "per_user", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	r, _ := h.applyWhere(t, func(r *config.Rules) bool { return perHour(r, "api") == 20 })
	if got := domains(r); len(got) != 1 || got[0] != "api" {
		t.Fatalf("applied domains %v, want [api]", got)
	}

	// By rename, as editors do: a watch on the old inode would miss it.
	writeAtomic(t, file, rule("api", "per_user", 30))
	h.applyWhere(t, func(r *config.Rules) bool { return perHour(r, "api") == 30 })

	// Changes to the neighbour lead to no reload.
	loads := h.w.loads.Load()
	writeAtomic(t, filepath.Join(dir, "other.yaml"), rule("other", "per_user", 2))
	writeAtomic(t, file, rule("api", "per_user", 40))
	h.applyWhere(t, func(r *config.Rules) bool { return perHour(r, "api") == 40 })
	if got := h.w.loads.Load() - loads; got != 1 {
		t.Fatalf("%d loads for one change of the file and one of its neighbour, want 1", got)
	}
}

func TestNewFileAddsDomain(t *testing.T) {
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 10))
	h := start(t, dir, setup{})

	writeAtomic(t, filepath.Join(dir, "web.yml"), rule("web", "per_user", 5))
	r := h.nextApply(t)
	if got := domains(r); len(got) != 2 || got[0] != "api" || got[1] != "web" {
		t.Fatalf("applied domains %v, want [api web]", got)
	}
	if got := perHour(r, "web"); got != 5 {
		t.Fatalf("web limit %d, want 5", got)
	}
}

// TestReferenceSubdirectories: read as envoyproxy/ratelimit reads a
// runtime directory, rule files in subdirectories are watched too, a
// subdirectory made after the start included, whatever the files' names.
func TestReferenceSubdirectories(t *testing.T) {
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 10))
	if err := os.MkdirAll(filepath.Join(dir, "team", "web"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, filepath.Join(dir, "team", "web", "rules"), rule("web", "per_user", 5))
	h := start(t, dir, setup{config: config.Options{Reference: true}})

	writeAtomic(t, filepath.Join(dir, "team", "web", "rules"), rule("web", "per_user", 6))
	if got := perHour(h.nextApply(t), "web"); got != 6 {
		t.Fatalf("web limit %d after an edit two levels down, want 6", got)
	}
	if err := os.MkdirAll(filepath.Join(dir, "later"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, filepath.Join(dir, "later", "mail.yml"), rule("mail", "per_user", 3))
	r, _ := h.applyWhere(t, func(r *config.Rules) bool { return r.Domain("mail") != nil })
	if got := perHour(r, "mail"); got != 3 {
		t.Fatalf("mail limit %d, want 3", got)
	}
	writeAtomic(t, filepath.Join(dir, "later", "mail.yml"), rule("mail", "per_user", 4))
	if got := perHour(h.nextApply(t), "mail"); got != 4 {
		t.Fatalf("mail limit %d after an edit in a directory made after the start, want 4", got)
	}
	if err := os.RemoveAll(filepath.Join(dir, "team")); err != nil {
		t.Fatal(err)
	}
	if got := domains(h.nextApply(t)); len(got) != 2 || got[0] != "api" || got[1] != "mail" {
		t.Fatalf("domains %v after the team directory was removed, want [api mail]", got)
	}
}

func TestDeletedFileRemovesDomain(t *testing.T) {
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 10))
	writeAtomic(t, filepath.Join(dir, "web.yaml"), rule("web", "per_user", 5))
	h := start(t, dir, setup{})

	if err := os.Remove(filepath.Join(dir, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	r := h.nextApply(t)
	if got := domains(r); len(got) != 1 || got[0] != "api" {
		t.Fatalf("applied domains %v, want [api]", got)
	}
	if r.Domain("web") != nil {
		t.Fatal("the deleted file's domain is still there")
	}
	if got := h.w.Reloads(); got != 1 {
		t.Fatalf("Reloads() = %d, want 1", got)
	}
}

func TestEmptiedDirectoryIsRejected(t *testing.T) {
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 10))
	h := start(t, dir, setup{})

	if err := os.Remove(filepath.Join(dir, "api.yaml")); err != nil {
		t.Fatal(err)
	}
	err := h.nextReject(t)
	if !strings.Contains(err.Error(), "no rule files") {
		t.Fatalf("rejected with %q, want no rule files", err)
	}
	if got := h.w.Rejections(); got != 1 {
		t.Fatalf("Rejections() = %d, want 1", got)
	}

	// The files come back: applied only if they differ from the rules in
	// force, which they do not.
	loads := h.w.loads.Load()
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 10))
	waitFor(t, wait, "a load", func() bool { return h.w.loads.Load() > loads })
	h.noApply(t)
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 11))
	if got := perHour(h.nextApply(t), "api"); got != 11 {
		t.Fatalf("applied %d, want 11", got)
	}
}

func TestDeletedRuleFileIsRejected(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	writeAtomic(t, file, rule("api", "per_user", 10))
	h := start(t, file, setup{})

	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := h.nextReject(t); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("rejected with %v, want a missing file", err)
	}
	writeAtomic(t, file, rule("api", "per_user", 12))
	if got := perHour(h.nextApply(t), "api"); got != 12 {
		t.Fatalf("applied %d, want 12", got)
	}
}

func TestInvalidEditIsRejectedThenFixed(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	writeAtomic(t, file, rule("api", "per_user", 10))
	writeAtomic(t, filepath.Join(dir, "web.yaml"), rule("web", "per_user", 5))
	h := start(t, dir, setup{})

	// An unknown field on line 8; the other file is fine, yet nothing of
	// the set is applied.
	bad := rule("api", "per_user", 20) + "      colour: red\n"
	writeAtomic(t, file, bad)
	err := h.nextReject(t)
	if want := file + ":8:"; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "colour") {
		t.Fatalf("rejected with %q, want it to name %s and the field colour", err, want)
	}
	if got := h.w.Rejections(); got != 1 {
		t.Fatalf("Rejections() = %d, want 1", got)
	}
	if got := h.w.Reloads(); got != 0 {
		t.Fatalf("Reloads() = %d, want 0", got)
	}
	if logs := h.logs.String(); !strings.Contains(logs, "level=ERROR msg=\"rules rejected\"") || !strings.Contains(logs, "colour") {
		t.Fatalf("logs lack the rejection:\n%s", logs)
	}

	// Bad YAML.
	writeAtomic(t, file, "domain: api\ndescriptors: [\n")
	err = h.nextReject(t)
	if !regexp.MustCompile(regexp.QuoteMeta(file) + `:\d+:`).MatchString(err.Error()) {
		t.Fatalf("rejected with %q, want it to name %s and a line", err, file)
	}
	if got := h.w.Rejections(); got != 2 {
		t.Fatalf("Rejections() = %d, want 2", got)
	}

	writeAtomic(t, file, rule("api", "per_user", 20))
	r := h.nextApply(t)
	if got := perHour(r, "api"); got != 20 {
		t.Fatalf("applied %d, want 20", got)
	}
	if got := perHour(r, "web"); got != 5 {
		t.Fatalf("web limit %d, want 5", got)
	}
	if got := h.w.Reloads(); got != 1 {
		t.Fatalf("Reloads() = %d, want 1", got)
	}
}

// configMap lays out dir as a Kubernetes ConfigMap volume holding files,
// or updates it as the kubelet does: a new timestamped directory, a
// ..data_tmp link to it renamed over ..data, the old directory removed.
// Links for new keys are made after the swap, links of removed keys removed
// last.
type configMap struct {
	t       *testing.T
	dir     string
	gen     int
	current string
	keys    map[string]bool
}

func (c *configMap) write(files map[string]string) {
	t := c.t
	c.gen++
	ts := fmt.Sprintf("..2026_11_22_10_00_%02d.%d", c.gen, 100000000+c.gen)
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(c.dir, ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(c.dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(c.dir, "..data_tmp"), filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if !c.keys[name] {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(c.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if c.current != "" {
		if err := os.RemoveAll(filepath.Join(c.dir, c.current)); err != nil {
			t.Fatal(err)
		}
	}
	for name := range c.keys {
		if _, ok := files[name]; !ok {
			if err := os.Remove(filepath.Join(c.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.current = ts
	c.keys = map[string]bool{}
	for name := range files {
		c.keys[name] = true
	}
}

func TestConfigMapSwap(t *testing.T) {
	for _, watchFile := range []bool{false, true} {
		t.Run(fmt.Sprintf("file=%v", watchFile), func(t *testing.T) {
			dir := t.TempDir()
			cm := &configMap{t: t, dir: dir}
			cm.write(map[string]string{"rules.yaml": rule("api", "per_user", 10)})
			path := dir
			if watchFile {
				path = filepath.Join(dir, "rules.yaml")
			}
			h := start(t, path, setup{})

			cm.write(map[string]string{"rules.yaml": rule("api", "per_user", 20)})
			r := h.nextApply(t)
			if got := perHour(r, "api"); got != 20 {
				t.Fatalf("applied %d, want 20", got)
			}
			// Read through the link, never from the timestamped directories.
			if got := r.Files(); len(got) != 1 || got[0] != filepath.Join(dir, "rules.yaml") {
				t.Fatalf("loaded files %v, want only %s", got, filepath.Join(dir, "rules.yaml"))
			}
			if got := h.w.Rejections(); got != 0 {
				t.Fatalf("Rejections() = %d, want 0", got)
			}

			cm.write(map[string]string{"rules.yaml": rule("api", "per_user", 30)})
			if got := perHour(h.nextApply(t), "api"); got != 30 {
				t.Fatalf("applied %d, want 30", got)
			}
		})
	}
}

func TestConfigMapKeysAddedAndRemoved(t *testing.T) {
	dir := t.TempDir()
	cm := &configMap{t: t, dir: dir}
	cm.write(map[string]string{"api.yaml": rule("api", "per_user", 10)})
	h := start(t, dir, setup{})

	cm.write(map[string]string{"api.yaml": rule("api", "per_user", 10), "web.yaml": rule("web", "per_user", 5)})
	h.applyWhere(t, func(r *config.Rules) bool { return perHour(r, "web") == 5 })

	// The link of a removed key dangles until the kubelet removes it; a load
	// in between may be rejected, the one after the removal applies.
	cm.write(map[string]string{"api.yaml": rule("api", "per_user", 15)})
	r, _ := h.applyWhere(t, func(r *config.Rules) bool { return perHour(r, "api") == 15 && r.Domain("web") == nil })
	if got := domains(r); len(got) != 1 {
		t.Fatalf("applied domains %v, want [api]", got)
	}
}

func TestBurstLoadsOnce(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	writeAtomic(t, file, rule("api", "per_user", 1))
	h := start(t, dir, setup{})

	// In place, so some loads could see a half-written file if they came
	// during the burst.
	for i := 100; i < 120; i++ {
		if err := os.WriteFile(file, []byte(rule("api", "per_user", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, n := h.applyWhere(t, func(r *config.Rules) bool { return perHour(r, "api") == 119 })
	if n > 3 {
		t.Fatalf("%d rule sets applied for one burst of 20 writes, want at most 3", n)
	}
	if got := h.w.Reloads(); got != uint64(n) {
		t.Fatalf("Reloads() = %d, want %d", got, n)
	}
	t.Logf("20 writes: %d applied, %d loads", n, h.w.loads.Load()-1)
}

func TestUnchangedRewriteIsNotApplied(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	content := rule("api", "per_user", 10)
	writeAtomic(t, file, content)
	h := start(t, dir, setup{})

	loads := h.w.loads.Load()
	writeAtomic(t, file, content)
	waitFor(t, wait, "the load after the rewrite", func() bool { return h.w.loads.Load() > loads })
	loads = h.w.loads.Load()
	if err := os.Chtimes(file, time.Now(), time.Now()); err != nil { // touch
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, wait, "the load after the touch", func() bool { return h.w.loads.Load() > loads })
	h.noApply(t)
	if got := h.w.Reloads(); got != 0 {
		t.Fatalf("Reloads() = %d, want 0", got)
	}
	if !h.w.LastReload().IsZero() {
		t.Fatalf("LastReload() = %v, want zero", h.w.LastReload())
	}
}

func TestIrrelevantNamesDoNotLoad(t *testing.T) {
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 10))
	h := start(t, dir, setup{})

	loads := h.w.loads.Load()
	for _, name := range []string{"notes.txt", ".api.yaml.swp", "api.yaml~", "4913"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A relevant change after them is the only load.
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 11))
	h.nextApply(t)
	if got := h.w.loads.Load() - loads; got != 1 {
		t.Fatalf("%d loads, want 1", got)
	}
}

func TestCurrentNilAppliesFirstLoad(t *testing.T) {
	dir := t.TempDir()
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 10))
	h := start(t, dir, setup{options: func(o *Options) { o.Current = nil }})
	if got := perHour(h.nextApply(t), "api"); got != 10 {
		t.Fatalf("applied %d, want 10", got)
	}
}

func TestChangeBeforeRunIsLoaded(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	writeAtomic(t, file, rule("api", "per_user", 10))
	// The file changes between the server's config.Load and New.
	h := start(t, dir, setup{options: func(*Options) { writeAtomic(t, file, rule("api", "per_user", 11)) }})
	if got := perHour(h.nextApply(t), "api"); got != 11 {
		t.Fatalf("applied %d, want 11", got)
	}
}

func TestDirectoryRemovedAndRecreated(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "rules")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 10))
	h := start(t, dir, setup{watcher: func(w *Watcher) { w.retry = 20 * time.Millisecond }})

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, wait, "the loss to be logged", func() bool { return strings.Contains(h.logs.String(), "rules directory gone") })
	h.noApply(t)

	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 20))
	h.applyWhere(t, func(r *config.Rules) bool { return perHour(r, "api") == 20 })
	waitFor(t, wait, "the watch to be back", func() bool { return strings.Contains(h.logs.String(), "watching rules again") })

	// Watched again: later edits apply.
	writeAtomic(t, filepath.Join(dir, "api.yaml"), rule("api", "per_user", 30))
	h.applyWhere(t, func(r *config.Rules) bool { return perHour(r, "api") == 30 })
	if n := strings.Count(h.logs.String(), "rules directory gone"); n != 1 {
		t.Fatalf("the loss logged %d times, want once", n)
	}
}

func TestNewValidates(t *testing.T) {
	dir := t.TempDir()
	apply := func(*config.Rules) {}
	for name, opts := range map[string]Options{
		"empty path":        {Apply: apply},
		"nil apply":         {Path: dir},
		"negative debounce": {Path: dir, Apply: apply, Debounce: -time.Second},
		"missing path":      {Path: filepath.Join(dir, "nope"), Apply: apply},
	} {
		if w, err := New(opts); err == nil {
			w.fsw.Close()
			t.Errorf("%s: New succeeded", name)
		}
	}
	w, err := New(Options{Path: dir, Apply: apply})
	if err != nil {
		t.Fatal(err)
	}
	defer w.fsw.Close()
	if w.debounce != DefaultDebounce {
		t.Errorf("debounce %v, want %v", w.debounce, DefaultDebounce)
	}
}

// TestInFlightDuringSwaps decides requests on a real service, from four
// goroutines, while the rules swap back and forth: every call succeeds and
// reports one whole version of the rule, never a missing or mixed one.
func TestInFlightDuringSwaps(t *testing.T) {
	versions := map[string]uint32{"hourly_1000": 1000, "hourly_2000": 2000}
	dir := t.TempDir()
	file := filepath.Join(dir, "api.yaml")
	writeAtomic(t, file, rule("api", "hourly_1000", 1000))
	initial, err := config.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	backend := memory.New(memory.Options{})
	defer backend.Close()
	svc, err := service.New(backend, initial, service.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, dir, setup{apply: svc.SetRules})

	var seen [2]atomic.Uint64 // answers under 1000 and under 2000
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &rlsv3.RateLimitRequest{
				Domain: "api",
				Descriptors: []*rlv3.RateLimitDescriptor{{
					Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("u%d", g)}},
				}},
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := svc.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Errorf("ShouldRateLimit: %v", err)
					return
				}
				if len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit == nil {
					t.Errorf("answer without a current limit: %v", resp)
					return
				}
				l := resp.Statuses[0].CurrentLimit
				want, ok := versions[l.Name]
				if !ok || l.RequestsPerUnit != want || l.Unit != rlsv3.RateLimitResponse_RateLimit_HOUR {
					t.Errorf("answer with limit %v, want one of the two versions", l)
					return
				}
				seen[want/1000-1].Add(1)
			}
		}()
	}

	for i := range 10 {
		name, n, idx := "hourly_2000", 2000, 1
		if i%2 == 1 {
			name, n, idx = "hourly_1000", 1000, 0
		}
		before := seen[idx].Load()
		writeAtomic(t, file, rule("api", name, n))
		if got := perHour(h.nextApply(t), "api"); got != n {
			t.Fatalf("swap %d: applied %d, want %d", i, got, n)
		}
		waitFor(t, wait, "answers under the new rules", func() bool { return seen[idx].Load() > before || t.Failed() })
		if t.Failed() {
			break
		}
	}
	close(stop)
	wg.Wait()
	if got := h.w.Reloads(); got != 10 && !t.Failed() {
		t.Fatalf("Reloads() = %d, want 10", got)
	}
	t.Logf("answers: %d under 1000/hour, %d under 2000/hour", seen[0].Load(), seen[1].Load())
}

// TestRuntimeRootSwap: rules under a runtime root whose link is swapped
// to a new directory, as envoyproxy/ratelimit's runtime is deployed
// (RUNTIME_ROOT=/srv/runtime_data/current, current -> a new snapshot). The
// directory watched is the old snapshot's; the swap loads the new one,
// and the old one's removal rejects nothing.
func TestRuntimeRootSwap(t *testing.T) {
	root := t.TempDir()
	snapshot := func(name string, perHourLimit int) string {
		dir := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Join(dir, "ratelimit", "config"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ratelimit", "config", "api.yaml"), []byte(rule("api", "per_user", perHourLimit)), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	current := filepath.Join(root, "current")
	swap := func(target string) {
		tmp := current + ".tmp"
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, current); err != nil {
			t.Fatal(err)
		}
	}
	swap(snapshot("v1", 10))
	h := start(t, filepath.Join(current, "ratelimit", "config"), setup{})

	swap(snapshot("v2", 20))
	if got := perHour(h.nextApply(t), "api"); got != 20 {
		t.Fatalf("after the swap to v2: %d per hour, want 20", got)
	}
	if err := os.RemoveAll(filepath.Join(root, "v1")); err != nil {
		t.Fatal(err)
	}
	swap(snapshot("v3", 30))
	if got := perHour(h.nextApply(t), "api"); got != 30 {
		t.Fatalf("after the swap to v3: %d per hour, want 30", got)
	}
	// Edits inside the snapshot in force still load.
	if err := os.WriteFile(filepath.Join(root, "v3", "ratelimit", "config", "api.yaml"), []byte(rule("api", "per_user", 40)), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := perHour(h.nextApply(t), "api"); got != 40 {
		t.Fatalf("after an edit in v3: %d per hour, want 40", got)
	}
	if got := h.w.Rejections(); got != 0 {
		t.Fatalf("Rejections() = %d, want 0", got)
	}
}
