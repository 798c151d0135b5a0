package algo

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"time"
)

// Algorithm selects how a [Limit] admits hits. The zero value is
// [FixedWindow], the Envoy-compatible default.
//
// In the descriptions, N is [Limit.Requests], W is [Limit.Window], r = N/W
// is the rate and B is the bucket capacity, [Limit.Burst] or N when that is
// zero.
type Algorithm uint8

const (
	// FixedWindow counts hits in windows of length W aligned to the Unix
	// epoch and admits while the count stays within N. At most N hits are
	// admitted per aligned window, so up to 2N across a window boundary.
	//
	// State: Time is the start of the counted window, Count the hits
	// admitted in it.
	FixedWindow Algorithm = iota

	// SlidingWindowLog logs the instant of every admitted hit and admits
	// while the log holds at most N hits newer than now−W: exactly at most
	// N hits in any window of length W. Refused hits are not logged, so an
	// attacker cannot grow the log past N entries nor extend their own
	// refusal.
	//
	// State: Log holds the admitted instants, oldest first, one per hit.
	SlidingWindowLog

	// SlidingWindowCounter is Cloudflare's approximation of a sliding
	// window: it counts hits in epoch-aligned windows like FixedWindow and
	// admits while ceil(prev × (W−elapsed)/W) + curr stays within N, where
	// prev is the previous window's count, curr the current window's and
	// elapsed the time since the current window began. It assumes the
	// previous window's hits were spread evenly; hits bunched at the end of
	// one window and the end of the next can still reach nearly 2N within
	// one window's length (see docs/algorithms.md for measured figures).
	//
	// State: Time is the start of the current window, Count its hits, Prev
	// the previous window's hits.
	SlidingWindowCounter

	// TokenBucket holds up to B tokens, refilled lazily at r, and admits
	// hits while it holds as many tokens. Any interval of length t admits
	// at most B + r·t hits. Refill is exact: the instant of the last refill
	// keeps the fraction of a token already earned.
	//
	// State: Count is the whole tokens held after the last refill (Time ==
	// 0 means a full bucket never used), Time and Frac are the last refill
	// instant: Time µs plus Frac/N µs.
	TokenBucket

	// LeakyBucket is a queue of capacity B that drains at r. Hits join the
	// queue when they fit; [Decision.Wait] says how long an admitted hit
	// waits for the queue ahead of it to drain. It admits exactly what
	// TokenBucket admits (a full queue is an empty bucket); it differs in
	// what it reports.
	//
	// State: Count is the queue level after the last leak, Time and Frac
	// the instant of the last leak, as for TokenBucket.
	LeakyBucket

	// GCRA is the generic cell rate algorithm: one theoretical arrival time
	// (TAT) per key. Hits admitted push the TAT forward by their emission
	// time, 1/r each; a request is admitted when its TAT would be at most
	// B/r ahead of now. The same bound as TokenBucket, from one value.
	//
	// State: the TAT is Time µs plus Frac/N µs.
	GCRA

	// BurstFill grants all N hits at once and starts the window of length W
	// at the first hit after the previous window ended (seed 001's
	// "refill all tokens at once"): at most N hits per window, windows not
	// aligned to the epoch. When the window is spent, RetryAfter is the
	// time until the next refill.
	//
	// State: Time is the start of the current window, Count the hits
	// admitted in it.
	BurstFill

	// Concurrency limits how many holders keep a slot at once, rather
	// than hits per time: Requests is the most slots held at once and
	// Window how long a holder keeps its slot unless it renews it (the
	// lease TTL). A slot is taken by an [OpAcquire] naming its
	// [Request.Holder], given back by an [OpRelease] and kept by an
	// [OpRenew]; a holder that does neither loses it when its TTL ends.
	// It is not a rule-file algorithm (a descriptor's concurrency block
	// makes one) and [Algorithms] does not list it.
	//
	// State: Log holds the holders as triples (the two halves of the
	// holder's id, the instant its slot ends), ordered by that instant.
	Concurrency
)

// Bounds of the exact arithmetic. Integer microseconds and counts stay
// below 2^53 in every computation, so Lua (whose numbers are float64) and Go
// compute the same results exactly.
const (
	// MaxBucket bounds Requests and Burst of TokenBucket, LeakyBucket and
	// GCRA: times are kept to a fraction of 1/N µs, and products of counts
	// with those fractions must stay below 2^53.
	MaxBucket = 1 << 26
	// MaxLog bounds Requests of SlidingWindowLog, which stores one instant
	// per admitted hit.
	MaxLog = 10_000
	// MaxRefill bounds the time a bucket takes to refill from empty,
	// Burst × Window / Requests, and the longest window.
	MaxRefill = 100 * 365 * 24 * time.Hour
	// MaxInFlight bounds Requests of Concurrency: a decision reads every
	// holder of its key.
	MaxInFlight = 10_000
	// MaxLeaseTTL bounds the Window of Concurrency, a holder's lease.
	MaxLeaseTTL = 24 * time.Hour
)

// Algorithms returns every algorithm, in a stable order.
func Algorithms() []Algorithm {
	return []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, LeakyBucket, GCRA, BurstFill}
}

// String returns the rule-file name of a, such as "fixed_window".
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed_window"
	case SlidingWindowLog:
		return "sliding_window_log"
	case SlidingWindowCounter:
		return "sliding_window_counter"
	case TokenBucket:
		return "token_bucket"
	case LeakyBucket:
		return "leaky_bucket"
	case GCRA:
		return "gcra"
	case BurstFill:
		return "burst_fill"
	case Concurrency:
		return "concurrency"
	default:
		return fmt.Sprintf("algorithm(%d)", uint8(a))
	}
}

// ParseAlgorithm returns the algorithm whose rule-file name is s. Names are
// case-sensitive, like every other rule-file keyword.
func ParseAlgorithm(s string) (Algorithm, error) {
	all := Algorithms()
	names := make([]string, len(all))
	for i, a := range all {
		if a.String() == s {
			return a, nil
		}
		names[i] = a.String()
	}
	return 0, fmt.Errorf("unknown algorithm %q; accepted: %s", s, strings.Join(names, ", "))
}

// UsesBurst reports whether a takes a bucket capacity, [Limit.Burst]: the
// bucket algorithms TokenBucket, LeakyBucket and GCRA do.
func (a Algorithm) UsesBurst() bool {
	switch a {
	case TokenBucket, LeakyBucket, GCRA:
		return true
	}
	return false
}

// Leasable reports whether a's budget is fungible, so that a slice of it
// can be leased out and spent elsewhere without admitting more than the
// limit: FixedWindow, SlidingWindowCounter, TokenBucket and GCRA. The
// others tie each hit to its instant (SlidingWindowLog, LeakyBucket's
// queue position) or start their window at a request (BurstFill).
func (a Algorithm) Leasable() bool {
	switch a {
	case FixedWindow, SlidingWindowCounter, TokenBucket, GCRA:
		return true
	}
	return false
}

// UnleasableReason says why a cannot be leased, as words completing
// "<algorithm> ...", such as "ties each admitted hit to its own instant";
// it is empty when a is [Algorithm.Leasable].
func (a Algorithm) UnleasableReason() string {
	if a.Leasable() {
		return ""
	}
	switch a {
	case SlidingWindowLog:
		return "ties each admitted hit to its own instant"
	case LeakyBucket:
		return "gives each admitted hit its place in one queue"
	case BurstFill:
		return "starts its window at the first request, which one replica cannot know of another"
	case Concurrency:
		return "holds slots for holders, not a budget of hits"
	}
	return "is not leasable"
}

// LogsHits reports whether a keeps one entry per admitted hit, so that
// [MaxLog] bounds its Requests: SlidingWindowLog does.
func (a Algorithm) LogsHits() bool {
	return a == SlidingWindowLog
}

// FullUntilAdmissible reports whether a refusal of a leaves the limit
// refusing whatever more is counted past it ([Request.Count]) until the
// instant the refusal names as admissible, and admitting from then on: a
// window's count past N is forgotten when the window ends, the instant
// its refusals name. Other algorithms carry what is counted past their
// limit further (a debt, a count that weighs on the next window). An
// over-limit cache may answer a counting request of such an algorithm
// from a refusal it holds.
func (a Algorithm) FullUntilAdmissible() bool {
	return a == FixedWindow || a == BurstFill
}

// Check reports whether l is within the bounds its algorithm computes
// exactly. [Step] refuses every hit of a limit that fails Check; rule
// validation keeps such limits out of the rules.
func (l Limit) Check() error {
	if l.Window > MaxRefill {
		return fmt.Errorf("window %v is longer than %v", l.Window, MaxRefill)
	}
	switch l.Algorithm {
	case FixedWindow, SlidingWindowCounter, BurstFill:
		return nil
	case Concurrency:
		switch {
		case l.Requests > MaxInFlight:
			return fmt.Errorf("concurrency keeps one entry per holder; max_in_flight %d is above %d", l.Requests, MaxInFlight)
		case l.Window < time.Millisecond || l.Window > MaxLeaseTTL:
			return fmt.Errorf("a lease TTL of %v is not between 1ms and %v", l.Window, MaxLeaseTTL)
		}
		return nil
	case SlidingWindowLog:
		if l.Requests > MaxLog {
			return fmt.Errorf("sliding_window_log keeps one entry per admitted hit; requests %d is above %d", l.Requests, MaxLog)
		}
		return nil
	case TokenBucket, LeakyBucket, GCRA:
		b := l.capacity()
		if l.Requests > MaxBucket || b > MaxBucket {
			return fmt.Errorf("%s requests %d and burst %d must be at most %d", l.Algorithm, l.Requests, b, MaxBucket)
		}
		if hi, lo := bits.Mul64(b, uint64(windowMicros(l))); l.Requests > 0 && (hi != 0 || lo/l.Requests > uint64(MaxRefill.Microseconds())) {
			return fmt.Errorf("%s takes longer than %v to refill a burst of %d at %d per %v", l.Algorithm, MaxRefill, b, l.Requests, l.Window)
		}
		return nil
	}
	return errors.New("unknown algorithm")
}

// capacity returns B: Burst, or Requests when Burst is zero.
func (l Limit) capacity() uint64 {
	if l.Burst == 0 {
		return l.Requests
	}
	return l.Burst
}

// windowMicros returns l's window in microseconds, at least one.
func windowMicros(l Limit) int64 {
	return max(l.Window.Microseconds(), 1)
}

// micros converts a count of microseconds to a Duration.
func micros(us int64) time.Duration {
	return time.Duration(us) * time.Microsecond
}
