package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// Redis at start and in the health checks, as envoyproxy/ratelimit's
// REDIS_STARTUP_* and REDIS_HEALTH_CHECK_ACTIVE_CONNECTION have it
// (src/redis/driver_impl.go, newClientImpl and poolTrace). By default
// ratelimitd does neither: it starts without Redis, deciding by the
// failure mode, and its health does not follow Redis.

// redisHealthInterval is how often -redis-health-check pings Redis.
const redisHealthInterval = time.Second

// redisStartupConfig is how serve waits for Redis.
type redisStartupConfig struct {
	// initial, when above 0, makes serve wait for Redis before it opens
	// any port, retrying after initial, doubling up to max, each wait
	// jittered; maxElapsed, when above 0, gives up (exit 1) after it.
	initial, max, maxElapsed time.Duration
	// healthCheck has the health checks report not serving while Redis
	// does not answer.
	healthCheck bool
}

func redisStartupFlags(fs *flag.FlagSet, c *redisStartupConfig) {
	fs.DurationVar(&c.initial, "redis-startup-initial-interval", 0, "wait for Redis before opening any port, retrying after this long, then twice as long each time (jittered) up to -redis-startup-max-interval (envoyproxy/ratelimit's REDIS_STARTUP_*); 0 starts at once and decides by -failure-mode until Redis answers")
	fs.DurationVar(&c.max, "redis-startup-max-interval", 30*time.Second, "longest wait between two tries of -redis-startup-initial-interval")
	fs.DurationVar(&c.maxElapsed, "redis-startup-max-elapsed-time", 0, "with -redis-startup-initial-interval, give up (exit 1) when Redis has not answered after this long; 0 waits for ever")
	fs.BoolVar(&c.healthCheck, "redis-health-check", false, "health checks report not serving while Redis does not answer a PING, tried once a second; calls are still decided, by -failure-mode (envoyproxy/ratelimit's REDIS_HEALTH_CHECK_ACTIVE_CONNECTION)")
}

func (c *redisStartupConfig) validate(source func(string) string) error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"redis-startup-initial-interval", c.initial}, {"redis-startup-max-interval", c.max}, {"redis-startup-max-elapsed-time", c.maxElapsed}} {
		if d.v < 0 {
			return fmt.Errorf("invalid %s %v; it must not be negative", source(d.name), d.v)
		}
	}
	if c.initial > 0 && c.max < c.initial {
		return fmt.Errorf("invalid %s %v; it must be at least %s (%v)", source("redis-startup-max-interval"), c.max, source("redis-startup-initial-interval"), c.initial)
	}
	return nil
}

// waitRedis checks b until Redis answers, as the reference's start does:
// the first try at once, then after initial, doubling up to max, each wait
// drawn at random between initial and the doubled one (jpillora/backoff
// with Jitter, which the reference uses); an error once maxElapsed has
// passed, or at once for an answer that is an error (a wrong password, the
// wrong mode). check is b.Check with a deadline.
func waitRedis(ctx context.Context, c redisStartupConfig, check func(context.Context) error, log *slog.Logger) error {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		err := check(ctx)
		if err == nil || !redis.Unreachable(err) {
			return err
		}
		elapsed := time.Since(start)
		if c.maxElapsed > 0 && elapsed >= c.maxElapsed {
			return fmt.Errorf("redis: not reachable after %v (-redis-startup-max-elapsed-time %v): %w", elapsed.Round(time.Millisecond), c.maxElapsed, err)
		}
		d := startupBackoff(c.initial, c.max, attempt)
		log.Warn("redis not reachable at start; retrying before opening any port", "in", d, "elapsed", elapsed.Round(time.Millisecond), "error", err)
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		}
	}
}

// startupBackoff is the wait before try attempt+2: initial × 2^attempt, at most
// max, jittered between initial and that.
func startupBackoff(initial, max time.Duration, attempt int) time.Duration {
	d := max
	if attempt < 32 && initial<<attempt > 0 && initial<<attempt < max {
		d = initial << attempt
	}
	if d <= initial {
		return initial
	}
	return initial + rand.N(d-initial+1)
}

// watchRedisHealth pings Redis every interval until ctx ends and marks the
// "redis" health component unhealthy while it does not answer.
func watchRedisHealth(ctx context.Context, b *redis.Backend, interval time.Duration, set func(bad bool), log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	bad := false
	for {
		pctx, cancel := context.WithTimeout(ctx, interval)
		err := b.Client().Ping(pctx).Err()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if now := err != nil; now != bad {
			bad = now
			set(bad)
			if bad {
				log.Warn("health checks report not serving: Redis does not answer (-redis-health-check)", "error", err)
			} else {
				log.Info("health checks report serving: Redis answers again")
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
