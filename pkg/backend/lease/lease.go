// Package lease decides the requests of leased limits (rate_limit
// consistency: leased) in process, from slices of their budget leased out
// of a shared store, so that a hot key almost never waits on Redis.
//
// An [Engine] wraps the backend that holds the shared state (the Redis
// backend, behind its circuit breaker) and is itself an [algo.Backend].
// Requests not marked [algo.Request.Leased] pass through unchanged.
//
// # Leases
//
// For each key in use, a replica holds up to two leases: hits the store
// counted against the limit at once ([algo.OpTake]), which the replica
// spends in process until the lease's deadline. A request whose hits the
// leases cover is decided with no call at all. One they do not cover asks
// the store, in the same atomic call as the request's other descriptors,
// for what is missing; the store refuses it only when the limit has no
// room left for it, as it would refuse an exact request.
//
// A lease is sized to the key's observed rate on this replica: about one
// [Options.Period] of its traffic, and never more than 1/[Options.Share] of
// what the limit has left. A key seen once leases nothing beyond its own
// hits; when little of a window remains, leases shrink to the hits of
// each request, which is exact mode. When the leases held fall below half
// a lease, the next one is fetched in the background (prefetch).
//
// A lease ends at its deadline: the end of the window it counts in, or
// for a bucket [Options.TTL] after it was taken; then the store no longer
// counts it and it is dropped. Hits held by a key gone cold (no request for
// a period), those beyond twice a period's traffic, and everything on
// [Engine.Close] are given back to the store ([algo.OpGive]). Background
// takes and gives gather for a moment and travel together, many keys to a
// call; requests for a key whose take is in flight wait for its lease.
//
// # Guarantees
//
// Safety: every hit admitted was counted by the store in the window it is
// admitted in (a lease never outlives its window), and a bucket's store
// keeps the tokens of the leases outstanding out of the bucket until they
// end. So leased limits admit no more than exact ones, across any number
// of replicas. The deadline of a lease is reckoned on this replica's clock
// from the instant before the store was asked, so it ends before the store
// stops counting it.
//
// A request that counts its hits whatever the answer ([algo.Request.Count])
// spends what its leases cover even when it or its batch is refused, and
// the store counts what they lack as it counts an exact request's.
//
// Liveness, the price: a request may be refused while budget sits unspent
// in another replica's leases. A replica refuses only after the store
// refused the missing hits; what it could have used instead is held by
// other replicas, at most two leases of at most 1/Share of the limit
// each, given back within a period and a sweep once their key goes cold.
// docs/leasing.md derives the bound and the property tests check it.
package lease

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Defaults for [Options].
const (
	DefaultTTL     = 40 * time.Second
	DefaultPeriod  = 20 * time.Second
	DefaultShare   = 8
	DefaultTimeout = 250 * time.Millisecond
	DefaultMaxKeys = 100_000
)

// numShards is the number of independently locked shards of keys.
const numShards = 64

// maxBatch bounds the background takes and gives of one call.
const maxBatch = 256

// stackBatch is the batch size decided without allocating scratch space.
const stackBatch = 8

// Options configure an [Engine]. The zero value selects every default.
type Options struct {
	// Now is the clock leases are timed by. Default time.Now.
	Now func() time.Time
	// TTL is how long a bucket's lease may be spent, and the store counts
	// it as outstanding; a window's lease is spent until its window ends.
	// A key that held nothing for a TTL is forgotten. Default DefaultTTL.
	TTL time.Duration
	// Period is how much of a key's traffic a lease covers: a lease is
	// sized to the hits the key saw on this replica in about the last
	// period. At most TTL. Default DefaultPeriod.
	Period time.Duration
	// Share caps each lease at 1/Share of what the limit has left.
	// Default DefaultShare.
	Share uint64
	// Timeout bounds each background call (prefetch, returns). Default
	// DefaultTimeout.
	Timeout time.Duration
	// MaxKeys bounds the keys tracked; past it, the coldest of a sample
	// is dropped, its leases given back. Default DefaultMaxKeys.
	MaxKeys int
	// Logger receives the engine's logs. Default: discard them.
	Logger *slog.Logger
	// Manual, for tests, starts no goroutine: background work waits in a
	// queue until [Engine.Flush] (or [Engine.Send] and [Engine.Deliver]),
	// and leases lapse and keys go cold on [Engine.Sweep]. A request then
	// never waits for another's take (tests that run work during a call,
	// in one goroutine, could not wake it).
	Manual bool
}

// Engine is a leasing [algo.Backend] in front of the backend that holds
// the shared state. Create it with [New]; it is safe for concurrent use.
type Engine struct {
	inner  algo.Backend
	now    func() time.Time
	base   time.Time // the zero of the engine's nanosecond clock
	ttl    time.Duration
	period float64 // ns
	share  uint64
	opts   Options
	log    *slog.Logger
	seed   maphash.Seed
	shards [numShards]shard
	perCap int // keys per shard

	qmu     sync.Mutex
	queue   []work // background takes and gives, in order
	sent    []sent // Manual: calls made, results not yet delivered
	kick    chan struct{}
	stop    chan struct{}
	done    sync.WaitGroup
	closing atomic.Bool

	stats counters
}

type shard struct {
	mu sync.Mutex
	m  map[string]*entry
	_  [64 - 16]byte
}

// work is a background take or give.
type work struct {
	en  *entry // the key's entry; for a take, the one to hold the lease
	req algo.Request
}

var _ algo.Backend = (*Engine)(nil)

var errShortOut = errors.New("lease: out is shorter than reqs")

// New returns an engine leasing from inner, configured by opts. Close it
// to give back what it holds.
func New(inner algo.Backend, opts Options) (*Engine, error) {
	if inner == nil {
		return nil, errors.New("lease: inner backend is nil")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.Period == 0 {
		opts.Period = min(DefaultPeriod, opts.TTL)
	}
	if opts.Share == 0 {
		opts.Share = DefaultShare
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	switch {
	case opts.TTL < time.Millisecond:
		return nil, fmt.Errorf("lease: TTL %v is under 1ms", opts.TTL)
	case opts.Period < time.Millisecond || opts.Period > opts.TTL:
		return nil, fmt.Errorf("lease: period %v is not between 1ms and the TTL (%v): a lease must last a period", opts.Period, opts.TTL)
	case opts.Timeout < 0 || opts.MaxKeys < 0:
		return nil, errors.New("lease: negative timeout or MaxKeys")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Engine{
		inner:  inner,
		now:    opts.Now,
		base:   opts.Now(),
		ttl:    opts.TTL,
		period: float64(opts.Period.Nanoseconds()),
		share:  opts.Share,
		opts:   opts,
		log:    opts.Logger,
		seed:   maphash.MakeSeed(),
		perCap: max(opts.MaxKeys/numShards, 1),
		kick:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	for i := range e.shards {
		e.shards[i].m = make(map[string]*entry)
	}
	if !opts.Manual {
		e.done.Add(2)
		go e.flushLoop()
		go e.sweepLoop()
	}
	return e, nil
}

// ns returns t on the engine's clock, in nanoseconds.
func (e *Engine) ns(t time.Time) int64 { return t.Sub(e.base).Nanoseconds() }

// leased reports whether r is decided from leases.
func leased(r *algo.Request) bool {
	return r.Leased && r.Op == algo.OpDecide && r.Limit.Algorithm.Leasable() && r.Limit.Check() == nil
}

// plan is one leased request's part in a call.
type plan struct {
	en   *entry
	res  reservation
	need uint64 // hits asked of the store: 0 when the leases covered them
	sub  int    // the index of its store request, -1 for none
	// sized marks a take that may lease more than need: this request
	// set en.fetching. most is then what it may take in all.
	sized bool
	most  uint64
	// read marks a request the leases cover that still asks the store,
	// for its figures: the key is new to this replica.
	read bool
}

// Decide implements [algo.Backend]: leased requests are decided from the
// leases held, with one call of the inner backend for what they lack and
// for every other request of the batch, all or nothing.
func (e *Engine) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	if len(out) < len(reqs) {
		return errShortOut
	}
	n := 0
	for i := range reqs {
		if leased(&reqs[i]) {
			n++
		}
	}
	if n == 0 {
		return e.inner.Decide(ctx, reqs, out)
	}
	if len(reqs) == 1 {
		if e.decideLocal(&reqs[0], &out[0]) {
			return nil
		}
		if done, err := e.awaitTake(ctx, &reqs[0], &out[0]); done || err != nil {
			return err
		}
	}
	var planBuf [stackBatch]plan
	plans := planBuf[:0]
	if len(reqs) > stackBatch {
		plans = make([]plan, 0, len(reqs))
	}
	plans = plans[:len(reqs)]
	now := e.now()
	at := e.ns(now)

	gives := e.reserve(at, reqs, plans)
	// What the leases lack goes to the store, with every other request.
	subs := 0
	for i := range reqs {
		if p := &plans[i]; p.en == nil || p.need > 0 || p.read {
			subs++
		}
	}
	if subs == 0 {
		e.stats.local.Add(uint64(n))
		e.settle(at, reqs, plans, nil, true, out)
		e.enqueue(gives)
		return nil
	}
	subReqs, first := e.storeBatch(reqs, plans, gives, subs)
	subOut := make([]algo.Decision, len(subReqs))
	e.countPlans(plans)
	e.stats.calls.Add(1)
	err := e.inner.Decide(ctx, subReqs, subOut)
	if err != nil {
		e.undo(reqs, plans)
		e.enqueue(gives)
		return err
	}
	admitted := admits(subReqs[first:], subOut[first:])
	if admitted {
		e.countGiven(gives)
	} else {
		e.enqueue(gives) // a refused batch stores nothing, gives included
	}
	e.settle(at, reqs, plans, subOut, admitted, out)
	return nil
}

// awaitTake decides a request r its leases do not cover, alone in its
// batch, once a take of its key on its way to the store for another
// request settles: that take's lease may cover r too (a hot key whose
// window just rolled over, or first seen by many callers at once). It
// returns ctx's error if ctx ends first, and done false when no take is
// on its way or its lease does not cover r: r then takes the general
// path.
func (e *Engine) awaitTake(ctx context.Context, r *algo.Request, out *algo.Decision) (done bool, _ error) {
	ch := e.inFlight(r)
	if ch == nil {
		return false, nil
	}
	e.stats.waits.Add(1)
	select {
	case <-ch:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return e.decideLocal(r, out), nil
}

// storeBatch returns the requests of the store call of a batch whose
// leases are reserved (plans), of which subs ask the store: first the
// leases set aside while reserving (gives: a rule's limit changed, a key
// evicted to make room), so that what the batch lacks may come from them,
// then from index first the batch's requests the leases do not cover
// (takes of what they lack, a peek's or a first read's figures) and its
// requests not leased. It sets each plan's sub.
func (e *Engine) storeBatch(reqs []algo.Request, plans []plan, gives []work, subs int) (subReqs []algo.Request, first int) {
	subReqs = make([]algo.Request, 0, subs+len(gives))
	for _, g := range gives {
		subReqs = append(subReqs, g.req)
	}
	first = len(subReqs)
	for i := range reqs {
		p := &plans[i]
		p.sub = -1
		r := reqs[i]
		switch {
		case p.en == nil:
		case p.need > 0 && !r.Peek:
			r.Op = algo.OpTake
			r.Hits = p.need
			r.Lease = algo.Lease{Max: max(p.most, p.need), Share: e.share, TTL: e.ttl}
		case p.need > 0 || p.read:
			r.Hits = p.need // a peek, or a first read: the store's figures
		default:
			continue
		}
		p.sub = len(subReqs)
		subReqs = append(subReqs, r)
	}
	return subReqs, first
}

// countPlans counts the leased requests of a batch that asked the store,
// and those their leases decided alone.
func (e *Engine) countPlans(plans []plan) {
	for i := range plans {
		switch {
		case plans[i].en == nil:
		case plans[i].sub >= 0:
			e.stats.backend.Add(1)
		default:
			e.stats.local.Add(1)
		}
	}
}

// admits reports whether the store admitted the requests reqs of a
// batch, deciding them out: each one allowed, or in shadow mode.
func admits(reqs []algo.Request, out []algo.Decision) bool {
	admitted := true
	for j := range reqs {
		if !out[j].Allowed && !reqs[j].Shadow {
			admitted = false
		}
	}
	return admitted
}

// decideLocal decides r alone when its leases cover it, in one pass
// under its shard's lock: the path of most decisions of a hot key. It
// reports false, having changed nothing, when r needs the general path.
func (e *Engine) decideLocal(r *algo.Request, out *algo.Decision) bool {
	if !leased(r) || r.Peek || r.Hits == 0 {
		return false
	}
	at := e.ns(e.now())
	sh := &e.shards[maphash.Bytes(e.seed, r.Key)%numShards]
	sh.mu.Lock()
	en := sh.m[string(r.Key)]
	var s *slice
	switch {
	case en == nil || !en.known || en.limit != r.Limit:
	case en.cur.n >= r.Hits && en.cur.deadline > at:
		s = &en.cur
	case en.cur.n == 0 && en.next.n >= r.Hits && en.next.deadline > at:
		s = &en.next
	}
	if s == nil {
		sh.mu.Unlock()
		return false
	}
	en.observe(at, r.Hits, e.period)
	s.n -= r.Hits
	held := en.held()
	*out = algo.Decision{Allowed: true, Remaining: en.shared + held}
	if reset := en.resetAt - at; reset > 0 {
		out.ResetAfter = time.Duration(reset)
	}
	w, due := e.prefetchDue(at, en)
	sh.mu.Unlock()
	e.stats.local.Add(1)
	e.stats.held.Add(-int64(r.Hits))
	if due {
		e.enqueue([]work{w})
	}
	return true
}

// inFlight returns the channel closed when the take in flight for r's key
// settles, or nil when none is.
func (e *Engine) inFlight(r *algo.Request) chan struct{} {
	if !leased(r) || r.Peek || r.Hits == 0 || e.opts.Manual {
		return nil
	}
	sh := &e.shards[maphash.Bytes(e.seed, r.Key)%numShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if en := sh.m[string(r.Key)]; en != nil && en.limit == r.Limit {
		return en.flight
	}
	return nil
}

// land ends the sized take p started: it wakes the requests waiting for
// it. en's shard must be locked.
func (p *plan) land() {
	if !p.sized {
		return
	}
	p.en.fetching = false
	if p.en.flight != nil {
		close(p.en.flight)
		p.en.flight = nil
	}
}

// reserve locks the shards of the leased requests and, for each, finds
// its entry and reserves what its leases cover; it fills plans and
// returns the leases set aside, to be given back.
func (e *Engine) reserve(at int64, reqs []algo.Request, plans []plan) []work {
	var gives []work
	e.lockAll(reqs, func(i int, sh *shard) {
		r := &reqs[i]
		p := &plans[i]
		*p = plan{sub: -1}
		en := e.entryOf(sh, r, at, &gives)
		en.inflight++
		p.en = en
		e.drop(en.expire(at))
		// A check of zero hits that counts asks the store, which refuses
		// it while the limit is past what it admits (algo's stepWith).
		p.read = !en.known || r.Hits == 0 && r.Counting()
		// Hits reserved by earlier requests of the batch are not held.
		if r.Peek || r.Hits == 0 {
			avail := en.held()
			if r.Hits > avail {
				p.need = r.Hits - avail
			}
			return
		}
		en.observe(at, r.Hits, e.period)
		p.res = en.reserve(r.Hits)
		if got := p.res.hits(); got < r.Hits {
			p.need = r.Hits - got
			if !en.fetching {
				en.fetching, p.sized = true, true
				en.flight = make(chan struct{})
				// A period's traffic beyond this request's own hits:
				// none for a key seen once.
				if w := en.want(at, e.period); w > r.Hits {
					p.most = p.need + w - r.Hits
				}
			}
		}
	})
	return gives
}

// entryOf returns the entry of r's key in sh, creating it; an entry of
// another limit (the rule changed) is started afresh, its leases given
// back. sh must be locked.
func (e *Engine) entryOf(sh *shard, r *algo.Request, at int64, gives *[]work) *entry {
	en := sh.m[string(r.Key)]
	if en != nil && en.limit != r.Limit {
		for _, s := range [2]slice{en.cur, en.next} {
			*gives = e.appendGive(*gives, en, s.n, s.mark)
		}
		*en = entry{key: en.key, limit: r.Limit, fetching: en.fetching, flight: en.flight, inflight: en.inflight, seq: en.seq}
	}
	if en == nil {
		if len(sh.m) >= e.perCap {
			*gives = e.evict(sh, at, *gives)
		}
		en = &entry{key: string(r.Key), limit: r.Limit}
		sh.m[en.key] = en
		e.stats.keys.Add(1)
	}
	en.global = r.Global
	return en
}

// settle ends a call: it commits or undoes the reservations, holds the
// leases taken, writes the decisions and starts the prefetches due.
// subOut is nil when no call was made.
func (e *Engine) settle(at int64, reqs []algo.Request, plans []plan, subOut []algo.Decision, admitted bool, out []algo.Decision) {
	var gives []work
	var prefetch []work
	e.lockAll(reqs, func(i int, sh *shard) {
		p := &plans[i]
		en := p.en
		en.inflight--
		r := &reqs[i]
		var d *algo.Decision
		if p.sub >= 0 {
			d = &subOut[p.sub]
		}
		p.land()
		// A request that counts (Request.Count) spends what it reserved
		// whatever the answer; the store counted the rest.
		spent := !r.Peek && (admitted && (d == nil || d.Allowed) || r.Counting())
		if !spent {
			for _, o := range en.unreserve(&p.res) {
				gives = e.appendGive(gives, en, o.n, o.mark)
			}
		}
		if d != nil {
			en.known = true
			en.shared, en.resetAt = d.Remaining, at+d.ResetAfter.Nanoseconds()
			if spent && d.Taken > p.need {
				e.stats.taken.Add(d.Taken - p.need)
				e.stats.takes.Add(1)
				e.stats.held.Add(int64(d.Taken - p.need))
				g := slice{n: d.Taken - p.need, deadline: at + d.Valid.Nanoseconds(), mark: d.Mark}
				if left := en.add(g); left.n > 0 {
					gives = e.appendGive(gives, en, left.n, left.mark)
				}
			}
		}
		if spent {
			e.stats.held.Add(-int64(p.res.hits()))
		}
		out[i] = e.decision(at, en, d, r, p)
		if !r.Peek && r.Hits > 0 {
			if w, ok := e.prefetchDue(at, en); ok {
				prefetch = append(prefetch, w)
			}
		}
	})
	if subOut != nil {
		for i := range reqs {
			if plans[i].en == nil {
				out[i] = subOut[plans[i].sub]
			}
		}
	}
	e.enqueue(gives)
	e.enqueue(prefetch)
}

// decision is the answer to leased request r: the store's decision d when
// it was asked (its remaining plus what this replica holds), else one from
// the leases held.
func (e *Engine) decision(at int64, en *entry, d *algo.Decision, r *algo.Request, p *plan) algo.Decision {
	held := en.held()
	if r.Peek && d != nil && d.Allowed {
		held -= min(held, r.Hits-p.need) // a peek's hits, as if spent
	}
	if d != nil {
		out := *d
		out.Taken, out.Mark, out.Valid = 0, 0, 0
		out.Remaining += held
		return out
	}
	if r.Peek {
		held -= min(held, r.Hits)
	}
	out := algo.Decision{Allowed: true, Remaining: en.shared + held}
	if reset := en.resetAt - at; reset > 0 {
		out.ResetAfter = time.Duration(reset)
	}
	return out
}

// prefetchDue returns the take that refills the leases of en, when they
// have fallen to half a lease and no take is in flight. en's shard must
// be locked.
func (e *Engine) prefetchDue(at int64, en *entry) (work, bool) {
	if en.fetching || e.closing.Load() || (en.cur.n > 0 && en.next.n > 0) {
		return work{}, false
	}
	want := en.want(at, e.period)
	if want < 2 || en.held() > want/2 {
		return work{}, false
	}
	en.fetching = true
	return work{en: en, req: algo.Request{
		Key:    []byte(en.key),
		Limit:  en.limit,
		Op:     algo.OpTake,
		Lease:  algo.Lease{Max: want, Share: e.share, TTL: e.ttl},
		Global: en.global,
	}}, true
}

// undo puts back every reservation of a call that failed, and ends the
// sized takes it started.
func (e *Engine) undo(reqs []algo.Request, plans []plan) {
	var gives []work
	e.lockAll(reqs, func(i int, sh *shard) {
		p := &plans[i]
		p.en.inflight--
		p.land()
		for _, o := range p.en.unreserve(&p.res) {
			gives = e.appendGive(gives, p.en, o.n, o.mark)
		}
	})
	e.enqueue(gives)
}

// appendGive appends the give of n hits of lease mark of en's key, unless
// n is 0.
func (e *Engine) appendGive(gives []work, en *entry, n uint64, mark int64) []work {
	if n == 0 {
		return gives
	}
	e.stats.held.Add(-int64(n))
	return append(gives, work{en: en, req: algo.Request{
		Key:   []byte(en.key),
		Limit: en.limit,
		Hits:  n,
		Op:    algo.OpGive,
		Lease: algo.Lease{Mark: mark},
	}})
}

// lockAll locks the shards of the leased requests of reqs, in ascending
// order, calls f for each leased request with its shard, and unlocks.
func (e *Engine) lockAll(reqs []algo.Request, f func(i int, sh *shard)) {
	var idxBuf [stackBatch]uint8
	idx := idxBuf[:0]
	var mask uint64 // shards locked, as a bit set
	for i := range reqs {
		if !leased(&reqs[i]) {
			continue
		}
		s := uint8(maphash.Bytes(e.seed, reqs[i].Key) % numShards)
		idx = append(idx, s)
		mask |= 1 << s
	}
	for s := range numShards {
		if mask&(1<<s) != 0 {
			e.shards[s].mu.Lock()
		}
	}
	j := 0
	for i := range reqs {
		if !leased(&reqs[i]) {
			continue
		}
		f(i, &e.shards[idx[j]])
		j++
	}
	for s := numShards - 1; s >= 0; s-- {
		if mask&(1<<s) != 0 {
			e.shards[s].mu.Unlock()
		}
	}
}

// Reset implements [algo.Resetter]: it drops this replica's leases of the
// keys, without giving them back, and resets the keys in the inner
// backend, which must be an [algo.Resetter].
func (e *Engine) Reset(ctx context.Context, reqs []algo.Request) error {
	r, ok := e.inner.(algo.Resetter)
	if !ok {
		return errors.New("lease: the backend cannot reset keys")
	}
	for i := range reqs {
		k := reqs[i].Key
		sh := &e.shards[maphash.Bytes(e.seed, k)%numShards]
		sh.mu.Lock()
		if en := sh.m[string(k)]; en != nil {
			e.stats.held.Add(-int64(en.held()))
			delete(sh.m, string(k))
			e.stats.keys.Add(-1)
		}
		sh.mu.Unlock()
	}
	return r.Reset(ctx, reqs)
}
