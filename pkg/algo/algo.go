package algo

import (
	"context"
	"math"
	"slices"
	"time"
)

// Never is the RetryAfter of a request that no amount of waiting admits,
// because it asks for more hits than the limit can ever hold.
const Never time.Duration = math.MaxInt64

// Limit is one rate limit: at most Requests hits per Window, decided by
// Algorithm. The zero Algorithm is [FixedWindow].
type Limit struct {
	Algorithm Algorithm
	// Requests is N, the hits admitted per Window. Zero admits nothing.
	Requests uint64
	// Window is W, at least one microsecond; shorter windows count as one
	// microsecond.
	Window time.Duration
	// Burst is the bucket capacity of the bucket algorithms; zero means
	// Requests. Window-based algorithms ignore it.
	Burst uint64
}

// Request asks a [Backend] to apply Hits to the state stored under Key.
type Request struct {
	// Key names the state. Different descriptors must use different keys
	// (see package key). A Backend must not retain Key after Decide returns.
	Key   []byte
	Limit Limit
	// Hits is the number of hits to consume. Zero consumes nothing and
	// reports the state as it stands.
	Hits uint64
	// Shadow marks a request that is decided and consumed like any other
	// but whose refusal never refuses the rest of its batch.
	Shadow bool
	// Peek marks a request that is decided like any other, for its hits,
	// with the same answer, but whose state is never stored: it consumes
	// nothing. (A later request of the batch for the same key still sees
	// its hits, as it would a request's that is stored.)
	Peek bool
	// Count marks a request whose hits are spent whatever the answer (a
	// rule's over_limit_hits: count, for costs reported after the
	// response): when its limit refuses them, they are counted beyond
	// what remains all the same, and the request is still refused (see
	// [Counted]); when its batch is refused, it is counted as if decided
	// alone with the other requests that count. A peek is decided the
	// same way and stores nothing.
	Count bool
	// Leased marks a request of a limit with consistency: leased, which a
	// lease engine in front of the backend may decide in process from
	// budget it leased earlier (package lease). A backend that holds the
	// state itself decides it like any other request.
	Leased bool
	// Global marks a request of a limit with scope: global, which a region
	// engine in front of the backend decides against the counts the other
	// regions reported (package region) by lowering its limit, for this
	// request only, by what they counted in its window. A backend decides
	// it like any other request.
	Global Global
	// Op is what the request does to its key's state; the zero value
	// decides Hits. A take or a give reads its arguments from Lease.
	Op    Op
	Lease Lease
	// Holder names who takes, gives back or keeps a slot of a
	// Concurrency limit.
	Holder Holder
	// RefKey, when set, is the key envoyproxy/ratelimit keeps this
	// limit's count under, less the window start that ends it
	// ("domain_k1_v1_", package key's reference layout). A caller sets it
	// only for a fixed window that implementation could hold too; a
	// backend whose store such pods share (package redis) then keeps the
	// count there, see [Plain]. Other backends ignore it. A Backend must
	// not retain RefKey after Decide returns.
	RefKey []byte
	// Plain, set by a backend for a request it keeps under RefKey, asks
	// the decision script to keep a FixedWindow state as
	// envoyproxy/ratelimit does. The zero value keeps algo's own state.
	Plain Plain
}

// Plain describes a fixed window kept in envoyproxy/ratelimit's layout: its
// key names one window (the one holding At) and holds the window's count
// alone, as a plain integer, raised by the hits admitted (INCRBY) and
// expiring TTL after the hit that created it. The decision is the
// [FixedWindow] step's, at At rather than at the backend's clock: At named
// the key, so the two cannot disagree about the window.
type Plain struct {
	// At is the instant the request is decided at; zero: not plain.
	At time.Time
	// TTL is the expiry of a key the request creates, whole seconds.
	TTL time.Duration
}

// Holder names the holder of a [Concurrency] slot: 128 random bits.
type Holder [2]uint64

// String returns the holder as 32 hexadecimal digits: its name in Redis.
func (h Holder) String() string {
	const hex = "0123456789abcdef"
	var b [32]byte
	for i, v := range h {
		for j := range 16 {
			b[i*16+j] = hex[v>>(60-4*j)&15]
		}
	}
	return string(b[:])
}

// Global says how a [Request] of a limit with scope: global is decided
// while its region cannot hear from a peer region; the zero value marks a
// limit counted in its region alone.
type Global uint8

const (
	// NotGlobal: the limit is counted in this region alone.
	NotGlobal Global = iota
	// GlobalShare: a peer region that is not heard from counts as what it
	// was last known to count, or its share of the limit, whichever is
	// more.
	GlobalShare
	// GlobalExactLocal: while a peer region is not heard from, the limit
	// is decided on this region's count alone.
	GlobalExactLocal
)

// Op is what a [Request] does to its key's state.
type Op uint8

const (
	// OpDecide decides the request's hits: [Step].
	OpDecide Op = iota
	// OpTake decides the request's hits like OpDecide and, when the batch
	// is admitted, also takes a lease: Taken hits in all are counted
	// against the limit at once, where
	//
	//	Taken = max(Hits, min(Lease.Max, available / Lease.Share))
	//
	// and available is what the limit admitted before the request. The
	// Hits are spent at once; the rest is the lease, which the caller may
	// spend for Valid. See [Decision.Taken]. Only the leasable algorithms
	// ([Algorithm.Leasable]) take more than Hits; a take of another
	// algorithm, a Peek, or a Lease.TTL of zero decides as OpDecide.
	OpTake
	// OpAcquire, OpRelease and OpRenew take, give back and keep a slot
	// of a [Concurrency] limit for Request.Holder. An acquire is refused
	// when every slot is held (by holders whose TTL has not ended); a
	// holder that acquires again keeps its slot, with its TTL restarted.
	// A release or a renew of a holder without a slot changes nothing and
	// is allowed. [Decision.Taken] says whether the slot was taken,
	// given back or kept.
	OpAcquire
	OpRelease
	OpRenew
	// OpGive gives back Hits hits of a lease that were not spent:
	// Lease.Mark names the lease by its [Decision.Mark]. Hits of a window
	// that has ended, or of a bucket lease past its TTL, are gone and give
	// nothing back. A give is always allowed, and is stored when its batch
	// is admitted; it reports the state it leaves.
	OpGive
	// OpReserve holds a reservation of Hits on a [FixedWindow] for a cost
	// known only later (reservations in reserve.go): admitted when the
	// window's count, the reservations made in it and Hits fit N, it
	// counts nothing and holds Hits until an OpSettle releases them or
	// Lease.TTL has passed. [Decision.Taken] is the reservation, Mark its
	// end (µs since the Unix epoch on the store's clock) and Valid the
	// time until then. Of another algorithm it decides as OpDecide.
	OpReserve
	// OpSettle charges Hits, a cost already spent, and releases the
	// oldest reservation outstanding on its [FixedWindow] key (the one
	// made first): the hits count in the window that reservation was made
	// in while it is current, and nowhere once it has ended; without a
	// reservation, in the current window. It is always allowed, and counts
	// even in a refused batch ([Request.Counting]). Taken, Mark and Valid
	// describe the reservation released: its hits, its end and how long it
	// was held (from when the reservations of its slot were made, on
	// average); zero when none was outstanding. Of another algorithm it decides
	// as OpDecide with [Request.Count].
	OpSettle
)

// Lease holds the arguments of an [OpTake] or an [OpGive].
type Lease struct {
	// Max is the most hits a take takes in all; at least Hits are taken.
	Max uint64
	// Share caps what a take takes beyond Hits to available / Share, so
	// that one lease never holds more than a share of what remains; 0 is 1.
	Share uint64
	// TTL is, for the bucket algorithms, how long a take's lease may be
	// spent and the store counts it as outstanding (see [TokenBucket]).
	// A window's lease may be spent until its window ends, whatever the
	// TTL: its hits count there until then. A TTL of zero takes no lease.
	TTL time.Duration
	// Mark names, for a give, the lease its hits come from.
	Mark int64
}

// Decision is the answer to one [Request].
type Decision struct {
	// Allowed reports whether the request's hits fit its limit.
	Allowed bool
	// Remaining is how many more hits the limit admits now, after this
	// decision's hits when they were consumed.
	Remaining uint64
	// ResetAfter is the time until the limit is fully restored, zero when
	// nothing is counted against it.
	ResetAfter time.Duration
	// RetryAfter is, when Allowed is false, the time after which the same
	// hits would be admitted, or [Never]. Zero when Allowed.
	RetryAfter time.Duration
	// Wait is, for an allowed LeakyBucket request, how long its hits wait
	// for the queue ahead of them to drain. Zero for every other algorithm.
	Wait time.Duration
	// Taken, Mark and Valid describe what an allowed [OpTake] of an
	// admitted batch took: Taken hits in all, the request's Hits among
	// them. When it took more than Hits, the rest is a lease: Mark names it
	// for [OpGive] (the start of the window it counts in or, for a bucket,
	// the instant the store stops counting it as outstanding; µs since the
	// Unix epoch on the store's clock) and Valid is how long, from the
	// store's now, it may be spent. All zero for other requests.
	//
	// For a [Concurrency] limit: Taken is 1 when the request took, gave
	// back or kept a slot; Mark how many holders it found whose TTL had
	// ended without a release, and dropped (each is found once, by the
	// first call that stores within a TTL of the key's last slot's end:
	// see [Keep]); Valid the TTL of the slot taken or kept.
	Taken uint64
	Mark  int64
	Valid time.Duration
}

// State is what an algorithm stores for one key between decisions. The zero
// value is a key never seen or already expired. The meaning of each field is
// the algorithm's own (see each [Algorithm]); times are integer microseconds
// since the Unix epoch. Backends store a State whole and never look inside.
//
// The state [Step] leaves may share Log's backing array with the state it
// replaced: Step never changes the entries the old state can see, but it
// may write past their end. A caller that derives two states from one must
// copy Log.
type State struct {
	Time  int64
	Count int64
	// Frac is a fraction of a microsecond added to Time, in units of 1/N µs
	// (N = Limit.Requests), for the bucket algorithms.
	Frac int64
	// Prev is the previous window's count, for SlidingWindowCounter.
	Prev int64
	// Log holds timestamps, oldest first, for SlidingWindowLog. For
	// TokenBucket and GCRA it holds the leases outstanding ([OpTake]) as
	// pairs: the instant the lease ends, then its hits; ordered by instant.
	Log []int64
}

// Equal reports whether s and t hold the same state.
func (s State) Equal(t State) bool {
	return s.Time == t.Time && s.Count == t.Count && s.Frac == t.Frac && s.Prev == t.Prev && slices.Equal(s.Log, t.Log)
}

// Backend stores state and applies requests to it atomically.
//
// Decide decides reqs as one batch and writes the decision for reqs[i] to
// out[i]; len(out) must be at least len(reqs). The batch is admitted when no
// request is refused except shadow requests: then every allowed request is
// consumed and refused shadow requests are not. Otherwise nothing at all is
// consumed, and every decision describes the state as it stands, so an
// allowed request reports its remaining count without its hits taken. When
// two requests share a key, the later one sees the earlier one's hits.
//
// Requests with [Request.Count] are the exception: they are always
// consumed. Refused, their hits are counted beyond what remains
// ([Counted]), in an admitted batch as in a refused one. In a refused
// batch they are decided again, in order, from the states the batch
// found, each seeing only the earlier counting requests of its key, and
// stored (a take as a plain decision: it leases nothing); their decisions
// are those of that second pass.
//
// Decide returns an error only when it could not decide, for example when
// the store is unreachable or ctx is done; out is then meaningless.
// Implementations must be safe for concurrent use.
type Backend interface {
	Decide(ctx context.Context, reqs []Request, out []Decision) error
}

// Resetter is a Backend that can forget keys: their next decision starts
// from a fresh state. It serves operators' Reset. Each request names a
// state as [Backend.Decide] would find it: its Key, and for a backend
// that keeps it there, its RefKey (the current window's); Hits and Op
// are not read.
type Resetter interface {
	Reset(ctx context.Context, reqs []Request) error
}

// GlobalState is what a region engine knows of one key of a limit of
// scope: global, in the window that holds now.
type GlobalState struct {
	// Window is the window's start and length.
	Start  time.Time
	Window time.Duration
	// Counts are the regions' counts in it: this region's first, then
	// each peer's as last heard.
	Counts []RegionCount
	// Offset is what a request now counts against the limit for the peers:
	// their counts, or for a peer cut off its reserved share
	// (GlobalShare), or nothing while a peer is cut off
	// (GlobalExactLocal).
	Offset uint64
	// Unseen estimates the hits the peers admitted that this region has
	// not heard of yet: each peer's rate, as its counts grew, times how
	// long it has gone unheard, plus one sync interval and one push's way.
	Unseen float64
}

// RegionCount is one region's count of a global key, as a region engine
// knows it.
type RegionCount struct {
	Region string
	Count  uint64
	// Unheard is how long since the region was last heard (zero for this
	// region); CutOff, whether it counts as cut off; Reserved, what is
	// counted for it while it is (on_partition: share).
	Unheard  time.Duration
	CutOff   bool
	Reserved uint64
	// Rate is how fast its count grew when last heard, hits per second.
	Rate float64
}

// GlobalReader reports what a region engine knows of a global key, for
// operators (explain).
type GlobalReader interface {
	GlobalState(key []byte, l Limit, g Global) (GlobalState, bool)
}
