// Package redis keeps rate-limit state in Redis, so that every replica of
// ratelimitd shares one exact view of the counters. Each batch of requests
// is decided by one call of the decision script (package algo's Lua twins
// of the step functions), atomically and in one round trip: EVALSHA, and
// EVAL once when Redis does not have the script cached.
package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Options configure a Backend.
type Options struct {
	// Prefix is prepended to every key, isolating the tenants of one Redis.
	Prefix string
	// Now, when set, is the clock the script decides by. By default the
	// script reads the Redis clock (TIME), so replicas whose clocks
	// disagree still agree on every decision; set Now only for
	// Redis-compatible services that forbid TIME in scripts.
	Now func() time.Time
}

// Backend is an [algo.Backend] on a Redis client.
type Backend struct {
	client goredis.Scripter
	script *goredis.Script
	opts   Options
	// minTTL is the least TTL of a stored key; tests whose clock runs
	// apart from the Redis clock raise it so keys outlive their test.
	minTTL time.Duration
}

// New returns a backend on client.
func New(client goredis.Scripter, opts Options) *Backend {
	return &Backend{client: client, script: goredis.NewScript(algo.Script()), opts: opts}
}

// Decide implements [algo.Backend].
func (b *Backend) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	var now time.Time
	if b.opts.Now != nil {
		now = b.opts.Now()
	}
	return b.decide(ctx, now, reqs, out)
}

// decide runs the script at now, or on the Redis clock when now is zero.
func (b *Backend) decide(ctx context.Context, now time.Time, reqs []algo.Request, out []algo.Decision) error {
	if len(reqs) == 0 {
		return nil
	}
	keys := make([]string, len(reqs))
	for i := range reqs {
		if err := reqs[i].Limit.Check(); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		keys[i] = b.opts.Prefix + string(reqs[i].Key)
	}
	args := algo.AppendScriptArgs(make([]any, 0, 2+algo.ScriptArgsPerRequest*len(reqs)), now, b.minTTL, reqs)
	reply, err := b.script.Run(ctx, b.client, keys, args...).Slice()
	if err != nil {
		return fmt.Errorf("redis: decision script: %w", err)
	}
	_, err = algo.ParseScriptReply(reply, out[:len(reqs)])
	return err
}
