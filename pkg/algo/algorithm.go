package algo

import (
	"fmt"
	"strings"
	"time"
)

// Algorithm selects how a [Limit] admits hits. The zero value is
// [FixedWindow], the Envoy-compatible default.
type Algorithm uint8

const (
	// FixedWindow counts hits in windows of length W aligned to the Unix
	// epoch and admits while the count stays within N. At most N hits are
	// admitted per aligned window, so up to 2N across a window boundary.
	//
	// State: Time is the start of the counted window, Count the hits
	// admitted in it.
	FixedWindow Algorithm = iota
)

// Algorithms returns every algorithm, in a stable order.
func Algorithms() []Algorithm {
	return []Algorithm{FixedWindow}
}

// String returns the rule-file name of a, such as "fixed_window".
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed_window"
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

// UsesBurst reports whether a takes a bucket capacity, [Limit.Burst]. The
// window algorithms, FixedWindow among them, do not.
func (a Algorithm) UsesBurst() bool {
	return false
}

// Step applies hits to state s at time now under limit l and returns the
// new state and the decision. It is a pure function: when the decision is
// not allowed the returned state equals s, and a backend that does not
// store the returned state (because the batch was refused) loses nothing.
// Hits of zero are always allowed and report the state as it stands.
func Step(s State, now time.Time, l Limit, hits uint64) (State, Decision) {
	switch l.Algorithm {
	case FixedWindow:
		return fixedWindow(s, now.UnixMicro(), l, hits)
	default:
		// Unreachable for limits built from validated rules; refusing is
		// the safe answer for a limit nobody can evaluate.
		return s, Decision{RetryAfter: Never}
	}
}

// windowMicros returns l's window in microseconds, at least one.
func windowMicros(l Limit) int64 {
	return max(l.Window.Microseconds(), 1)
}

// micros converts a count of microseconds to a Duration.
func micros(us int64) time.Duration {
	return time.Duration(us) * time.Microsecond
}
