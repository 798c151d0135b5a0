package algo

import "sort"

// holders are the holders of a Concurrency state ([State.Log]): triples
// (id high, id low, end µs), ordered by end, then by id. The functions
// below never write into the receiver's backing array.
type holders []int64

func (hs holders) len() int { return len(hs) / 3 }

// end returns the instant the slot of holder i ends.
func (hs holders) end(i int) int64 { return hs[3*i+2] }

// live returns the holders whose slot ends after now, and how many ended.
func (hs holders) live(now int64) (holders, int) {
	i := 0
	for i < hs.len() && hs.end(i) <= now {
		i++
	}
	return hs[3*i:], i
}

// find returns the index of holder h, or -1.
func (hs holders) find(h Holder) int {
	for i := range hs.len() {
		if uint64(hs[3*i]) == h[0] && uint64(hs[3*i+1]) == h[1] {
			return i
		}
	}
	return -1
}

// without returns hs less holder i, as a new slice.
func (hs holders) without(i int) holders {
	out := make(holders, 0, len(hs)-3)
	out = append(out, hs[:3*i]...)
	return append(out, hs[3*i+3:]...)
}

// with returns hs with holder h (or without, then with, when present)
// ending at end, in order, as a new slice.
func (hs holders) with(h Holder, end int64) holders {
	if i := hs.find(h); i >= 0 {
		hs = hs.without(i)
	}
	hi, lo := int64(h[0]), int64(h[1])
	at := sort.Search(hs.len(), func(i int) bool {
		e := hs.end(i)
		return e > end || e == end && (uint64(hs[3*i]) > h[0] || uint64(hs[3*i]) == h[0] && uint64(hs[3*i+1]) > h[1])
	})
	out := make(holders, 0, len(hs)+3)
	out = append(out, hs[:3*at]...)
	out = append(out, hi, lo, end)
	return append(out, hs[3*at:]...)
}

// concurrency is [Apply] for a [Concurrency] limit. now is in µs.
//
// An OpDecide is an acquire of Hits slots that stores nothing: it tells
// whether they are free. Every figure counts the holders whose slot has
// not ended: Remaining the slots free, ResetAfter the time until the last
// slot held ends, RetryAfter (of a refused acquire) the time until enough
// of them end, should none be given back sooner.
func concurrency(s *State, now int64, r *Request) Decision {
	l := r.Limit
	n, ttl := int64(l.Requests), windowMicros(l)
	hs := holders(s.Log)
	live, ended := hs.live(now)
	if live.len() == 0 && hs.len() > 0 && now >= hs.end(hs.len()-1)+ttl {
		// Every slot ended a lease TTL ago or more: the key's state is
		// gone, as a store keeps it no longer ([Keep]), and its holders
		// with it.
		ended = 0
	}
	figures := func(live holders) Decision {
		d := Decision{Remaining: uint64(max(n-int64(live.len()), 0))}
		if live.len() > 0 {
			d.ResetAfter = micros(live.end(live.len()-1) - now)
		}
		return d
	}
	// keep stores live as the state a request leaves, reporting the
	// holders it dropped.
	keep := func(live holders, d *Decision) {
		*s = State{Log: live}
		d.Mark = int64(ended)
	}

	i := live.find(r.Holder)
	switch r.Op {
	case OpAcquire:
		if i < 0 && int64(live.len())+1 > n {
			d := figures(live)
			d.RetryAfter = Never
			if n > 0 {
				d.RetryAfter = micros(live.end(live.len()-int(n)) - now)
			}
			return d
		}
		live = live.with(r.Holder, now+ttl)
		d := figures(live)
		d.Allowed, d.Taken, d.Valid = true, 1, micros(ttl)
		keep(live, &d)
		return d
	case OpRelease, OpRenew:
		if i < 0 {
			d := figures(live)
			d.Allowed = true
			return d
		}
		if r.Op == OpRelease {
			live = live.without(i)
		} else {
			live = live.with(r.Holder, now+ttl)
		}
		d := figures(live)
		d.Allowed, d.Taken = true, 1
		if r.Op == OpRenew {
			d.Valid = micros(ttl)
		}
		keep(live, &d)
		return d
	}
	// An acquire of Hits slots, stored by no one.
	d := figures(live)
	k := int64(min(r.Hits, uint64(n)+1))
	switch {
	case int64(live.len())+k <= n:
		d.Allowed = true
		d.Remaining -= uint64(k)
	case r.Hits > uint64(n):
		d.RetryAfter = Never
	default:
		d.RetryAfter = micros(live.end(live.len()+int(k)-int(n)-1) - now)
	}
	return d
}
