package algotest

import (
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// reserveStep is a step that holds a reservation of hits for ttl.
func reserveStep(at time.Duration, hits uint64, ttl time.Duration, want algo.Decision) LeaseStep {
	return LeaseStep{Step: Step{at, hits, want}, Op: algo.OpReserve, Lease: algo.Lease{TTL: ttl}}
}

// settleStep is a step that charges hits and releases the oldest
// reservation.
func settleStep(at time.Duration, hits uint64, want algo.Decision) LeaseStep {
	return LeaseStep{Step: Step{at, hits, want}, Op: algo.OpSettle}
}

// ReserveCases returns the vectors of reservations (algo.OpReserve,
// algo.OpSettle), hand-computed: what they hold, what a settle charges and
// releases and where, the reservations that end on their own, and the
// slots they share. A TTL of 800 ms rounds ends up to 50 ms. A settle
// releases the reservation made first; its Valid is how long that
// reservation was held: since its slot's reservations were made, on
// average.
func ReserveCases() []LeaseCase {
	ttl := 800 * ms
	fw := limit(algo.FixedWindow, 10, sec)
	long := limit(algo.FixedWindow, 10, 10*sec)
	big := limit(algo.FixedWindow, 100, 10*sec)
	return []LeaseCase{
		{"a reservation holds budget until a settle charges its cost and releases it", fw, []LeaseStep{
			// Ends at 900 ms; the key lives until the window ends at 1 s.
			reserveStep(100*ms, 4, ttl, took(6, 900*ms, 4, mark(900*ms), 800*ms)),
			reserveStep(200*ms, 4, ttl, took(2, 800*ms, 4, mark(sec), 800*ms)),
			// 4 do not fit: they would once the first reservation ends.
			reserveStep(250*ms, 4, ttl, no(2, 750*ms, 650*ms)),
			// 3 charged to the window, the oldest reservation released.
			settleStep(300*ms, 3, took(3, 700*ms, 4, mark(900*ms), 200*ms)),
			decide(400*ms, 0, ok(3, 600*ms)),
			// A cost over its reservation is charged whole.
			settleStep(500*ms, 6, took(1, 500*ms, 4, mark(sec), 300*ms)),
			// With none outstanding, a settle is charged all the same:
			// 11 of 10, and nothing fits until the window ends.
			settleStep(600*ms, 2, ok(0, 400*ms)),
			reserveStep(700*ms, 1, ttl, no(0, 300*ms, 300*ms)),
			reserveStep(1100*ms, 1, ttl, took(9, 900*ms, 1, mark(1900*ms), 800*ms)),
		}},
		{"a settle of a reservation made in an ended window charges nothing", fw, []LeaseStep{
			// Ends at 1.6 s, in the next window: the key lives until then.
			reserveStep(800*ms, 5, ttl, took(5, 800*ms, 5, mark(1600*ms), 800*ms)),
			// The next window admits 10: the reservation of the first one
			// does not count there.
			reserveStep(1200*ms, 5, ttl, took(5, 800*ms, 5, mark(2*sec), 800*ms)),
			// The oldest, the first window's, is released; its 7 are
			// charged to that window, which has ended.
			settleStep(1300*ms, 7, took(5, 700*ms, 5, mark(1600*ms), 500*ms)),
			// The second reservation ended at 2 s.
			decide(2100*ms, 0, ok(10, 0)),
		}},
		{"a reservation never settled ends on its own", long, []LeaseStep{
			reserveStep(100*ms, 8, ttl, took(2, 9900*ms, 8, mark(900*ms), 800*ms)),
			reserveStep(500*ms, 5, ttl, no(2, 9500*ms, 400*ms)),
			reserveStep(900*ms, 5, ttl, took(5, 9100*ms, 5, mark(1700*ms), 800*ms)),
			settleStep(sec, 3, took(7, 9*sec, 5, mark(1700*ms), 100*ms)),
			// Nothing outstanding: a cost of 0 changes nothing.
			settleStep(1100*ms, 0, ok(7, 8900*ms)),
		}},
		{"reservations of one slot share it, and the oldest is released first", big, []LeaseStep{
			// Made at 10 and 20 ms, both end at 850 ms: one slot.
			reserveStep(10*ms, 10, ttl, took(90, 9990*ms, 10, mark(850*ms), 840*ms)),
			reserveStep(20*ms, 21, ttl, took(69, 9980*ms, 21, mark(850*ms), 830*ms)),
			// Two reservations of 31 in all: one releases 15, the last 16,
			// each held since the slot's reservations were made, on
			// average: at 15 ms.
			settleStep(30*ms, 5, took(79, 9970*ms, 15, mark(850*ms), 15*ms)),
			settleStep(40*ms, 5, took(90, 9960*ms, 16, mark(850*ms), 25*ms)),
		}},
		{"the reservation made first is released first, though a later one ends sooner", big, []LeaseStep{
			// A TTL of 4 s rounds ends up to 250 ms: 4.1 s to 4.25 s.
			reserveStep(100*ms, 10, 4*sec, took(90, 9900*ms, 10, mark(4250*ms), 4150*ms)),
			reserveStep(200*ms, 20, ttl, took(70, 9800*ms, 20, mark(sec), 800*ms)),
			// The first made is released, though it ends last.
			settleStep(300*ms, 5, took(75, 9700*ms, 10, mark(4250*ms), 200*ms)),
			// The second ended at 1 s on its own: nothing is held.
			decide(1100*ms, 0, ok(95, 8900*ms)),
		}},
	}
}
