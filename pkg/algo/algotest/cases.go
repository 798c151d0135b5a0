package algotest

import (
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

const (
	us  = time.Microsecond
	ms  = time.Millisecond
	sec = time.Second
)

// ok is an allowed decision; okWait one that also waits in the queue.
func ok(remaining uint64, reset time.Duration) algo.Decision {
	return algo.Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

func okWait(remaining uint64, reset, wait time.Duration) algo.Decision {
	return algo.Decision{Allowed: true, Remaining: remaining, ResetAfter: reset, Wait: wait}
}

// no is a refusal; retry is algo.Never when waiting cannot help.
func no(remaining uint64, reset, retry time.Duration) algo.Decision {
	return algo.Decision{Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
}

func limit(a algo.Algorithm, n uint64, w time.Duration) algo.Limit {
	return algo.Limit{Algorithm: a, Requests: n, Window: w}
}

// Cases returns the vectors of every algorithm. Each was computed by hand
// from the algorithm's definition in package algo; the comments show the
// arithmetic where it is not obvious.
func Cases() []Case {
	var cs []Case
	for _, f := range []func() []Case{
		fixedWindow, slidingWindowLog, slidingWindowCounter,
		tokenBucket, leakyBucket, gcra, burstFill, zeroLimits,
	} {
		cs = append(cs, f()...)
	}
	return cs
}

func fixedWindow() []Case {
	l := func(n uint64) algo.Limit { return limit(algo.FixedWindow, n, sec) }
	return []Case{
		{"fills then refuses until the aligned window ends", l(2), []Step{
			{0, 1, ok(1, sec)},
			{250 * ms, 1, ok(0, 750*ms)},
			{500 * ms, 1, no(0, 500*ms, 500*ms)},
			{999 * ms, 1, no(0, ms, ms)},
			{sec, 1, ok(1, sec)},
		}},
		{"a window boundary admits 2N in a short span", l(2), []Step{
			{900 * ms, 2, ok(0, 100*ms)},
			{1000 * ms, 2, ok(0, sec)},
		}},
		{"several hits are all or nothing", l(5), []Step{
			{0, 3, ok(2, sec)},
			{10 * ms, 3, no(2, 990*ms, 990*ms)},
			{20 * ms, 2, ok(0, 980*ms)},
		}},
		{"hits above the limit are never admitted", l(5), []Step{
			{0, 6, no(5, 0, algo.Never)},
			{10 * ms, 5, ok(0, 990*ms)},
			{20 * ms, 6, no(0, 980*ms, algo.Never)},
		}},
		{"zero hits peek without consuming", l(3), []Step{
			{0, 0, ok(3, 0)},
			{0, 1, ok(2, sec)},
			{500 * ms, 0, ok(2, 500*ms)},
		}},
		{"an idle gap longer than the window forgets the count", l(1), []Step{
			{0, 1, ok(0, sec)},
			{10 * sec, 1, ok(0, sec)},
		}},
		{"a clock stepping back less than a window keeps the newer window", l(2), []Step{
			{5500 * ms, 2, ok(0, 500*ms)},
			// 0.7 s back: the window [5 s, 6 s) is still counting.
			{4800 * ms, 1, no(0, 1200*ms, 1200*ms)},
			{6 * sec, 1, ok(1, sec)},
		}},
		{"a clock stepping back more than a window starts afresh", l(2), []Step{
			{5 * sec, 2, ok(0, sec)},
			{2 * sec, 1, ok(1, sec)},
			{2500 * ms, 2, no(1, 500*ms, 500*ms)},
		}},
		{"a clock stepping forward starts a fresh window", l(2), []Step{
			{0, 2, ok(0, sec)},
			{time.Hour + 300*ms, 1, ok(1, 700*ms)},
		}},
		{"minute windows align to the epoch", limit(algo.FixedWindow, 10, time.Minute), []Step{
			{45 * sec, 4, ok(6, 15*sec)},
			{59*sec + 999*ms, 6, ok(0, ms)},
			{time.Minute, 10, ok(0, time.Minute)},
		}},
		{"a window shorter than a microsecond counts as one", limit(algo.FixedWindow, 1, 0), []Step{
			{0, 1, ok(0, us)},
			{0, 1, no(0, us, us)},
			{us, 1, ok(0, us)},
		}},
	}
}

func slidingWindowLog() []Case {
	l := func(n uint64) algo.Limit { return limit(algo.SlidingWindowLog, n, sec) }
	return []Case{
		{"at most N in any window of length W", l(3), []Step{
			{0, 1, ok(2, sec)},
			{400 * ms, 1, ok(1, sec)},
			// 2 logged, 2 more do not fit; they would once the entry at 0
			// expires, at 1 s.
			{600 * ms, 2, no(1, 800*ms, 400*ms)},
			{600 * ms, 1, ok(0, sec)},
			{999 * ms, 1, no(0, 601*ms, ms)},
			// The entry at 0 expires exactly at 1 s (the window is
			// (now−W, now]); a fixed window would admit 3 here.
			{sec, 1, ok(0, sec)},
			{sec, 1, no(0, sec, 400*ms)},
			// Log {600 ms, 1 s}: 2 hits wait for the entry at 600 ms.
			{1400 * ms, 2, no(1, 600*ms, 200*ms)},
			{1600 * ms, 2, ok(0, sec)},
			{1600 * ms, 4, no(0, sec, algo.Never)},
		}},
		{"an idle gap longer than the window forgets the log", l(3), []Step{
			{0, 3, ok(0, sec)},
			{10 * sec, 3, ok(0, sec)},
		}},
		{"zero hits peek", l(2), []Step{
			{0, 0, ok(2, 0)},
			{0, 1, ok(1, sec)},
			{300 * ms, 0, ok(1, 700*ms)},
		}},
		{"a clock stepping back counts entries up to a window ahead", l(2), []Step{
			{5 * sec, 1, ok(1, sec)},
			// The entry at 5 s is 0.5 s ahead: it still counts.
			{4500 * ms, 1, ok(0, 1500*ms)},
			// Log {4.5 s, 5 s}: the entry at 4.5 s frees a place at 5.5 s.
			{4600 * ms, 1, no(0, 1400*ms, 900*ms)},
			// 2.5 s and 3 s ahead: void.
			{2 * sec, 2, ok(0, sec)},
		}},
	}
}

func slidingWindowCounter() []Case {
	l := func(n uint64) algo.Limit { return limit(algo.SlidingWindowCounter, n, sec) }
	return []Case{
		{"the previous window weighs by the part still covered", l(10), []Step{
			{200 * ms, 6, ok(4, 1800*ms)},
			{900 * ms, 4, ok(0, 1100*ms)},
			// New window [1 s, 2 s): prev 10 weighs ceil(10×1.0) = 10. One
			// hit fits once ceil(10×(1−e)) ≤ 9, e ≥ 100 ms.
			{sec, 1, no(0, sec, 100*ms)},
			{1100 * ms, 1, ok(0, 1900*ms)},
			// ceil(10×0.5) + 1 = 6 used.
			{1500 * ms, 2, ok(2, 1500*ms)},
			// 5 + 3 used, 3 more fit once ceil(10×(1−e)) ≤ 4: e ≥ 600 ms.
			{1500 * ms, 3, no(2, 1500*ms, 100*ms)},
			// ceil(10×0.05) + 3 = 4 used; 9 never fit in this window
			// (curr 3 + 9 > 10). In the next, curr 3 weighs
			// ceil(3×(1−e)) ≤ 1 from e = 666 667 µs: 2 s + 666 667 µs.
			{1950 * ms, 9, no(6, 1050*ms, 716667*us)},
			{1950 * ms, 11, no(6, 1050*ms, algo.Never)},
		}},
		{"windows more than one back weigh nothing", l(10), []Step{
			{10 * sec, 10, ok(0, 2*sec)},
			{11 * sec, 0, ok(0, sec)},
			{11500 * ms, 0, ok(5, 500*ms)},
			{12 * sec, 0, ok(10, 0)},
		}},
		{"a clock stepping back keeps the newer window", l(2), []Step{
			{5500 * ms, 2, ok(0, 1500*ms)},
			// Window [5 s, 6 s) is ahead by up to a window: it counts, as if
			// at its start. 1 hit fits in the next window once
			// ceil(2×(1−e)) ≤ 1: e ≥ 500 ms, 6.5 s.
			{4800 * ms, 1, no(0, 2200*ms, 1700*ms)},
		}},
	}
}

func tokenBucket() []Case {
	return bucketCases(algo.TokenBucket)
}

func gcra() []Case {
	cs := bucketCases(algo.GCRA)
	l := limit(algo.GCRA, 2, sec)
	return append(cs, Case{"a clock stepping back holds the TAT until the clock catches up", l, []Step{
		{5 * sec, 2, ok(0, sec)}, // TAT 6 s
		// TAT 1.5 s ahead, within a burst (1 s) plus a window: kept, and
		// counted as spent. A hit needs the TAT at most 1 s − 0.5 s ahead.
		{4500 * ms, 1, no(0, 1500*ms, sec)},
		// TAT 4 s ahead: void.
		{2 * sec, 1, ok(1, 500*ms)},
	}})
}

// bucketCases are the vectors that TokenBucket and GCRA share: they admit
// exactly the same hits and report the same figures.
func bucketCases(a algo.Algorithm) []Case {
	l := limit(a, 3, sec) // T = 333 333⅓ µs
	burst := limit(a, 1, sec)
	burst.Burst = 5
	cs := []Case{
		{"three per second exactly, without drift", l, []Step{
			{0, 3, ok(0, sec)},
			// The next token is earned at 333 333⅓ µs.
			{0, 1, no(0, sec, 333334*us)},
			{333334 * us, 1, ok(0, sec)},
			// Two more earned by 1 s exactly: ⅓ + ⅔ µs carried, not lost.
			{sec, 2, ok(0, sec)},
			// 1.5 s: one token earned (at 1 333 333⅓ µs); 3 need two more.
			{1500 * ms, 3, no(1, 500*ms, 500*ms)},
			{1500 * ms, 4, no(1, 500*ms, algo.Never)},
			{10 * sec, 1, ok(2, 333334*us)},
		}},
		{"burst above the rate", burst, []Step{
			{0, 5, ok(0, 5*sec)},
			{2 * sec, 2, ok(0, 5*sec)},
			{2500 * ms, 1, no(0, 4500*ms, 500*ms)},
			{2500 * ms, 0, ok(0, 4500*ms)},
			{2500 * ms, 6, no(0, 4500*ms, algo.Never)},
		}},
	}
	if a == algo.TokenBucket {
		cs = append(cs, Case{"a clock stepping back earns nothing until it catches up", limit(a, 2, sec), []Step{
			{5 * sec, 2, ok(0, sec)},
			// Last refill 0.5 s ahead: no tokens until 5.5 s.
			{4500 * ms, 1, no(0, 1500*ms, sec)},
			// 3 s ahead, more than a window: void, a full bucket.
			{2 * sec, 1, ok(1, 500*ms)},
		}})
	}
	return cs
}

func leakyBucket() []Case {
	l := limit(algo.LeakyBucket, 2, sec) // drains one every 500 ms
	l.Burst = 3
	third := limit(algo.LeakyBucket, 3, sec)
	return []Case{
		{"a queue of three draining every 500 ms", l, []Step{
			{0, 2, okWait(1, sec, 0)},
			// Nothing drained yet: waits for 2 ahead, until 1 s.
			{100 * ms, 1, okWait(0, 1400*ms, 900*ms)},
			{200 * ms, 1, no(0, 1300*ms, 300*ms)},
			// One drained at 500 ms; two ahead until 1.5 s.
			{500 * ms, 1, okWait(0, 1500*ms, sec)},
			{600 * ms, 4, no(0, 1400*ms, algo.Never)},
			{5 * sec, 3, okWait(0, 1500*ms, 0)},
		}},
		{"fractional drain is exact", third, []Step{
			{0, 3, okWait(0, sec, 0)},
			// One drained at 333 333⅓ µs; two ahead drain by 1 s exactly.
			{333334 * us, 1, okWait(0, sec, 666666*us)},
		}},
		{"a clock stepping back does not drain until it catches up", limit(algo.LeakyBucket, 2, sec), []Step{
			{5 * sec, 2, okWait(0, sec, 0)},
			{4500 * ms, 1, no(0, 1500*ms, sec)},
			{2 * sec, 1, okWait(1, 500*ms, 0)},
		}},
	}
}

func burstFill() []Case {
	l := func(n uint64) algo.Limit { return limit(algo.BurstFill, n, sec) }
	return []Case{
		{"the window starts at the first hit, not on the epoch", l(3), []Step{
			{0, 0, ok(3, 0)},
			{300 * ms, 1, ok(2, sec)},
			// Same instant: no refill (seed 001 refilled on elapsed == 0).
			{300 * ms, 1, ok(1, sec)},
			{800 * ms, 2, no(1, 500*ms, 500*ms)},
			{800 * ms, 1, ok(0, 500*ms)},
			{1299 * ms, 1, no(0, ms, ms)},
			// The window ended at 1.3 s; a new one starts with this hit.
			{1300 * ms, 1, ok(2, sec)},
			{5 * sec, 3, ok(0, sec)},
			{5500 * ms, 4, no(0, 500*ms, algo.Never)},
		}},
		{"a clock stepping back keeps a window up to W ahead", l(2), []Step{
			{5 * sec, 2, ok(0, sec)},
			{4500 * ms, 1, no(0, 1500*ms, 1500*ms)},
			{2 * sec, 1, ok(1, sec)},
			{2500 * ms, 2, no(1, 500*ms, 500*ms)},
		}},
	}
}

// zeroLimits checks that a limit of zero admits nothing, for every
// algorithm, while zero hits still peek.
func zeroLimits() []Case {
	var cs []Case
	for _, a := range algo.Algorithms() {
		cs = append(cs, Case{"a limit of zero admits nothing", limit(a, 0, sec), []Step{
			{0, 1, no(0, 0, algo.Never)},
			{0, 0, ok(0, 0)},
		}})
	}
	return cs
}

// BatchCases returns vectors of batches, the contract of
// [algo.Backend.Decide]: all or nothing, shadow requests, requests of one
// batch sharing a key, and requests that count ([CountBatchCases]).
func BatchCases() []BatchCase {
	fw := func(n uint64) algo.Limit { return limit(algo.FixedWindow, n, sec) }
	return append(CountBatchCases(), []BatchCase{
		{"a refusal consumes nothing", []BatchRequest{{"a", fw(5), false, false, false}, {"b", fw(1), false, false, false}}, []BatchStep{
			{0, []uint64{2, 1}, []algo.Decision{ok(3, sec), ok(0, sec)}},
			// b refuses: a reports its state without its own hits.
			{100 * ms, []uint64{2, 1}, []algo.Decision{ok(3, 900*ms), no(0, 900*ms, 900*ms)}},
			{200 * ms, []uint64{3, 0}, []algo.Decision{ok(0, 800*ms), ok(0, 800*ms)}},
		}},
		{"a shadow refusal refuses nothing", []BatchRequest{{"a", fw(5), false, false, false}, {"s", fw(1), true, false, false}}, []BatchStep{
			{0, []uint64{1, 1}, []algo.Decision{ok(4, sec), ok(0, sec)}},
			{0, []uint64{1, 1}, []algo.Decision{ok(3, sec), no(0, sec, sec)}},
			{0, []uint64{3, 0}, []algo.Decision{ok(0, sec), ok(0, sec)}},
		}},
		{"a key twice in a batch sees its earlier hits", []BatchRequest{
			{"k", limit(algo.SlidingWindowLog, 3, sec), false, false, false},
			{"k", limit(algo.SlidingWindowLog, 3, sec), false, false, false},
		}, []BatchStep{
			{0, []uint64{1, 1}, []algo.Decision{ok(2, sec), ok(1, sec)}},
			{500 * ms, []uint64{1, 0}, []algo.Decision{ok(0, sec), ok(0, sec)}},
			{900 * ms, []uint64{1, 0}, []algo.Decision{no(0, 600*ms, 100*ms), ok(0, 600*ms)}},
		}},
		{"a peek is decided and stores nothing", []BatchRequest{
			{"p", limit(algo.GCRA, 4, sec), false, true, false},
			{"c", fw(2), false, true, false},
		}, []BatchStep{
			{0, []uint64{2, 1}, []algo.Decision{ok(2, 500*ms), ok(1, sec)}},
			// The same answer again: the first consumed nothing.
			{0, []uint64{2, 1}, []algo.Decision{ok(2, 500*ms), ok(1, sec)}},
			{0, []uint64{5, 3}, []algo.Decision{no(4, 0, algo.Never), no(2, 0, algo.Never)}},
		}},
		{"all or nothing across algorithms", []BatchRequest{
			{"t", limit(algo.TokenBucket, 2, sec), false, false, false},
			{"l", limit(algo.SlidingWindowLog, 1, sec), false, false, false},
		}, []BatchStep{
			{0, []uint64{1, 1}, []algo.Decision{ok(1, 500*ms), ok(0, sec)}},
			{100 * ms, []uint64{1, 1}, []algo.Decision{ok(1, 400*ms), no(0, 900*ms, 900*ms)}},
			// Neither the token nor the log entry of the refused batch
			// was taken.
			{100 * ms, []uint64{1, 0}, []algo.Decision{ok(0, 900*ms), ok(0, 900*ms)}},
		}},
	}...)
}
