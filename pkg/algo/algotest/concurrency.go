package algotest

import (
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// slot is a step of holder h: op (an acquire, release or renew) at at.
func slot(at time.Duration, op algo.Op, h algo.Holder, want algo.Decision) LeaseStep {
	return LeaseStep{Step: Step{at, 1, want}, Op: op, Holder: h}
}

// held is the decision of an op that took, gave back or kept a slot:
// remaining slots free, reset until the last one ends, the holders whose
// slot had ended and were dropped, and the slot's TTL (0 for a release).
func held(remaining uint64, reset time.Duration, dropped int64, valid time.Duration) algo.Decision {
	d := ok(remaining, reset)
	d.Taken, d.Mark, d.Valid = 1, dropped, valid
	return d
}

// ConcurrencyCases returns the vectors of concurrency limits,
// hand-computed: slots taken, refused, taken again, given back, kept, and
// lost when their TTL ends.
func ConcurrencyCases() []LeaseCase {
	l := algo.Limit{Algorithm: algo.Concurrency, Requests: 2, Window: sec}
	a, b, c := algo.Holder{1, 1}, algo.Holder{2, 2}, algo.Holder{3, 3}
	return []LeaseCase{
		{"two slots, held, given back, kept and lost", l, []LeaseStep{
			slot(0, algo.OpAcquire, a, held(1, sec, 0, sec)),
			// b's slot ends at 1.1 s.
			slot(100*ms, algo.OpAcquire, b, held(0, sec, 0, sec)),
			// Full: a slot frees when a's ends, at 1 s.
			slot(200*ms, algo.OpAcquire, c, no(0, 900*ms, 800*ms)),
			// a acquires again: its TTL restarts (until 1.3 s).
			slot(300*ms, algo.OpAcquire, a, held(0, sec, 0, sec)),
			slot(400*ms, algo.OpRelease, b, held(1, 900*ms, 0, 0)),
			// Released twice: nothing to give back.
			slot(500*ms, algo.OpRelease, b, ok(1, 800*ms)),
			// a keeps its slot until 1.6 s.
			slot(600*ms, algo.OpRenew, a, held(1, sec, 0, sec)),
			slot(700*ms, algo.OpAcquire, c, held(0, sec, 0, sec)),
			// a's slot ended at 1.6 s: b takes it; a is dropped.
			slot(1650*ms, algo.OpAcquire, b, held(0, sec, 1, sec)),
			// c's slot ended at 1.7 s: too late to keep it.
			slot(1700*ms, algo.OpRenew, c, ok(1, 950*ms)),
			// Decisions ask whether slots are free and take none: 2 are
			// once b's slot ends at 2.65 s, 3 never are.
			{Step: Step{1800 * ms, 2, no(1, 850*ms, 850*ms)}},
			{Step: Step{1800 * ms, 3, no(1, 850*ms, algo.Never)}},
			{Step: Step{1800 * ms, 1, ok(0, 850*ms)}},
			{Step: Step{1800 * ms, 0, ok(1, 850*ms)}},
		}},
		// A store keeps a key one TTL past its last slot's end, so that
		// holders that never released are found and reported, once.
		{"holders that never release", l, []LeaseStep{
			slot(0, algo.OpAcquire, a, held(1, sec, 0, sec)),
			slot(100*ms, algo.OpAcquire, b, held(0, sec, 0, sec)),
			// Both ended (at 1 s and 1.1 s), neither released: c finds them.
			slot(1500*ms, algo.OpAcquire, c, held(1, sec, 2, sec)),
			// They were dropped: a release of b finds nothing.
			slot(1600*ms, algo.OpRelease, b, ok(1, 900*ms)),
			// c's slot ends at 2.5 s; 1 µs before 3.5 s the key still
			// holds it.
			slot(3500*ms-us, algo.OpAcquire, a, held(1, sec, 1, sec)),
			// a's ends at 4.5 s - 1 µs; a TTL later, the key is gone.
			slot(5500*ms-us, algo.OpAcquire, b, held(1, sec, 0, sec)),
		}},
		{"no slots", algo.Limit{Algorithm: algo.Concurrency, Requests: 0, Window: sec}, []LeaseStep{
			slot(0, algo.OpAcquire, a, no(0, 0, algo.Never)),
			slot(0, algo.OpRelease, a, ok(0, 0)),
		}},
	}
}
