package algotest

import (
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// mark is the lease mark of the instant Epoch+d, in µs since the epoch.
func mark(d time.Duration) int64 { return Epoch.Add(d).UnixMicro() }

// take is a step that takes a lease of hits, up to most in all, at most
// 1/share of what remains, for ttl.
func take(at time.Duration, hits, most, share uint64, ttl time.Duration, want algo.Decision) LeaseStep {
	return LeaseStep{Step: Step{at, hits, want}, Op: algo.OpTake, Lease: algo.Lease{Max: most, Share: share, TTL: ttl}}
}

// decide is a step that decides hits.
func decide(at time.Duration, hits uint64, want algo.Decision) LeaseStep {
	return LeaseStep{Step: Step{at, hits, want}}
}

// give is a step that gives hits back to the lease marked m.
func give(at time.Duration, hits uint64, m int64, want algo.Decision) LeaseStep {
	return LeaseStep{Step: Step{at, hits, want}, Op: algo.OpGive, Lease: algo.Lease{Mark: m}}
}

// took is the decision of a take that took taken hits, its lease marked m
// and valid for valid.
func took(remaining uint64, reset time.Duration, taken uint64, m int64, valid time.Duration) algo.Decision {
	d := ok(remaining, reset)
	d.Taken, d.Mark, d.Valid = taken, m, valid
	return d
}

// LeaseCases returns the vectors of leases, hand-computed: takes sized by
// Max and Share, gives back to the window or bucket lease they came from,
// and the cap that outstanding leases put on a bucket's refill.
func LeaseCases() []LeaseCase {
	fw := limit(algo.FixedWindow, 10, sec)
	swc := limit(algo.SlidingWindowCounter, 10, sec)
	return []LeaseCase{
		{"a take takes a share of what remains, a give returns to its window", fw, []LeaseStep{
			// 10 remain: min(Max 8, 10/2) = 5, the 1 hit among them; the
			// lease is valid until the window ends, whatever its TTL.
			take(100*ms, 1, 8, 2, 500*ms, took(5, 900*ms, 5, mark(0), 900*ms)),
			// 5 remain: 5/2 = 2.
			take(200*ms, 0, 8, 2, 2*sec, took(3, 800*ms, 2, mark(0), 800*ms)),
			give(300*ms, 4, mark(0), ok(7, 700*ms)),
			// Share 1 takes all that remains.
			take(400*ms, 3, 100, 1, sec, took(0, 600*ms, 7, mark(0), 600*ms)),
			take(500*ms, 1, 100, 1, sec, no(0, 500*ms, 500*ms)),
			// Hits of a window that ended give nothing back.
			give(1200*ms, 5, mark(0), ok(10, 0)),
			take(1300*ms, 0, 3, 1, sec, took(7, 700*ms, 3, mark(sec), 700*ms)),
		}},
		{"leases shrink to the hits when little remains", fw, []LeaseStep{
			decide(0, 9, ok(1, sec)),
			// 1 remains: 1/8 is 0, so the take takes its hit only.
			take(10*ms, 1, 100, 8, sec, took(0, 990*ms, 1, 0, 0)),
		}},
		{"a give returns to its window while current, then to the previous", swc, []LeaseStep{
			decide(200*ms, 6, ok(4, 1800*ms)),
			// 4 remain: 4/2 = 2, valid until the window ends.
			take(900*ms, 0, 10, 2, sec, took(2, 1100*ms, 2, mark(0), 100*ms)),
			// Window [1 s, 2 s): the stored window is the previous one; its
			// 8 hits become 6, which weigh ceil(6 × 0.5) = 3.
			give(1500*ms, 2, mark(0), ok(7, 500*ms)),
			take(1500*ms, 1, 100, 1, 100*ms, took(0, 1500*ms, 7, mark(sec), 500*ms)),
			// Window [2 s, 3 s): 7 hits of [1 s, 2 s) become 4, weighing
			// ceil(4 × 0.9) = 4.
			give(2100*ms, 3, mark(sec), ok(6, 900*ms)),
			// The hits of [0, 1 s) no longer weigh: nothing changes.
			give(2100*ms, 2, mark(0), ok(6, 900*ms)),
		}},
		bucketLeaseCase(algo.TokenBucket),
		bucketLeaseCase(algo.GCRA),
	}
}

// bucketLeaseCase is the lease vector of a bucket algorithm: 10 per
// second, a token every 100 ms. A token bucket and GCRA admit the same.
func bucketLeaseCase(a algo.Algorithm) LeaseCase {
	return LeaseCase{"a lease holds tokens out of the bucket until it ends", limit(a, 10, sec), []LeaseStep{
		// 6 taken, 2 spent at once: a lease of 4 until 300 ms. The bucket
		// refills to 10 − 4 = 6 by 200 ms, waits for the lease to end, and
		// is full 400 ms later.
		take(0, 2, 6, 1, 300*ms, took(4, 700*ms, 6, mark(300*ms), 300*ms)),
		// 1 token earned (up to the cap of 6), 5 hits spend all 5.
		decide(100*ms, 5, ok(0, sec)),
		// 1 more token; 3 of the lease come back: 4 tokens, a lease of 1.
		give(200*ms, 3, mark(300*ms), ok(4, 600*ms)),
		// 6 hits need 2 more tokens: one at 300 ms, when the lease ends
		// and the cap rises to 10, and one at 400 ms.
		decide(250*ms, 6, no(4, 550*ms, 150*ms)),
		decide(400*ms, 6, ok(0, sec)),
		// A lease that ended gives nothing back.
		give(400*ms, 2, mark(300*ms), ok(0, sec)),
	}}
}
