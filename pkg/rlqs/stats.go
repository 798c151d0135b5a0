package rlqs

import (
	"cmp"
	"slices"
	"sync/atomic"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Stats is a snapshot of what a [Server] holds and has done, for metrics.
type Stats struct {
	Streams int // streams open
	Buckets int // buckets the open streams hold
	Pools   int // bucket limits shared by streams

	Reports uint64 // usage reports received
	Pushes  uint64 // responses pushed without a report, after a reload
	// Rebalances counts responses pushed without a report because the
	// store showed a bucket's shares moved (a stream ended, another
	// replica's demand changed or it freed budget).
	Rebalances uint64
	// Assignments are the bucket actions sent, by kind.
	Assignments Assignments
	// StreamErrors counts the streams the server ended with an error, by
	// gRPC code: InvalidArgument and ResourceExhausted for bad input,
	// Unavailable at shutdown. Streams the client ended are not counted.
	StreamErrors map[codes.Code]uint64
	// Usage is, for every rule a bucket of an open stream matches, the
	// requests per second the stream reported allowed, summed over the
	// buckets at their latest reports: the rule's usage through this
	// replica. Summed over the replicas, it is the rule's global usage.
	// Sorted by domain and rule.
	Usage []RuleUsage
	// Budget counts the operations sent to the budget store, by kind.
	Budget BudgetOps
	// NotUTF8 counts the buckets reported whose id is not UTF-8, left out
	// of the answers (Envoy could not read an answer naming them).
	NotUTF8 uint64
}

// BudgetOps counts operations on the budget store ([Options.Budget]).
type BudgetOps struct {
	Takes uint64 // leases taken: renewals, and announcements where contended
	Gives uint64 // leases given back: renewed, or of a bucket no stream reports any more
	Reads uint64 // reads of contended budgets and announcements, storing nothing
	// Failed counts calls that failed (each a report answered with this
	// replica's share alone, or budget left to end with its lease).
	Failed uint64
}

// Assignments counts bucket actions sent, by the strategy sent.
type Assignments struct {
	TokenBucket uint64 // a token_bucket strategy: a share of a limit
	AllowAll    uint64
	DenyAll     uint64
	Abandon     uint64 // abandon_action
}

// RuleUsage is the usage of one rule through a replica.
type RuleUsage struct {
	Domain, Rule string  // the stream's domain and the rule's ID
	Buckets      int     // the buckets of open streams matching it
	Allowed      float64 // requests allowed per second, as reported
	// Held is the budget this replica holds in the store for the rule's
	// buckets, summed (units per period; 0 without a Budget), and
	// Assigned what its streams are assigned and still apply.
	Held, Assigned uint64
}

// counts are a Server's counters; its mutex guards errors and usage.
type counts struct {
	reports, pushes, rebalances               atomic.Uint64
	tokenBucket, allowAll, denyAll, abandoned atomic.Uint64
	takes, gives, reads, failed               atomic.Uint64
	notUTF8                                   atomic.Uint64
	buckets                                   int
	errors                                    map[codes.Code]uint64
	usage                                     map[ruleRef]*ruleUsage
}

// ruleRef names a rule of a domain for usage; the zero value is no rule.
type ruleRef struct{ domain, rule string }

type ruleUsage struct {
	buckets int
	allowed float64
}

// track records that bucket b is now decided by rule ref (zero: none, or
// the bucket is forgotten) and was last reported allowing allowed requests
// per second. Called with s.mu held.
func (s *Server) track(b *streamBucket, ref ruleRef, allowed float64) {
	if b.ref != (ruleRef{}) {
		u := s.counts.usage[b.ref]
		u.buckets--
		u.allowed -= b.allowed
		if u.buckets == 0 {
			delete(s.counts.usage, b.ref) // and the rounding it gathered
		}
	}
	b.ref, b.allowed = ref, allowed
	if ref != (ruleRef{}) {
		u := s.counts.usage[ref]
		if u == nil {
			u = &ruleUsage{}
			s.counts.usage[ref] = u
		}
		u.buckets++
		u.allowed += allowed
	}
}

// sent counts the bucket actions of a response about to be sent (a send
// that fails ends the stream).
func (s *Server) sent(resp *rlqsv3.RateLimitQuotaResponse) {
	var tokenBucket, allow, deny, abandon uint64
	for _, a := range resp.GetBucketAction() {
		if a.GetAbandonAction() != nil {
			abandon++
			continue
		}
		switch v := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetStrategy().(type) {
		case *typev3.RateLimitStrategy_BlanketRule_:
			if v.BlanketRule == typev3.RateLimitStrategy_DENY_ALL {
				deny++
			} else {
				allow++
			}
		case *typev3.RateLimitStrategy_TokenBucket:
			tokenBucket++
		}
	}
	s.counts.tokenBucket.Add(tokenBucket)
	s.counts.allowAll.Add(allow)
	s.counts.denyAll.Add(deny)
	s.counts.abandoned.Add(abandon)
}

// failed counts a stream the server ends with err, and returns err.
func (s *Server) failed(err error) error {
	code := status.Code(err)
	s.mu.Lock()
	s.counts.errors[code]++
	s.mu.Unlock()
	return err
}

// Stats returns a snapshot of the server's counts.
func (s *Server) Stats() Stats {
	st := Stats{
		Reports:    s.counts.reports.Load(),
		NotUTF8:    s.counts.notUTF8.Load(),
		Pushes:     s.counts.pushes.Load(),
		Rebalances: s.counts.rebalances.Load(),
		Budget: BudgetOps{
			Takes: s.counts.takes.Load(), Gives: s.counts.gives.Load(),
			Reads: s.counts.reads.Load(), Failed: s.counts.failed.Load(),
		},
		Assignments: Assignments{
			TokenBucket: s.counts.tokenBucket.Load(), AllowAll: s.counts.allowAll.Load(),
			DenyAll: s.counts.denyAll.Load(), Abandon: s.counts.abandoned.Load(),
		},
	}
	s.mu.Lock()
	st.Streams, st.Buckets, st.Pools = s.active, s.counts.buckets, len(s.pools)
	st.StreamErrors = make(map[codes.Code]uint64, len(s.counts.errors))
	for c, n := range s.counts.errors {
		st.StreamErrors[c] = n
	}
	st.Usage = make([]RuleUsage, 0, len(s.counts.usage))
	index := make(map[ruleRef]int, len(s.counts.usage))
	for ref, u := range s.counts.usage {
		index[ref] = len(st.Usage)
		st.Usage = append(st.Usage, RuleUsage{Domain: ref.domain, Rule: ref.rule, Buckets: u.buckets, Allowed: max(u.allowed, 0)})
	}
	for pk, p := range s.pools {
		if i, ok := index[ruleRef{domain: pk.domain, rule: pk.rule}]; ok {
			st.Usage[i].Held += p.lease.held()
			st.Usage[i].Assigned += p.assigned
		}
	}
	s.mu.Unlock()
	slices.SortFunc(st.Usage, func(a, b RuleUsage) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Rule, b.Rule))
	})
	return st
}
