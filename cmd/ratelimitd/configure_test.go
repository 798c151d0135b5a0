package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// update rewrites the golden files of this package from the code:
// go test ./cmd/ratelimitd -run Golden -update. Only for a change of
// behaviour made on purpose; the diff is then the change.
var update = flag.Bool("update", false, "rewrite testdata/*.golden from the code")

// golden compares got with testdata/name, or writes it there with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			g, w := "", ""
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("%s differs from the code at line %d:\n got: %s\nwant: %s", path, i+1, g, w)
			}
		}
	}
}

// TestGoldenHelp: ratelimitd help prints every flag of serve with its
// default and meaning exactly as testdata/help.golden holds them, written
// at main e0edd5f before serve was made of components. Each flag's
// environment variable is RATELIMITD_ and its name (envName), so this
// holds the variables too.
func TestGoldenHelp(t *testing.T) {
	code, out, _ := runMain(t, nil, "help")
	if code != exitOK {
		t.Fatalf("help: exit %d", code)
	}
	golden(t, "help.golden", out)
}

// configureCase is one configuration tried by TestGoldenConfigure.
type configureCase struct {
	env  env
	args []string
}

func (c configureCase) String() string {
	var env []string
	for k, v := range c.env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	return strings.TrimSpace(strings.Join(env, " ") + " -- " + strings.Join(c.args, " "))
}

// probes are values tried on each flag, by the kind of value it takes:
// valid ones, bounds and nonsense.
func probes(f *flag.Flag) []string {
	switch fmt.Sprintf("%T", f.Value) {
	case "*flag.boolValue":
		return []string{"true", "false", "maybe"}
	case "*flag.durationValue":
		return []string{"-1s", "0s", "1ms", "1500ms", "10m", "x"}
	case "*flag.intValue", "*flag.uint64Value":
		return []string{"-1", "0", "1", "100000", "x"}
	case "*flag.float64Value":
		return []string{"-1", "0", "0.5", "1", "1.5", "+Inf", "NaN", "x"}
	}
	return []string{"", "x", "127.0.0.1:0", "a=b,c=d", "k:v", "redis://127.0.0.1:1", "/nonexistent", "unix:/tmp/x.sock"}
}

// contexts are the other flags each probe is tried beside: the flags of
// some settings are checked only with another (-backend redis, say).
var contexts = [][]string{
	nil,
	{"-backend", "redis", "-redis-url", "redis://127.0.0.1:1"},
	{"-backend", "redis", "-redis-url", "redis://127.0.0.1:1", "-redis-mode", "sentinel", "-redis-master", "m"},
	{"-xds-server", "127.0.0.1:1"},
	{"-region", "a", "-region-peers", "b=127.0.0.1:1", "-grpc-tls-cert", "c", "-grpc-tls-key", "k", "-grpc-tls-client-ca", "ca"},
	{"-statsd-addr", "127.0.0.1:1", "-reference-metrics-addr", "127.0.0.1:0"},
}

// compatEnvs are envoyproxy/ratelimit environments, as compatibility mode
// reads them.
var compatEnvs = []env{
	{"RATELIMITD_COMPAT": "envoyproxy"},
	{"RATELIMITD_COMPAT": "envoyproxy", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "app:pw", "REDIS_TYPE": "SENTINEL", "REDIS_SENTINEL_AUTH": "pw3", "LOG_LEVEL": "debug", "PORT": "9000", "GRPC_PORT": "9001", "USE_STATSD": "true", "STATSD_HOST": "statsd", "STATSD_PORT": "8125"},
	{"RATELIMITD_COMPAT": "envoyproxy", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "a:1,b:2", "REDIS_TYPE": "CLUSTER", "REDIS_PIPELINE_WINDOW": "1ms", "REDIS_POOL_SIZE": "20", "LOCAL_CACHE_SIZE_IN_BYTES": "1024", "NEAR_LIMIT_RATIO": "0.9"},
	{"RATELIMITD_COMPAT": "envoyproxy", "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "xds:18000", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "a:b", "RATELIMITD_RESPONSE_HEADERS": "ratelimit"},
	{"RATELIMITD_COMPAT": "envoyproxy", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_CLIENT_TLS_CACERT": "ca", "GRPC_UDS": "/s", "USE_PROMETHEUS": "true", "TRACING_ENABLED": "true", "RATELIMITD_FAILURE_MODE": "open"},
	{"RATELIMITD_COMPAT": "envoyproxy", "BACKEND_TYPE": "memcache"},
	{"RATELIMITD_COMPAT": "envoyproxy", "REDIS_PERSECOND": "true", "PORT": "x"},
}

// configureCases are the configurations TestGoldenConfigure tries: every
// flag with each of its probes, on the command line in each context and
// once from its environment variable, and the compatibility environments.
func configureCases() []configureCase {
	var cases []configureCase
	for _, ctx := range contexts {
		cases = append(cases, configureCase{args: ctx})
	}
	newServeConfig().flags.VisitAll(func(f *flag.Flag) {
		for _, v := range probes(f) {
			for _, ctx := range contexts {
				cases = append(cases, configureCase{args: append(slices.Clip(ctx), "-"+f.Name+"="+v)})
			}
			cases = append(cases, configureCase{env: env{envName(f.Name): v}})
		}
	})
	for _, e := range compatEnvs {
		cases = append(cases, configureCase{env: e}, configureCase{env: e, args: []string{"-log-level", "warn"}})
	}
	return cases
}

// TestGoldenConfigure: every configuration of configureCases ends as
// testdata/configure.golden holds it, written at main e0edd5f before
// serve was made of components: the exit code and the error's text of
// those refused, and for the compatibility environments and the contexts
// the value every flag holds once configured. So names, variables,
// defaults, exit codes and error texts stay as they were.
func TestGoldenConfigure(t *testing.T) {
	var usageText strings.Builder
	usage(&usageText)
	var out strings.Builder
	for _, c := range configureCases() {
		var stderr bytes.Buffer
		values, code := configuredFlags(c.args, c.env.lookup, &stderr)
		fmt.Fprintf(&out, "%s\n\texit %d\n", c, code)
		if code != exitOK {
			// The usage printed on a flag's parse error is help.golden's.
			errs := strings.ReplaceAll(stderr.String(), usageText.String(), "<usage>\n")
			for _, l := range strings.Split(strings.TrimSpace(errs), "\n") {
				fmt.Fprintf(&out, "\t%s\n", l)
			}
			continue
		}
		if c.env == nil && slices.ContainsFunc(contexts, func(ctx []string) bool { return slices.Equal(ctx, c.args) }) || c.env["RATELIMITD_COMPAT"] != "" {
			for _, v := range values {
				fmt.Fprintf(&out, "\t%s\n", v)
			}
		}
	}
	golden(t, "configure.golden", out.String())
}

// configuredFlags configures serve as args and lookupEnv say and returns
// every flag's value once configured, name=value in name order, and the
// exit code of configure.
func configuredFlags(args []string, lookupEnv func(string) (string, bool), stderr *bytes.Buffer) ([]string, int) {
	c, _, code := configure(args, lookupEnv, stderr)
	if c == nil {
		if code == exitOK {
			code = -1 // help asked: no configuration
		}
		return nil, code
	}
	var values []string
	c.flags.VisitAll(func(f *flag.Flag) {
		values = append(values, f.Name+"="+f.Value.String())
	})
	return values, code
}
