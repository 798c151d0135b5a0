package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/console"
)

// stack is the backend stack, built bottom up by its layers, each a
// component in front of the one before: the store (memory, or Redis
// behind a circuit breaker), the region engine (-region), the lease
// engine (Redis), the local over-limit cache (-local-cache-keys) and
// tracing (-tracing).
type stack struct {
	// kind is -backend: memory or redis.
	kind string
	// main is the top of the stack: what decisions go to. Each layer
	// puts itself in front of it.
	main algo.Backend
	// store is the bottom of the stack, without the breaker: the memory
	// backend, or the Redis backend as the breaker sees it.
	store algo.Backend
	// redis is the Redis backend, nil on memory; prefix is its keys'
	// prefix (-redis-prefix).
	redis  *redis.Backend
	prefix string
	// fallback decides while the store fails, in failure mode local; nil
	// on memory, which does not fail.
	fallback    algo.Backend
	failureMode config.FailureMode
	localShare  float64
	// referenceKeys gives the limits the reference could hold a key in
	// its layout too (-redis-key-format reference).
	referenceKeys bool
	// breaker configures the circuits in front of Redis: the store's,
	// and those a layer asks for (guarded).
	breaker breaker.Options
	// leases tells what this replica holds of leased limits, global what
	// this region knows of the other regions' counts: nil without the
	// lease or the region engine.
	leases algo.LeaseReader
	global algo.GlobalReader
	// describe fill in, layer by layer, what the ops console shows of the
	// stack.
	describe []func(*console.Backend)
	log      *slog.Logger
	now      func() time.Time
}

// guarded returns the store behind a circuit breaker of its own with
// deadline timeout, whose state changes are logged as those of the circuit
// named what, whileOpen saying what an open circuit means: for calls off
// the request path (RLQS budgets), which must neither fail nor open the
// circuit of decisions. The memory store, which does not fail, comes as
// it is.
func (st *stack) guarded(timeout time.Duration, what, whileOpen string) algo.Backend {
	if st.redis == nil {
		return st.store
	}
	return newBreaker(st.store, st.breaker, timeout, st.now, st.log, what, whileOpen)
}

// backendStore is the component at the bottom of the backend stack: where
// counters live (-backend), with the failure policy around it.
type backendStore struct {
	backend       string
	memoryMaxKeys int
	redis         redisConfig
	failureMode   string
	localShare    float64
	breaker       breaker.Options
}

func (b *backendStore) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&b.backend, "backend", "memory", "where counters live: memory (in this process) or redis (shared by every replica)")
	fs.IntVar(&b.memoryMaxKeys, "memory-max-keys", memory.DefaultMaxKeys, "most keys the memory backend tracks at once; beyond it the entries nearest expiry are evicted")
	b.redis.addFlags(fs)
	fs.StringVar(&b.failureMode, "failure-mode", "open", "what a decision is when the backend fails, for domains whose rule file does not say: open (admit), closed (refuse), error (answer Unavailable) or local (decide in this process)")
	fs.Float64Var(&b.localShare, "local-share", 1, "with failure mode local, the `fraction` of each limit this replica admits on its own (1/replicas keeps the total near the limit)")
	fs.DurationVar(&b.breaker.Timeout, "backend-timeout", breaker.DefaultTimeout, "deadline of each backend call; past it the decision falls to the failure mode")
	fs.IntVar(&b.breaker.Failures, "circuit-failures", breaker.DefaultFailures, "consecutive failed backend calls that open the circuit: calls then fail at once, without waiting for the backend")
	fs.DurationVar(&b.breaker.Cooldown, "circuit-cooldown", breaker.DefaultCooldown, "how long the circuit stays open before one call probes the backend again")
}

func (b *backendStore) check(flagName func(string) string) error {
	switch b.backend {
	case "memory":
	case "redis":
		if err := b.redis.check(flagName); err != nil {
			return err
		}
	default:
		return fmt.Errorf("invalid %s %q; accepted: memory, redis", flagName("backend"), b.backend)
	}
	if _, err := config.ParseFailureMode(b.failureMode); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: open, closed, error, local", flagName("failure-mode"), b.failureMode)
	}
	if !(b.localShare > 0 && b.localShare <= 1) {
		return fmt.Errorf("invalid %s %v; it must be above 0 and at most 1", flagName("local-share"), b.localShare)
	}
	if b.breaker.Timeout <= 0 || b.breaker.Cooldown <= 0 {
		name, v := "backend-timeout", b.breaker.Timeout
		if b.breaker.Timeout > 0 {
			name, v = "circuit-cooldown", b.breaker.Cooldown
		}
		return fmt.Errorf("invalid %s %v; it must be positive", flagName(name), v)
	}
	if b.breaker.Failures < 1 {
		return fmt.Errorf("invalid %s %d; it must be at least 1", flagName("circuit-failures"), b.breaker.Failures)
	}
	if b.memoryMaxKeys < 1 {
		return fmt.Errorf("invalid %s %d; it must be at least 1", flagName("memory-max-keys"), b.memoryMaxKeys)
	}
	return nil
}

func (b *backendStore) build(ctx context.Context, s *server) (hooks, error) {
	mode, _ := config.ParseFailureMode(b.failureMode) // checked
	s.stack = &stack{
		kind: b.backend, failureMode: mode, localShare: b.localShare, breaker: b.breaker,
		referenceKeys: b.referenceKeys(), log: s.log, now: s.now,
	}
	tuneGC(b.backend, s.lookupEnv, s.log)
	b.logKeyFormat(s.source.initial, s.log)
	if b.backend == "redis" {
		return b.buildRedis(ctx, s)
	}
	return b.buildMemory(s), nil
}

// buildMemory puts the memory backend at the bottom of the stack.
func (b *backendStore) buildMemory(s *server) hooks {
	m := memory.New(memory.Options{MaxKeys: b.memoryMaxKeys, Now: s.now})
	s.log.Info("backend ready", "backend", "memory", "max_keys", b.memoryMaxKeys)
	registerMemory(s.reg, m)
	s.stack.main, s.stack.store = m, m
	s.stack.describe = append(s.stack.describe, func(d *console.Backend) {
		d.Memory = &console.Memory{Keys: m.Len(), MaxKeys: b.memoryMaxKeys, Evictions: m.Evictions()}
	})
	b.describeKind(s.stack)
	return hooks{
		start: func(ctx context.Context) {
			go watchEvictions(ctx, m.Evictions, memoryEvictionsWarning, s.log, evictionReportInterval)
		},
		close: func() { m.Close() },
	}
}

// buildRedis puts Redis, behind a deadline and a circuit breaker, at the
// bottom of the stack, with a memory backend as the fallback of failure
// mode local.
func (b *backendStore) buildRedis(ctx context.Context, s *server) (hooks, error) {
	rb, err := b.redis.open(ctx, b.failureMode, s.now, s.log)
	if err != nil {
		return hooks{}, err
	}
	b.warnReadTimeout(s.log)
	fallback := memory.New(memory.Options{MaxKeys: b.memoryMaxKeys, Now: s.now})
	var store algo.Backend = rb
	if b.redis.config.Mode == redis.Cluster {
		store = clusterNodes{rb}
	}
	guard := newBreaker(store, b.breaker, b.breaker.Timeout, s.now, s.log, "backend", "calls fail at once until a probe succeeds")
	registerBreaker(s.reg, guard)
	st := s.stack
	st.main, st.store, st.fallback, st.redis, st.prefix = guard, store, fallback, rb, b.redis.prefix
	b.describeKind(st)
	st.describe = append(st.describe, func(d *console.Backend) {
		d.Redis = b.redis.describe(rb)
		gs := guard.Stats()
		d.Circuit = &console.Circuit{State: guard.State().String(), Calls: gs.Calls, Errors: gs.Errors,
			Timeouts: gs.Timeouts, Rejected: gs.Rejected, Opens: gs.Opens}
	})
	return hooks{
		health: func(ctx context.Context, mark func(part, reason string, bad bool)) {
			if b.redis.startup.healthCheck {
				go watchRedisHealth(ctx, rb, redisHealthInterval, func(bad bool) {
					mark("redis", "no connection to Redis", bad)
				}, s.log)
			}
		},
		close: func() {
			rb.Close()
			fallback.Close()
		},
	}, nil
}

// describeKind adds the backend's kind and failure mode to what the ops
// console shows.
func (b *backendStore) describeKind(st *stack) {
	st.describe = append(st.describe, func(d *console.Backend) {
		d.Kind, d.FailureMode = b.backend, b.failureMode
	})
}

// evictionReportInterval is how often serve reports evictions of live keys.
const evictionReportInterval = 30 * time.Second

// Warnings of watchEvictions: what an eviction cost, and the flag to raise.
const (
	memoryEvictionsWarning = "memory backend full: live keys evicted and their counts forgotten; raise -memory-max-keys"
	leaseEvictionsWarning  = "lease engine full: keys of leased limits evicted, their leases given back and their traffic forgotten (more Redis calls, never more admitted); raise -lease-max-keys"
)

// watchEvictions logs msg as a warning, at most once per interval, when
// the count of evictions (the memory backend's, or the lease engine's key
// table's) has grown since the last look: each eviction forgot a key,
// which the cap is too small to keep. It returns when ctx is done.
func watchEvictions(ctx context.Context, evictions func() uint64, msg string, log *slog.Logger, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := evictions(); n > last {
				log.Warn(msg, "evicted", n-last, "evicted_total", n, "interval", interval)
				last = n
			}
		}
	}
}

// redisGCPercent is the garbage collector's target (GOGC) on the Redis
// backend when the environment sets none.
const redisGCPercent = 400

// tuneGC lets the heap of a Redis-backed replica grow to 5 times its live
// size between collections instead of twice, unless GOGC is set. Such a
// heap holds no counters, only the garbage of calls in flight and the
// lease engine's keys (29 MB live when -lease-max-keys is full, up to
// about 5 times that resident: docs/leasing.md), and collecting it at
// Go's default rate cost a seventh of ratelimitd's CPU under load
// (docs/performance.md). The memory backend's heap is its counters: there
// GOGC=400 would mean five times their size, so the default stays, and
// operators choose.
func tuneGC(backend string, lookupEnv func(string) (string, bool), log *slog.Logger) {
	if backend != "redis" {
		return
	}
	if v, ok := lookupEnv("GOGC"); ok {
		log.Info("garbage collector: GOGC from the environment", "gogc", v)
		return
	}
	debug.SetGCPercent(redisGCPercent)
	log.Info("garbage collector: GOGC unset, collecting at 400% growth (a Redis-backed heap is small)", "gogc", redisGCPercent)
}

// newBreaker puts a circuit breaker with deadline timeout and the
// -circuit-* flags in front of b, logging its state changes as those of
// the circuit named what; whileOpen says what an open circuit means. In
// front of a backend made of nodes (a Redis Cluster: clusterNodes) it
// keeps a circuit per node, and the lines name the node.
func newBreaker(b algo.Backend, o breaker.Options, timeout time.Duration, now func() time.Time, log *slog.Logger, what, whileOpen string) *breaker.Breaker {
	_, nodes := b.(breaker.Nodes)
	return breaker.New(b, breaker.Options{
		Timeout: timeout, Failures: o.Failures, Cooldown: o.Cooldown, Now: now,
		OnStateChange: func(node string, from, to breaker.State, err error) {
			name, attrs := what+" circuit", []any{"from", from.String()}
			if nodes {
				name += " of node " + breaker.NodeName(node)
				attrs = append(attrs, "node", breaker.NodeName(node))
			}
			if to == breaker.Open {
				log.Warn(name+" open: "+whileOpen, append(attrs, "error", err, "cooldown", o.Cooldown)...)
			} else {
				log.Info(name+" "+to.String(), attrs...)
			}
		},
	})
}

// clusterNodes is the Redis backend on a Cluster, seen by the breaker as a
// backend made of nodes (breaker.Nodes): one circuit per primary, so that
// a dead primary fails only the keys of its slots.
type clusterNodes struct{ *redis.Backend }

// DecideVia implements breaker.Nodes.
func (c clusterNodes) DecideVia(ctx context.Context, gate breaker.Gate, reqs []algo.Request, out []algo.Decision) error {
	return c.Backend.DecideVia(ctx, gate, reqs, out)
}

// warnReadTimeout warns when -backend-timeout is longer than
// -redis-read-timeout: a Redis call then gives up at the read timeout, and
// the backend's deadline never comes into play (docs/failure-modes.md,
// "The margin").
// Both are positive once validated.
func (b *backendStore) warnReadTimeout(log *slog.Logger) {
	if read := b.redis.config.ReadTimeout; b.breaker.Timeout > read {
		log.Warn("Redis calls give up at -redis-read-timeout, before -backend-timeout: raise the read timeout to at least the backend timeout, or lower the backend timeout",
			"backend_timeout", b.breaker.Timeout, "redis_read_timeout", read)
	}
}
