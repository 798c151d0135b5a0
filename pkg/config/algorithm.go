package config

import (
	"fmt"
	"strings"
)

// Algorithm is the value of a rule's rate_limit.algorithm: the algorithms a
// rule file may name. Package algo implements them; the service maps each
// one to its implementation. The zero value is FixedWindow, the default.
type Algorithm uint8

// Algorithms, as rule files name them, in the order of algo.Algorithms.
const (
	FixedWindow          Algorithm = iota // "fixed_window"
	SlidingWindowLog                      // "sliding_window_log"
	SlidingWindowCounter                  // "sliding_window_counter"
	TokenBucket                           // "token_bucket"
	LeakyBucket                           // "leaky_bucket"
	GCRA                                  // "gcra"
	BurstFill                             // "burst_fill"
)

// Algorithms returns every algorithm a rule file may name, in a stable
// order.
func Algorithms() []Algorithm {
	return []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, LeakyBucket, GCRA, BurstFill}
}

// String returns the algorithm's rule-file name.
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
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// UsesBurst reports whether the algorithm takes rate_limit.burst, a bucket
// capacity: the bucket algorithms token_bucket, leaky_bucket and gcra do,
// the window algorithms do not.
func (a Algorithm) UsesBurst() bool {
	switch a {
	case TokenBucket, LeakyBucket, GCRA:
		return true
	}
	return false
}

// ParseAlgorithm returns the algorithm named s. Names are case-sensitive,
// like every other rule-file keyword.
func ParseAlgorithm(s string) (Algorithm, error) {
	var names []string
	for _, a := range Algorithms() {
		if a.String() == s {
			return a, nil
		}
		names = append(names, a.String())
	}
	return 0, fmt.Errorf("unknown algorithm %q; accepted: %s", s, strings.Join(names, ", "))
}
