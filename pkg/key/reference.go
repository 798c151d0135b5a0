package key

import "strconv"

// The reference layout is the key envoyproxy/ratelimit keeps a
// fixed-window count under (src/limiter/cache_key.go there), which
// ratelimitd writes with -redis-key-format reference so that both can
// count in one Redis during a migration:
//
//	domain "_" (key "_" value "_")* windowStart
//
// where value is the wildcard pattern (such as "files/*") of an entry
// that matched a rule with share_threshold, and windowStart is the Unix
// time in seconds at the start of the limit's unit, now / unit * unit.
// The store's own prefix goes in front. Unlike the native encoding it is
// not injective: ("a", "b_c") and ("a_b", "c") share a key, and so do two
// units whose windows start at the same second. Build it with
// [AppendReference], one [AppendReferenceEntry] per entry, then
// [AppendReferenceWindow].

// AppendReference starts a reference-layout key with domain.
func AppendReference(dst []byte, domain string) []byte {
	dst = append(dst, domain...)
	return append(dst, '_')
}

// AppendReferenceEntry appends an entry: its key and its value, or for a
// share_threshold match the wildcard pattern, each followed by "_".
func AppendReferenceEntry(dst []byte, k, v string) []byte {
	dst = append(dst, k...)
	dst = append(dst, '_')
	dst = append(dst, v...)
	return append(dst, '_')
}

// AppendReferenceWindow ends a reference-layout key with the start of the
// window of unitSeconds that holds the Unix time now (seconds), as
// envoyproxy/ratelimit computes it: now / unitSeconds * unitSeconds.
func AppendReferenceWindow(dst []byte, now, unitSeconds int64) []byte {
	return strconv.AppendInt(dst, now/unitSeconds*unitSeconds, 10)
}
