package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/console"
)

// redisConfig is the configuration of the Redis backend (-redis-*).
type redisConfig struct {
	config    redis.Config
	mode      string
	prefix    string
	hashTag   string
	clock     string
	scripts   bool
	coalesce  int
	keyFormat string
	jitter    time.Duration
	startup   redisStartupConfig
}

func (c *redisConfig) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.config.URL, "redis-url", "", "Redis `URL`: redis://[user:password@]host:port[/db], rediss:// for TLS; comma-separated sentinels or cluster nodes")
	fs.StringVar(&c.mode, "redis-mode", "standalone", "Redis topology: standalone, sentinel (with -redis-master) or cluster")
	fs.StringVar(&c.config.MasterName, "redis-master", "", "`name` of the master the sentinels monitor (sentinel mode)")
	fs.StringVar(&c.config.SentinelUsername, "redis-sentinel-username", "", "user name for the sentinels themselves, when they require one")
	fs.StringVar(&c.config.SentinelPassword, "redis-sentinel-password", "", "password for the sentinels themselves, when they require one (the URL's credentials are the data nodes')")
	fs.IntVar(&c.config.PoolSize, "redis-pool-size", 0, "most connections to each Redis node; 0 means 10 per CPU")
	fs.DurationVar(&c.config.DialTimeout, "redis-dial-timeout", redis.DefaultDialTimeout, "how long opening a Redis connection may take")
	fs.DurationVar(&c.config.ReadTimeout, "redis-read-timeout", redis.DefaultReadTimeout, "how long a Redis answer (and a free pooled connection) may take")
	fs.DurationVar(&c.config.WriteTimeout, "redis-write-timeout", redis.DefaultWriteTimeout, "how long sending a Redis call may take")
	fs.StringVar(&c.config.TLSCAFile, "redis-tls-ca", "", "PEM `file` of the CAs a rediss:// server's certificate must chain to (default: the system's)")
	fs.StringVar(&c.config.TLSCertFile, "redis-tls-cert", "", "PEM `file` of a client certificate for mutual TLS with Redis")
	fs.StringVar(&c.config.TLSKeyFile, "redis-tls-key", "", "PEM `file` of the key of -redis-tls-cert")
	fs.StringVar(&c.prefix, "redis-prefix", "ratelimitd:", "`prefix` of every Redis key, isolating tenants of one Redis")
	fs.StringVar(&c.hashTag, "redis-hash-tag", "descriptor", "what places a key in a Redis Cluster, and so what is decided atomically: descriptor (its limits together) or domain (a whole request)")
	fs.IntVar(&c.coalesce, "redis-coalesce", 4, "decide through this many workers, each sending every decision waiting when it is free in one Redis call (each still all or nothing); 0 sends one call per decision. Cluster mode always sends one call per slot of a decision")
	fs.BoolVar(&c.scripts, "redis-scripts", false, "decide with EVALSHA scripts even where Redis 7 offers functions (FCALL, cheaper; used by default when available)")
	fs.StringVar(&c.keyFormat, "redis-key-format", keyFormatNative, "layout of Redis keys: native (collision-free) or reference (envoyproxy/ratelimit's, for fixed windows, so reference pods sharing the Redis count together during a migration; docs/redis.md#key-formats)")
	fs.DurationVar(&c.jitter, "redis-expiration-jitter", 0, "with -redis-key-format reference: most random time added to the expiry of a reference key, in whole seconds, like the reference's EXPIRATION_JITTER_MAX_SECONDS; 0 adds none")
	fs.StringVar(&c.clock, "redis-clock", "redis", "clock the Redis scripts decide by: redis (TIME; replicas may disagree on the time) or local (this process's, for Redis-compatible services that forbid TIME in scripts)")
	redisStartupFlags(fs, &c.startup)
}

// check checks the -redis-* flags of -backend redis.
func (c *redisConfig) check(flagName func(string) string) error {
	if c.config.URL == "" {
		return fmt.Errorf("%s is required with -backend redis: redis://host:port", flagName("redis-url"))
	}
	if err := c.startup.validate(flagName); err != nil {
		return err
	}
	switch m := redis.Mode(c.mode); m {
	case redis.Standalone, redis.Sentinel, redis.Cluster:
		c.config.Mode = m
	default:
		return fmt.Errorf("invalid %s %q; accepted: standalone, sentinel, cluster", flagName("redis-mode"), c.mode)
	}
	if c.config.Mode == redis.Sentinel && c.config.MasterName == "" {
		return fmt.Errorf("%s is required with -redis-mode sentinel: the name the sentinels monitor", flagName("redis-master"))
	}
	if c.config.Mode != redis.Sentinel && c.config.MasterName != "" {
		return fmt.Errorf("%s is only for -redis-mode sentinel", flagName("redis-master"))
	}
	if _, err := redis.ParseHashTag(c.hashTag); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: descriptor, domain", flagName("redis-hash-tag"), c.hashTag)
	}
	if c.clock != "redis" && c.clock != "local" {
		return fmt.Errorf("invalid %s %q; accepted: redis, local", flagName("redis-clock"), c.clock)
	}
	if err := c.checkKeyFormat(flagName); err != nil {
		return err
	}
	if c.coalesce < 0 {
		return fmt.Errorf("invalid %s %d; it must not be negative (0 turns coalescing off)", flagName("redis-coalesce"), c.coalesce)
	}
	if c.config.PoolSize < 0 {
		return fmt.Errorf("invalid %s %d; it must not be negative (0 means 10 per CPU)", flagName("redis-pool-size"), c.config.PoolSize)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"redis-dial-timeout", c.config.DialTimeout},
		{"redis-read-timeout", c.config.ReadTimeout},
		{"redis-write-timeout", c.config.WriteTimeout},
	} {
		if d.v <= 0 {
			return fmt.Errorf("invalid %s %v; it must be positive", flagName(d.name), d.v)
		}
	}
	// Parse the URL now, so that a typo is a usage error naming the flag.
	if _, err := redis.NewClient(c.config); err != nil {
		return fmt.Errorf("invalid %s: %w", flagName("redis-url"), err)
	}
	return nil
}

// redisDialTimeout bounds connecting to Redis and loading the script at
// start.
const redisDialTimeout = 10 * time.Second

// open connects to Redis and checks it answers, waiting for it first with
// -redis-startup-initial-interval. A Redis unreachable or refusing writes
// at start is logged, not fatal: serving by failureMode beats not serving.
func (c *redisConfig) open(ctx context.Context, failureMode string, now func() time.Time, log *slog.Logger) (*redis.Backend, error) {
	tag, _ := redis.ParseHashTag(c.hashTag) // checked
	opts := redis.Options{Prefix: c.prefix, HashTag: tag, Scripts: c.scripts, Coalesce: c.coalesce, ExpirationJitter: c.jitter}
	if c.clock == "local" {
		opts.Now = now
	}
	// go-redis logs through a logger of its own, global to the process.
	goredis.SetLogger(redis.Logger{Log: log})
	b, err := redis.Open(c.config, opts)
	if err != nil {
		return nil, err
	}
	attrs := []any{"backend", "redis", "mode", c.config.Mode, "url", redis.RedactURL(c.config.URL), "prefix", c.prefix, "clock", c.clock}
	if c.config.Mode == redis.Cluster {
		attrs = append(attrs, "hash_tag", c.hashTag)
	}
	check := func(ctx context.Context) error {
		dctx, cancel := context.WithTimeout(ctx, redisDialTimeout)
		defer cancel()
		return b.Check(dctx)
	}
	if c.startup.initial > 0 {
		// As the reference: no port opens before Redis answers, and none
		// at all when it never does.
		if err = waitRedis(ctx, c.startup, check, log); err != nil {
			b.Close()
			return nil, err
		}
	} else {
		err = check(ctx)
	}
	switch {
	case err == nil:
		log.Info("backend ready", append(attrs, "lua", luaKind(b))...)
	case redis.Unreachable(err):
		// Serving by the failure mode beats not serving: the breaker
		// probes Redis until it answers.
		log.Error("backend unreachable at start; deciding by the failure mode until it answers",
			append(attrs, "error", err, "failure_mode", failureMode)...)
	case redis.Refusing(err):
		// A full Redis (maxmemory, noeviction) or one loading its data is
		// up: pods that exit would crash-loop until it frees memory. The
		// first decision it takes loads the functions.
		log.Error("backend refuses writes at start; deciding by the failure mode until it takes them, then loading the decision functions",
			append(attrs, "error", err, "failure_mode", failureMode)...)
	default:
		b.Close()
		return nil, err
	}
	return b, nil
}

// luaKind names how b runs its Lua, as the start-up log says it.
func luaKind(b *redis.Backend) string {
	if b.Functions() {
		return "functions (FCALL)"
	}
	return "scripts (EVALSHA)"
}

// describe describes the Redis backend b as the ops console shows it.
func (c *redisConfig) describe(b *redis.Backend) *console.Redis {
	lua := "functions"
	if !b.Functions() {
		lua = "scripts"
	}
	d := &console.Redis{Mode: string(c.config.Mode), URL: redis.RedactURL(c.config.URL), Master: c.config.MasterName,
		Prefix: c.prefix, Lua: lua, Clock: c.clock, KeyFormat: c.keyFormat}
	if c.config.Mode == redis.Cluster {
		d.HashTag = c.hashTag
	}
	return d
}
