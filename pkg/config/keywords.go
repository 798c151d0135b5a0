package config

import (
	"fmt"
	"math"
	"strconv"
)

// Consistency is a limit's rate_limit.consistency: where its decisions
// are made. The zero value is Exact, the default.
type Consistency uint8

const (
	// Exact decides every request in the backend: with Redis, one round
	// trip per decision, shared by every replica at once.
	Exact Consistency = iota
	// Leased lets each replica decide in process from slices of the
	// budget it leased from the backend (docs/leasing.md): never more
	// than the limit, at the cost of refusing while budget sits unspent
	// in another replica's lease, within documented bounds.
	Leased
)

// String returns the consistency's rule-file name.
func (c Consistency) String() string {
	switch c {
	case Exact:
		return "exact"
	case Leased:
		return "leased"
	}
	return fmt.Sprintf("consistency(%d)", uint8(c))
}

// ParseConsistency returns the consistency named s.
func ParseConsistency(s string) (Consistency, error) {
	switch s {
	case "exact":
		return Exact, nil
	case "leased":
		return Leased, nil
	}
	return 0, fmt.Errorf("unknown consistency %q; accepted: exact, leased", s)
}

// OverLimitHits is a limit's rate_limit.over_limit_hits: what becomes of
// hits beyond what remains. The zero value, OverLimitDefault, leaves it to
// the server, whose default is OverLimitDrop natively and OverLimitCount in
// envoyproxy/ratelimit compatibility mode.
type OverLimitHits uint8

const (
	// OverLimitDefault is a limit that does not say: the server decides.
	OverLimitDefault OverLimitHits = iota
	// OverLimitDrop refuses hits beyond what remains and counts nothing:
	// a refused request consumes nothing, and all or nothing holds for
	// the descriptors of one request.
	OverLimitDrop
	// OverLimitCount counts the hits of every request, whatever the
	// answer: refused hits are counted beyond what remains and the
	// descriptor is still answered OVER_LIMIT, and a request refused by
	// another descriptor is counted too, as envoyproxy/ratelimit counts
	// them. For costs reported after the response (Envoy's
	// apply_on_stream_done), which are spent whatever the answer.
	OverLimitCount
)

// String returns the rule-file name: "drop", "count", or "" for the
// default.
func (o OverLimitHits) String() string {
	switch o {
	case OverLimitDefault:
		return ""
	case OverLimitDrop:
		return "drop"
	case OverLimitCount:
		return "count"
	}
	return fmt.Sprintf("over_limit_hits(%d)", uint8(o))
}

// Or returns o, or def when o is OverLimitDefault.
func (o OverLimitHits) Or(def OverLimitHits) OverLimitHits {
	if o == OverLimitDefault {
		return def
	}
	return o
}

// ParseOverLimitHits returns the behaviour named s: drop or count.
func ParseOverLimitHits(s string) (OverLimitHits, error) {
	switch s {
	case "drop":
		return OverLimitDrop, nil
	case "count":
		return OverLimitCount, nil
	}
	return 0, fmt.Errorf("unknown over_limit_hits %q; accepted: drop (refuse and count nothing), count (count the hits anyway, as envoyproxy/ratelimit does)", s)
}

// Scope is a limit's rate_limit.scope: which requests share its count.
// The zero value is Region, the default.
type Scope uint8

const (
	// Region counts the limit in each region on its own: every region
	// (its replicas and its Redis) admits up to the limit.
	Region Scope = iota
	// Global counts the limit across all regions: each region admits
	// while the count of every region it knows, its own included, is
	// under the limit; the regions exchange their counts asynchronously
	// (docs/multi-region.md).
	Global
)

// String returns the scope's rule-file name.
func (s Scope) String() string {
	switch s {
	case Region:
		return "region"
	case Global:
		return "global"
	}
	return fmt.Sprintf("scope(%d)", uint8(s))
}

// ParseScope returns the scope named s.
func ParseScope(s string) (Scope, error) {
	switch s {
	case "region":
		return Region, nil
	case "global":
		return Global, nil
	}
	return 0, fmt.Errorf("unknown scope %q; accepted: region, global", s)
}

// Partition is a global limit's rate_limit.on_partition: what a region
// admits while it cannot hear from a peer region. The zero value is
// Share, the default.
type Partition uint8

const (
	// Share admits the region's share of the limit: the limit less what
	// every peer it cannot hear was last known to count, or that peer's
	// share (its -region-weight), whichever is more. The regions on both
	// sides of a partition then admit no more than the limit together.
	Share Partition = iota
	// ExactLocal decides the limit per region while a peer is unheard:
	// the region admits up to the whole limit on its own count, as with
	// scope: region. Availability over the global count.
	ExactLocal
)

// String returns the partition behaviour's rule-file name.
func (p Partition) String() string {
	switch p {
	case Share:
		return "share"
	case ExactLocal:
		return "exact-local"
	}
	return fmt.Sprintf("partition(%d)", uint8(p))
}

// ParsePartition returns the partition behaviour named s.
func ParsePartition(s string) (Partition, error) {
	switch s {
	case "share":
		return Share, nil
	case "exact-local":
		return ExactLocal, nil
	}
	return 0, fmt.Errorf("unknown on_partition %q; accepted: share, exact-local", s)
}

// Reserve is a limit's rate_limit.reserve: what a request-time call
// holds until its cost is settled by a stream-done call (SPEC section 12,
// docs/ai-gateway.md). The zero value, ReserveDefault, leaves it to the
// server's -reserve.
type Reserve struct {
	Mode ReserveMode
	// Hits is the reservation of ReserveFixed.
	Hits uint64
}

// ReserveMode says how a limit reserves.
type ReserveMode uint8

const (
	// ReserveDefault: the rule does not say; the server's -reserve does.
	ReserveDefault ReserveMode = iota
	// ReserveOff: no reservation; costs count when they are reported.
	ReserveOff
	// ReserveAuto: the reservation and how long it lasts are learnt from
	// the costs settled and the time they took.
	ReserveAuto
	// ReserveFixed: Reserve.Hits at every request-time call.
	ReserveFixed
)

// On reports whether the limit reserves: auto or a fixed amount.
func (r Reserve) On() bool { return r.Mode == ReserveAuto || r.Mode == ReserveFixed }

// Or returns r, or def when r is ReserveDefault.
func (r Reserve) Or(def Reserve) Reserve {
	if r.Mode == ReserveDefault {
		return def
	}
	return r
}

// String returns the rule-file name: "auto", the number of hits, "off",
// or "" for the default.
func (r Reserve) String() string {
	switch r.Mode {
	case ReserveOff:
		return "off"
	case ReserveAuto:
		return "auto"
	case ReserveFixed:
		return fmt.Sprint(r.Hits)
	}
	return ""
}

// ParseReserve returns the reserve named s: auto, off, or a whole number
// of hits from 1 to 2^32-1.
func ParseReserve(s string) (Reserve, error) {
	switch s {
	case "auto":
		return Reserve{Mode: ReserveAuto}, nil
	case "off":
		return Reserve{Mode: ReserveOff}, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 {
		return Reserve{}, fmt.Errorf("unknown reserve %q; accepted: auto (learnt from the costs settled), off, or the hits a request-time call holds, 1 to %d", s, uint32(math.MaxUint32))
	}
	return Reserve{Mode: ReserveFixed, Hits: n}, nil
}
