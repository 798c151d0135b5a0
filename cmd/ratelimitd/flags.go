package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// envPrefix starts the environment variable of every flag.
const envPrefix = "RATELIMITD_"

// serveConfig is everything serve is configured with.
type serveConfig struct {
	config          string
	grpcAddr        string
	httpAddr        string
	backend         string
	memoryMaxKeys   int
	logLevel        string
	logFormat       string
	shutdownTimeout time.Duration
	bounds          service.Bounds
	maxHits         uint64

	// fromEnv maps the flags set from the environment to their variable,
	// so that errors name what the user wrote.
	fromEnv map[string]string
}

// source names where flag name was set: its environment variable, or the
// flag itself.
func (c *serveConfig) source(name string) string {
	if env, ok := c.fromEnv[name]; ok {
		return env
	}
	return "-" + name
}

func newServeFlags(c *serveConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&c.config, "config", "config", "rule `path`: a YAML rule file, or a directory of *.yaml and *.yml rule files")
	fs.StringVar(&c.grpcAddr, "grpc-addr", ":8081", "gRPC listen `address` (Envoy RLS v3, grpc.health.v1, reflection); port 0 picks a free port")
	fs.StringVar(&c.httpAddr, "http-addr", ":8080", "HTTP listen `address` (/json, /healthcheck, /rlconfig); port 0 picks a free port")
	fs.StringVar(&c.backend, "backend", "memory", "where counters live: memory (in this process)")
	fs.IntVar(&c.memoryMaxKeys, "memory-max-keys", memory.DefaultMaxKeys, "most keys the memory backend tracks at once; beyond it the entries nearest expiry are evicted")
	fs.StringVar(&c.logLevel, "log-level", "info", "least important log `level` written: debug, info, warn, error")
	fs.StringVar(&c.logFormat, "log-format", "text", "log `format`: text or json")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 15*time.Second, "on SIGTERM, how long in-flight calls may take before connections are closed")
	fs.IntVar(&c.bounds.MaxDomainLen, "max-domain-bytes", service.DefaultMaxDomainLen, "longest domain a request may name, in bytes")
	fs.IntVar(&c.bounds.MaxDescriptors, "max-descriptors", service.DefaultMaxDescriptors, "most descriptors one request may carry")
	fs.IntVar(&c.bounds.MaxEntries, "max-entries", service.DefaultMaxEntries, "most entries one descriptor may carry")
	fs.IntVar(&c.bounds.MaxKeyLen, "max-key-bytes", service.DefaultMaxKeyLen, "longest descriptor entry key, in bytes")
	fs.IntVar(&c.bounds.MaxValueLen, "max-value-bytes", service.DefaultMaxValueLen, "longest descriptor entry value, in bytes")
	fs.Uint64Var(&c.maxHits, "max-hits", service.DefaultMaxHits, "largest hits_addend a request or descriptor may carry")
	return fs
}

// parseFlags parses args into fs, then sets every flag not given on the
// command line from its RATELIMITD_ environment variable, if present. It
// returns the flags set from the environment, mapped to their variable.
func parseFlags(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (map[string]string, error) {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q; flags start with -", fs.Arg(0))
	}
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	fromEnv := make(map[string]string)
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		name := envName(f.Name)
		if v, ok := lookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("invalid value %q for %s: %v", v, name, e)
			}
			fromEnv[f.Name] = name
		}
	})
	return fromEnv, err
}

// envName is the environment variable of flag name: "grpc-addr" is read
// from RATELIMITD_GRPC_ADDR.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// validate checks the values flags cannot check themselves.
func (c *serveConfig) validate() error {
	for _, a := range []struct{ name, v string }{{"grpc-addr", c.grpcAddr}, {"http-addr", c.httpAddr}, {"config", c.config}} {
		if a.v == "" {
			return fmt.Errorf("invalid %s: it must not be empty", c.source(a.name))
		}
	}
	if c.backend != "memory" {
		return fmt.Errorf("invalid %s %q; accepted: memory", c.source("backend"), c.backend)
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: debug, info, warn, error", c.source("log-level"), c.logLevel)
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return fmt.Errorf("invalid %s %q; accepted: text, json", c.source("log-format"), c.logFormat)
	}
	if c.shutdownTimeout < 0 {
		return fmt.Errorf("invalid %s %v; it must not be negative", c.source("shutdown-timeout"), c.shutdownTimeout)
	}
	for _, b := range []struct {
		name string
		v    int
	}{
		{"memory-max-keys", c.memoryMaxKeys},
		{"max-domain-bytes", c.bounds.MaxDomainLen},
		{"max-descriptors", c.bounds.MaxDescriptors},
		{"max-entries", c.bounds.MaxEntries},
		{"max-key-bytes", c.bounds.MaxKeyLen},
		{"max-value-bytes", c.bounds.MaxValueLen},
	} {
		if b.v < 1 {
			return fmt.Errorf("invalid %s %d; it must be at least 1", c.source(b.name), b.v)
		}
	}
	if c.maxHits < 1 {
		return fmt.Errorf("invalid %s %d; it must be at least 1", c.source("max-hits"), c.maxHits)
	}
	c.bounds.MaxHits = c.maxHits
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q", s)
}

func newLogger(c *serveConfig, w io.Writer) *slog.Logger {
	level, _ := parseLevel(c.logLevel) // validated
	opts := &slog.HandlerOptions{Level: level}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
