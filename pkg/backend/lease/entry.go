package lease

import (
	"math"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// entry is what a replica knows and holds of one key. Every field is
// guarded by the mutex of the key's shard.
type entry struct {
	key   string
	limit algo.Limit
	// global is the key's scope across regions, carried to the takes a
	// region engine below decides (algo.Request.Global).
	global algo.Global
	// cur and next are the leases held: budget taken from the store and
	// not yet spent. Hits are spent from cur first; next is the lease
	// fetched before cur ran out.
	cur, next slice
	// fetching is set while a sized take is in flight: at most one per
	// key, so that concurrent requests for a cold key do not each lease a
	// share of the budget. flight, when not nil, is closed when a take
	// that a decision is waiting on settles: other requests for the key
	// wait for it rather than each calling the store.
	fetching bool
	flight   chan struct{}
	// known is set once the store has answered for the key; shared and
	// resetAt are what it said then: the hits it had left beyond this
	// replica's leases, and when the limit is fully restored (ns).
	known   bool
	shared  uint64
	resetAt int64
	// rate is the key's hits on this replica, decayed with a time constant
	// of one period: about the hits of the last period. rateAt is when it
	// was last decayed, born its first request, lastUse the last (ns).
	rate    float64
	rateAt  int64
	born    int64
	lastUse int64
	// seq numbers the slices, so that a reservation finds its own.
	seq uint64
	// inflight counts the calls between reserving and settling on the
	// entry: it is not forgotten while one may still put hits back.
	inflight int
}

// slice is one lease: n hits left to spend until deadline (ns, local
// clock), named mark in the store.
type slice struct {
	n        uint64
	deadline int64
	mark     int64
	id       uint64
}

// held returns the hits the entry holds.
func (en *entry) held() uint64 { return en.cur.n + en.next.n }

// observe adds hits at now to the key's rate.
func (en *entry) observe(now int64, hits uint64, period float64) {
	if en.rate == 0 && en.born == 0 {
		en.born = now
	}
	if dt := now - en.rateAt; dt > 0 && en.rate > 0 {
		en.rate *= math.Exp(-float64(dt) / period)
	}
	en.rate += float64(hits)
	en.rateAt = now
	en.lastUse = now
}

// want returns the size of the next lease: the hits the key saw in about
// the last period, so that a lease lasts about a period. A key younger
// than a period has seen only part of one: its count is scaled up to a
// period, by at most 4, so that a key's leases reach their size within a
// few of its requests rather than one at a time over a whole period. A
// key seen once wants one hit: a cold key leases nothing beyond its own
// requests.
func (en *entry) want(now int64, period float64) uint64 {
	r := en.rate
	if dt := now - en.rateAt; dt > 0 {
		r *= math.Exp(-float64(dt) / period)
	}
	if age := float64(now - en.born); r > 1 && age < period {
		r *= period / max(age, period/4)
	}
	return uint64(math.Ceil(r - 1e-9))
}

// expire moves the slices whose deadline is at or before by out of the
// entry and returns them, to be given back.
func (en *entry) expire(by int64) (gone [2]slice) {
	if en.next.n > 0 && en.next.deadline <= by {
		gone[1], en.next = en.next, slice{}
	}
	if en.cur.n > 0 && en.cur.deadline <= by {
		gone[0], en.cur = en.cur, slice{}
	}
	return gone
}

// add holds a new lease g, after the ones held. A replica holds at most
// two leases of a key: when two are held already (a reservation undone
// filled a slot again while g was on its way), g is returned, to be given
// back.
func (en *entry) add(g slice) (refused slice) {
	en.seq++
	g.id = en.seq
	if en.cur.n == 0 {
		en.cur, en.next = en.next, slice{}
	}
	switch {
	case en.cur.n == 0:
		en.cur = g
	case en.next.n == 0:
		en.next = g
	default:
		return g
	}
	return slice{}
}

// part is hits reserved from one slice.
type part struct {
	id, n    uint64
	mark     int64
	deadline int64
}

// reservation is what a request reserved of the entry's leases: from cur,
// then from next.
type reservation [2]part

// hits returns the hits reserved.
func (r *reservation) hits() uint64 { return r[0].n + r[1].n }

// reserve takes up to n hits from the leases held, oldest first.
func (en *entry) reserve(n uint64) reservation {
	var r reservation
	for i, s := range []*slice{&en.cur, &en.next} {
		k := min(n, s.n)
		if k == 0 {
			continue
		}
		s.n -= k
		n -= k
		r[i] = part{id: s.id, n: k, mark: s.mark, deadline: s.deadline}
	}
	// An emptied slice stays in place, so that a reservation undone finds
	// it; add and expire make room.
	return r
}

// unreserve puts back what r reserved, into the slices it came from when
// they are still held; the hits of slices gone since (expired, returned)
// are returned to be given back.
func (en *entry) unreserve(r *reservation) (orphans [2]part) {
	for i, p := range r {
		if p.n == 0 {
			continue
		}
		switch p.id {
		case en.cur.id:
			en.cur.n += p.n
		case en.next.id:
			en.next.n += p.n
		default:
			orphans[i] = p
		}
	}
	return orphans
}
