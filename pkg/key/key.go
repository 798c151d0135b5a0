// Package key encodes what identifies one rate-limit counter (a domain, the
// entries of a descriptor, and the algorithm and window of the limit) as the
// key a backend stores its state under.
//
// The encoding is injective: two different descriptors never share a key,
// whatever bytes their keys and values hold. (envoyproxy/ratelimit joins
// parts with "_", so ("a", "b_c") and ("a_b", "c") collide there, and it
// leaves the unit out.) Every string is length-prefixed, so no byte needs
// escaping, and the result stays readable in redis-cli:
//
//	key    = domain entry* "|" algorithm ["/" window]
//	domain = len ":" bytes
//	entry  = ("=" | "*") len ":" bytes len ":" bytes
//	window = seconds "s" | microseconds "us"
//
// A concurrency limit's key has no window: its lease TTL says how long a
// slot is held, not which counter holds it, so a new TTL keeps the slots
// already held.
//
// An entry starting with "=" carries the descriptor's value; one starting
// with "*" carries the wildcard pattern of a rule with share_threshold, which
// every matching value shares. For example, ("to_number", "2061111111") in
// domain "messaging" under 5 per day:
//
//	9:messaging=9:to_number10:2061111111|fixed_window/86400s
//
// The Append functions append to dst and return the extended slice, so a
// caller reusing a buffer builds keys without allocating. Call
// [AppendDomain], then [AppendEntry] or [AppendShared] once per entry in
// order, then [AppendLimit].
package key

import (
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// AppendDomain starts a key with domain.
func AppendDomain(dst []byte, domain string) []byte {
	return appendString(dst, domain)
}

// AppendEntry appends a descriptor entry with its own value.
func AppendEntry(dst []byte, k, v string) []byte {
	dst = append(dst, '=')
	return appendString(appendString(dst, k), v)
}

// AppendShared appends a descriptor entry whose value is replaced by the
// wildcard pattern as written (such as "files/*" or "/api*v1") that every
// matching value shares.
func AppendShared(dst []byte, k, pattern string) []byte {
	dst = append(dst, '*')
	return appendString(appendString(dst, k), pattern)
}

// AppendLimit ends a key with the limit's algorithm and window. The count
// N is deliberately not part of the key: raising a limit keeps what was
// already counted, while a new window or algorithm starts afresh.
func AppendLimit(dst []byte, l algo.Limit) []byte {
	dst = append(dst, '|')
	dst = append(dst, l.Algorithm.String()...)
	if l.Algorithm == algo.Concurrency {
		return dst
	}
	dst = append(dst, '/')
	if l.Window%time.Second == 0 {
		dst = strconv.AppendInt(dst, int64(l.Window/time.Second), 10)
		return append(dst, 's')
	}
	dst = strconv.AppendInt(dst, l.Window.Microseconds(), 10)
	return append(dst, "us"...)
}

func appendString(dst []byte, s string) []byte {
	dst = strconv.AppendInt(dst, int64(len(s)), 10)
	dst = append(dst, ':')
	return append(dst, s...)
}
