// Package algo is the vocabulary of rate limiting shared by every other
// package: a [Limit], a [Request] against it, the [Decision] that answers it,
// the [State] an algorithm keeps per key, and the [Backend] that stores state
// and applies requests atomically.
//
// Each [Algorithm] is a step function of (state, now, limit, hits), [Step]:
// it reads no clock and touches no storage, so the in-memory backend and the
// Lua twins of the Redis backend ([Script]) can be proven against the same
// test vectors (package algotest). Backends only load and store state.
//
// Times in [State] are integer microseconds since the Unix epoch, and the
// bucket algorithms keep fractions of a microsecond as exact integers too:
// nothing drifts the way accumulated floating-point seconds do. Every value
// stays below 2^53, where the Lua twins' float64 numbers are exact: until
// the year 2255.
//
// An [Algorithm] is also the name rule files give it and the properties
// the rest of ratelimitd reads instead of listing algorithms: whether it
// takes a burst, leases, logs hits, holds a refusal until its admissible
// instant. A new algorithm is a constant in algorithm.go (its name, its
// place in [Algorithms], its properties and bounds), its Go step (and
// overcount, and lease ops if it leases) dispatched in step.go, count.go
// and lease.go, its Lua twin lua/<name>.lua, and its conformance cases in
// algotest; outside this package, only its value in the own API's
// Algorithm enum (proto/ratelimitd/v1) and its docs.
//
// This package imports nothing else of ratelimitd.
package algo
