package algotest

import (
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// CountCases returns the vectors of requests that count their hits
// whatever the answer ([algo.Request.Count], a rule's over_limit_hits:
// count): refused hits are counted beyond what remains, each algorithm in
// its own way (package algo's count.go), and the request is still refused;
// zero hits are refused while the limit holds more than it admits.
// [Run] decides every request of these cases with Count set.
func CountCases() []Case {
	fw := limit(algo.FixedWindow, 3, sec)
	leaky := limit(algo.LeakyBucket, 2, sec) // drains one every 500 ms
	leaky.Burst = 3
	cs := []Case{
		{"a refused cost is counted past N until the window ends", fw, []Step{
			{0, 2, ok(1, sec)},
			// 2 more do not fit: counted all the same, 4 of 3.
			{100 * ms, 2, no(0, 900*ms, 900*ms)},
			// Past the limit: even zero hits are refused until it ends.
			{200 * ms, 0, no(0, 800*ms, 800*ms)},
			{300 * ms, 1, no(0, 700*ms, 700*ms)},
			// More than the limit: counted, and never admitted.
			{500 * ms, 5, no(0, 500*ms, algo.Never)},
			// The window's count goes with the window.
			{sec, 1, ok(2, sec)},
		}},
		// Issue 27's calls: 800, 1, 900, 1, 900 tokens under 1,000 per
		// minute. The first 900 is counted (1,701), so the next call is
		// refused.
		{"token costs under 1000 per minute", limit(algo.FixedWindow, 1000, time.Minute), []Step{
			{0, 800, ok(200, time.Minute)},
			{sec, 1, ok(199, 59*sec)},
			{2 * sec, 900, no(0, 58*sec, 58*sec)},
			{3 * sec, 1, no(0, 57*sec, 57*sec)},
			{4 * sec, 900, no(0, 56*sec, 56*sec)},
			// The request-time check of the next call (AI Gateway's cost
			// of 0): refused.
			{5 * sec, 0, no(0, 55*sec, 55*sec)},
			{time.Minute, 1, ok(999, time.Minute)},
			{time.Minute, 0, ok(999, time.Minute)},
		}},
		{"a cost above the limit opens a window of its own", limit(algo.BurstFill, 2, sec), []Step{
			// No window runs: the 3 start one, counted, 3 of 2.
			{0, 3, no(0, sec, algo.Never)},
			{500 * ms, 1, no(0, 500*ms, 500*ms)},
			{500 * ms, 0, no(0, 500*ms, 500*ms)},
			{sec, 2, ok(0, sec)},
			// Exactly full is not past the limit.
			{sec, 0, ok(0, sec)},
		}},
		{"a counted cost weighs on the next window", limit(algo.SlidingWindowCounter, 4, sec), []Step{
			{0, 3, ok(1, 2*sec)},
			// Counted: 6 in [0, 1 s). Nothing fits in this window; in the
			// next, 3 hits need ceil(6 × (1−e)) ≤ 1: e ≥ 833 334 µs.
			{500 * ms, 3, no(0, 1500*ms, 1333334*us)},
			// Window [1 s, 2 s): the 6 weigh ceil(6 × 0.8) = 5 > 4, where
			// the 3 admitted alone would weigh 3. Counted: 1 in this one;
			// 1 more fits once ceil(6 × (1−e)) ≤ 2: e ≥ 666 667 µs.
			{1200 * ms, 1, no(0, 1800*ms, 466667*us)},
			// 5 + 1 of 4: zero hits fit once ceil(6 × (1−e)) ≤ 3, e ≥ 0.5.
			{1200 * ms, 0, no(0, 1800*ms, 300*ms)},
		}},
		{"a counted cost is logged, the newest N entries kept", limit(algo.SlidingWindowLog, 3, sec), []Step{
			{0, 2, ok(1, sec)},
			// Log {0, 0, 400 ms, 400 ms}, 4 of 3: past the limit. 2 hits
			// fit once the oldest three have expired, at 1.4 s.
			{400 * ms, 2, no(0, sec, sec)},
			{400 * ms, 0, no(0, sec, 600*ms)},
			// The entries at 0 expired: one place.
			{sec, 1, ok(0, sec)},
			// {400 ms, 400 ms, 1 s} and 3 at 1.2 s: the newest 4 kept,
			// {1 s, 1.2 s, 1.2 s, 1.2 s}.
			{1200 * ms, 3, no(0, sec, sec)},
			// The entry at 1 s expired: {1.2 s ×3, 2.199 s}, 4 of 3.
			{2199 * ms, 1, no(0, sec, ms)},
			{2199 * ms, 0, no(0, sec, ms)},
			{2200 * ms, 0, ok(2, 999*ms)},
		}},
		{"a counted cost is a debt of at most N tokens", limit(algo.TokenBucket, 2, sec), bucketDebt()},
		{"a counted cost is a debt of at most N tokens", limit(algo.GCRA, 2, sec), bucketDebt()},
		{"a counted cost fills the queue past B by at most N", leaky, []Step{
			{0, 3, okWait(0, 1500*ms, 0)},
			// Level 5: 2 hits fit once 4 have drained, at 2 s.
			{0, 2, no(0, 2500*ms, 2*sec)},
			// More than B: never admitted; the queue stays at B + N.
			{0, 4, no(0, 2500*ms, algo.Never)},
			// Past B: zero hits wait for 2 to drain.
			{0, 0, no(0, 2500*ms, sec)},
			// 4 drained by 2 s: level 1, then 2.
			{2 * sec, 1, okWait(1, sec, 500*ms)},
		}},
	}
	// A limit of zero counts nothing.
	for _, a := range algo.Algorithms() {
		cs = append(cs, Case{"a limit of zero counts nothing", limit(a, 0, sec), []Step{
			{0, 1, no(0, 0, algo.Never)},
			{0, 0, ok(0, 0)},
		}})
	}
	return cs
}

// bucketDebt is the count vector that TokenBucket and GCRA share: 2 per
// second, a token every 500 ms.
func bucketDebt() []Step {
	return []Step{
		{0, 2, ok(0, sec)},
		// More than the bucket: counted as a debt of 2 (N), never more.
		{0, 3, no(0, 2*sec, algo.Never)},
		// A token earned (−1), and spent again (−2): the hit fits in 1.5 s.
		{500 * ms, 1, no(0, 2*sec, 1500*ms)},
		// In debt: zero hits wait for the debt to be paid, 1 s.
		{500 * ms, 0, no(0, 2*sec, sec)},
		// 3 tokens earned by 2 s: the debt paid, one left.
		{2 * sec, 1, ok(0, sec)},
		// Empty is not in debt.
		{2 * sec, 0, ok(0, sec)},
	}
}

// CountBatchCases returns vectors of batches with requests that count:
// counted in a refused batch, as in an admitted one when shadow.
func CountBatchCases() []BatchCase {
	fw := func(n uint64) algo.Limit { return limit(algo.FixedWindow, n, sec) }
	return []BatchCase{
		{"a request that counts is counted in a refused batch", []BatchRequest{
			{Key: "a", Limit: fw(5), Count: true},
			{Key: "b", Limit: fw(1)},
		}, []BatchStep{
			{0, []uint64{2, 1}, []algo.Decision{ok(3, sec), ok(0, sec)}},
			// b refuses the batch; a counts its 2 all the same.
			{100 * ms, []uint64{2, 1}, []algo.Decision{ok(1, 900*ms), no(0, 900*ms, 900*ms)}},
			// a refuses, counted: 6 of 5.
			{200 * ms, []uint64{2, 0}, []algo.Decision{no(0, 800*ms, 800*ms), ok(0, 800*ms)}},
			// 6 of 5: a's zero hits refuse the batch.
			{300 * ms, []uint64{0, 0}, []algo.Decision{no(0, 700*ms, 700*ms), ok(0, 700*ms)}},
		}},
		{"in a refused batch a key sees its earlier counting requests alone", []BatchRequest{
			{Key: "k", Limit: fw(3), Count: true},
			{Key: "k", Limit: fw(3)},
			{Key: "x", Limit: fw(1)},
		}, []BatchStep{
			{0, []uint64{1, 1, 1}, []algo.Decision{ok(2, sec), ok(1, sec), ok(0, sec)}},
			// The second request refuses (the first left 0); decided
			// again, the first counts its hit: 3 of 3. The second reports
			// the key as the batch found it.
			{100 * ms, []uint64{1, 1, 1}, []algo.Decision{ok(0, 900*ms), no(1, 900*ms, 900*ms), no(0, 900*ms, 900*ms)}},
			{200 * ms, []uint64{0, 0, 0}, []algo.Decision{ok(0, 800*ms), ok(0, 800*ms), ok(0, 800*ms)}},
		}},
		{"a shadow request that counts goes into debt in an admitted batch", []BatchRequest{
			{Key: "a", Limit: fw(5)},
			{Key: "s", Limit: limit(algo.TokenBucket, 2, sec), Shadow: true, Count: true},
		}, []BatchStep{
			{0, []uint64{1, 2}, []algo.Decision{ok(4, sec), ok(0, sec)}},
			// s has no token: a debt of 1; the batch is admitted all the same.
			{0, []uint64{1, 1}, []algo.Decision{ok(3, sec), no(0, 1500*ms, sec)}},
			{500 * ms, []uint64{0, 1}, []algo.Decision{ok(3, 500*ms), no(0, 1500*ms, sec)}},
		}},
		{"a peek that counts is answered as counted and stores nothing", []BatchRequest{
			{Key: "p", Limit: fw(2), Peek: true, Count: true},
		}, []BatchStep{
			{0, []uint64{3}, []algo.Decision{no(0, sec, algo.Never)}},
			{0, []uint64{1}, []algo.Decision{ok(1, sec)}},
		}},
	}
}
