package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// envPrefix starts the environment variable of every flag.
const envPrefix = "RATELIMITD_"

// serveConfig is serve's configuration: the server's own (listeners,
// logs, shutdown) and that of each of its components.
type serveConfig struct {
	serving    servingConfig
	components []component

	// flags is the flag set c was read with.
	flags *flag.FlagSet
	// fromEnv maps the flags set from the environment to their variable,
	// so that errors name what the user wrote.
	fromEnv map[string]string
	// lookupEnv reads the environment (GOGC, the OTEL_* variables).
	lookupEnv func(string) (string, bool)
}

// newServeConfig returns serve's configuration, every flag at its
// default, with the flag set that reads it.
func newServeConfig() *serveConfig {
	c := &serveConfig{}
	c.components = serveComponents(&c.serving)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	c.serving.addFlags(fs)
	for _, comp := range c.components {
		comp.addFlags(fs)
	}
	c.flags = fs
	return c
}

// serveComponents are the parts of the server, in the order they are
// built: each may use what those before it built, and their hooks run in
// this order. The rule source comes first; the backend stack's layers
// follow bottom up; the observers of decisions come before the RLS
// service, which is built with them; RLQS comes after RLS, whose rules
// its pushes read. serving holds the flags some components read of the
// server's own.
func serveComponents(serving *servingConfig) []component {
	rls := &rlsFrontEnd{}
	return []component{
		&ruleSource{},
		&backendStore{},
		&regionSync{grpcTLS: &serving.grpcTLS},
		&leasing{},
		&overLimitCache{},
		&tracing{},
		&ownMetrics{},
		&referenceStats{nearLimitRatio: &rls.nearLimitRatio},
		&opsConsole{httpTLS: &serving.httpTLS, enableReset: &rls.enableReset},
		rls,
		&rlqsFrontEnd{},
	}
}

// source names where flag name was set: its environment variable, or the
// flag itself.
func (c *serveConfig) source(name string) string {
	if env, ok := c.fromEnv[name]; ok {
		return env
	}
	return "-" + name
}

// validate checks the values flags cannot check themselves: the
// server's, then each component's.
func (c *serveConfig) validate() error {
	if err := c.serving.check(c.source); err != nil {
		return err
	}
	for _, comp := range c.components {
		if err := comp.check(c.source); err != nil {
			return err
		}
	}
	return nil
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

func newLogger(c *servingConfig, w io.Writer) *slog.Logger {
	level, _ := parseLevel(c.logLevel) // validated
	opts := &slog.HandlerOptions{Level: level}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
