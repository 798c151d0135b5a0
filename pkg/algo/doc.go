// Package algo is the vocabulary of rate limiting shared by every other
// package: a [Limit], a [Request] against it, the [Decision] that answers it,
// the [State] an algorithm keeps per key, and the [Backend] that stores state
// and applies requests atomically.
//
// Each [Algorithm] is a pure step function of (state, now, limit, hits):
// it reads no clock and touches no storage, so the in-memory backend and the
// Redis scripts (which mirror the same steps in Lua) can be proven against
// the same test vectors. Backends only load and store state.
//
// Times in [State] are integer microseconds since the Unix epoch. Integers
// never drift the way accumulated floating-point seconds do, and an int64 of
// microseconds spans about ±292,000 years.
//
// This package imports nothing else of ratelimitd.
package algo
