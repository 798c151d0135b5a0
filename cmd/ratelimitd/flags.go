package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/lease"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/metrics"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/tlsconfig"
)

// envPrefix starts the environment variable of every flag.
const envPrefix = "RATELIMITD_"

// serveConfig is everything serve is configured with.
type serveConfig struct {
	config              string
	configOpts          config.Options
	grpcAddr            string
	grpcMaxConnAge      time.Duration
	grpcMaxConnAgeGrace time.Duration
	httpAddr            string
	backend             string
	memoryMaxKeys       int
	redis               redis.Config
	redisMode           string
	redisPrefix         string
	redisHashTag        string
	redisClock          string
	redisScripts        bool
	redisCoalesce       int
	redisKeyFormat      string
	redisJitter         time.Duration
	redisStartup        redisStartupConfig
	localCacheKeys      int
	lease               lease.Options
	clockOffset         time.Duration
	failureMode         string
	grpcTLS             tlsconfig.Files
	httpTLS             tlsconfig.Files
	debugAddr           string
	watchConfig         bool
	tracing             bool
	responseHeaders     service.HeaderStyle
	responseHeaderNames string
	dynamicMetadata     bool
	headerNames         service.HeaderNames
	nearLimitRatio      float64
	maxDetailedSeries   int
	enableReset         bool
	ui                  bool
	rlqs                rlqsConfig
	region              regionConfig
	shadowMode          bool
	quotaMode           bool
	overLimitHits       string
	localShare          float64
	breaker             breaker.Options
	logLevel            string
	logFormat           string
	shutdownTimeout     time.Duration
	shutdownDelay       time.Duration
	bounds              service.Bounds
	maxHits             uint64
	xds                 xdsConfig
	refStats            refStatsConfig

	// flags is the flag set c was read with.
	flags *flag.FlagSet
	// fromEnv maps the flags set from the environment to their variable,
	// so that errors name what the user wrote.
	fromEnv map[string]string
	// lookupEnv reads the environment (the OTEL_* variables of tracing).
	lookupEnv func(string) (string, bool)
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
	configReadingFlags(fs, &c.configOpts)
	redisStartupFlags(fs, &c.redisStartup)
	fs.TextVar(&c.responseHeaders, "response-headers", service.HeadersNone, "rate-limit headers Envoy adds to answers: none, ratelimit (RateLimit-*), x-ratelimit (X-RateLimit-*), structured (RateLimit-Policy and RateLimit) or reference (RateLimit-*, for the descriptor envoyproxy/ratelimit picks); Retry-After when over the limit")
	fs.StringVar(&c.responseHeaderNames, "response-header-names", "RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset", "`names` of the limit, remaining and reset headers of -response-headers ratelimit and reference, comma-separated (envoyproxy/ratelimit's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER)")
	fs.BoolVar(&c.dynamicMetadata, "response-dynamic-metadata", false, "answers of Envoy's API carry dynamic_metadata: the domain, the descriptors and the merged metadata of the rules of those that passed (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA), for Envoy's later filters")
	fs.Float64Var(&c.nearLimitRatio, "near-limit-ratio", service.DefaultNearLimitRatio, "share of a limit past which an admitted descriptor counts as near_limit in the metrics")
	fs.IntVar(&c.maxDetailedSeries, "metrics-max-detailed-series", metrics.DefaultMaxDetailedSeries, "most metric series that name descriptor values (rules with detailed_metric or value_to_metric); beyond it decisions count under the rule")
	fs.BoolVar(&c.shadowMode, "shadow-mode", false, "answer every request of Envoy's API OK overall, while each descriptor is still decided, counted and reported (envoyproxy/ratelimit's SHADOW_MODE): to try rules in production")
	fs.BoolVar(&c.quotaMode, "quota-mode", false, "decide every descriptor but unlimited ones as one of a rule with quota_mode: true, unmatched ones and limit overrides included (envoyproxy/ratelimit's QUOTA_MODE): a request is refused only when a non-quota descriptor is over, or every quota descriptor is")
	fs.StringVar(&c.overLimitHits, "over-limit-hits", "drop", "hits beyond what remains, for limits whose rule does not say (rate_limit.over_limit_hits) and limit overrides: drop (refuse and count nothing) or count (count them anyway, as envoyproxy/ratelimit does: for costs reported after the response; the default in compatibility mode)")
	fs.BoolVar(&c.enableReset, "enable-reset", false, "let ratelimitd.v1.RateLimiter/Reset clear a descriptor's counters, and with -ui the ops console's reset button (an operator's tool; anyone who can reach the gRPC port, or the console, can call it)")
	fs.BoolVar(&c.ui, "ui", false, "serve the ops console at /ui on the HTTP listener: rules, live decisions, top limited keys (descriptor values of every caller), backend state, explain (docs/console.md); put the listener behind TLS and auth first")
	fs.BoolVar(&c.tracing, "tracing", false, "trace gRPC calls and backend calls with OpenTelemetry, exported as the standard OTEL_* variables say (OTLP over HTTP by default)")
	fs.BoolVar(&c.watchConfig, "watch-config", true, "reload the rules when the files under -config change (a bad set is rejected whole; the last good rules keep serving)")
	fs.StringVar(&c.grpcAddr, "grpc-addr", ":8081", "gRPC listen `address` (Envoy RLS v3, grpc.health.v1, reflection); port 0 picks a free port; unix:PATH listens on a Unix socket")
	fs.StringVar(&c.httpAddr, "http-addr", ":8080", "HTTP listen `address` (/json, /healthcheck, /rlconfig); port 0 picks a free port")
	fs.StringVar(&c.backend, "backend", "memory", "where counters live: memory (in this process) or redis (shared by every replica)")
	fs.IntVar(&c.memoryMaxKeys, "memory-max-keys", memory.DefaultMaxKeys, "most keys the memory backend tracks at once; beyond it the entries nearest expiry are evicted")
	fs.StringVar(&c.redis.URL, "redis-url", "", "Redis `URL`: redis://[user:password@]host:port[/db], rediss:// for TLS; comma-separated sentinels or cluster nodes")
	fs.StringVar(&c.redisMode, "redis-mode", "standalone", "Redis topology: standalone, sentinel (with -redis-master) or cluster")
	fs.StringVar(&c.redis.MasterName, "redis-master", "", "`name` of the master the sentinels monitor (sentinel mode)")
	fs.StringVar(&c.redis.SentinelUsername, "redis-sentinel-username", "", "user name for the sentinels themselves, when they require one")
	fs.StringVar(&c.redis.SentinelPassword, "redis-sentinel-password", "", "password for the sentinels themselves, when they require one (the URL's credentials are the data nodes')")
	fs.IntVar(&c.redis.PoolSize, "redis-pool-size", 0, "most connections to each Redis node; 0 means 10 per CPU")
	fs.DurationVar(&c.redis.DialTimeout, "redis-dial-timeout", redis.DefaultDialTimeout, "how long opening a Redis connection may take")
	fs.DurationVar(&c.redis.ReadTimeout, "redis-read-timeout", redis.DefaultReadTimeout, "how long a Redis answer (and a free pooled connection) may take")
	fs.DurationVar(&c.redis.WriteTimeout, "redis-write-timeout", redis.DefaultWriteTimeout, "how long sending a Redis call may take")
	fs.StringVar(&c.redis.TLSCAFile, "redis-tls-ca", "", "PEM `file` of the CAs a rediss:// server's certificate must chain to (default: the system's)")
	fs.StringVar(&c.redis.TLSCertFile, "redis-tls-cert", "", "PEM `file` of a client certificate for mutual TLS with Redis")
	fs.StringVar(&c.redis.TLSKeyFile, "redis-tls-key", "", "PEM `file` of the key of -redis-tls-cert")
	fs.StringVar(&c.redisPrefix, "redis-prefix", "ratelimitd:", "`prefix` of every Redis key, isolating tenants of one Redis")
	fs.StringVar(&c.redisHashTag, "redis-hash-tag", "descriptor", "what places a key in a Redis Cluster, and so what is decided atomically: descriptor (its limits together) or domain (a whole request)")
	fs.IntVar(&c.redisCoalesce, "redis-coalesce", 4, "decide through this many workers, each sending every decision waiting when it is free in one Redis call (each still all or nothing); 0 sends one call per decision. Cluster mode always sends one call per slot of a decision")
	fs.BoolVar(&c.redisScripts, "redis-scripts", false, "decide with EVALSHA scripts even where Redis 7 offers functions (FCALL, cheaper; used by default when available)")
	fs.StringVar(&c.redisKeyFormat, "redis-key-format", keyFormatNative, "layout of Redis keys: native (collision-free) or reference (envoyproxy/ratelimit's, for fixed windows, so reference pods sharing the Redis count together during a migration; docs/redis.md#key-formats)")
	fs.DurationVar(&c.redisJitter, "redis-expiration-jitter", 0, "with -redis-key-format reference: most random time added to the expiry of a reference key, in whole seconds, like the reference's EXPIRATION_JITTER_MAX_SECONDS; 0 adds none")
	fs.StringVar(&c.redisClock, "redis-clock", "redis", "clock the Redis scripts decide by: redis (TIME; replicas may disagree on the time) or local (this process's, for Redis-compatible services that forbid TIME in scripts)")
	fs.StringVar(&c.grpcTLS.Cert, "grpc-tls-cert", "", "PEM `file` of the gRPC listener's certificate chain; with -grpc-tls-key, gRPC is served over TLS (re-read when the file changes)")
	fs.StringVar(&c.grpcTLS.Key, "grpc-tls-key", "", "PEM `file` of the key of -grpc-tls-cert")
	fs.StringVar(&c.grpcTLS.ClientCA, "grpc-tls-client-ca", "", "PEM `file` of the CAs gRPC clients' certificates must chain to: requires client certificates (mutual TLS)")
	fs.StringVar(&c.grpcTLS.ClientSAN, "grpc-tls-client-san", "", "with -grpc-tls-client-ca, the `name` (DNS or IP) client certificates must also be valid for")
	fs.DurationVar(&c.grpcMaxConnAge, "grpc-max-connection-age", 0, "close each gRPC connection (GOAWAY) after this long, so clients reconnect and spread over new replicas; 0 keeps connections")
	fs.DurationVar(&c.grpcMaxConnAgeGrace, "grpc-max-connection-age-grace", 0, "after -grpc-max-connection-age, how long calls in flight may take before the connection is cut; 0 waits for them")
	fs.StringVar(&c.httpTLS.Cert, "http-tls-cert", "", "PEM `file` of the HTTP listener's certificate chain; with -http-tls-key, HTTP is served over TLS (re-read when the file changes)")
	fs.StringVar(&c.httpTLS.Key, "http-tls-key", "", "PEM `file` of the key of -http-tls-cert")
	fs.StringVar(&c.httpTLS.ClientCA, "http-tls-client-ca", "", "PEM `file` of the CAs HTTP clients' certificates must chain to: requires client certificates (mutual TLS)")
	fs.StringVar(&c.debugAddr, "debug-addr", "", "listen `address` for Go's profiles (/debug/pprof/); off when empty. Keep it private")
	fs.StringVar(&c.failureMode, "failure-mode", "open", "what a decision is when the backend fails, for domains whose rule file does not say: open (admit), closed (refuse), error (answer Unavailable) or local (decide in this process)")
	fs.Float64Var(&c.localShare, "local-share", 1, "with failure mode local, the `fraction` of each limit this replica admits on its own (1/replicas keeps the total near the limit)")
	fs.DurationVar(&c.breaker.Timeout, "backend-timeout", breaker.DefaultTimeout, "deadline of each backend call; past it the decision falls to the failure mode")
	fs.IntVar(&c.breaker.Failures, "circuit-failures", breaker.DefaultFailures, "consecutive failed backend calls that open the circuit: calls then fail at once, without waiting for the backend")
	fs.DurationVar(&c.breaker.Cooldown, "circuit-cooldown", breaker.DefaultCooldown, "how long the circuit stays open before one call probes the backend again")
	fs.DurationVar(&c.lease.TTL, "lease-ttl", lease.DefaultTTL, "rules with consistency: leased (Redis backend): how long a bucket's lease of budget may be spent (a window's lasts until its window ends), and when an idle key is forgotten (docs/leasing.md)")
	fs.DurationVar(&c.lease.Period, "lease-period", lease.DefaultPeriod, "rules with consistency: leased: how much of a key's traffic a lease covers, at most -lease-ttl; longer leases mean fewer Redis calls and more budget held by one replica")
	fs.Uint64Var(&c.lease.Share, "lease-share", lease.DefaultShare, "rules with consistency: leased: a lease takes at most 1/`N` of what a limit has left, so that no replica holds much of a limit that binds")
	fs.IntVar(&c.localCacheKeys, "local-cache-keys", 0, "remember up to this many over-limit keys and refuse them locally, without calling Redis, until they may pass again; 0 turns the cache off")
	fs.DurationVar(&c.clockOffset, "clock-offset", 0, "testing aid: shift this process's clock by this `duration` (simulates a replica whose clock is wrong)")
	fs.StringVar(&c.logLevel, "log-level", "info", "least important log `level` written: debug, info, warn, error")
	fs.StringVar(&c.logFormat, "log-format", "text", "log `format`: text or json")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 15*time.Second, "on SIGTERM, how long in-flight calls may take before connections are closed")
	fs.DurationVar(&c.shutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, how long health checks report not serving while calls are still served, before the listeners close (load balancers stop sending meanwhile); 0 closes at once")
	fs.IntVar(&c.bounds.MaxDomainLen, "max-domain-bytes", service.DefaultMaxDomainLen, "longest domain a request may name, in bytes")
	fs.IntVar(&c.bounds.MaxDescriptors, "max-descriptors", service.DefaultMaxDescriptors, "most descriptors one request may carry")
	fs.IntVar(&c.bounds.MaxEntries, "max-entries", service.DefaultMaxEntries, "most entries one descriptor may carry")
	fs.IntVar(&c.bounds.MaxKeyLen, "max-key-bytes", service.DefaultMaxKeyLen, "longest descriptor entry key, in bytes")
	fs.IntVar(&c.bounds.MaxValueLen, "max-value-bytes", service.DefaultMaxValueLen, "longest descriptor entry value, in bytes")
	fs.Uint64Var(&c.maxHits, "max-hits", service.DefaultMaxHits, "largest hits_addend a request or descriptor may carry")
	addXDSFlags(fs, &c.xds)
	addRefStatsFlags(fs, &c.refStats)
	addRLQSFlags(fs, &c.rlqs)
	addRegionFlags(fs, &c.region)
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

// configReadingFlags defines the flags that say how -config is read
// (config.Options); compatibility mode sets them from RUNTIME_*.
func configReadingFlags(fs *flag.FlagSet, o *config.Options) {
	fs.BoolVar(&o.Reference, "config-reference", false, "read and decode -config as envoyproxy/ratelimit does: every file below the directory, subdirectories included; only a file's first YAML document; the last of a field given twice; each with a warning (docs/rules.md#reading-rule-files)")
	fs.StringVar(&o.Prefix, "config-reference-prefix", "", "with -config-reference, read only the files whose path below -config, each / written ., starts with this `prefix` (envoyproxy/ratelimit's RUNTIME_WATCH_ROOT=true reads RUNTIME_APPDIRECTORY. below RUNTIME_ROOT/RUNTIME_SUBDIRECTORY)")
}

// validate checks the values flags cannot check themselves.
func (c *serveConfig) validate() error {
	for _, a := range []struct{ name, v string }{{"grpc-addr", c.grpcAddr}, {"http-addr", c.httpAddr}, {"config", c.config}} {
		if a.v == "" {
			return fmt.Errorf("invalid %s: it must not be empty", c.source(a.name))
		}
	}
	switch c.backend {
	case "memory":
	case "redis":
		if err := c.validateRedis(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("invalid %s %q; accepted: memory, redis", c.source("backend"), c.backend)
	}
	for _, l := range []struct {
		name string
		f    tlsconfig.Files
	}{{"grpc", c.grpcTLS}, {"http", c.httpTLS}} {
		cert, key, ca := c.source(l.name+"-tls-cert"), c.source(l.name+"-tls-key"), c.source(l.name+"-tls-client-ca")
		if (l.f.Cert == "") != (l.f.Key == "") {
			return fmt.Errorf("%s and %s go together: give both or neither", cert, key)
		}
		if l.f.ClientCA != "" && l.f.Cert == "" {
			return fmt.Errorf("%s needs %s and %s: mutual TLS is TLS first", ca, cert, key)
		}
	}
	if _, err := config.ParseFailureMode(c.failureMode); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: open, closed, error, local", c.source("failure-mode"), c.failureMode)
	}
	names := strings.Split(c.responseHeaderNames, ",")
	for i := range names {
		names[i] = strings.TrimSpace(names[i])
	}
	if len(names) == 3 {
		c.headerNames = service.HeaderNames{Limit: names[0], Remaining: names[1], Reset: names[2]}
	}
	if err := c.headerNames.Check(); len(names) != 3 || slices.Contains(names, "") || err != nil {
		return fmt.Errorf("invalid %s %q: want three HTTP header names, limit,remaining,reset (%v)", c.source("response-header-names"), c.responseHeaderNames, cmp.Or(err, errors.New("not three names")))
	}
	if _, err := config.ParseOverLimitHits(c.overLimitHits); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: drop, count", c.source("over-limit-hits"), c.overLimitHits)
	}
	if !(c.nearLimitRatio > 0 && c.nearLimitRatio <= 1) {
		return fmt.Errorf("invalid %s %v; it must be above 0 and at most 1", c.source("near-limit-ratio"), c.nearLimitRatio)
	}
	if !(c.localShare > 0 && c.localShare <= 1) {
		return fmt.Errorf("invalid %s %v; it must be above 0 and at most 1", c.source("local-share"), c.localShare)
	}
	if c.breaker.Timeout <= 0 || c.breaker.Cooldown <= 0 {
		name, v := "backend-timeout", c.breaker.Timeout
		if c.breaker.Timeout > 0 {
			name, v = "circuit-cooldown", c.breaker.Cooldown
		}
		return fmt.Errorf("invalid %s %v; it must be positive", c.source(name), v)
	}
	if c.breaker.Failures < 1 {
		return fmt.Errorf("invalid %s %d; it must be at least 1", c.source("circuit-failures"), c.breaker.Failures)
	}
	switch {
	case c.lease.TTL < time.Millisecond:
		return fmt.Errorf("invalid %s %v; it must be at least 1ms", c.source("lease-ttl"), c.lease.TTL)
	case c.lease.Period < time.Millisecond || c.lease.Period > c.lease.TTL:
		return fmt.Errorf("invalid %s %v; it must be at least 1ms and at most %s (%v): a lease must be spendable for a period",
			c.source("lease-period"), c.lease.Period, c.source("lease-ttl"), c.lease.TTL)
	case c.lease.Share < 1:
		return fmt.Errorf("invalid %s %d; it must be at least 1 (1 lets one lease take all that remains)", c.source("lease-share"), c.lease.Share)
	}
	if c.localCacheKeys < 0 {
		return fmt.Errorf("invalid %s %d; it must not be negative (0 turns the cache off)", c.source("local-cache-keys"), c.localCacheKeys)
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: debug, info, warn, error", c.source("log-level"), c.logLevel)
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return fmt.Errorf("invalid %s %q; accepted: text, json", c.source("log-format"), c.logFormat)
	}
	if c.grpcMaxConnAge < 0 || c.grpcMaxConnAgeGrace < 0 {
		name, v := "grpc-max-connection-age", c.grpcMaxConnAge
		if v >= 0 {
			name, v = "grpc-max-connection-age-grace", c.grpcMaxConnAgeGrace
		}
		return fmt.Errorf("invalid %s %v; it must not be negative", c.source(name), v)
	}
	if c.grpcTLS.ClientSAN != "" && c.grpcTLS.ClientCA == "" {
		return fmt.Errorf("%s needs %s: only mutual TLS verifies client certificates", c.source("grpc-tls-client-san"), c.source("grpc-tls-client-ca"))
	}
	if c.shutdownDelay < 0 {
		return fmt.Errorf("invalid %s %v; it must not be negative", c.source("shutdown-delay"), c.shutdownDelay)
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
	if err := c.validateXDS(); err != nil {
		return err
	}
	if err := c.rlqs.validate(c.source); err != nil {
		return err
	}
	if err := c.region.validate(c.source, c.grpcTLS); err != nil {
		return err
	}
	return c.refStats.validate(c.source)
}

// validateRedis checks the -redis-* flags of -backend redis.
func (c *serveConfig) validateRedis() error {
	if c.redis.URL == "" {
		return fmt.Errorf("%s is required with -backend redis: redis://host:port", c.source("redis-url"))
	}
	if err := c.redisStartup.validate(c.source); err != nil {
		return err
	}
	switch m := redis.Mode(c.redisMode); m {
	case redis.Standalone, redis.Sentinel, redis.Cluster:
		c.redis.Mode = m
	default:
		return fmt.Errorf("invalid %s %q; accepted: standalone, sentinel, cluster", c.source("redis-mode"), c.redisMode)
	}
	if c.redis.Mode == redis.Sentinel && c.redis.MasterName == "" {
		return fmt.Errorf("%s is required with -redis-mode sentinel: the name the sentinels monitor", c.source("redis-master"))
	}
	if c.redis.Mode != redis.Sentinel && c.redis.MasterName != "" {
		return fmt.Errorf("%s is only for -redis-mode sentinel", c.source("redis-master"))
	}
	if _, err := redis.ParseHashTag(c.redisHashTag); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: descriptor, domain", c.source("redis-hash-tag"), c.redisHashTag)
	}
	if c.redisClock != "redis" && c.redisClock != "local" {
		return fmt.Errorf("invalid %s %q; accepted: redis, local", c.source("redis-clock"), c.redisClock)
	}
	if err := c.validateKeyFormat(); err != nil {
		return err
	}
	if c.redisCoalesce < 0 {
		return fmt.Errorf("invalid %s %d; it must not be negative (0 turns coalescing off)", c.source("redis-coalesce"), c.redisCoalesce)
	}
	if c.redis.PoolSize < 0 {
		return fmt.Errorf("invalid %s %d; it must not be negative (0 means 10 per CPU)", c.source("redis-pool-size"), c.redis.PoolSize)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"redis-dial-timeout", c.redis.DialTimeout},
		{"redis-read-timeout", c.redis.ReadTimeout},
		{"redis-write-timeout", c.redis.WriteTimeout},
	} {
		if d.v <= 0 {
			return fmt.Errorf("invalid %s %v; it must be positive", c.source(d.name), d.v)
		}
	}
	// Parse the URL now, so that a typo is a usage error naming the flag.
	if _, err := redis.NewClient(c.redis); err != nil {
		return fmt.Errorf("invalid %s: %w", c.source("redis-url"), err)
	}
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
