// Package redis keeps rate-limit state in Redis, so that every replica of
// ratelimitd shares one exact view of the counters.
//
// A batch of requests is decided by the decision script (package algo's Lua
// twins of the step functions), atomically and in one round trip. On Redis
// 7 and later the script is loaded as a function library and called with
// FCALL: the algorithms are then defined once, not on every call, which
// halves the Redis CPU a decision costs. Functions are replicated and
// persisted; when one is missing all the same (FUNCTION FLUSH, a restart
// without persistence), the library is loaded again and the call repeated.
// Where functions are unavailable (Redis 6, a Redis-compatible service, an
// ACL without FUNCTION LOAD) the backend runs the script with EVALSHA, and
// EVAL once whenever Redis answers NOSCRIPT.
//
// One Redis server (standalone, or the master Sentinel names) decides a
// whole batch in one script call. A Cluster can only run a script over keys
// of one hash slot, so there a batch is split by slot and the groups are
// pipelined: one round trip, each group atomic. Keys are hash-tagged so that
// every limit of one descriptor shares a slot (or, with [TagDomain], every
// key of one domain); see [HashTag].
//
// The script reads the Redis clock (TIME) by default, so replicas of
// ratelimitd whose clocks disagree still agree on every decision.
package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Options configure a Backend.
type Options struct {
	// Prefix is prepended to every key, isolating the tenants of one Redis.
	// In a Cluster, a prefix holding a hash tag ("{tenant}:") puts every
	// key on that tag's slot.
	Prefix string
	// HashTag chooses which part of a key a Cluster hashes. It is ignored
	// by a client that is not a Cluster client.
	HashTag HashTag
	// Scripts makes the backend run the script with EVALSHA even where
	// Redis offers functions.
	Scripts bool
	// Coalesce, when above 0, sends decisions through that many workers,
	// each of which decides every call waiting when it is free in one
	// call of the decision (each call's batch still all or nothing). Not
	// for a Cluster, whose batches are split by slot.
	Coalesce int
	// Now, when set, is the clock the script decides by. By default the
	// script reads the Redis clock (TIME), so replicas whose clocks
	// disagree still agree on every decision; set Now only for
	// Redis-compatible services that forbid TIME in scripts.
	Now func() time.Time
	// ExpirationJitter bounds the random time added to the expiry of a
	// key kept in envoyproxy/ratelimit's layout (a request with a
	// RefKey), in whole seconds, as that implementation's
	// EXPIRATION_JITTER_MAX_SECONDS does. Zero adds none.
	ExpirationJitter time.Duration
}

// Backend is an [algo.Backend] on a Redis client.
type Backend struct {
	client  goredis.UniversalClient
	cluster *goredis.ClusterClient // the client, when it is a Cluster client
	script  string
	sha     string
	lib     string // the function library, named after sha
	libName string // its name
	fn      string // its function
	// scripts is set once functions turn out to be unavailable, or when
	// Options.Scripts asks for scripts.
	scripts atomic.Bool
	opts    Options
	co      *coalescer // nil unless Options.Coalesce
	owned   bool       // Close closes client: Open made it
	cfg     Config     // what Open was given, for Check's messages
	// minTTL is the least TTL of a stored key; tests whose clock runs
	// apart from the Redis clock raise it so keys outlive their test.
	minTTL time.Duration
	// clock is the offset of the Redis clock, which turns a caller's
	// deadline into the instant after which its call decides nothing
	// (clock.go).
	clock clockOffset
	// nodeClocks holds, in a Cluster, the offset of each primary's clock
	// (address → *clockOffset), which its calls' instants are put on.
	nodeClocks sync.Map
	// readTimeout is the client's, which may end a call before its
	// caller's deadline (0: none known).
	readTimeout time.Duration
}

// New returns a backend on client, which the caller keeps and closes. The
// script is loaded on first use; [Backend.LoadScript] loads it at once.
func New(client goredis.UniversalClient, opts Options) *Backend {
	src := algo.Script()
	sha := scriptSHA(src)
	// The library's name carries the script's digest, so replicas of two
	// versions of ratelimitd each find their own during a rolling update.
	name := "ratelimitd_" + sha[:12]
	b := &Backend{client: client, script: src, sha: sha, lib: algo.Library(name), libName: name, fn: name + "_decide", opts: opts}
	b.scripts.Store(opts.Scripts)
	b.cluster, _ = client.(*goredis.ClusterClient)
	b.readTimeout = readTimeoutOf(client)
	if opts.Coalesce > 0 && b.cluster == nil {
		b.co = newCoalescer(b, opts.Coalesce)
	}
	return b
}

// Client returns the Redis client the backend decides with.
func (b *Backend) Client() goredis.UniversalClient { return b.client }

// Functions reports whether decisions are made with FCALL of the function
// library rather than with the script.
func (b *Backend) Functions() bool { return !b.scripts.Load() }

// LoadScript loads the decision library, or where Redis has no functions
// the decision script, into Redis: into every master of a Cluster.
// Deciding reloads either by itself when Redis has lost it; loading up
// front saves the first call that round trip and proves the server runs
// Lua.
func (b *Backend) LoadScript(ctx context.Context) error {
	// The clocks' offset is measured before the first decision (in a
	// Cluster, each primary's too); when it cannot be, decisions measure
	// it meanwhile.
	_ = b.clock.measure(ctx, b.client)
	if b.cluster != nil {
		_ = b.cluster.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			_ = b.nodeClock(c.Options().Addr).measure(ctx, c)
			return nil
		})
	}
	if !b.scripts.Load() {
		err := b.loadLibrary(ctx)
		if err == nil {
			return nil
		}
		if !unsupported(err) {
			return err
		}
		b.scripts.Store(true)
	}
	load := func(ctx context.Context, c goredis.Scripter) error {
		sha, err := c.ScriptLoad(ctx, b.script).Result()
		if err != nil {
			return fmt.Errorf("redis: loading the decision script: %w", err)
		}
		if sha != b.sha {
			return fmt.Errorf("redis: the server hashed the decision script to %s, want %s", sha, b.sha)
		}
		return nil
	}
	if b.cluster != nil {
		return b.cluster.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return load(ctx, c)
		})
	}
	return load(ctx, b.client)
}

// Decide implements [algo.Backend].
func (b *Backend) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	if b.co != nil {
		if err := check(reqs, out); err != nil || len(reqs) == 0 {
			return err
		}
		return b.co.decide(ctx, reqs, out)
	}
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
	if err := check(reqs, out); err != nil {
		return err
	}
	if b.cluster != nil {
		return b.decideCluster(ctx, now, reqs, out, nil)
	}

	keys := make([]string, len(reqs))
	reqs = b.prepare(keys, reqs, false)
	start := time.Now()
	giveUp := b.giveUp(ctx, start)
	bound := b.lateBound(start, giveUp)
	args := algo.AppendScriptArgs(make([]any, 0, 2+algo.ScriptArgsPerRequest*len(reqs)), now, b.minTTL, bound.notAfter, reqs)
	ctx, cancel := endAtGiveUp(ctx, bound, giveUp)
	defer cancel()
	reply, err := b.run(ctx, b.client, keys, args)
	if err != nil {
		b.checkLate(bound, err)
		return err
	}
	_, err = algo.ParseScriptReply(reply, out[:len(reqs)])
	return err
}

// Reset implements [algo.Resetter]: it deletes each request's native key
// and, for one kept in the reference layout, its current window's
// reference key too, in one pipeline (a Cluster sends each DEL to its
// key's master).
func (b *Backend) Reset(ctx context.Context, reqs []algo.Request) error {
	if len(reqs) == 0 {
		return nil
	}
	refs := make([]string, len(reqs))
	b.prepare(refs, reqs, b.cluster != nil)
	_, err := b.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i := range reqs {
			key := b.opts.Prefix + string(reqs[i].Key)
			if b.cluster != nil {
				key = b.clusterKey(reqs[i].Key)
			}
			p.Del(ctx, key)
			if refs[i] != key {
				p.Del(ctx, refs[i]) // the reference layout's
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis: reset: %w", err)
	}
	return nil
}

// loadLibrary loads the function library: into every master of a Cluster.
// A library already there is not an error, even when Redis refuses to
// load it again because it is full (FUNCTION LOAD is a write).
func (b *Backend) loadLibrary(ctx context.Context) error {
	load := func(ctx context.Context, c goredis.Cmdable) error {
		err := c.FunctionLoad(ctx, b.lib).Err()
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			if Refusing(err) && b.hasLibrary(ctx, c) {
				return nil
			}
			return fmt.Errorf("redis: loading the decision functions: %w", err)
		}
		return nil
	}
	if b.cluster != nil {
		return b.cluster.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return load(ctx, c)
		})
	}
	return load(ctx, b.client)
}

// hasLibrary reports whether the server c holds the function library,
// asking with FUNCTION LIST, which a full Redis still answers.
func (b *Backend) hasLibrary(ctx context.Context, c goredis.Cmdable) bool {
	libs, err := c.FunctionList(ctx, goredis.FunctionListQuery{LibraryNamePattern: b.libName}).Result()
	return err == nil && len(libs) == 1 && libs[0].Name == b.libName
}

// Refusing reports whether err is Redis answering that it takes no writes
// for now: it is full (OOM: maxmemory reached with the noeviction policy)
// or still loading its dataset (LOADING). Such a Redis is up: ratelimitd
// starts, decides by the failure mode while the decisions (writes) are
// refused, and loads the decision functions once they are taken.
func Refusing(err error) bool {
	var reply goredis.Error
	if err == nil || !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	return strings.HasPrefix(msg, "OOM ") || strings.HasPrefix(msg, "LOADING ")
}

// unsupported reports whether err, from loading or calling a function,
// says that this server will not run functions (Redis before 7, a
// Redis-compatible service, an ACL without FUNCTION or FCALL), as opposed
// to a network failure.
func unsupported(err error) bool {
	var redisErr goredis.Error
	if err == nil || !errors.As(err, &redisErr) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand") ||
		strings.Contains(msg, "NOPERM") || strings.Contains(msg, "no permissions")
}

// isNoFunction reports whether err says the function is not loaded.
func isNoFunction(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// caller runs the decision: a client, or a Cluster client that routes the
// call by its first key.
type caller interface {
	goredis.Scripter
	FCall(ctx context.Context, function string, keys []string, args ...any) *goredis.Cmd
}

// check refuses a batch the decision must not see: too few decisions, or a
// limit past the algorithms' bounds.
func check(reqs []algo.Request, out []algo.Decision) error {
	if len(out) < len(reqs) {
		return fmt.Errorf("redis: %d decisions for %d requests", len(out), len(reqs))
	}
	for i := range reqs {
		if err := reqs[i].Limit.Check(); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	}
	return nil
}

// run calls the decision function, or where functions are unavailable the
// script by its SHA, and by its source when Redis answers NOSCRIPT (EVAL
// caches it again).
func (b *Backend) run(ctx context.Context, c caller, keys []string, args []any) ([]any, error) {
	if !b.scripts.Load() {
		reply, err := b.fcall(ctx, c, keys, args)
		if !unsupported(err) {
			return reply, err
		}
		b.scripts.Store(true) // this server runs scripts only
	}
	reply, err := c.EvalSha(ctx, b.sha, keys, args...).Slice()
	if isNoScript(err) {
		reply, err = c.Eval(ctx, b.script, keys, args...).Slice()
	}
	if err != nil {
		return nil, fmt.Errorf("redis: decision script: %w", err)
	}
	return reply, nil
}

// fcall calls the decision function, loading the library again when it
// was lost (FUNCTION FLUSH, a restart without persistence).
func (b *Backend) fcall(ctx context.Context, c caller, keys []string, args []any) ([]any, error) {
	reply, err := c.FCall(ctx, b.fn, keys, args...).Slice()
	if isNoFunction(err) {
		if err = b.loadLibrary(ctx); err == nil {
			reply, err = c.FCall(ctx, b.fn, keys, args...).Slice()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("redis: decision function: %w", err)
	}
	return reply, nil
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, goredis.ErrNoScript) || goredis.HasErrorPrefix(err, "NOSCRIPT"))
}
