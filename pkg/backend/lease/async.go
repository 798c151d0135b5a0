package lease

import (
	"context"
	"errors"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// sent is a background call made and not yet delivered.
type sent struct {
	batch []work
	out   []algo.Decision
	err   error
	at    int64 // when it was sent (ns)
}

// enqueue queues background work and wakes the flusher.
func (e *Engine) enqueue(ws []work) {
	if len(ws) == 0 {
		return
	}
	e.qmu.Lock()
	e.queue = append(e.queue, ws...)
	e.qmu.Unlock()
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// Queued returns the background takes and gives waiting for a call.
func (e *Engine) Queued() int {
	e.qmu.Lock()
	defer e.qmu.Unlock()
	return len(e.queue)
}

// flushWait is how long the flusher lets background work gather before
// it sends it: a twentieth of the period, from 1 to 50 ms. A prefetch is
// due at half a lease, with about half a period left, so the wait costs
// nothing, and one call carries the work of every key that came due
// meanwhile: a call costs Redis far more than an operation in it
// (docs/leasing.md).
func (e *Engine) flushWait() time.Duration {
	return min(max(time.Duration(e.period)/20, time.Millisecond), 50*time.Millisecond)
}

// flushLoop sends the queue whenever work arrives, until Close: it waits
// flushWait for more (unless a full call's worth is queued), then sends
// all.
func (e *Engine) flushLoop() {
	defer e.done.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-e.kick:
		}
		if e.Queued() < maxBatch {
			t.Reset(e.flushWait())
			select {
			case <-e.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
		for e.flushOnce(context.Background()) {
		}
	}
}

// flushOnce sends up to maxBatch queued takes and gives in one call and
// delivers the results. It reports whether there was anything to send.
func (e *Engine) flushOnce(ctx context.Context) bool {
	s, ok := e.send(ctx, maxBatch)
	if ok {
		e.deliver(s)
	}
	return ok
}

// Flush sends every queued take and give, in calls of up to 256, and
// delivers their results. It is for Options.Manual and for Close; the
// engine flushes by itself otherwise.
func (e *Engine) Flush(ctx context.Context) {
	for e.flushOnce(ctx) {
	}
}

// Send, for Options.Manual, sends up to max queued takes and gives in one
// call, whose results wait for [Engine.Deliver]: between the two, the
// store has applied the call and this replica does not know it yet, as
// while a reply is on its way. It returns how many it sent.
func (e *Engine) Send(ctx context.Context, max int) int {
	s, ok := e.send(ctx, max)
	if !ok {
		return 0
	}
	e.qmu.Lock()
	e.sent = append(e.sent, s)
	e.qmu.Unlock()
	return len(s.batch)
}

// Deliver, for Options.Manual, delivers the results of every call Send
// made.
func (e *Engine) Deliver() {
	e.qmu.Lock()
	ss := e.sent
	e.sent = nil
	e.qmu.Unlock()
	for _, s := range ss {
		e.deliver(s)
	}
}

// send takes up to max queued works off the queue and calls the inner
// backend with them: each is a take of no hits or a give, always allowed,
// so one call carries many keys' independent work.
func (e *Engine) send(ctx context.Context, max int) (sent, bool) {
	e.qmu.Lock()
	n := min(len(e.queue), max)
	if n == 0 {
		e.qmu.Unlock()
		return sent{}, false
	}
	batch := make([]work, n)
	copy(batch, e.queue)
	e.queue = append(e.queue[:0], e.queue[n:]...)
	e.qmu.Unlock()

	s := sent{batch: batch, out: make([]algo.Decision, n), at: e.ns(e.now())}
	reqs := make([]algo.Request, n)
	for i := range batch {
		reqs[i] = batch[i].req
	}
	ctx, cancel := context.WithTimeout(ctx, e.opts.Timeout)
	s.err = e.inner.Decide(ctx, reqs, s.out)
	cancel()
	e.stats.calls.Add(1)
	return s, true
}

// deliver applies the results of a background call: the leases taken are
// held (or given back when their key moved on), the gives counted.
func (e *Engine) deliver(s sent) {
	var gives []work
	for i, w := range s.batch {
		d := &s.out[i]
		switch w.req.Op {
		case algo.OpGive:
			if s.err != nil {
				e.stats.stranded.Add(w.req.Hits)
				continue
			}
			e.stats.gives.Add(1)
			e.stats.given.Add(w.req.Hits)
		case algo.OpTake:
			sh := e.shardOf(w.en.key)
			sh.mu.Lock()
			en := w.en
			en.fetching = false
			if s.err == nil {
				current := sh.m[en.key] == en && en.limit == w.req.Limit
				if current {
					en.known = true
					en.shared, en.resetAt = d.Remaining, s.at+d.ResetAfter.Nanoseconds()
				}
				if d.Allowed && d.Taken > 0 {
					e.stats.takes.Add(1)
					e.stats.taken.Add(d.Taken)
					e.stats.held.Add(int64(d.Taken))
					g := slice{n: d.Taken, deadline: s.at + d.Valid.Nanoseconds(), mark: d.Mark}
					switch {
					case !current || e.closing.Load():
						gives = e.appendGiveOf(gives, w.req.Key, w.req.Limit, g.n, g.mark)
					default:
						if left := en.add(g); left.n > 0 {
							gives = e.appendGive(gives, en, left.n, left.mark)
						}
					}
				}
			}
			sh.mu.Unlock()
		}
	}
	if s.err != nil {
		e.stats.errors.Add(1)
		if !errors.Is(s.err, context.Canceled) {
			e.log.Warn("lease: background call failed; leases held still decide until they end", "works", len(s.batch), "error", s.err)
		}
	}
	e.enqueue(gives)
}

// appendGiveOf is appendGive for a key without its entry.
func (e *Engine) appendGiveOf(gives []work, key []byte, l algo.Limit, n uint64, mark int64) []work {
	return e.appendGive(gives, &entry{key: string(key), limit: l}, n, mark)
}

// shardOf returns the shard of key.
func (e *Engine) shardOf(key string) *shard {
	return &e.shards[maphash.String(e.seed, key)%numShards]
}

// sweepEvery is how often the leases are swept: a quarter of the period,
// at most 250 ms (a window's leases end together; their keys' next leases
// are prefetched at the next sweep), at least 10 ms.
func (e *Engine) sweepEvery() time.Duration {
	return min(max(time.Duration(e.period)/4, 10*time.Millisecond), 250*time.Millisecond)
}

// sweepLoop sweeps every sweepEvery until Close.
func (e *Engine) sweepLoop() {
	defer e.done.Done()
	t := time.NewTicker(e.sweepEvery())
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			e.Sweep()
		}
	}
}

// Sweep drops the leases that have ended (the store no longer counts
// them: a window's has ended with it, a bucket's TTL has passed), gives
// back every lease of a key gone cold (no request for a period) and what
// a key holds beyond twice a period's traffic, and forgets keys that held
// nothing for a TTL. The engine sweeps by itself unless Options.Manual.
func (e *Engine) Sweep() {
	at := e.ns(e.now())
	cold := at - int64(e.period)
	idle := at - e.ttl.Nanoseconds()
	var gives, takes []work
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		for k, en := range sh.m {
			ended := en.expire(at)
			e.drop(ended)
			switch {
			case en.lastUse <= cold:
				gives = e.retire(gives, en)
			case !en.fetching:
				if want := en.want(at, e.period); en.held() > 2*max(want, 1) {
					gives = e.trim(gives, en, en.held()-want)
				} else if ended[0].n+ended[1].n > 0 {
					// A warm key's lease ended with its window (or its
					// TTL): the next one, now, in the background.
					if w, ok := e.prefetchDue(at, en); ok {
						takes = append(takes, w)
					}
				}
			}
			if en.held() == 0 && !en.fetching && en.inflight == 0 && en.lastUse <= idle {
				delete(sh.m, k)
				e.stats.keys.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
	e.enqueue(gives)
	e.enqueue(takes)
}

// drop forgets leases that have ended: their hits are counted as expired.
func (e *Engine) drop(gone [2]slice) {
	for _, g := range gone {
		if g.n > 0 {
			e.stats.expired.Add(g.n)
			e.stats.held.Add(-int64(g.n))
		}
	}
}

// trim gives back n hits of what en holds, from its newest lease first.
// en's shard must be locked.
func (e *Engine) trim(gives []work, en *entry, n uint64) []work {
	for _, s := range []*slice{&en.next, &en.cur} {
		k := min(n, s.n)
		if k == 0 {
			continue
		}
		s.n -= k
		n -= k
		gives = e.appendGive(gives, en, k, s.mark)
	}
	return gives
}

// retire gives back every lease en holds. en's shard must be locked.
func (e *Engine) retire(gives []work, en *entry) []work {
	gives = e.appendGive(gives, en, en.cur.n, en.cur.mark)
	gives = e.appendGive(gives, en, en.next.n, en.next.mark)
	en.cur.n, en.next.n = 0, 0
	return gives
}

// evict makes room in a full shard: of a few entries, the one used least
// recently is forgotten, its leases given back. sh must be locked.
func (e *Engine) evict(sh *shard, at int64, gives []work) []work {
	var victim *entry
	seen := 0
	for _, en := range sh.m {
		if en.inflight == 0 && !en.fetching && (victim == nil || en.lastUse < victim.lastUse) {
			victim = en
		}
		if seen++; seen == 8 {
			break
		}
	}
	if victim == nil {
		return gives
	}
	gives = e.retire(gives, victim)
	delete(sh.m, victim.key)
	e.stats.keys.Add(-1)
	e.stats.evicted.Add(1)
	return gives
}

// countGiven counts gives that went out with a decision's call.
func (e *Engine) countGiven(gives []work) {
	for _, g := range gives {
		e.stats.gives.Add(1)
		e.stats.given.Add(g.req.Hits)
	}
}

// Close stops the engine's goroutines and gives back every lease it holds,
// within ctx: call it on graceful shutdown, after the last decision, so
// that budget is not stranded until the leases end.
func (e *Engine) Close(ctx context.Context) error {
	if !e.closing.CompareAndSwap(false, true) {
		return nil
	}
	close(e.stop)
	e.done.Wait()
	e.Deliver()
	var gives []work
	for i := range e.shards {
		sh := &e.shards[i]
		sh.mu.Lock()
		for _, en := range sh.m {
			gives = e.retire(gives, en)
		}
		sh.mu.Unlock()
	}
	e.enqueue(gives)
	e.Flush(ctx)
	if n := e.Queued(); n > 0 {
		e.log.Warn("lease: leases not given back at shutdown; their budget returns when they end", "works", n, "error", ctx.Err())
		return ctx.Err()
	}
	return nil
}

// counters are the engine's statistics; see [Stats].
type counters struct {
	keys, held                         atomic.Int64
	local, backend, calls              atomic.Uint64
	takes, taken, gives, given         atomic.Uint64
	expired, stranded, errors, evicted atomic.Uint64
	waits                              atomic.Uint64
}

// Stats are an engine's statistics since it started.
type Stats struct {
	// Keys is the keys tracked; Held the hits held in leases, unspent.
	Keys, Held int64
	// Local and Backend count the leased decisions made in process and
	// those that called the inner backend; Calls the calls of it that
	// carried leased work: decisions' (with the batch's exact requests),
	// prefetches' and gives'. Batches without a leased request pass
	// through uncounted.
	Local, Backend, Calls uint64
	// Takes and Taken count the leases taken and their hits (beyond the
	// hits of the request that took them); Gives and Given the gives and
	// the hits they gave back.
	Takes, Taken, Gives, Given uint64
	// Expired is the hits unspent when their lease came to its end;
	// Stranded the hits that could not be given back because the call
	// failed (they return when their lease ends in the store); Errors the
	// background calls that failed; Evicted the keys forgotten to stay
	// within MaxKeys.
	Expired, Stranded, Errors, Evicted uint64
	// Waits counts requests that waited for another's take of their key
	// rather than calling the store themselves.
	Waits uint64
}

// Stats returns the engine's statistics.
func (e *Engine) Stats() Stats {
	c := &e.stats
	return Stats{
		Keys: c.keys.Load(), Held: c.held.Load(),
		Local: c.local.Load(), Backend: c.backend.Load(), Calls: c.calls.Load(),
		Takes: c.takes.Load(), Taken: c.taken.Load(), Gives: c.gives.Load(), Given: c.given.Load(),
		Expired: c.expired.Load(), Stranded: c.stranded.Load(), Errors: c.errors.Load(), Evicted: c.evicted.Load(),
		Waits: c.waits.Load(),
	}
}

// LeaseState implements [algo.LeaseReader]: what this replica holds of
// key now, if it tracks the key.
func (e *Engine) LeaseState(key []byte) (algo.LeaseState, bool) {
	sh := e.shardOf(string(key))
	at := e.ns(e.now())
	sh.mu.Lock()
	defer sh.mu.Unlock()
	en := sh.m[string(key)]
	if en == nil {
		return algo.LeaseState{}, false
	}
	st := algo.LeaseState{
		Held:     en.held(),
		Rate:     float64(en.want(at, e.period)) / (e.period / 1e9),
		Fetching: en.fetching,
	}
	for _, s := range [2]slice{en.cur, en.next} {
		if s.n > 0 && (st.Ends == 0 || time.Duration(s.deadline-at) < st.Ends) {
			st.Ends = max(time.Duration(s.deadline-at), 0)
		}
	}
	return st, true
}
