// Package overlimit is a local over-limit cache: an [algo.Backend] that
// wraps another one (in production the Redis backend) and answers, without
// calling it, batches it already knows the inner backend would refuse.
//
// # What is remembered
//
// When the inner backend refuses a request (Decision.Allowed false, Hits
// above zero, RetryAfter not [algo.Never]), the cache remembers, under a
// copy of the request's key bytes: the [algo.Limit] it was decided under,
// the hits refused, the Remaining reported, the instant it becomes
// admissible (now + RetryAfter) and the instant the limit is fully restored
// (now + ResetAfter, never before the admissible instant). now is read from
// [Options.Now] before the inner backend is called, and only durations come
// back from it, so the remembered instants err early: a clock that differs
// from the store's (Redis reads its own) shifts nothing.
//
// Concurrency slots (a request whose Op is not [algo.OpDecide]) are never
// remembered nor answered: a slot given back frees it before any refusal's
// RetryAfter says.
//
// A request that counts its hits whatever the answer ([algo.Request.Count])
// is answered locally only for a fixed window or a burst fill: their
// refusals last until the window ends, however much more is counted in
// it, so the hits a local answer leaves uncounted change no decision (as
// envoyproxy/ratelimit's local cache leaves them uncounted). For the
// other algorithms what is counted past the limit carries on (a bucket's
// debt, a count that weighs on the next window), and such a request goes
// to the inner backend.
//
// A refusal of a request whose key already appeared earlier in the same
// batch is not remembered: the inner backend decided it on top of the
// earlier request's hits, which a refused batch never consumes.
//
// # What is answered locally
//
// A batch is answered locally only when every request of it has a live
// entry (now before its admissible instant) with an equal Limit and at least
// as many hits as were refused; more hits never fit earlier, fewer might.
// Each decision is then Allowed false, the remembered Remaining, RetryAfter
// up to the admissible instant and ResetAfter up to the restored instant.
// Anything else (a key without an entry, a changed Limit after a rule
// reload, fewer hits, a peek of zero hits) sends the whole batch to the
// inner backend: a batch is all-or-nothing across its requests, so the cache
// never splits it. Shadow requests follow the same rules. Answers from the
// inner backend update the cache: refused requests are remembered, and
// admitted requests with hits forget their key's entry.
//
// This is exact as long as the state of a key changes only through
// admitted requests: a refused request consumes nothing, so until the
// admissible instant the inner backend refuses the same hits again, and
// hits admitted meanwhile (by this process, which forgets the entry, or by
// another replica, or by a request decided concurrently with the refusal)
// only push that instant later, for a state read by the algorithm that
// wrote it (package key puts the algorithm and window in the key). Two
// figures are bounds, not copies: for more hits than were refused
// RetryAfter is a lower bound, and Remaining is the value at the refusal,
// which refills can only raise.
//
// A store that forgets a key before the RetryAfter it reported is not
// seen: the remembered refusal lasts until its admissible instant. That
// happens on an operator's Reset, an eviction in the store, and when a
// rule reload lowers N or Burst of a bucket algorithm: the store expires
// the state when it would be full under the limit that wrote it.
//
// A batch answered locally does not look at its context: it needs no I/O.
// Errors of the inner backend are returned unchanged and touch no entry.
//
// # Memory
//
// At most [Options.MaxKeys] keys are remembered. Entries past their
// admissible instant are dropped when a lookup meets them. To make room, a
// full cache samples a few entries (map iteration starts at a random
// place), drops those already expired and, when none was, evicts the
// sampled entry closest to its admissible instant: the one that would have
// saved the fewest calls. Each insertion therefore costs O(1), even when an
// attacker fills the cache with live refusals.
package overlimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// evictionSample is how many entries a full cache inspects to make room.
const evictionSample = 8

// Options configure a [Cache].
type Options struct {
	// MaxKeys bounds the number of keys remembered at once. Required,
	// above zero.
	MaxKeys int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Cache is the over-limit cache around an inner [algo.Backend]. Create it
// with [New]. It is safe for concurrent use.
type Cache struct {
	inner   algo.Backend
	now     func() time.Time
	maxKeys int

	mu sync.Mutex
	m  map[string]entry

	hits, misses atomic.Uint64
	size         atomic.Int64
}

// entry is a remembered refusal. Instants are µs since the Unix epoch.
type entry struct {
	limit      algo.Limit
	hits       uint64
	remaining  uint64
	admissible int64
	reset      int64
}

var _ algo.Backend = (*Cache)(nil)

var errShortOut = errors.New("overlimit: out is shorter than reqs")

// New returns a cache in front of inner, configured by opts.
func New(inner algo.Backend, opts Options) (*Cache, error) {
	if inner == nil {
		return nil, errors.New("overlimit: inner backend is nil")
	}
	if opts.MaxKeys <= 0 {
		return nil, errors.New("overlimit: MaxKeys must be above zero")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Cache{inner: inner, now: opts.Now, maxKeys: opts.MaxKeys, m: make(map[string]entry)}, nil
}

// Reset implements [algo.Resetter]: it forgets the keys' refusals and
// resets them in the inner backend, which must be an [algo.Resetter].
func (c *Cache) Reset(ctx context.Context, reqs []algo.Request) error {
	r, ok := c.inner.(algo.Resetter)
	if !ok {
		return errors.New("overlimit: the backend cannot reset keys")
	}
	c.mu.Lock()
	for i := range reqs {
		delete(c.m, string(reqs[i].Key))
	}
	c.size.Store(int64(len(c.m)))
	c.mu.Unlock()
	return r.Reset(ctx, reqs)
}

// Hits returns how many batches were answered locally.
func (c *Cache) Hits() uint64 { return c.hits.Load() }

// Misses returns how many batches were sent to the inner backend.
func (c *Cache) Misses() uint64 { return c.misses.Load() }

// Len returns the number of keys remembered, expired ones not yet dropped
// included.
func (c *Cache) Len() int { return int(c.size.Load()) }

// Decide implements [algo.Backend]: it answers reqs locally when the cache
// knows every request is refused, and otherwise asks the inner backend.
func (c *Cache) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	if len(out) < len(reqs) {
		return errShortOut
	}
	now := c.now().UnixMicro()
	if c.answer(now, reqs, out) {
		c.hits.Add(1)
		return nil
	}
	c.misses.Add(1)
	if err := c.inner.Decide(ctx, reqs, out); err != nil {
		return err
	}
	c.learn(now, reqs, out)
	return nil
}

// answer writes the local decisions for reqs and reports whether every
// request had a matching live entry. When it did not, out holds garbage.
func (c *Cache) answer(now int64, reqs []algo.Request, out []algo.Decision) bool {
	if len(reqs) == 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range reqs {
		r := &reqs[i]
		e, ok := c.m[string(r.Key)]
		if !ok || r.Op != algo.OpDecide || r.Count && !r.Limit.Algorithm.FullUntilAdmissible() {
			return false
		}
		if now >= e.admissible {
			delete(c.m, string(r.Key))
			c.size.Store(int64(len(c.m)))
			return false
		}
		if e.limit != r.Limit || r.Hits < e.hits {
			return false
		}
		out[i] = algo.Decision{
			Remaining:  e.remaining,
			RetryAfter: time.Duration(e.admissible-now) * time.Microsecond,
			ResetAfter: time.Duration(e.reset-now) * time.Microsecond,
		}
	}
	return true
}

// learn updates the cache from the inner backend's decisions out for reqs,
// decided at now.
func (c *Cache) learn(now int64, reqs []algo.Request, out []algo.Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range reqs {
		r, d := &reqs[i], &out[i]
		switch {
		case r.Hits == 0, r.Op != algo.OpDecide:
			// Nothing counted, or a slot: one given back frees it sooner
			// than any refusal can tell.
		case d.Allowed:
			delete(c.m, string(r.Key))
		case d.RetryAfter > 0 && d.RetryAfter != algo.Never && !seenBefore(reqs, i):
			admissible := now + d.RetryAfter.Microseconds()
			c.store(now, r.Key, entry{
				limit:      r.Limit,
				hits:       r.Hits,
				remaining:  d.Remaining,
				admissible: admissible,
				reset:      max(now+d.ResetAfter.Microseconds(), admissible),
			})
		}
	}
	c.size.Store(int64(len(c.m)))
}

// seenBefore reports whether reqs[i]'s key appears earlier in reqs.
func seenBefore(reqs []algo.Request, i int) bool {
	for j := range i {
		if string(reqs[j].Key) == string(reqs[i].Key) {
			return true
		}
	}
	return false
}

// store remembers e under a copy of key, making room first when the cache
// is full. c.mu must be held.
func (c *Cache) store(now int64, key []byte, e entry) {
	if _, ok := c.m[string(key)]; !ok && len(c.m) >= c.maxKeys {
		c.makeRoom(now)
	}
	c.m[string(key)] = e
}

// makeRoom frees at least one slot: the expired entries of a small sample,
// or else the sampled entry closest to its admissible instant. c.mu must
// be held.
func (c *Cache) makeRoom(now int64) {
	var (
		victim  string
		soonest int64
		seen    int
		freed   bool
	)
	for k, e := range c.m {
		switch {
		case e.admissible <= now:
			delete(c.m, k)
			freed = true
		case seen == 0 || e.admissible < soonest:
			victim, soonest = k, e.admissible
		}
		if seen++; seen == evictionSample {
			break
		}
	}
	if !freed {
		delete(c.m, victim)
	}
}
