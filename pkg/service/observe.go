package service

import (
	"context"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// Outcome is what a decision was for one descriptor, as metrics count it.
type Outcome uint8

const (
	// OutcomeOK: admitted, with room to spare.
	OutcomeOK Outcome = iota
	// OutcomeNearLimit: admitted, but with less than 1 − NearLimitRatio of
	// the limit left.
	OutcomeNearLimit
	// OutcomeOverLimit: refused.
	OutcomeOverLimit
	// OutcomeShadowOverride: over the limit of a shadow_mode rule, and so
	// admitted anyway.
	OutcomeShadowOverride
	// OutcomeUnlimited: matched an unlimited rule.
	OutcomeUnlimited
)

// String returns the outcome's metric label: ok, near_limit, over_limit,
// shadow_mode or unlimited.
func (o Outcome) String() string {
	switch o {
	case OutcomeNearLimit:
		return "near_limit"
	case OutcomeOverLimit:
		return "over_limit"
	case OutcomeShadowOverride:
		return "shadow_mode"
	case OutcomeUnlimited:
		return "unlimited"
	}
	return "ok"
}

// Observer is told of decisions, for metrics. Its methods are called on the
// request path, concurrently: they must be cheap and must not block.
type Observer interface {
	// Decided reports one descriptor's decision: the rule it matched (nil
	// for a descriptor's own limit override), the descriptor, its outcome
	// and the hits it asked for. Descriptors that match no rule, or whose
	// rule another replaced, are not reported.
	Decided(domain string, rule *config.Rule, d *rlv3.RateLimitDescriptor, o Outcome, hits uint64)
	// BackendCall reports one call of the backend: how long it took and
	// its error, nil when it succeeded.
	BackendCall(took time.Duration, err error)
	// FailureMode reports a request of domain decided by failure mode m
	// because the backend failed.
	FailureMode(domain string, m config.FailureMode)
}

// DefaultNearLimitRatio is the share of a limit past which an admitted
// descriptor counts as near its limit, as envoyproxy/ratelimit's default.
const DefaultNearLimitRatio = 0.8

// outcome classifies decision d of a descriptor under limit l.
func (s *Service) outcome(c *check, d *algo.Decision, l algo.Limit) Outcome {
	switch {
	case !d.Allowed && c.rule != nil && c.rule.ShadowMode:
		return OutcomeShadowOverride
	case !d.Allowed:
		return OutcomeOverLimit
	}
	capacity := l.Requests
	if l.Algorithm.UsesBurst() && l.Burst > 0 {
		capacity = l.Burst
	}
	if float64(capacity-min(d.Remaining, capacity)) > s.nearLimitRatio*float64(capacity) {
		return OutcomeNearLimit
	}
	return OutcomeOK
}

// hitsOf returns the hits descriptor d asks for in req: its own
// hits_addend, else the request's, else 1.
func hitsOf(req *rlsv3.RateLimitRequest, d *rlv3.RateLimitDescriptor) uint64 {
	if dh := d.GetHitsAddend(); dh != nil {
		return dh.Value
	}
	return uint64(max(req.HitsAddend, 1))
}

// decide asks the backend for sc's decisions, timed for the observer.
func (s *Service) decide(ctx context.Context, sc *scratch) error {
	b := s.backend
	if s.observer == nil {
		return b.Decide(ctx, sc.reqs, sc.decisions)
	}
	start := s.now()
	err := b.Decide(ctx, sc.reqs, sc.decisions)
	s.observer.BackendCall(s.now().Sub(start), err)
	return err
}
