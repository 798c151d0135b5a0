package algo

import (
	"math"
	"time"
)

// Reservations hold a limit's budget for a cost known only later: a token
// budget of an LLM gateway, charged once the response has streamed
// (Envoy's apply_on_stream_done). An [OpReserve] of a [FixedWindow] is
// admitted when the window's count, the reservations outstanding in it and
// its own reservation fit N; it counts nothing and holds its reservation
// until an [OpSettle] releases it, or until it ends on its own (a stream
// whose cost never comes: a failed upstream, a client gone). A settle
// charges its hits and releases the oldest reservation outstanding: calls
// share no id, so which reservation is whose is not known, only how many
// are outstanding.
//
// A settle charges the window whose reservation it releases: the current
// window's count when that reservation was made in it, nothing when it was
// made in a window that has ended, whose count no decision reads any more;
// a settle that finds no reservation (it came after its own ended) charges
// the current window. So the costs of the streams a window admits, settled
// whenever, stay within N plus what each cost exceeded the reservation it
// released, plus the costs of settles that found none (docs/algorithms.md,
// reservations).
//
// Reservations are kept in [State.Log] as entries (end, count, hits,
// window, made): count reservations of hits in all, made in the window
// starting at window, the first at made, that end at end unless settled
// first; ordered by end, then window. Ends are rounded up to a slot of a
// sixteenth of the reservation's TTL (at least 1 ms), so that the
// reservations of one window made within a slot share an entry and a key
// keeps about seventeen per window they span; never more than
// maxReservationSlots. An entry's made is when its reservations were made
// on average, so that a settle reports how long the reservation it
// released was held without a slot's bias: what a caller learns how long
// reservations should last from, whatever TTL each replica gave them.
//
// A settle releases the reservation made first, not the one that ends
// first: reservations made with different TTLs (a lifetime learnt anew,
// replicas that learnt different ones) end out of the order they were
// made in. Released by end, a reservation made with a long TTL would
// outlast every later one: a stream that never settles leaves one
// reservation too many outstanding, and that one would be the long one,
// holding the window's budget until it ends instead of for the TTL now
// learnt.

// maxReservationSlots bounds the entries of a key's reservations: past
// it, a reservation joins the latest entry of its window, which ends no
// earlier than it would have.
const maxReservationSlots = 32

// rsvStride is the integers of one entry of reservations: end, count,
// hits, window, made.
const rsvStride = 5

// reservations are the reservations outstanding on a FixedWindow key
// ([State.Log]): entries (end, count, hits, window, made) of count
// reservations of hits in all, made in the window starting at window, on
// average at made, that end at end unless settled first; ordered by end,
// then window. The methods never write into the receiver's backing
// array: states may share it.
type reservations []int64

// live returns the reservations that end after now: rs itself when none
// ended.
func (rs reservations) live(now int64) reservations {
	i := 0
	for i+rsvStride <= len(rs) && rs[i] <= now {
		i += rsvStride
	}
	if i == 0 {
		return rs
	}
	return rs[i:]
}

// heldIn returns the hits of the reservations made in the window starting
// at window.
func (rs reservations) heldIn(window int64) int64 {
	var n int64
	for i := 0; i+rsvStride <= len(rs); i += rsvStride {
		if rs[i+3] == window {
			n += rs[i+2]
		}
	}
	return n
}

// lastEnd returns the end of the latest reservation, 0 when none.
func (rs reservations) lastEnd() int64 {
	if len(rs) < rsvStride {
		return 0
	}
	return rs[len(rs)-rsvStride]
}

// with returns rs with one more reservation of hits, made at made in
// window and ending at end, as a new slice.
func (rs reservations) with(end, window, hits, made int64) reservations {
	for i := 0; i+rsvStride <= len(rs); i += rsvStride {
		if rs[i] == end && rs[i+3] == window {
			out := append(reservations(nil), rs...)
			out[i+1]++
			out[i+2] += hits
			out[i+4] = meanMade(rs[i+4], made, out[i+1])
			return out
		}
	}
	count := int64(1)
	if len(rs)/rsvStride >= maxReservationSlots {
		// Join the latest entry of the window, which then ends at the
		// later of the two ends.
		for i := len(rs) - rsvStride; i >= 0; i -= rsvStride {
			if rs[i+3] == window {
				end, count, hits, made = max(end, rs[i]), rs[i+1]+1, rs[i+2]+hits, meanMade(rs[i+4], made, rs[i+1]+1)
				rs = append(append(reservations(nil), rs[:i]...), rs[i+rsvStride:]...)
				break
			}
		}
	}
	out := make(reservations, 0, len(rs)+rsvStride)
	i := 0
	for i+rsvStride <= len(rs) && (rs[i] < end || rs[i] == end && rs[i+3] < window) {
		i += rsvStride
	}
	out = append(out, rs[:i]...)
	out = append(out, end, count, hits, window, made)
	return append(out, rs[i:]...)
}

// released is a reservation a settle released.
type released struct {
	hits, end, window, made int64
}

// meanMade returns when an entry's count reservations were made on
// average, the entry's count-1 first ones made on average at was and one
// more at made: was moved by a count-th of the difference, rounded down
// (Lua's rsv_mean_made computes the same).
func meanMade(was, made, count int64) int64 {
	d := made - was
	q := d / count
	if d%count != 0 && d < 0 {
		q--
	}
	return was + q
}

// release returns rs without its oldest reservation, the one made first
// (of the entry made earliest, the first in order of those made as
// early: its hits over its count, the rest going with its last), as a new
// slice, and that reservation; a zero one and rs itself when none is
// outstanding.
func (rs reservations) release() (reservations, released) {
	if len(rs) < rsvStride {
		return rs, released{}
	}
	o := 0
	for i := rsvStride; i+rsvStride <= len(rs); i += rsvStride {
		if rs[i+4] < rs[o+4] {
			o = i
		}
	}
	r := released{end: rs[o], window: rs[o+3], made: rs[o+4]}
	count, held := rs[o+1], rs[o+2]
	if count <= 1 {
		r.hits = held
		if o == 0 {
			return rs[rsvStride:], r
		}
		return append(append(reservations(nil), rs[:o]...), rs[o+rsvStride:]...), r
	}
	r.hits = held / count
	out := append(reservations(nil), rs...)
	out[o+1], out[o+2] = count-1, held-r.hits
	return out, r
}

// reservationEnd returns when a reservation made at now for ttl µs ends:
// now + ttl rounded up to a slot of ttl/16, at least 1 ms.
func reservationEnd(now, ttl int64) int64 {
	g := max(ttl/16, 1000)
	e := now + max(ttl, 1)
	return e + floorMod(-e, g)
}

// reserve is [Apply] for an OpReserve of a FixedWindow: a reservation of
// hits for ttl µs, admitted when the window's count, the reservations made
// in it and hits fit N. It counts nothing.
func reserve(s *State, now int64, l Limit, hits uint64, ttl int64) Decision {
	v := viewWindow(s, now, l)
	if hits > v.remaining {
		return v.refusal(now, hits)
	}
	end := reservationEnd(now, ttl)
	live := v.live.with(end, v.start, int64(min(hits, maxCount)), now)
	*s = State{Time: v.start, Count: int64(v.used), Log: live}
	return Decision{Allowed: true, Remaining: v.remaining - hits, ResetAfter: windowReset(now, v.end, true, live),
		Taken: hits, Mark: end, Valid: micros(end - now)}
}

// settle is [Apply] for an OpSettle of a FixedWindow: hits charged to the
// window of the oldest reservation outstanding (the one made first),
// which it releases (the current window's count, or none when that window
// has ended), or to the current window when none is outstanding. It is always allowed: the hits
// were spent. Taken, Mark and Valid describe the reservation released:
// its hits, its end and how long it was held (since the reservations of
// its slot were made, on average: within a slot of how long it was).
func settle(s *State, now int64, l Limit, hits uint64) Decision {
	v := viewWindow(s, now, l)
	live, r := v.live.release()
	count := int64(v.used)
	if r.end == 0 || r.window == v.start {
		count = addCount(count, hits)
	}
	if count == 0 && len(live) == 0 {
		*s = State{}
	} else {
		*s = State{Time: v.start, Count: count, Log: live}
	}
	d := fixedWindow(s, now, l, 0, false)
	if r.end != 0 {
		d.Taken, d.Mark, d.Valid = uint64(r.hits), r.end, micros(max(now-r.made, 0))
	}
	return d
}

// windowView is what a FixedWindow state holds at an instant.
type windowView struct {
	start, end int64  // the window that counts at the instant
	used, held uint64 // its count, and the hits of the reservations made in it
	n          uint64 // N, at most what a count holds
	remaining  uint64 // what the window admits more: N - used - held, at least 0
	live       reservations
}

// viewWindow returns what the FixedWindow state s holds at now.
//
// A clock that steps back finds a stored window later than its own. Up to
// one window ahead, the stored window keeps counting until it ends, at
// most two windows away: a small step back neither reopens a spent budget
// nor holds it shut for long. A stored window further ahead is void, as if
// the window had passed; freezing a key for as long as the clock stepped
// back would be worse.
func viewWindow(s *State, now int64, l Limit) windowView {
	w := windowMicros(l)
	v := windowView{start: windowStart(s, now, w), n: min(l.Requests, math.MaxInt64)}
	v.end = v.start + w
	if s.Time == v.start && s.Count > 0 {
		v.used = uint64(s.Count)
	}
	v.live = reservations(s.Log).live(now)
	v.held = uint64(v.live.heldIn(v.start))
	if v.used+v.held < v.n {
		v.remaining = v.n - v.used - v.held
	}
	return v
}

// reset is the view's reset-after at now: see windowReset.
func (v *windowView) reset(now int64) time.Duration {
	return windowReset(now, v.end, v.used > 0 || v.held > 0, v.live)
}

// refusal is the decision refusing hits at now: the same hits fit when
// the window ends, or sooner when reservations made in it end before and
// leave room; never when they are more than N.
func (v *windowView) refusal(now int64, hits uint64) Decision {
	d := Decision{Remaining: v.remaining, ResetAfter: v.reset(now), RetryAfter: micros(v.end - now)}
	switch {
	case hits > v.n:
		d.RetryAfter = Never
	case v.used+hits <= v.n:
		room, held := v.n-v.used-hits, v.held
		for i := 0; i+rsvStride <= len(v.live) && v.live[i] < v.end; i += rsvStride {
			if v.live[i+3] != v.start {
				continue
			}
			if held -= uint64(v.live[i+2]); held <= room {
				d.RetryAfter = micros(v.live[i] - now)
				break
			}
		}
	}
	return d
}

// windowReset is a FixedWindow's reset-after at now: until its window
// ends at end when counts (it counts hits, or holds reservations made in
// it), and until its last reservation ends, whichever is later, so that
// a key lives as long as reservations it holds; zero when nothing counts.
func windowReset(now, end int64, counts bool, live reservations) time.Duration {
	var until int64
	if counts {
		until = end
	}
	if until = max(until, live.lastEnd()); until <= now {
		return 0
	}
	return micros(until - now)
}
