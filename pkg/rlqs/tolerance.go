package rlqs

import (
	"unicode/utf8"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// Tolerance is what the RLQS server asks of [wire.DecodeOptions]: Envoy's
// usage report whose strings are not UTF-8 is decoded as it came, for the
// server to answer the buckets it can. A bucket id is built from headers
// as an RLS descriptor is (docs/rlqs.md), so its keys and values may hold
// any bytes; ending the stream would leave every bucket of that Envoy
// unassigned. Those buckets are left unanswered, and counted
// (Stats.NotUTF8). The domain comes from Envoy's config: one that is not
// UTF-8 is refused as InvalidArgument naming it, like any other string.
func Tolerance() wire.Tolerance {
	return wire.Tolerate(func(rep *rlqsv3.RateLimitQuotaUsageReports) bool {
		return utf8.ValidString(rep.GetDomain())
	})
}
