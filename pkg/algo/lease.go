package algo

import (
	"time"
)

// Apply applies request r to the state *s at now, as a backend does for
// one request of a batch, and returns its decision: [Step] for an
// [OpDecide], a lease for an [OpTake], a return for an [OpGive], a
// reservation for an [OpReserve], a charge for an [OpSettle]. Like Step,
// it changes *s only when the request changes the state (see [Stores]).
//
// Every backend that keeps state in Go applies requests with Apply; the
// Lua twins in the decision script apply them the same way.
func Apply(s *State, now time.Time, r *Request) Decision {
	l := r.Limit
	if l.Algorithm == Concurrency && l.Check() == nil {
		return concurrency(s, now.UnixMicro(), r)
	}
	leasable := l.Algorithm.Leasable() && l.Check() == nil
	switch {
	case r.Op == OpGive && leasable:
		d := give(s, now.UnixMicro(), l, r.Hits, r.Lease.Mark)
		if d.ResetAfter == 0 {
			// Nothing counts any more: no state, as a store that expires
			// keys at their reset keeps none (even for a clock that later
			// steps back).
			*s = State{}
		}
		return d
	case r.Op == OpGive:
		// Nothing of this limit is ever leased, so nothing comes back.
		d := Step(s, now, l, 0)
		d.Allowed = true
		return d
	}
	if l.Algorithm == FixedWindow && l.Check() == nil {
		switch r.Op {
		case OpReserve:
			return reserve(s, now.UnixMicro(), l, r.Hits, max(r.Lease.TTL.Microseconds(), 1))
		case OpSettle:
			return settle(s, now.UnixMicro(), l, r.Hits)
		}
	}
	if r.Op == OpSettle {
		// A settle of another algorithm is a cost counted whatever the
		// answer.
		c := *r
		c.Op, c.Count = OpDecide, true
		r = &c
	}
	strict := r.Counting() && r.Hits == 0
	if r.Op == OpTake && leasable && !r.Peek && r.Lease.TTL > 0 {
		return overcount(s, now, r, take(s, now.UnixMicro(), l, r.Hits, r.Lease, strict))
	}
	return overcount(s, now, r, stepWith(s, now, l, r.Hits, strict))
}

// Stores reports whether a backend must store the state that [Apply] left
// for request r with decision d, once the batch is admitted: an allowed
// request that is no peek and consumed hits, took a lease or gave hits
// back to a limit that leases; a refused one that is no peek and was
// [Counted]; for a Concurrency limit, one that took, gave back or kept a
// slot.
func Stores(r *Request, d *Decision) bool {
	if r.Limit.Algorithm == Concurrency {
		return d.Allowed && !r.Peek && d.Taken > 0
	}
	if r.Peek {
		return false
	}
	return d.Allowed && (r.Hits > 0 || d.Taken > 0) && (r.Op != OpGive || r.Limit.Algorithm.Leasable()) || Counted(r, d)
}

// Keep returns how long a backend keeps the state that [Apply] left for
// request r with decision d, once stored: until it frees up, d.ResetAfter;
// for a Concurrency limit with slots held, one lease TTL longer, so that
// holders whose slots end without a release are still there for the key's
// next call to find, and report (Decision.Mark). Redis expires the key
// then; the memory backend drops it.
func Keep(r *Request, d *Decision) time.Duration {
	if r.Limit.Algorithm == Concurrency && d.ResetAfter > 0 {
		return d.ResetAfter + r.Limit.Window
	}
	return d.ResetAfter
}

// take is [Apply] for an OpTake of a leasable algorithm. now is in µs;
// strict, as for [stepWith].
func take(s *State, now int64, l Limit, hits uint64, ls Lease, strict bool) Decision {
	ttl := max(ls.TTL.Microseconds(), 1)
	switch l.Algorithm {
	case TokenBucket:
		return tokenBucketOp(s, now, l, hits, leaseOp{op: OpTake, max: ls.Max, share: ls.Share, ttl: ttl, strict: strict})
	case GCRA:
		return gcraOp(s, now, l, hits, leaseOp{op: OpTake, max: ls.Max, share: ls.Share, ttl: ttl, strict: strict})
	}
	step := fixedWindow
	if l.Algorithm == SlidingWindowCounter {
		step = slidingWindowCounter
	}
	orig := *s
	d := step(s, now, l, hits, strict)
	if !d.Allowed {
		return d
	}
	taken := leaseSize(hits, d.Remaining+hits, ls)
	if taken > hits {
		*s = orig
		d = step(s, now, l, taken, false) // taken fits what remained: allowed
		d.Mark = s.Time
		d.Valid = micros(s.Time + windowMicros(l) - now) // the window's end
	}
	d.Taken = taken
	return d
}

// leaseSize is what a take of hits takes when avail hits remain:
// max(hits, min(Max, avail / Share)).
func leaseSize(hits, avail uint64, ls Lease) uint64 {
	return max(hits, min(ls.Max, avail/max(ls.Share, 1)))
}

// give is [Apply] for an OpGive of a leasable algorithm. now is in µs.
func give(s *State, now int64, l Limit, hits uint64, mark int64) Decision {
	switch l.Algorithm {
	case TokenBucket:
		return tokenBucketOp(s, now, l, hits, leaseOp{op: OpGive, mark: mark})
	case GCRA:
		return gcraOp(s, now, l, hits, leaseOp{op: OpGive, mark: mark})
	case FixedWindow:
		// The hits count in the window they were taken in, or nowhere.
		if s.Time == mark && s.Count > 0 {
			if s.Count -= int64(min(hits, uint64(s.Count))); s.Count == 0 {
				*s = State{}
			}
		}
		d := fixedWindow(s, now, l, 0, false)
		return d
	default: // SlidingWindowCounter
		// The hits count in their window while it is current, then as the
		// previous window's.
		n := int64(min(hits, 1<<62))
		switch w := windowMicros(l); {
		case s.Time == mark && s.Count > 0:
			s.Count -= min(n, s.Count)
		case s.Time == mark+w && s.Prev > 0:
			s.Prev -= min(n, s.Prev)
		}
		if s.Count == 0 && s.Prev == 0 {
			*s = State{}
		}
		return slidingWindowCounter(s, now, l, 0, false)
	}
}

// leaseOp is what a bucket step does beyond deciding hits: a take or a
// give with its arguments (ttl in µs).
type leaseOp struct {
	op         Op
	max, share uint64
	ttl, mark  int64
	strict     bool // zero hits are refused while the limit is over (stepWith)
}

// taken returns what a bucket's request of hits takes when avail remain:
// its hits, or for a take the lease's size.
func (o leaseOp) taken(hits, avail uint64) uint64 {
	if o.op == OpTake {
		return leaseSize(hits, avail, Lease{Max: o.max, Share: o.share})
	}
	return hits
}

// hold returns live with the lease of a request that took taken hits for
// its own hits: what it took beyond them, outstanding for the TTL.
func (o leaseOp) hold(live leases, now int64, taken, hits uint64) leases {
	if taken > hits {
		return live.with(now+o.ttl, int64(taken-hits))
	}
	return live
}

// report fills the lease figures of a take's decision d.
func (o leaseOp) report(d *Decision, now int64, taken, hits uint64) {
	if o.op != OpTake {
		return
	}
	d.Taken = taken
	if taken > hits {
		d.Mark, d.Valid = now+o.ttl, micros(o.ttl)
	}
}

// leases are the leases outstanding on a bucket ([State.Log]): pairs
// (end, hits), ordered by end. The methods never write into the receiver's
// backing array: states may share it.
type leases []int64

// hits returns the hits of every lease.
func (ls leases) hits() int64 {
	var n int64
	for i := 1; i < len(ls); i += 2 {
		n += ls[i]
	}
	return n
}

// live returns the leases that end after now: ls itself when none ended.
func (ls leases) live(now int64) leases {
	i := 0
	for i < len(ls) && ls[i] <= now {
		i += 2
	}
	if i == 0 {
		return ls
	}
	return ls[i:]
}

// with returns ls with n more hits in the lease ending at end, added in
// order, as a new slice.
func (ls leases) with(end, n int64) leases {
	out := make(leases, 0, len(ls)+2)
	i := 0
	for i < len(ls) && ls[i] < end {
		out = append(out, ls[i], ls[i+1])
		i += 2
	}
	if i < len(ls) && ls[i] == end {
		out = append(out, end, ls[i+1]+n)
		i += 2
	} else {
		out = append(out, end, n)
	}
	return append(out, ls[i:]...)
}

// without returns ls with up to n hits taken out of the lease ending at
// mark, as a new slice, and the hits taken out: none when no lease ends at
// mark.
func (ls leases) without(mark, n int64) (leases, int64) {
	for i := 0; i < len(ls); i += 2 {
		if ls[i] != mark {
			continue
		}
		k := min(n, ls[i+1])
		out := make(leases, 0, len(ls))
		out = append(out, ls[:i]...)
		if ls[i+1] > k {
			out = append(out, mark, ls[i+1]-k)
		}
		return append(out, ls[i+2:]...), k
	}
	return ls, 0
}

// LeaseState is what a lease engine holds of one key in this process.
type LeaseState struct {
	// Held is the hits leased and not yet spent.
	Held uint64
	// Ends is the time until the first lease held ends; zero when none.
	Ends time.Duration
	// Rate is the key's observed rate on this replica, in hits per
	// second, which sizes its leases.
	Rate float64
	// Fetching is set while a lease is being taken.
	Fetching bool
}

// LeaseReader reports what a lease engine holds of a key, for operators
// (explain, Peek).
type LeaseReader interface {
	LeaseState(key []byte) (LeaseState, bool)
}
