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

// Report is one counted descriptor's decision with the figures behind it,
// for a [ReportObserver]: enough to count hits the way
// envoyproxy/ratelimit's statistics do (which hits of a request fell past
// the near-limit threshold, which past the limit).
type Report struct {
	Domain string
	// Rule is the matched rule, nil for a descriptor's own limit override.
	Rule       *config.Rule
	Descriptor *rlv3.RateLimitDescriptor
	Outcome    Outcome
	// Hits is what the descriptor asked for.
	Hits uint64
	// Limit is the capacity decided against: requests_per_unit, or the
	// burst of a bucket; of the rule's most restrictive limit when it has
	// several.
	Limit uint64
	// Used is how much of Limit was used before the decision's hits. When
	// the hits were refused, nothing was consumed, and Used+Hits is over
	// Limit. When another descriptor of the request was refused, nothing
	// was consumed either, and Used is what stands.
	Used uint64
}

// ReportObserver is an Observer that is also told each counted decision's
// figures and the requests naming an unknown domain. The service calls
// Report right after Decided, for counted descriptors only (not unlimited
// ones). Its methods are called on the request path, concurrently: they
// must be cheap and must not block.
type ReportObserver interface {
	Observer
	Report(r Report)
	// UnknownDomain reports an Envoy RLS request naming a domain no rule
	// file has, with its number of descriptors.
	UnknownDomain(domain string, descriptors int)
}

// admitted reports whether the backend admitted sc's batch: no request
// refused but a shadow rule's. Only then were allowed requests consumed.
func (sc *scratch) admitted() bool {
	for i := range sc.checks {
		c := &sc.checks[i]
		if c.kind != counted {
			continue
		}
		shadow := c.rule != nil && c.rule.ShadowMode
		for j := c.req; j < c.req+c.n; j++ {
			if !sc.decisions[j].Allowed && !shadow {
				return false
			}
		}
		if c.slot >= 0 && !sc.decisions[c.slot].Allowed {
			return false
		}
	}
	return true
}

// report tells the report observer, if any, of counted descriptor d of
// req, decided as dec against limit l for hits; taken tells whether the
// batch was admitted, and so dec's hits consumed when it allowed them.
func (s *Service) report(domain string, c *check, d *rlv3.RateLimitDescriptor, o Outcome, dec *algo.Decision, l algo.Limit, hits uint64, taken bool) {
	if s.reporter == nil {
		return
	}
	capacity := l.Requests
	if l.Algorithm.UsesBurst() && l.Burst > 0 {
		capacity = l.Burst
	}
	used := capacity - min(dec.Remaining, capacity)
	if dec.Allowed && taken {
		used -= min(hits, used) // Remaining counts the hits just taken
	}
	s.reporter.Report(Report{Domain: domain, Rule: c.rule, Descriptor: d, Outcome: o, Hits: hits, Limit: capacity, Used: used})
}

// Tee returns an Observer telling each of obs, in order, of everything:
// decisions, backend calls, failure modes, and, to those that are one, what
// a [SlotObserver] or a [ReportObserver] is told. Nil observers are left
// out; with none left, Tee returns nil.
func Tee(obs ...Observer) Observer {
	t := &tee{}
	for _, o := range obs {
		if o == nil {
			continue
		}
		t.all = append(t.all, o)
		if so, ok := o.(SlotObserver); ok {
			t.slots = append(t.slots, so)
		}
		if ro, ok := o.(ReportObserver); ok {
			t.reports = append(t.reports, ro)
		}
	}
	switch {
	case len(t.all) == 0:
		return nil
	case len(t.all) == 1:
		return t.all[0]
	}
	return t
}

// tee is the Observer of Tee.
type tee struct {
	all     []Observer
	slots   []SlotObserver
	reports []ReportObserver
}

var (
	_ SlotObserver   = (*tee)(nil)
	_ ReportObserver = (*tee)(nil)
)

func (t *tee) Decided(domain string, rule *config.Rule, d *rlv3.RateLimitDescriptor, o Outcome, hits uint64) {
	for _, ob := range t.all {
		ob.Decided(domain, rule, d, o, hits)
	}
}

func (t *tee) BackendCall(took time.Duration, err error) {
	for _, ob := range t.all {
		ob.BackendCall(took, err)
	}
}

func (t *tee) FailureMode(domain string, m config.FailureMode) {
	for _, ob := range t.all {
		ob.FailureMode(domain, m)
	}
}

func (t *tee) Slots(r *SlotReport) {
	for _, ob := range t.slots {
		ob.Slots(r)
	}
}

func (t *tee) Report(r Report) {
	for _, ob := range t.reports {
		ob.Report(r)
	}
}

func (t *tee) UnknownDomain(domain string, descriptors int) {
	for _, ob := range t.reports {
		ob.UnknownDomain(domain, descriptors)
	}
}
