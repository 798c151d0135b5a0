package service

import (
	"context"
	"math"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// ownAPI serves ratelimitd.v1.RateLimiter with the service's engine: the
// same rules, matching, backend batch and failure modes as ShouldRateLimit.
type ownAPI struct {
	ratelimitdv1.UnimplementedRateLimiterServer
	s *Service
}

// Check implements ratelimitd.v1.RateLimiter.
func (a ownAPI) Check(ctx context.Context, req *ratelimitdv1.CheckRequest) (*ratelimitdv1.CheckResponse, error) {
	allowed, results, err := a.s.check(ctx, req.GetDomain(), req.GetDescriptors(), req.GetHits(), false)
	if err != nil {
		return nil, err
	}
	return &ratelimitdv1.CheckResponse{Allowed: allowed, Results: results}, nil
}

// Peek implements ratelimitd.v1.RateLimiter.
func (a ownAPI) Peek(ctx context.Context, req *ratelimitdv1.PeekRequest) (*ratelimitdv1.PeekResponse, error) {
	allowed, results, err := a.s.check(ctx, req.GetDomain(), req.GetDescriptors(), req.GetHits(), true)
	if err != nil {
		return nil, err
	}
	return &ratelimitdv1.PeekResponse{Allowed: allowed, Results: results}, nil
}

// Reset implements ratelimitd.v1.RateLimiter.
func (a ownAPI) Reset(ctx context.Context, req *ratelimitdv1.ResetRequest) (*ratelimitdv1.ResetResponse, error) {
	s := a.s
	if !s.enableReset {
		return nil, status.Error(codes.PermissionDenied, "Reset is off: start the server with -enable-reset to let operators clear counters")
	}
	if req.GetDescriptor_() == nil {
		return nil, status.Error(codes.InvalidArgument, "descriptor: must be set")
	}
	rls := toRLS(req.GetDomain(), []*ratelimitdv1.Descriptor{req.GetDescriptor_()}, 0)
	if err := s.bounds.check(rls); err != nil {
		return nil, err.Status()
	}
	dom := s.rules.Load().Domain(rls.Domain)
	if dom == nil {
		return nil, status.Errorf(codes.NotFound, "domain %q has no rules", rls.Domain)
	}
	resetter, ok := s.backend.(algo.Resetter)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this backend cannot reset counters")
	}
	sc := s.getScratch(1)
	defer s.putScratch(sc)
	plan(sc, dom, rls)
	c := &sc.checks[0]
	if c.kind != counted {
		return nil, status.Errorf(codes.NotFound, "no rule with a limit matches the descriptor in domain %q", rls.Domain)
	}
	keys := sc.reqs
	if err := resetter.Reset(ctx, keys); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, status.FromContextError(ctxErr).Err()
		}
		s.log.WarnContext(ctx, "counters not reset: the backend failed", "domain", rls.Domain, "error", err)
		return nil, status.Error(codes.Unavailable, errBackendUnavailable)
	}
	resp := &ratelimitdv1.ResetResponse{Counters: uint32(len(keys))}
	if c.rule != nil {
		resp.Rule = c.rule.ID
	}
	s.log.InfoContext(ctx, "counters reset", "domain", rls.Domain, "rule", resp.Rule, "counters", len(keys))
	return resp, nil
}

// toRLS is an own-API request as Envoy's, for the shared engine.
func toRLS(domain string, ds []*ratelimitdv1.Descriptor, hits uint64) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: make([]*rlv3.RateLimitDescriptor, len(ds))}
	if hits > math.MaxUint32 {
		hits = math.MaxUint32 // past any bound: refused as such
	}
	req.HitsAddend = uint32(hits)
	for i, d := range ds {
		rd := &rlv3.RateLimitDescriptor{Entries: make([]*rlv3.RateLimitDescriptor_Entry, len(d.GetEntries()))}
		for j, e := range d.GetEntries() {
			rd.Entries[j] = &rlv3.RateLimitDescriptor_Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if d.GetHits() > 0 {
			rd.HitsAddend = wrapperspb.UInt64(d.GetHits())
		}
		req.Descriptors[i] = rd
	}
	return req
}

// check decides an own-API request; with peek, nothing is stored.
func (s *Service) check(ctx context.Context, domain string, ds []*ratelimitdv1.Descriptor, hits uint64, peek bool) (bool, []*ratelimitdv1.DescriptorResult, error) {
	req := toRLS(domain, ds, hits)
	if err := s.bounds.check(req); err != nil {
		return false, nil, err.Status()
	}
	dom := s.rules.Load().Domain(req.Domain)
	if dom == nil {
		return true, noLimits(len(req.Descriptors)), nil
	}
	sc := s.getScratch(len(req.Descriptors))
	defer s.putScratch(sc)
	plan(sc, dom, req)
	for i := range sc.reqs {
		sc.reqs[i].Peek = peek
	}
	known, err := s.decideAll(ctx, req.Domain, dom, sc)
	if err != nil {
		return false, nil, err
	}
	allowed, results := s.ownResults(req, sc, s.observer != nil && !peek && known)
	return allowed, results, nil
}

// ownResults describes a decided request in the own API's terms, telling
// the observer of each descriptor's outcome when observe is set. A
// descriptor is described by its most restrictive limit or, when its
// concurrency slot was refused or it has no other limit, by its slot.
func (s *Service) ownResults(req *rlsv3.RateLimitRequest, sc *scratch, observe bool) (bool, []*ratelimitdv1.DescriptorResult) {
	results := make([]*ratelimitdv1.DescriptorResult, len(req.Descriptors))
	allowed := true
	taken := observe && s.reporter != nil && sc.admitted()
	for i := range sc.checks {
		c := &sc.checks[i]
		r := &ratelimitdv1.DescriptorResult{Outcome: ratelimitdv1.Outcome_OUTCOME_NO_LIMIT}
		results[i] = r
		if c.rule != nil && c.kind != replaced {
			r.Rule, r.Shadow = c.rule.ID, c.rule.ShadowMode
		}
		switch c.kind {
		case unlimited:
			r.Outcome = ratelimitdv1.Outcome_OUTCOME_UNLIMITED
			if observe {
				s.observer.Decided(req.Domain, c.rule, req.Descriptors[i], OutcomeUnlimited, hitsOf(req, req.Descriptors[i]))
			}
		case counted:
			var d *algo.Decision
			if c.n > 0 {
				j := mostRestrictive(sc.decisions[c.req : c.req+c.n])
				q := &sc.reqs[c.req+j]
				d = &sc.decisions[c.req+j]
				if observe {
					o := s.outcome(c, d, q.Limit)
					s.observer.Decided(req.Domain, c.rule, req.Descriptors[i], o, q.Hits)
					s.report(req.Domain, c, req.Descriptors[i], o, d, q.Limit, q.Hits, taken)
				}
				r.Limit = ownLimit(c, j, q.Limit)
				if q.Leased && s.leases != nil {
					r.Lease = ownLease(s.leases, q.Key)
				}
			}
			if c.slot >= 0 {
				q, sd := &sc.reqs[c.slot], &sc.decisions[c.slot]
				r.Concurrency = &ratelimitdv1.ConcurrencyState{
					InFlight:    q.Limit.Requests - min(sd.Remaining, q.Limit.Requests),
					MaxInFlight: q.Limit.Requests,
					LeaseTtl:    durationpb.New(q.Limit.Window),
				}
				if d == nil || d.Allowed && !sd.Allowed {
					d = sd
				}
			}
			r.Outcome = ratelimitdv1.Outcome_OUTCOME_OK
			r.Remaining = d.Remaining
			r.ResetAfter = durationpb.New(d.ResetAfter)
			r.Wait = durationpb.New(d.Wait)
			if d.Allowed {
				break
			}
			r.Outcome = ratelimitdv1.Outcome_OUTCOME_OVER_LIMIT
			if d.RetryAfter == algo.Never {
				r.RetryNever = true
			} else {
				r.RetryAfter = durationpb.New(d.RetryAfter)
			}
			if !r.Shadow && !c.quota {
				allowed = false
			}
		}
	}
	if quotaRefuses(sc) {
		allowed = false
	}
	return allowed, results
}

// noLimits is the results of n descriptors of a domain without rules.
func noLimits(n int) []*ratelimitdv1.DescriptorResult {
	results := make([]*ratelimitdv1.DescriptorResult, n)
	for i := range results {
		results[i] = &ratelimitdv1.DescriptorResult{Outcome: ratelimitdv1.Outcome_OUTCOME_NO_LIMIT}
	}
	return results
}

// ownLimit describes limit j of a counted check, decided under l.
func ownLimit(c *check, j int, l algo.Limit) *ratelimitdv1.Limit {
	out := &ratelimitdv1.Limit{
		Requests:  l.Requests,
		Window:    durationpb.New(l.Window),
		Algorithm: ratelimitdv1.Algorithm(l.Algorithm + 1), // the enum follows algo's order
	}
	if l.Algorithm.UsesBurst() {
		out.Burst = l.Requests
		if l.Burst > 0 {
			out.Burst = l.Burst
		}
	}
	out.Consistency = ratelimitdv1.Consistency_CONSISTENCY_EXACT
	if c.rule != nil {
		out.Name = c.rule.Limits[j].Name
		if c.rule.Limits[j].Consistency == config.Leased {
			out.Consistency = ratelimitdv1.Consistency_CONSISTENCY_LEASED
		}
	}
	return out
}

// ownLease is what this replica holds of key, or nil when nothing.
func ownLease(leases algo.LeaseReader, key []byte) *ratelimitdv1.LeaseState {
	st, ok := leases.LeaseState(key)
	if !ok {
		return nil
	}
	return &ratelimitdv1.LeaseState{Held: st.Held, Ends: durationpb.New(st.Ends), Rate: st.Rate, Fetching: st.Fetching}
}
