package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCompatMode(t *testing.T) {
	for _, c := range []struct {
		program string
		env     env
		want    bool
		err     string
	}{
		{"ratelimitd", nil, false, ""},
		{"/bin/ratelimit", nil, true, ""},
		{"ratelimit", nil, true, ""},
		{"/usr/local/bin/ratelimitd", env{"RATELIMITD_COMPAT": "envoyproxy"}, true, ""},
		{"/bin/ratelimit", env{"RATELIMITD_COMPAT": ""}, false, ""}, // set empty: off, even under the name
		{"ratelimitd", env{"RATELIMITD_COMPAT": "gubernator"}, false, `invalid RATELIMITD_COMPAT "gubernator"; accepted: envoyproxy`},
	} {
		got, err := compatMode(withCompatName(c.program, c.env.lookup))
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s with %v: %v, %v; want %v, %q", c.program, c.env, got, err, c.want, c.err)
		}
	}
}

// TestCompatDefaults: with nothing set, the reference's defaults: its
// ports, its rule directory, a Redis on its Unix socket, warn logs.
func TestCompatDefaults(t *testing.T) {
	args, ignored, _, err := compatArgs(env{}.lookup)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"-http-addr=0.0.0.0:8080", "-grpc-addr=0.0.0.0:8081", "-debug-addr=0.0.0.0:6070",
		"-grpc-max-connection-age=24h", "-grpc-max-connection-age-grace=1h",
		"-log-level=warn", "-log-format=text",
		"-config=/srv/runtime_data/current", "-config-reference=true", "-config-reference-prefix=config.", "-watch-config=true",
		"-backend=redis", "-redis-url=unix:///var/run/nutcracker/ratelimit.sock", "-redis-mode=standalone",
		"-redis-pool-size=10", "-redis-read-timeout=10s", "-near-limit-ratio=0.8",
		"-redis-key-format=reference", "-redis-prefix=", "-redis-expiration-jitter=300s",
		"-statsd-addr=localhost:8125", "-statsd-flush-interval=10s",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("defaults lack %s: %q", want, args)
		}
	}
	if len(ignored) != 1 || !strings.HasPrefix(ignored[0], "RUNTIME_IGNOREDOTFILES=false") {
		t.Errorf("ignored %q; want only the dot files the reference loads by default", ignored)
	}
}

// envoyGatewayEnv is exactly the environment Envoy Gateway gives the
// reference's container, every optional branch taken (a Redis with TLS
// and a client certificate, Prometheus, tracing): envoyproxy/gateway
// d32f28294245e454d20f81d323d626a90e660c1e (resource.go last changed in
// a89c775), internal/infrastructure/kubernetes/ratelimit/resource.go,
// expectedRateLimitContainerEnv, with its constants' values.
var envoyGatewayEnv = env{
	"RUNTIME_ROOT":                       "/data",
	"RUNTIME_SUBDIRECTORY":               "ratelimit",
	"RUNTIME_IGNOREDOTFILES":             "true",
	"RUNTIME_WATCH_ROOT":                 "false",
	"LOG_LEVEL":                          "info",
	"USE_STATSD":                         "false",
	"CONFIG_TYPE":                        "GRPC_XDS_SOTW",
	"CONFIG_GRPC_XDS_SERVER_URL":         "envoy-gateway:18001", // XdsGrpcSotwConfigServerHost:Port
	"CONFIG_GRPC_XDS_NODE_ID":            "envoy-ratelimit",     // InfraName
	"GRPC_SERVER_USE_TLS":                "true",
	"GRPC_SERVER_TLS_CERT":               "/certs/tls.crt",
	"GRPC_SERVER_TLS_KEY":                "/certs/tls.key",
	"GRPC_SERVER_TLS_CA_CERT":            "/certs/ca.crt", // not a reference setting: neither reads it
	"CONFIG_GRPC_XDS_SERVER_USE_TLS":     "true",
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":    "/certs/tls.crt",
	"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":     "/certs/tls.key",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":  "/certs/ca.crt",
	"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
	// rateLimit.Backend.Redis
	"REDIS_SOCKET_TYPE": "tcp",
	"REDIS_URL":         "redis.envoy-gateway-system.svc.cluster.local:6379",
	// rateLimit.Backend.Redis.TLS, with a CertificateRef
	"REDIS_TLS":             "true",
	"REDIS_TLS_CLIENT_CERT": "/redis-certs/tls.crt",
	"REDIS_TLS_CLIENT_KEY":  "/redis-certs/tls.key",
	// enablePrometheus
	"USE_PROMETHEUS":         "true",
	"PROMETHEUS_ADDR":        ":19001",
	"PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
	// enableTracing
	"TRACING_ENABLED":             "true",
	"TRACING_SERVICE_NAME":        "envoy-ratelimit",
	"TRACING_SERVICE_NAMESPACE":   "envoy-gateway-system",
	"TRACING_SERVICE_INSTANCE_ID": "envoy-ratelimit-5d8f7c9b4-x2x7q", // metadata.name
	"TRACING_SAMPLING_RATE":       "0.5",
	"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.monitoring.svc:4318",
}

// TestCompatEnvoyGateway: Envoy Gateway's environment maps to rules over
// xDS from envoy-gateway:18001 with mutual TLS, a TLS gRPC listener, a
// Redis over TLS with a client certificate, the reference's Prometheus
// series on :19001, and tracing; what it sets that neither the reference
// nor ratelimitd reads is named.
func TestCompatEnvoyGateway(t *testing.T) {
	args, ignored, from, err := compatArgs(envoyGatewayEnv.lookup)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"-log-level=info",
		"-xds-server=envoy-gateway:18001", "-xds-node-id=envoy-ratelimit", "-xds-force-start=true",
		"-xds-tls=true", "-xds-tls-cert=/certs/tls.crt", "-xds-tls-key=/certs/tls.key", "-xds-tls-ca=/certs/ca.crt",
		"-grpc-tls-cert=/certs/tls.crt", "-grpc-tls-key=/certs/tls.key",
		"-redis-url=rediss://redis.envoy-gateway-system.svc.cluster.local:6379",
		"-redis-tls-cert=/redis-certs/tls.crt", "-redis-tls-key=/redis-certs/tls.key",
		"-reference-metrics-addr=:19001", "-reference-metrics-mapping=/etc/statsd-exporter/conf.yaml",
		"-tracing=true",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("args lack %s: %q", want, args)
		}
	}
	// The reference takes client CAs from GRPC_CLIENT_TLS_CACERT only:
	// under Envoy Gateway its listener is TLS without client
	// certificates, and so is ratelimitd's.
	for _, a := range args {
		if strings.HasPrefix(a, "-grpc-tls-client-ca=") || strings.HasPrefix(a, "-statsd-addr=") {
			t.Errorf("args hold %s", a)
		}
	}
	var names []string
	for _, i := range ignored {
		names = append(names, strings.Fields(i)[0])
	}
	// RUNTIME_*: Envoy Gateway sets them, and with rules over xDS
	// neither server reads them.
	if want := []string{"GRPC_SERVER_TLS_CA_CERT", "TRACING_SERVICE_INSTANCE_ID", "TRACING_SERVICE_NAMESPACE",
		"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT"}; !slices.Equal(names, want) {
		t.Errorf("ignored %q, want %v named", ignored, want)
	}
	if from["xds-server"] != "CONFIG_GRPC_XDS_SERVER_URL" || from["redis-url"] != "REDIS_URL" {
		t.Errorf("sources %v", from)
	}
	otel := compatEnvironment(envoyGatewayEnv.lookup)
	for name, want := range map[string]string{
		"OTEL_SERVICE_NAME":           "envoy-ratelimit",
		"OTEL_TRACES_SAMPLER_ARG":     "0.5",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.monitoring.svc:4318",
	} {
		if got, _ := otel(name); got != want {
			t.Errorf("%s=%q, want %q", name, got, want)
		}
	}
}

// TestCompatOverLimitHits: compatibility mode counts hits beyond what
// remains, as the reference counts every hit, unless ratelimitd's own
// RATELIMITD_OVER_LIMIT_HITS says otherwise; the reference's
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT drops them.
func TestCompatOverLimitHits(t *testing.T) {
	for _, c := range []struct {
		env  env
		want string // the flag compatibility mode gives; "" for none
	}{
		{env{}, "-over-limit-hits=count"},
		{env{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "false"}, "-over-limit-hits=count"},
		{env{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}, "-over-limit-hits=drop"},
		{env{"RATELIMITD_OVER_LIMIT_HITS": "drop"}, ""},
		{env{"RATELIMITD_OVER_LIMIT_HITS": "count", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}, ""},
	} {
		args, ignored, _, err := compatArgs(c.env.lookup)
		if err != nil {
			t.Fatal(err)
		}
		got := flagIn(args, "over-limit-hits")
		if got != c.want {
			t.Errorf("%v: %q, want %q", c.env, got, c.want)
		}
		// Read, and overridden: not among the settings not honoured
		// because the reference would not read them either.
		for _, i := range ignored {
			if strings.HasPrefix(i, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT") {
				t.Errorf("%v: %q named as not honoured", c.env, i)
			}
		}
	}
}

// flagIn returns the last of args that sets flag name, "-name=value", or
// "" for none.
func flagIn(args []string, name string) string {
	var got string
	for _, a := range args {
		if strings.HasPrefix(a, "-"+name+"=") {
			got = a
		}
	}
	return got
}

// TestCompatFailureMode: compatibility mode answers a call it cannot
// decide with an error, as the reference does, unless ratelimitd's own
// RATELIMITD_FAILURE_MODE says otherwise.
func TestCompatFailureMode(t *testing.T) {
	for _, c := range []struct {
		env  env
		want string
	}{
		{env{}, "-failure-mode=error"},
		{env{"RATELIMITD_FAILURE_MODE": "open"}, ""},
		{env{"RATELIMITD_FAILURE_MODE": "local"}, ""},
	} {
		args, _, from, err := compatArgs(c.env.lookup)
		if err != nil {
			t.Fatal(err)
		}
		got := flagIn(args, "failure-mode")
		if got != c.want || got != "" && from["failure-mode"] != "RATELIMITD_COMPAT" {
			t.Errorf("%v: %q from %q, want %q", c.env, got, from["failure-mode"], c.want)
		}
	}
	// In serve, RATELIMITD_FAILURE_MODE then applies as to any flag the
	// reference's settings do not give.
	p := startServeEnv(t, env{"RATELIMITD_COMPAT": "envoyproxy", "RATELIMITD_FAILURE_MODE": "bogus",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:1", "RUNTIME_ROOT": t.TempDir(),
		"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0", "USE_STATSD": "false"}, false)
	if code := p.stop(t); code != exitUsage {
		t.Errorf("RATELIMITD_FAILURE_MODE=bogus in compatibility mode: exit %d, want %d (the variable read and refused)", code, exitUsage)
	}
}

// TestCompatResponseHeaders: LIMIT_RESPONSE_HEADERS_ENABLED gives the
// reference's headers, under the names of LIMIT_LIMIT_HEADER,
// LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER; a name that is no HTTP
// header name stops the start.
func TestCompatResponseHeaders(t *testing.T) {
	args, ignored, _, err := compatArgs(env{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-Left"}.lookup)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-response-headers=reference", "-response-header-names=RateLimit-Limit,X-Left,RateLimit-Reset"} {
		if !slices.Contains(args, want) {
			t.Errorf("args lack %s: %q", want, args)
		}
	}
	if len(ignored) != 1 { // RUNTIME_IGNOREDOTFILES, as by default
		t.Errorf("ignored %q", ignored)
	}
	_, _, _, err = compatArgs(env{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_RESET_HEADER": "Reset In"}.lookup)
	if err == nil || !strings.Contains(err.Error(), `"Reset In" is not an HTTP header name`) {
		t.Errorf("a header name with a space: %v", err)
	}
	if args, _, _, _ := compatArgs(env{"LIMIT_REMAINING_HEADER": "X-Left"}.lookup); slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "-response-header") }) {
		t.Errorf("names without LIMIT_RESPONSE_HEADERS_ENABLED: %q", args)
	}
}

// TestCompatXDS: CONFIG_TYPE=GRPC_XDS_SOTW takes the rules from the
// control plane of the CONFIG_GRPC_XDS_* settings, and no directory.
func TestCompatXDS(t *testing.T) {
	args, ignored, _, err := compatArgs(env{
		"CONFIG_TYPE":                               "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL":                "envoy-gateway:18001",
		"CONFIG_GRPC_XDS_NODE_ID":                   "envoy-ratelimit",
		"CONFIG_GRPC_XDS_NODE_METADATA":             "zone=a,team=edge",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "authorization:Bearer t0ken,x-env:prod",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS":            "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":           "/certs/tls.crt",
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":            "/certs/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":         "/certs/ca.crt",
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN":            "envoy-gateway",
		"FORCE_START_WITHOUT_INITIAL_CONFIG":        "true",
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED":   "true",
		"XDS_CLIENT_BACKOFF_JITTER":                 "false",
		"RUNTIME_IGNOREDOTFILES":                    "true",
	}.lookup)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"-xds-server=envoy-gateway:18001", "-xds-node-id=envoy-ratelimit", "-xds-node-metadata=zone=a,team=edge",
		"-xds-headers=authorization=Bearer t0ken,x-env=prod",
		"-xds-tls=true", "-xds-tls-cert=/certs/tls.crt", "-xds-tls-key=/certs/tls.key", "-xds-tls-ca=/certs/ca.crt", "-xds-tls-server-name=envoy-gateway",
		"-xds-backoff-initial=10s", "-xds-backoff-max=60s", "-xds-force-start=true", "-xds-ready-with-rules=true",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("args lack %s: %q", want, args)
		}
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-config=") {
			t.Errorf("rules from xDS, yet %s", a)
		}
	}
	if len(ignored) != 2 || !strings.HasPrefix(ignored[0], "XDS_CLIENT_BACKOFF_JITTER") || !strings.HasPrefix(ignored[1], "RUNTIME_IGNOREDOTFILES (the rules come over xDS") {
		t.Errorf("ignored %q", ignored)
	}
}

// TestCompatStats: statsd on by default; USE_PROMETHEUS serves the
// reference's series on its address; DISABLE_STATS turns both off.
func TestCompatStats(t *testing.T) {
	args, _, _, err := compatArgs(env{
		"USE_STATSD": "false", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":9091",
		"PROMETHEUS_MAPPER_YAML": "/etc/mapper.yaml", "EXTRA_TAGS": "env:prod",
	}.lookup)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-reference-metrics-addr=:9091", "-reference-metrics-path=/metrics", "-reference-metrics-mapping=/etc/mapper.yaml", "-statsd-tags=env:prod"} {
		if !slices.Contains(args, want) {
			t.Errorf("args lack %s: %q", want, args)
		}
	}
	args, _, _, err = compatArgs(env{"DISABLE_STATS": "true", "USE_PROMETHEUS": "true", "STATSD_HOST": "statsd"}.lookup)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-statsd-addr") || strings.HasPrefix(a, "-reference-metrics-addr") {
			t.Errorf("DISABLE_STATS, yet %s", a)
		}
	}
}

func TestReferenceRedisURL(t *testing.T) {
	for _, c := range []struct {
		socket, typ, url, auth string
		tls                    bool
		want                   referenceRedis
		err                    string
	}{
		{"tcp", "SINGLE", "redis:6379", "", false, referenceRedis{url: "redis://redis:6379", mode: "standalone"}, ""},
		{"tcp", "single", "redis:6379", "s3cret", true, referenceRedis{url: "rediss://:s3cret@redis:6379", mode: "standalone"}, ""},
		{"tcp", "SINGLE", "redis:6379", "app:s3cret", false, referenceRedis{url: "redis://app:s3cret@redis:6379", mode: "standalone"}, ""},
		{"unix", "SINGLE", "/var/run/redis.sock", "", false, referenceRedis{url: "unix:///var/run/redis.sock", mode: "standalone"}, ""},
		{"tcp", "SENTINEL", "mymaster,s1:26379, s2:26379", "pw", false, referenceRedis{url: "redis://:pw@s1:26379,redis://s2:26379", mode: "sentinel", master: "mymaster"}, ""},
		{"tcp", "CLUSTER", "n1:7000,n2:7001,n3:7002", "", false, referenceRedis{url: "redis://n1:7000,redis://n2:7001,redis://n3:7002", mode: "cluster"}, ""},
		{"tcp", "SENTINEL", "s1:26379", "", false, referenceRedis{}, "REDIS_URL=master,sentinel1:port"},
		{"udp", "SINGLE", "redis:6379", "", false, referenceRedis{}, `REDIS_SOCKET_TYPE="udp"`},
		{"tcp", "RING", "redis:6379", "", false, referenceRedis{}, `REDIS_TYPE="RING"`},
		{"unix", "SINGLE", "/s.sock", "", true, referenceRedis{}, "TLS is for tcp"},
	} {
		got, err := referenceRedisURL(c.socket, c.typ, c.url, c.auth, c.tls)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s %s %q: %+v, %v; want %+v, %q", c.socket, c.typ, c.url, got, err, c.want, c.err)
		}
	}
}

// TestCompatRefuses: settings that would change decisions stop the start,
// every one of them named at once.
func TestCompatRefuses(t *testing.T) {
	_, _, _, err := compatArgs(env{
		"BACKEND_TYPE":        "redis",
		"REDIS_PERSECOND":     "true",
		"MERGE_DOMAIN_CONFIG": "true",
		"NEAR_LIMIT_RATIO":    "1.5",
		"LOG_LEVEL":           "loud",
	}.lookup)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"REDIS_PERSECOND=true", "MERGE_DOMAIN_CONFIG=true", `NEAR_LIMIT_RATIO="1.5"`, `LOG_LEVEL="loud"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
	_, _, _, err = compatArgs(env{"BACKEND_TYPE": "memcache"}.lookup)
	if err == nil || !strings.Contains(err.Error(), "BACKEND_TYPE=memcache") || !strings.Contains(err.Error(), "run Redis") {
		t.Errorf("memcache: %v", err)
	}
}

// TestCompatIgnored: a setting not honoured is named once set to other
// than its default, with why.
func TestCompatIgnored(t *testing.T) {
	_, ignored, _, err := compatArgs(env{
		"RUNTIME_IGNOREDOTFILES":               "true",
		"REDIS_PIPELINE_WINDOW":                "150us",
		"REDIS_PIPELINE_LIMIT":                 "0",    // its default
		"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true", // honoured
	}.lookup)
	if err != nil {
		t.Fatal(err)
	}
	if len(ignored) != 1 || !strings.HasPrefix(ignored[0], "REDIS_PIPELINE_WINDOW (ratelimitd batches") {
		t.Errorf("ignored %q", ignored)
	}
}

// TestCompatServe: serve in compatibility mode names the setting behind a
// bad flag value, and a command-line flag still wins over the settings.
func TestCompatServe(t *testing.T) {
	var stderr bytes.Buffer
	code := Main(context.Background(), []string{"serve"}, env{
		"RATELIMITD_COMPAT": "envoyproxy",
		"REDIS_POOL_SIZE":   "many",
	}.lookup, &stderr, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "REDIS_POOL_SIZE") {
		t.Errorf("exit %d:\n%s", code, stderr.String())
	}
	stderr.Reset()
	code = Main(context.Background(), []string{"serve", "-redis-pool-size", "-3"}, env{
		"RATELIMITD_COMPAT": "envoyproxy",
		"REDIS_SOCKET_TYPE": "tcp",
		"REDIS_URL":         "127.0.0.1:1",
	}.lookup, &stderr, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "invalid -redis-pool-size -3") {
		t.Errorf("exit %d:\n%s", code, stderr.String())
	}
	stderr.Reset()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "a.yaml"), []byte("domain: a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Without Redis, the reference's start would wait for it before any
	// port opens; the command line says not to, and wins.
	code = Main(context.Background(), []string{"serve", "-redis-startup-initial-interval", "0"}, env{
		"RATELIMITD_COMPAT": "envoyproxy",
		"REDIS_SOCKET_TYPE": "tcp",
		"REDIS_URL":         "127.0.0.1:1",
		"RUNTIME_ROOT":      root,
		"PORT":              "99999",
	}.lookup, &stderr, &stderr)
	if code == exitOK || !strings.Contains(stderr.String(), "99999") {
		t.Errorf("exit %d:\n%s", code, stderr.String())
	}
}

// TestMigratingDocListsEverySetting: docs/migrating.md names every
// setting compatibility mode reads or names as ignored, and every setting
// of the reference's settings.go as recorded (testdata/
// reference-settings.txt) in a row of its tables under "Every setting",
// whose status agrees with the code: "not read" for exactly the recorded
// settings compatibility mode never reads (in any of the environments
// below) nor lists as ignored, and "ignored" for those it lists.
//
// Shown failing against broken builds: a recorded setting taken out of
// the doc's tables (named only in prose); REDIS_PERSECOND_URL's row
// marked "mapped"; MEMCACHE_SRV read by compatArgs while its row says
// "not read"; a name added to the recording that no row names.
func TestMigratingDocListsEverySetting(t *testing.T) {
	data, err := os.ReadFile("../../docs/migrating.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	read := compatReads(t)
	recorded := readSettingsFixture(t).Names
	named := map[string]bool{}
	for name := range read {
		named[name] = true
	}
	for name := range ignoredSettings {
		named[name] = true
	}
	for _, name := range recorded { // all of settings.go
		named[name] = true
	}
	for name := range named {
		if strings.HasPrefix(name, "OTEL_") {
			continue // ratelimitd's own
		}
		if !strings.Contains(doc, "`"+name+"`") && !strings.Contains(doc, "`"+name+" ") {
			t.Errorf("docs/migrating.md does not name %s", name)
		}
	}
	t.Logf("%d settings read", len(read))
	if len(read) < 80 {
		t.Errorf("only %d settings read: the recording missed branches", len(read))
	}
	status := settingRows(t, doc)
	for _, name := range recorded {
		st, ok := status[name]
		switch {
		case !ok:
			t.Errorf("docs/migrating.md: no row of \"Every setting\" names %s, a setting of the reference", name)
		case ignoredSettings[name] != "" && !strings.Contains(st, "ignored"):
			t.Errorf("docs/migrating.md: %s is %q; compatibility mode ignores it (ignoredSettings)", name, st)
		case ignoredSettings[name] == "" && !read[name] && st != "not read":
			t.Errorf("docs/migrating.md: %s is %q; compatibility mode never reads it: \"not read\"", name, st)
		case read[name] && strings.Contains(st, "not read"):
			t.Errorf("docs/migrating.md: %s is %q, but compatibility mode reads it", name, st)
		}
	}
}

// compatReads returns every variable compatibility mode reads, over
// environments that take each of compatArgs's branches: those it maps to
// flags (compatRead) and those the tracing environment derives from
// (compatEnvironment). The look-ups that only name settings set but not
// honoured (ignoredSettings, unreadSettings) are not reads.
func compatReads(t *testing.T) map[string]bool {
	t.Helper()
	read := map[string]bool{}
	for _, e := range []env{
		{},
		{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "a:b"},
		{"GRPC_SERVER_USE_TLS": "true", "GRPC_CLIENT_TLS_CACERT": "ca", "GRPC_UDS": "/s", "LOCAL_CACHE_SIZE_IN_BYTES": "1024", "LIMIT_RESPONSE_HEADERS_ENABLED": "true"},
		{"USE_PROMETHEUS": "true", "TRACING_ENABLED": "true", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "m,s:1", "REDIS_SENTINEL_AUTH": "p"},
	} {
		if _, _, _, err := compatArgs(e.lookup); err != nil {
			t.Fatal(err)
		}
		_, r := compatRead(e.lookup)
		for name := range r {
			read[name] = true
		}
		compatEnvironment(func(name string) (string, bool) {
			read[name] = true
			return e.lookup(name)
		})("OTEL_SERVICE_NAME")
	}
	return read
}

// settingRows returns the status of each setting the tables under
// "## Every setting" of docs/migrating.md name in their first column.
func settingRows(t *testing.T, doc string) map[string]string {
	t.Helper()
	_, section, ok := strings.Cut(doc, "\n## Every setting\n")
	if !ok {
		t.Fatal(`docs/migrating.md has no "## Every setting"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	status := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(line, "| `") {
			continue
		}
		st := strings.TrimSpace(cells[2])
		for _, field := range strings.Split(cells[1], ",") {
			field = strings.TrimSpace(field)
			if !strings.HasPrefix(field, "`") {
				continue
			}
			name, _, _ := strings.Cut(field[1:], "`")
			if prev, dup := status[name]; dup {
				t.Errorf("docs/migrating.md names %s in two rows (%q, %q)", name, prev, st)
			}
			status[name] = st
		}
	}
	return status
}

// TestCompatUnreadSettingsNamed: a reference setting set but not read
// with the other settings given is named among those not honoured, and a
// setting read is not.
func TestCompatUnreadSettingsNamed(t *testing.T) {
	_, ignored, _, err := compatArgs(env{
		"MEMCACHE_HOST_PORT":  "memcached:11211",
		"REDIS_PERSECOND_URL": "redis-persecond:6379",
		"REDIS_POOL_SIZE":     "20",
		"NOT_A_SETTING":       "x",
	}.lookup)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ignored {
		names = append(names, strings.Fields(i)[0])
	}
	if want := []string{"RUNTIME_IGNOREDOTFILES=false", "REDIS_PERSECOND_URL", "MEMCACHE_HOST_PORT"}; !slices.Equal(names, want) {
		t.Errorf("named %q, want %v", ignored, want)
	}
}

// TestCompatLogsNoSecret: the flags logged at start-up hide the Redis
// password and the xDS headers.
func TestCompatLogsNoSecret(t *testing.T) {
	args, _, _, err := compatArgs(env{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "REDIS_AUTH": "app:hunter2",
		"REDIS_TYPE": "SINGLE", "REDIS_SENTINEL_AUTH": "hunter3",
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "authorization:hunter4",
	}.lookup)
	if err != nil {
		t.Fatal(err)
	}
	logged := strings.Join(redactArgs(args), " ")
	for _, secret := range []string{"hunter2", "hunter3", "hunter4"} {
		if strings.Contains(logged, secret) {
			t.Errorf("the logged flags show %s: %s", secret, logged)
		}
	}
	if !strings.Contains(logged, "-redis-url=redis://app:xxxxx@redis:6379") {
		t.Errorf("the logged flags lack the redacted Redis URL: %s", logged)
	}
}
