package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/console"
	"github.com/ratelimitd/ratelimitd/pkg/reload"
)

// ruleSource is the component that loads the rules, first of all: from
// the files of -config, reloaded when they change (-watch-config), or
// from an xDS control plane (-xds-server). Each later rule set is put in
// force through every component's rules hook (server.putInForce).
type ruleSource struct {
	path  string
	opts  config.Options
	watch bool
	xds   xdsConfig

	// initial are the rules at start, loaded at loadedAt, which the
	// components are built with; nil once they are started.
	initial  *config.Rules
	loadedAt time.Time
	fromXDS  *xdsSource      // nil for files
	watcher  *reload.Watcher // nil without -watch-config, or when the watch failed
	// mark marks the server unhealthy while it awaits rules with a
	// domain (-xds-ready-with-rules); set by the health hook.
	mark func(part, reason string, bad bool)
}

func (r *ruleSource) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&r.path, "config", "config", "rule `path`: a YAML rule file, or a directory of *.yaml and *.yml rule files")
	configReadingFlags(fs, &r.opts)
	fs.BoolVar(&r.watch, "watch-config", true, "reload the rules when the files under -config change (a bad set is rejected whole; the last good rules keep serving)")
	addXDSFlags(fs, &r.xds)
}

// configReadingFlags defines the flags that say how -config is read
// (config.Options); compatibility mode sets them from RUNTIME_*.
func configReadingFlags(fs *flag.FlagSet, o *config.Options) {
	fs.BoolVar(&o.Reference, "config-reference", false, "read and decode -config as envoyproxy/ratelimit does: every file below the directory, subdirectories included; only a file's first YAML document; the last of a field given twice; each with a warning (docs/rules.md#reading-rule-files)")
	fs.StringVar(&o.Prefix, "config-reference-prefix", "", "with -config-reference, read only the files whose path below -config, each / written ., starts with this `prefix` (envoyproxy/ratelimit's RUNTIME_WATCH_ROOT=true reads RUNTIME_APPDIRECTORY. below RUNTIME_ROOT/RUNTIME_SUBDIRECTORY)")
}

func (r *ruleSource) check(flagName func(string) string) error {
	if r.path == "" {
		return fmt.Errorf("invalid %s: it must not be empty", flagName("config"))
	}
	return r.xds.check(flagName)
}

func (r *ruleSource) build(ctx context.Context, s *server) (hooks, error) {
	s.source = r
	if r.xds.server != "" {
		if err := r.startXDS(ctx, s); err != nil {
			return hooks{}, err
		}
	} else if err := r.load(s); err != nil {
		return hooks{}, err
	}
	r.loadedAt = time.Now()
	s.reg.MustRegister(sourceInfo{r.fromXDS})
	return hooks{
		health: func(_ context.Context, mark func(part, reason string, bad bool)) {
			r.mark = mark
			r.awaitRules(r.initial)
		},
		rules: r.awaitRules,
		start: func(ctx context.Context) { r.follow(ctx, s) },
		http: func(mux *http.ServeMux) {
			mux.Handle("GET /rlconfig", r.rlconfig(s.svc.HTTPHandler()))
		},
	}, nil
}

// load loads the files of -config.
func (r *ruleSource) load(s *server) error {
	start := time.Now()
	rules, err := config.LoadOptions(r.path, r.opts)
	if err != nil {
		return fmt.Errorf("loading rules from %s:\n%w", r.path, err)
	}
	took := time.Since(start)
	releaseMemory()
	s.log.Info("rules loaded", "path", r.path, "files", len(rules.Files()), "domains", len(rules.Domains()), "rules", rules.NumRules(),
		"took", took.Round(time.Millisecond), "hash", rules.Hash())
	for _, w := range rules.Warnings() {
		s.log.Warn("rules: " + w.Error())
	}
	r.initial = rules
	return nil
}

// startXDS starts the xDS client and takes the first rules it receives,
// or, with -xds-force-start, what it has so far.
func (r *ruleSource) startXDS(ctx context.Context, s *server) error {
	x, err := startXDS(ctx, &r.xds, s.log)
	if err != nil {
		return err
	}
	r.fromXDS = x
	if r.initial = x.initial(ctx, r.xds.forceStart, s.log); r.initial == nil {
		s.log.Info("stopped before the first rules arrived from xDS")
		return errStoppedEarly
	}
	releaseMemory()
	registerXDS(s.reg, x)
	return nil
}

// releaseMemory collects garbage and gives the free memory back to the
// system at once, after a rule set is loaded or put in force. Loading
// leaves garbage several times the rules' own size (the YAML tree, some
// 3 KB a descriptor, and the rules replaced); the runtime would give the
// memory back over minutes, the resident set staying at the load's peak
// meanwhile: some 550 MB after loading 100,000 descriptors, whose rules
// hold 65 MB. It costs one collection of the live heap per rule set, on
// the goroutine that loaded it.
func releaseMemory() { debug.FreeOSMemory() }

// awaitRules, with -xds-ready-with-rules, has health follow whether the
// rules in force hold a domain, as the reference's config component does
// (src/service/ratelimit.go, SetConfig). The set served before the first
// rules arrive is empty too.
func (r *ruleSource) awaitRules(rules *config.Rules) {
	if r.fromXDS != nil {
		r.mark("rules", "waiting for rules", r.xds.readyWithRules && len(rules.Domains()) == 0)
	}
}

// follow puts every later rule set in force: each xDS update, or each
// change of the files when watched.
func (r *ruleSource) follow(ctx context.Context, s *server) {
	// The components were built with the first rules; from now on only
	// the rules in force are held, so that a reload frees them.
	defer func() { r.initial = nil }()
	if r.fromXDS != nil {
		r.fromXDS.attach(r.initial, s.putInForce, s.reject)
		return
	}
	if !r.watch {
		return
	}
	rw, err := reload.New(reload.Options{Path: r.path, Config: r.opts, Apply: s.putInForce, Reject: s.reject, Logger: s.log, Current: r.initial})
	if err != nil {
		// Serving without reload beats not serving (the inotify limit,
		// say); a restart still picks up new rules.
		s.log.Error("rules are not watched: edits need a restart", "path", r.path, "error", err)
		return
	}
	r.watcher = rw
	go rw.Run(ctx)
	registerReload(s.reg, rw)
	s.log.Info("watching rules for changes", "path", r.path)
}

// loaded returns when the rules in force were loaded: at start, or at the
// last reload or xDS update since.
func (r *ruleSource) loaded() time.Time {
	var last time.Time
	switch {
	case r.fromXDS != nil:
		last = r.fromXDS.client.Status().LastUpdate
	case r.watcher != nil:
		last = r.watcher.LastReload()
	}
	if last.After(r.loadedAt) {
		return last
	}
	return r.loadedAt
}

// describe describes the source as the ops console shows it.
func (r *ruleSource) describe() console.Source {
	if r.fromXDS == nil {
		return console.Source{Kind: "file", Path: r.path, LoadedAt: r.loaded()}
	}
	st := r.fromXDS.client.Status()
	return console.Source{Kind: "xds", Server: st.Server, Version: st.Version, Connected: st.Connected,
		Error: st.LastError, LoadedAt: st.LastUpdate}
}

// rlconfig serves GET /rlconfig: a line saying where the rules come from
// (the files, or the xDS server, version and connection, and the last
// rejection), then the rules in force as rules serves them.
func (r *ruleSource) rlconfig(rules http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if r.fromXDS == nil {
			fmt.Fprintf(w, "# source file %s\n", r.path)
		} else {
			st := r.fromXDS.client.Status()
			fmt.Fprintf(w, "# source xds %s version %q connected %t\n", st.Server, st.Version, st.Connected)
			if st.LastError != "" {
				fmt.Fprintf(w, "# xds: the last response was rejected (NACK); the rules below keep serving:\n")
				for _, line := range strings.Split(st.LastError, "\n") {
					fmt.Fprintf(w, "#   %s\n", line)
				}
			}
		}
		rules.ServeHTTP(w, req)
	})
}
