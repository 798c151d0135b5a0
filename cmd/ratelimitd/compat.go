package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// Compatibility mode: ratelimitd configured by envoyproxy/ratelimit's
// environment, so that a Deployment of the reference image switches by
// changing the image alone. It is on when the binary runs under the name
// "ratelimit" (the reference image's /bin/ratelimit) or with
// RATELIMITD_COMPAT=envoyproxy. docs/migrating.md lists every setting.

// compatEnv turns compatibility mode on; compatEnvoyproxy is its value.
const (
	compatEnv        = "RATELIMITD_COMPAT"
	compatEnvoyproxy = "envoyproxy"
	// compatBinary is the reference image's entry point, /bin/ratelimit.
	compatBinary = "ratelimit"
)

// withCompatName returns lookupEnv, answering RATELIMITD_COMPAT=envoyproxy
// when the program (argv[0]) is named ratelimit and the environment does
// not say otherwise.
func withCompatName(program string, lookupEnv func(string) (string, bool)) func(string) (string, bool) {
	if filepath.Base(program) != compatBinary {
		return lookupEnv
	}
	return func(name string) (string, bool) {
		if v, ok := lookupEnv(name); ok || name != compatEnv {
			return v, ok
		}
		return compatEnvoyproxy, true
	}
}

// compatMode reports whether compatibility mode is on, or an error for a
// value of RATELIMITD_COMPAT it does not know.
func compatMode(lookupEnv func(string) (string, bool)) (bool, error) {
	v, ok := lookupEnv(compatEnv)
	switch {
	case !ok || v == "":
		return false, nil
	case v == compatEnvoyproxy:
		return true, nil
	}
	return false, fmt.Errorf("invalid %s %q; accepted: %s (configuration from envoyproxy/ratelimit's environment)", compatEnv, v, compatEnvoyproxy)
}

// ignoredSettings are the reference's settings compatibility mode does not
// honour, with why: set to anything but their default, they are named in
// one startup warning. None of them changes a decision. Read only.
var ignoredSettings = map[string]string{
	"REDIS_PIPELINE_WINDOW":                         "ratelimitd batches Redis calls by itself (-redis-coalesce)",
	"REDIS_PIPELINE_LIMIT":                          "ratelimitd batches Redis calls by itself (-redis-coalesce)",
	"REDIS_CLUSTER_PIPELINE_PARALLELISM":            "ratelimitd sends one call per Cluster slot, in parallel",
	"REDIS_POOL_ON_EMPTY_BEHAVIOR":                  "a call waits for a pooled connection up to -redis-read-timeout",
	"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION":          "the server's certificate is always verified",
	"USE_DOG_STATSD_MOGRIFIERS":                     "not supported",
	"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS":      "not supported",
	"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES":              "gRPC's default limit of 4 MiB per message applies",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR":              "reconnects wait a random time up to the backoff (full jitter)",
	"XDS_CLIENT_BACKOFF_JITTER":                     "reconnects wait a random time up to the backoff (full jitter)",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "reconnects follow the backoff (XDS_CLIENT_BACKOFF_*)",
	"GRPC_SERVER_TLS_CA_CERT":                       "not a setting of envoyproxy/ratelimit, which takes client CAs from GRPC_CLIENT_TLS_CACERT; Envoy Gateway sets it, and neither reads it",
	"TRACING_SERVICE_NAMESPACE":                     "set OTEL_RESOURCE_ATTRIBUTES=service.namespace=…",
	"TRACING_SERVICE_INSTANCE_ID":                   "set OTEL_RESOURCE_ATTRIBUTES=service.instance.id=…",
}

// ignoredDefaults are the reference's defaults of ignored settings whose
// default is not empty: set to it, a setting changes nothing and is not
// warned of. Read only.
var ignoredDefaults = map[string]string{
	"REDIS_POOL_ON_EMPTY_BEHAVIOR":                  "WAIT",
	"REDIS_PIPELINE_WINDOW":                         "0",
	"REDIS_PIPELINE_LIMIT":                          "0",
	"REDIS_CLUSTER_PIPELINE_PARALLELISM":            "1",
	"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION":          "false",
	"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS":      "false",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR":              "0.5",
	"XDS_CLIENT_BACKOFF_JITTER":                     "true",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "3s",
}

// compat reads the reference's environment.
type compat struct {
	lookupEnv func(string) (string, bool)
	args      []string          // the native flags the settings map to
	from      map[string]string // flag name → the settings it comes from, for errors
	ignored   []string          // settings set but not honoured, with why
	errs      []string          // settings that cannot be honoured without changing decisions
}

// get returns the value of a reference setting, or def when unset or
// empty (as the reference's envconfig does).
func (c *compat) get(name, def string) string {
	if v, ok := c.lookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// bool reads a boolean setting as Go's strconv.ParseBool does, which the
// reference uses.
func (c *compat) bool(name string, def bool) bool {
	v := c.get(name, strconv.FormatBool(def))
	b, err := strconv.ParseBool(v)
	if err != nil {
		c.errs = append(c.errs, fmt.Sprintf("%s=%q is not a boolean", name, v))
	}
	return b
}

// duration reads a duration setting, as Go's time.ParseDuration does,
// which the reference uses.
func (c *compat) duration(name, def string) string {
	v := c.get(name, def)
	if _, err := time.ParseDuration(v); err != nil {
		c.errs = append(c.errs, fmt.Sprintf("%s=%q is not a duration such as 10s", name, v))
	}
	return v
}

// flag sets flag name to value, from the reference settings named by from
// (errors about the flag name them).
func (c *compat) flag(name, value, from string) {
	c.args = append(c.args, "-"+name+"="+value)
	c.from[name] = from
}

// defaultFlag is flag for a default the reference's behaviour implies,
// which ratelimitd's own variable for the flag, when set, overrides.
func (c *compat) defaultFlag(name, value, from string) {
	if _, ok := c.lookupEnv(envName(name)); !ok {
		c.flag(name, value, from)
	}
}

// refuse records a setting whose value ratelimitd cannot honour, and why.
func (c *compat) refuse(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// compatArgs maps the reference's environment to ratelimitd's flags, in
// the order they are given (the command line's own flags, after them,
// win). ignored names each setting set but not honoured; from maps each
// flag to the settings it comes from; err lists every setting whose value
// cannot be honoured, such as one that would change decisions if
// ratelimitd ran anyway.
func compatArgs(lookupEnv func(string) (string, bool)) (args, ignored []string, from map[string]string, err error) {
	c, read := compatRead(lookupEnv)
	for _, name := range slices.Sorted(maps.Keys(ignoredSettings)) {
		if v, ok := lookupEnv(name); ok && v != "" && v != ignoredDefaults[name] {
			c.ignored = append(c.ignored, name+" ("+ignoredSettings[name]+")")
		}
	}
	c.ignored = append(c.ignored, unreadSettings(lookupEnv, read, strings.EqualFold(c.get("CONFIG_TYPE", "FILE"), "GRPC_XDS_SOTW"))...)
	if len(c.errs) > 0 {
		return nil, nil, nil, fmt.Errorf("envoyproxy/ratelimit compatibility mode cannot honour its environment:\n  %s", strings.Join(c.errs, "\n  "))
	}
	return c.args, c.ignored, c.from, nil
}

// compatRead maps the settings compatibility mode honours to flags, and
// returns them with the names it read.
func compatRead(lookupEnv func(string) (string, bool)) (c *compat, read map[string]bool) {
	read = map[string]bool{}
	c = &compat{lookupEnv: func(name string) (string, bool) {
		read[name] = true
		return lookupEnv(name)
	}, from: map[string]string{}}
	c.listeners()
	c.logging()
	c.rules()
	c.backend()
	c.limits()
	c.stats()
	c.tracing()
	return c, read
}

// listeners: the reference's ports (HTTP 8080, gRPC 8081, debug 6070),
// TLS and connection age.
func (c *compat) listeners() {
	c.flag("http-addr", net.JoinHostPort(c.get("HOST", "0.0.0.0"), c.get("PORT", "8080")), "HOST and PORT")
	if uds := c.get("GRPC_UDS", ""); uds != "" {
		c.flag("grpc-addr", "unix:"+uds, "GRPC_UDS")
	} else {
		c.flag("grpc-addr", net.JoinHostPort(c.get("GRPC_HOST", "0.0.0.0"), c.get("GRPC_PORT", "8081")), "GRPC_HOST and GRPC_PORT")
	}
	c.flag("debug-addr", net.JoinHostPort(c.get("DEBUG_HOST", "0.0.0.0"), c.get("DEBUG_PORT", "6070")), "DEBUG_HOST and DEBUG_PORT")
	c.flag("grpc-max-connection-age", c.duration("GRPC_MAX_CONNECTION_AGE", "24h"), "GRPC_MAX_CONNECTION_AGE")
	c.flag("grpc-max-connection-age-grace", c.duration("GRPC_MAX_CONNECTION_AGE_GRACE", "1h"), "GRPC_MAX_CONNECTION_AGE_GRACE")
	if c.bool("GRPC_SERVER_USE_TLS", false) {
		c.flag("grpc-tls-cert", c.get("GRPC_SERVER_TLS_CERT", ""), "GRPC_SERVER_TLS_CERT")
		c.flag("grpc-tls-key", c.get("GRPC_SERVER_TLS_KEY", ""), "GRPC_SERVER_TLS_KEY")
		if ca := c.get("GRPC_CLIENT_TLS_CACERT", ""); ca != "" {
			c.flag("grpc-tls-client-ca", ca, "GRPC_CLIENT_TLS_CACERT")
			if san := c.get("GRPC_CLIENT_TLS_SAN", ""); san != "" {
				c.flag("grpc-tls-client-san", san, "GRPC_CLIENT_TLS_SAN")
			}
		}
	}
}

// logging: the reference's levels are logrus's, in any case; its default
// is warn.
func (c *compat) logging() {
	switch l := strings.ToLower(c.get("LOG_LEVEL", "warn")); l {
	case "trace", "debug":
		c.flag("log-level", "debug", "LOG_LEVEL")
	case "info", "warn", "error":
		c.flag("log-level", l, "LOG_LEVEL")
	case "warning":
		c.flag("log-level", "warn", "LOG_LEVEL")
	case "fatal", "panic":
		c.flag("log-level", "error", "LOG_LEVEL")
	default:
		c.refuse("LOG_LEVEL=%q is not a level; accepted: trace, debug, info, warn, error, fatal, panic", l)
	}
	c.flag("log-format", strings.ToLower(c.get("LOG_FORMAT", "text")), "LOG_FORMAT")
}

// rules: the reference reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
// RUNTIME_APPDIRECTORY and, with RUNTIME_WATCH_ROOT, reloads when the
// root's symbolic link is swapped; ratelimitd watches the directory and
// the links on its path either way.
func (c *compat) rules() {
	switch t := c.get("CONFIG_TYPE", "FILE"); strings.ToUpper(t) {
	case "FILE":
		if c.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false) {
			c.ignored = append(c.ignored, "FORCE_START_WITHOUT_INITIAL_CONFIG (with rule files, nothing is waited for: they load before any port opens, and rules that do not load stop the start, exit 1; docs/migrating.md#rules-that-do-not-load)")
		}
	case "GRPC_XDS_SOTW":
		c.xds()
		return // the files are not read, as the reference does not read them
	default:
		c.refuse("CONFIG_TYPE=%q; accepted: FILE, GRPC_XDS_SOTW", t)
	}
	// The files are those the reference's runtime loader reads
	// (src/provider/file_provider.go, setupRuntime and sendEvent; lyft/
	// goruntime loader.go, walkDirectoryCallback): every file below the
	// directory, recursively, whatever its name. With RUNTIME_WATCH_ROOT
	// (its default) it walks RUNTIME_ROOT/RUNTIME_SUBDIRECTORY and keeps
	// the files whose path there, "/" written ".", starts with
	// RUNTIME_APPDIRECTORY + "." (so also a sibling config.extra.yaml);
	// without, it walks RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
	// RUNTIME_APPDIRECTORY.
	root := filepath.Join(c.get("RUNTIME_ROOT", "/srv/runtime_data/current"), c.get("RUNTIME_SUBDIRECTORY", ""))
	app := c.get("RUNTIME_APPDIRECTORY", "config")
	c.flag("config-reference", "true", "RATELIMITD_COMPAT")
	if c.bool("RUNTIME_WATCH_ROOT", true) {
		c.flag("config", root, "RUNTIME_ROOT and RUNTIME_SUBDIRECTORY")
		c.flag("config-reference-prefix", app+".", "RUNTIME_APPDIRECTORY")
	} else {
		c.flag("config", filepath.Join(root, app), "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY")
	}
	c.flag("watch-config", "true", "RUNTIME_WATCH_ROOT") // either way, the tree is watched
	if !c.bool("RUNTIME_IGNOREDOTFILES", false) {
		// ratelimitd always skips dot files (and Kubernetes' ..data
		// directories); the reference would load them.
		c.ignored = append(c.ignored, "RUNTIME_IGNOREDOTFILES=false (rule files whose names start with a dot are always skipped)")
	}
	if c.bool("MERGE_DOMAIN_CONFIG", false) {
		c.refuse("MERGE_DOMAIN_CONFIG=true: ratelimitd keeps each domain in one file, and refuses a domain defined twice rather than merge it")
	}
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED holds anyway: files are
	// loaded before any port opens, and a set that loads has a domain
	// (one with none is refused, and the server exits).
	c.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)
}

// xds: CONFIG_TYPE=GRPC_XDS_SOTW, rules from an xDS control plane.
func (c *compat) xds() {
	c.flag("xds-server", c.get("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"), "CONFIG_GRPC_XDS_SERVER_URL")
	c.flag("xds-node-id", c.get("CONFIG_GRPC_XDS_NODE_ID", "default"), "CONFIG_GRPC_XDS_NODE_ID")
	if md := c.get("CONFIG_GRPC_XDS_NODE_METADATA", ""); md != "" {
		c.flag("xds-node-metadata", md, "CONFIG_GRPC_XDS_NODE_METADATA")
	}
	if h := c.get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ""); h != "" {
		// The reference reads a map as key:value,key:value.
		pairs := strings.Split(h, ",")
		for i, p := range pairs {
			k, v, ok := strings.Cut(p, ":")
			if !ok {
				c.refuse("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: %q is not key:value", p)
			}
			pairs[i] = strings.TrimSpace(k) + "=" + strings.TrimSpace(v)
		}
		c.flag("xds-headers", strings.Join(pairs, ","), "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")
	}
	if c.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false) {
		c.flag("xds-tls", "true", "CONFIG_GRPC_XDS_SERVER_USE_TLS")
		for env, flag := range map[string]string{
			"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":   "xds-tls-cert",
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":    "xds-tls-key",
			"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "xds-tls-ca",
			"CONFIG_GRPC_XDS_SERVER_TLS_SAN":    "xds-tls-server-name",
		} {
			if v := c.get(env, ""); v != "" {
				c.flag(flag, v, env)
			}
		}
	}
	c.flag("xds-backoff-initial", c.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s"), "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
	c.flag("xds-backoff-max", c.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s"), "XDS_CLIENT_BACKOFF_MAX_INTERVAL")
	if c.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false) {
		c.flag("xds-force-start", "true", "FORCE_START_WITHOUT_INITIAL_CONFIG")
	}
	// Health follows whether the rules in force hold a domain, before
	// the first rules and after every update (src/service/ratelimit.go,
	// SetConfig).
	if c.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false) {
		c.flag("xds-ready-with-rules", "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")
	}
}

// backend: Redis, with the reference's URL forms.
func (c *compat) backend() {
	switch b := c.get("BACKEND_TYPE", "redis"); strings.ToLower(b) {
	case "redis":
	case "memcache":
		c.refuse("BACKEND_TYPE=memcache: ratelimitd keeps counters in Redis or in memory, not in memcached; run Redis (BACKEND_TYPE=redis)")
		return
	default:
		c.refuse("BACKEND_TYPE=%q; accepted: redis", b)
		return
	}
	c.flag("backend", "redis", "BACKEND_TYPE")
	// A call the reference cannot decide for want of Redis is answered
	// with a gRPC error (src/service/ratelimit.go, ShouldRateLimit: the
	// cache's RedisError panic is recovered into the call's error), so
	// Envoy's failure_mode_deny decides, not the rate-limit service: as
	// -failure-mode error does, unless ratelimitd's own variable says.
	c.defaultFlag("failure-mode", "error", "RATELIMITD_COMPAT")
	if c.bool("REDIS_PERSECOND", false) {
		c.refuse("REDIS_PERSECOND=true: ratelimitd keeps every counter in one Redis; per-second counts kept in REDIS_PERSECOND_URL by the reference would not be shared")
	}
	redisURL, err := referenceRedisURL(c.get("REDIS_SOCKET_TYPE", "unix"), c.get("REDIS_TYPE", "SINGLE"),
		c.get("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"), c.get("REDIS_AUTH", ""), c.bool("REDIS_TLS", false))
	if err != nil {
		c.refuse("%v", err)
		return
	}
	c.flag("redis-url", redisURL.url, "REDIS_URL")
	c.flag("redis-mode", redisURL.mode, "REDIS_TYPE")
	if redisURL.master != "" {
		c.flag("redis-master", redisURL.master, "REDIS_URL")
	}
	if auth := c.get("REDIS_SENTINEL_AUTH", ""); auth != "" {
		user, pass, ok := strings.Cut(auth, ":")
		if !ok {
			user, pass = "", auth
		}
		if user != "" {
			c.flag("redis-sentinel-username", user, "REDIS_SENTINEL_AUTH")
		}
		c.flag("redis-sentinel-password", pass, "REDIS_SENTINEL_AUTH")
	}
	// Counted in the reference's keys, so that reference pods and these
	// share one count during the migration (docs/redis.md#key-formats).
	c.flag("redis-key-format", "reference", "RATELIMITD_COMPAT")
	c.flag("redis-prefix", c.get("CACHE_KEY_PREFIX", ""), "CACHE_KEY_PREFIX")
	jitter := c.get("EXPIRATION_JITTER_MAX_SECONDS", "300")
	if n, err := strconv.ParseUint(jitter, 10, 32); err != nil {
		c.refuse("EXPIRATION_JITTER_MAX_SECONDS=%q; it must be a whole number of seconds", jitter)
	} else {
		c.flag("redis-expiration-jitter", strconv.FormatUint(n, 10)+"s", "EXPIRATION_JITTER_MAX_SECONDS")
	}
	c.redisStartupAndHealth()
	c.flag("redis-pool-size", c.get("REDIS_POOL_SIZE", "10"), "REDIS_POOL_SIZE")
	timeout := c.duration("REDIS_TIMEOUT", "10s")
	c.flag("redis-read-timeout", timeout, "REDIS_TIMEOUT")
	c.flag("redis-write-timeout", timeout, "REDIS_TIMEOUT")
	for env, flag := range map[string]string{
		"REDIS_TLS_CLIENT_CERT": "redis-tls-cert",
		"REDIS_TLS_CLIENT_KEY":  "redis-tls-key",
		"REDIS_TLS_CACERT":      "redis-tls-ca",
	} {
		if v := c.get(env, ""); v != "" {
			c.flag(flag, v, env)
		}
	}
}

// redisStartupAndHealth: Redis at start and in the health checks, as the
// reference has them (src/redis/driver_impl.go, newClientImpl): no port
// opens before Redis answers a PING, tried again after
// REDIS_STARTUP_INITIAL_INTERVAL, doubling up to
// REDIS_STARTUP_MAX_INTERVAL (jittered), given up after
// REDIS_STARTUP_MAX_ELAPSED_TIME (0: never); with
// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, health follows Redis.
func (c *compat) redisStartupAndHealth() {
	c.flag("redis-startup-initial-interval", c.duration("REDIS_STARTUP_INITIAL_INTERVAL", "1s"), "REDIS_STARTUP_INITIAL_INTERVAL")
	c.flag("redis-startup-max-interval", c.duration("REDIS_STARTUP_MAX_INTERVAL", "30s"), "REDIS_STARTUP_MAX_INTERVAL")
	c.flag("redis-startup-max-elapsed-time", c.duration("REDIS_STARTUP_MAX_ELAPSED_TIME", "0s"), "REDIS_STARTUP_MAX_ELAPSED_TIME")
	if c.bool("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", false) {
		c.flag("redis-health-check", "true", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")
	}
}

// limits: settings that shape decisions and what they report.
func (c *compat) limits() {
	ratio := c.get("NEAR_LIMIT_RATIO", "0.8")
	if f, err := strconv.ParseFloat(ratio, 64); err != nil || !(f > 0 && f <= 1) {
		c.refuse("NEAR_LIMIT_RATIO=%q; it must be a number above 0 and at most 1", ratio)
	} else {
		c.flag("near-limit-ratio", ratio, "NEAR_LIMIT_RATIO")
	}
	if v := c.get("LOCAL_CACHE_SIZE_IN_BYTES", "0"); v != "0" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			c.refuse("LOCAL_CACHE_SIZE_IN_BYTES=%q; it must be a whole number of bytes", v)
		} else {
			// The reference sizes its cache of over-limit keys in bytes;
			// ratelimitd counts keys, about 128 bytes each.
			c.flag("local-cache-keys", strconv.Itoa(max(n/128, 1)), "LOCAL_CACHE_SIZE_IN_BYTES")
		}
	}
	if c.bool("SHADOW_MODE", false) {
		c.flag("shadow-mode", "true", "SHADOW_MODE")
	}
	if c.bool("QUOTA_MODE", false) {
		c.flag("quota-mode", "true", "QUOTA_MODE")
	}
	// The reference counts every hit of every descriptor it is sent
	// (src/redis/fixed_cache_impl.go, DoLimit: INCRBY each key whatever the
	// answer), and Envoy Gateway's rules cannot say otherwise: hits beyond
	// what remains are counted, unless ratelimitd's own variable says.
	// With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT the reference counts
	// nothing of a call's descriptors that are within their limits when
	// one is over (getHitsAddend); the descriptors that are over it still
	// counts, which drop does not (docs/migrating.md).
	if c.bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false) {
		c.defaultFlag("over-limit-hits", "drop", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")
	} else {
		c.defaultFlag("over-limit-hits", "count", "RATELIMITD_COMPAT")
	}
	if c.bool("RESPONSE_DYNAMIC_METADATA", false) {
		c.flag("response-dynamic-metadata", "true", "RESPONSE_DYNAMIC_METADATA")
	}
	if c.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
		// The reference's headers, for the descriptor it picks, under
		// the names it is given (src/service/ratelimit.go).
		c.flag("response-headers", "reference", "LIMIT_RESPONSE_HEADERS_ENABLED")
		names := []string{c.get("LIMIT_LIMIT_HEADER", "RateLimit-Limit"), c.get("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"), c.get("LIMIT_RESET_HEADER", "RateLimit-Reset")}
		if err := (service.HeaderNames{Limit: names[0], Remaining: names[1], Reset: names[2]}).Check(); err != nil || strings.Contains(strings.Join(names, ""), ",") {
			c.refuse("LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER: %v", cmp.Or(err, errors.New("a name holds a comma")))
		} else {
			c.flag("response-header-names", strings.Join(names, ","), "LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER")
		}
	}
}

// stats: the reference's statistics, over statsd (on by default, as in
// the reference) and, with USE_PROMETHEUS, on its own Prometheus address.
func (c *compat) stats() {
	if c.bool("DISABLE_STATS", false) {
		return
	}
	if c.bool("USE_STATSD", true) {
		c.flag("statsd-addr", net.JoinHostPort(c.get("STATSD_HOST", "localhost"), c.get("STATSD_PORT", "8125")), "STATSD_HOST and STATSD_PORT")
	}
	if tags := c.get("EXTRA_TAGS", ""); tags != "" {
		c.flag("statsd-tags", tags, "EXTRA_TAGS")
	}
	if c.bool("USE_DOG_STATSD", false) {
		c.flag("statsd-dogstatsd", "true", "USE_DOG_STATSD")
	}
	c.flag("statsd-flush-interval", c.duration("STATS_FLUSH_INTERVAL", "10s"), "STATS_FLUSH_INTERVAL")
	if c.bool("USE_PROMETHEUS", false) {
		c.flag("reference-metrics-addr", c.get("PROMETHEUS_ADDR", ":9090"), "PROMETHEUS_ADDR")
		c.flag("reference-metrics-path", c.get("PROMETHEUS_PATH", "/metrics"), "PROMETHEUS_PATH")
		if m := c.get("PROMETHEUS_MAPPER_YAML", ""); m != "" {
			c.flag("reference-metrics-mapping", m, "PROMETHEUS_MAPPER_YAML")
		}
	}
}

// tracing: TRACING_* become the OpenTelemetry variables ratelimitd reads
// (see compatEnvironment).
func (c *compat) tracing() {
	if c.bool("TRACING_ENABLED", false) {
		c.flag("tracing", "true", "TRACING_ENABLED")
		switch p := strings.ToLower(c.get("TRACING_EXPORTER_PROTOCOL", "http")); p {
		case "http", "grpc":
		default:
			c.refuse("TRACING_EXPORTER_PROTOCOL=%q; accepted: http, grpc", p)
		}
		// Mapped by compatEnvironment, which reads them when tracing
		// starts.
		c.get("TRACING_SERVICE_NAME", "")
		c.get("TRACING_SAMPLING_RATE", "")
	}
}

// compatEnvironment returns lookupEnv with the OpenTelemetry variables
// the reference's TRACING_* settings stand for, unless set themselves.
func compatEnvironment(lookupEnv func(string) (string, bool)) func(string) (string, bool) {
	derived := map[string]string{}
	get := func(name string) string {
		v, _ := lookupEnv(name)
		return v
	}
	derived["OTEL_SERVICE_NAME"] = orDefault(get("TRACING_SERVICE_NAME"), "RateLimit")
	if strings.EqualFold(get("TRACING_EXPORTER_PROTOCOL"), "grpc") {
		derived["OTEL_EXPORTER_OTLP_PROTOCOL"] = "grpc"
	}
	if r := get("TRACING_SAMPLING_RATE"); r != "" {
		derived["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
		derived["OTEL_TRACES_SAMPLER_ARG"] = r
	}
	return func(name string) (string, bool) {
		if v, ok := lookupEnv(name); ok {
			return v, ok
		}
		v, ok := derived[name]
		return v, ok
	}
}

// orDefault returns v, or def when v is empty.
func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// referenceRedis is a Redis of the reference's settings, as ratelimitd's
// flags say it.
type referenceRedis struct {
	url, mode, master string
}

// referenceRedisURL turns the reference's Redis settings into a URL and a
// mode. REDIS_URL is host:port (or a socket path with REDIS_SOCKET_TYPE
// unix) for SINGLE, master,sentinel1,sentinel2… for SENTINEL, and
// node1,node2… for CLUSTER; REDIS_AUTH is password or user:password.
func referenceRedisURL(socketType, redisType, addrs, auth string, useTLS bool) (referenceRedis, error) {
	scheme := "redis"
	if useTLS {
		scheme = "rediss"
	}
	var user *url.Userinfo
	if auth != "" {
		if u, p, ok := strings.Cut(auth, ":"); ok {
			user = url.UserPassword(u, p)
		} else {
			user = url.UserPassword("", auth)
		}
	}
	join := func(hosts []string) string {
		out := make([]string, len(hosts))
		for i, h := range hosts {
			u := url.URL{Scheme: scheme, Host: strings.TrimSpace(h)}
			if i == 0 {
				u.User = user
			}
			out[i] = u.String()
		}
		return strings.Join(out, ",")
	}
	parts := strings.Split(addrs, ",")
	switch strings.ToUpper(redisType) {
	case "SINGLE":
		switch strings.ToLower(socketType) {
		case "unix":
			if useTLS {
				return referenceRedis{}, fmt.Errorf("REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: TLS is for tcp")
			}
			u := url.URL{Scheme: "unix", Path: addrs, User: user}
			return referenceRedis{url: u.String(), mode: "standalone"}, nil
		case "tcp":
			return referenceRedis{url: join(parts[:1]), mode: "standalone"}, nil
		}
		return referenceRedis{}, fmt.Errorf("REDIS_SOCKET_TYPE=%q; accepted: tcp, unix", socketType)
	case "SENTINEL":
		if len(parts) < 2 {
			return referenceRedis{}, fmt.Errorf("REDIS_TYPE=SENTINEL needs REDIS_URL=master,sentinel1:port[,sentinel2:port…]; got %q", addrs)
		}
		return referenceRedis{url: join(parts[1:]), mode: "sentinel", master: strings.TrimSpace(parts[0])}, nil
	case "CLUSTER":
		return referenceRedis{url: join(parts), mode: "cluster"}, nil
	}
	return referenceRedis{}, fmt.Errorf("REDIS_TYPE=%q; accepted: SINGLE, SENTINEL, CLUSTER", redisType)
}

// commandLineFlags returns the names of the serve flags args set.
func commandLineFlags(args []string) map[string]bool {
	fs := newServeConfig().flags
	fs.SetOutput(io.Discard)
	set := map[string]bool{}
	if fs.Parse(args) == nil {
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	}
	return set
}

// compatSource returns, for an error of the flag package about a flag the
// reference's settings gave, which settings those were.
func compatSource(err error, from map[string]string) string {
	for name, settings := range from {
		if strings.Contains(err.Error(), "-"+name+":") {
			return " (from envoyproxy/ratelimit's " + settings + ")"
		}
	}
	return ""
}
