package config

import "strings"

// A wildcard is a descriptor value holding "*", as envoyproxy/ratelimit
// reads one: each "*" matches any run of bytes, the empty run included,
// anywhere in the value and any number of times ("files/*", "/api*v1",
// "svc*ep*rpc", "*foo", "*"). Every other byte matches itself; there is no
// escape, no "?" and no character class.
type wildcard struct {
	key string
	// pattern is the value as written, "*" included. It is what a level
	// with share_threshold puts in the counter key, so it must stay the
	// value as written for counters to survive upgrades.
	pattern string
	// prefix is set when pattern is a prefix followed by one "*" at the
	// end, the common form, matched with one HasPrefix; parts is nil then.
	prefix string
	// parts is pattern split at every "*", for every other form. It has
	// at least two elements; minLen is the sum of their lengths, the
	// shortest value that can match.
	parts  []string
	minLen int
	node   *node
}

// isWildcard reports whether value is a wildcard pattern.
func isWildcard(value string) bool {
	return strings.IndexByte(value, '*') >= 0
}

// newWildcard compiles pattern, a value holding at least one "*".
func newWildcard(key, pattern string, n *node) wildcard {
	w := wildcard{key: key, pattern: pattern, node: n}
	if i := strings.IndexByte(pattern, '*'); i == len(pattern)-1 {
		w.prefix = pattern[:i]
		return w
	}
	w.parts = strings.Split(pattern, "*")
	for _, p := range w.parts {
		w.minLen += len(p)
	}
	return w
}

// matches reports whether value v matches the wildcard. It does not
// allocate.
func (w *wildcard) matches(v string) bool {
	if w.parts == nil {
		return strings.HasPrefix(v, w.prefix)
	}
	return globMatch(w.parts, w.minLen, v)
}

// globMatch reports whether v matches the pattern whose pieces between
// "*"s are parts (at least two), minLen bytes in all: v starts with the
// first piece, ends with the last, and holds the others in order, none
// overlapping. Taking each middle piece at its leftmost place is never
// wrong, since "*" can absorb whatever a later place would skip, so one
// pass decides: O(len(v) × pieces) at worst, no backtracking.
func globMatch(parts []string, minLen int, v string) bool {
	if len(v) < minLen {
		return false
	}
	first, last := parts[0], parts[len(parts)-1]
	if !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	// len(v) >= minLen, so the first and last pieces do not overlap.
	rest := v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
