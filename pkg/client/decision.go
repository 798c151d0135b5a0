package client

import (
	"math"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// Never is the RetryAfter of a request that no amount of waiting admits:
// it asks for more hits than its limit ever holds.
const Never time.Duration = math.MaxInt64

// Entry is one key and value of a [Descriptor].
type Entry struct {
	Key, Value string
}

// Descriptor names what to limit, such as ("user_id", "alice"): the
// entries a rule of the domain matches, as in Envoy's descriptors. Build
// one with [D].
type Descriptor struct {
	Entries []Entry
	// HitsAddend is the hits the descriptor asks for; 0 means 1.
	HitsAddend uint64
}

// D returns the descriptor of the given keys and values, in order:
//
//	client.D("user_id", "alice")
//	client.D("user_id", "alice", "path", "/upload").Hits(3)
//
// It panics when given an odd number of strings.
func D(keyValues ...string) Descriptor {
	if len(keyValues)%2 != 0 {
		panic("client.D: odd number of arguments: want key, value pairs")
	}
	d := Descriptor{Entries: make([]Entry, len(keyValues)/2)}
	for i := range d.Entries {
		d.Entries[i] = Entry{Key: keyValues[2*i], Value: keyValues[2*i+1]}
	}
	return d
}

// Hits returns a copy of d asking for n hits instead of 1, such as the
// size of an upload for a limit of bytes.
func (d Descriptor) Hits(n uint64) Descriptor {
	d.HitsAddend = n
	return d
}

// String returns d as "user_id=alice,path=/x", followed by " hits=N" when
// it asks for more than one hit.
func (d Descriptor) String() string {
	var b strings.Builder
	for i, e := range d.Entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	if d.HitsAddend > 1 {
		b.WriteString(" hits=")
		b.WriteString(strconv.FormatUint(d.HitsAddend, 10))
	}
	return b.String()
}

// proto returns d in the own API's form.
func (d Descriptor) proto() *ratelimitdv1.Descriptor {
	p := &ratelimitdv1.Descriptor{Entries: make([]*ratelimitdv1.Entry, len(d.Entries)), Hits: d.HitsAddend}
	for i, e := range d.Entries {
		p.Entries[i] = &ratelimitdv1.Entry{Key: e.Key, Value: e.Value}
	}
	return p
}

// protos returns ds in the own API's form.
func protos(ds []Descriptor) []*ratelimitdv1.Descriptor {
	out := make([]*ratelimitdv1.Descriptor, len(ds))
	for i, d := range ds {
		out[i] = d.proto()
	}
	return out
}

// Decision is ratelimitd's answer to a request.
type Decision struct {
	// Allowed is true when the request is admitted: no descriptor is over
	// its limit, shadow_mode rules aside.
	Allowed bool
	// RetryAfter is, for a refused request, the time after which the same
	// request would be admitted: the longest RetryAfter of its refused
	// non-shadow descriptors, or [Never]. Zero when Allowed.
	RetryAfter time.Duration
	// Results are the descriptors' results, in request order.
	Results []Result
}

// Outcome is what a descriptor came to.
type Outcome uint8

const (
	// OutcomeUnknown is an outcome this package does not know.
	OutcomeUnknown Outcome = iota
	// OutcomeOK is within its limits.
	OutcomeOK
	// OutcomeOverLimit is over a limit: refused (and the request with it),
	// unless its rule is in shadow mode.
	OutcomeOverLimit
	// OutcomeNoLimit matched no rule (or a rule another descriptor of the
	// request replaced): admitted, not counted.
	OutcomeNoLimit
	// OutcomeUnlimited matched an unlimited rule: admitted, not counted.
	OutcomeUnlimited
)

var outcomeNames = [...]string{"unknown", "ok", "over_limit", "no_limit", "unlimited"}

// String returns the outcome's name: ok, over_limit, no_limit, unlimited
// or unknown.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Limit is the limit a result reports: for a rule with several limits,
// the most restrictive one.
type Limit struct {
	// Name is the limit's name in the rule file, if any.
	Name string
	// Requests is the limit's requests_per_unit.
	Requests uint64
	// Window is the limit's unit times its multiplier (a month is 30
	// days, a year 365).
	Window time.Duration
	// Algorithm is the algorithm's rule-file name, such as "fixed_window"
	// or "token_bucket"; empty when the answer does not say (Envoy's API).
	Algorithm string
	// Burst is the bucket capacity of token_bucket, leaky_bucket and gcra.
	Burst uint64
	// Leased is true for a limit with consistency: leased, decided by
	// each server replica from budget it leased (docs/leasing.md).
	Leased bool
}

// Lease is what the server replica that answered holds of a leased
// limit's counter: budget leased from its backend, not yet spent.
type Lease struct {
	// Held is the hits it may still admit without asking its backend.
	Held uint64
	// Ends is the time until the first lease it holds ends.
	Ends time.Duration
	// Rate is the counter's rate on that replica, in hits per second.
	Rate float64
}

// Result is one descriptor's part in a [Decision].
type Result struct {
	Outcome Outcome
	// Rule is the matched rule's ID, such as "api.user_id"; empty for no
	// rule, and in answers of Envoy's API.
	Rule string
	// Shadow is true for a shadow_mode rule: counted, never refusing.
	// Envoy's API does not tell; its answers report a shadow rule over its
	// limit as OK with nothing remaining.
	Shadow bool
	// Limit, Remaining and ResetAfter are set for OutcomeOK and
	// OutcomeOverLimit.
	Limit     Limit
	Remaining uint64
	// ResetAfter is the time until the limit is fully restored.
	ResetAfter time.Duration
	// RetryAfter, for OutcomeOverLimit, is the time after which the same
	// hits would be admitted, or [Never].
	RetryAfter time.Duration
	// Wait is how long an admitted hit of a leaky bucket waits for the
	// queue ahead of it.
	Wait time.Duration
	// Lease is, for a leased limit, what the replica that answered holds
	// of its counter; nil when it holds nothing or the API does not tell.
	Lease *Lease
	// Concurrency is, in an answer of [Client.Acquire], the slots of the
	// descriptor's concurrency limit; nil for a rule without one, and in
	// other answers (Check and Peek take no slot).
	Concurrency *Concurrency
}

// Concurrency is a concurrency limit's slots, as [Client.Acquire]
// answers. When its slot is refused, the result is OutcomeOverLimit,
// Remaining is the free slots (none) and RetryAfter the time until the
// first holder's lease TTL ends: a release may free a slot sooner, and a
// renewal later.
type Concurrency struct {
	// InFlight is the slots held, the request's own included when it
	// took one.
	InFlight uint64
	// MaxInFlight is the limit's max_in_flight.
	MaxInFlight uint64
	// LeaseTTL is the limit's lease_ttl: how long a slot is held unless
	// released or renewed.
	LeaseTTL time.Duration
}

// NewDecision returns the decision of an own-API answer: the allowed and
// results fields of a CheckResponse, a PeekResponse or an
// AcquireResponse.
func NewDecision(allowed bool, results []*ratelimitdv1.DescriptorResult) Decision {
	d := Decision{Allowed: allowed, Results: make([]Result, len(results))}
	for i, pr := range results {
		r := &d.Results[i]
		if o := pr.GetOutcome(); o >= 0 && int(o) < len(outcomeNames) {
			r.Outcome = Outcome(o)
		}
		r.Rule = pr.GetRule()
		r.Shadow = pr.GetShadow()
		if l := pr.GetLimit(); l != nil {
			r.Limit = Limit{
				Name:      l.GetName(),
				Requests:  l.GetRequests(),
				Window:    l.GetWindow().AsDuration(),
				Algorithm: algorithmName(l.GetAlgorithm()),
				Burst:     l.GetBurst(),
				Leased:    l.GetConsistency() == ratelimitdv1.Consistency_CONSISTENCY_LEASED,
			}
		}
		if ls := pr.GetLease(); ls != nil {
			r.Lease = &Lease{Held: ls.GetHeld(), Ends: ls.GetEnds().AsDuration(), Rate: ls.GetRate()}
		}
		if cs := pr.GetConcurrency(); cs != nil {
			r.Concurrency = &Concurrency{InFlight: cs.GetInFlight(), MaxInFlight: cs.GetMaxInFlight(), LeaseTTL: cs.GetLeaseTtl().AsDuration()}
		}
		r.Remaining = pr.GetRemaining()
		r.ResetAfter = pr.GetResetAfter().AsDuration()
		r.Wait = pr.GetWait().AsDuration()
		if pr.GetRetryNever() {
			r.RetryAfter = Never
		} else {
			r.RetryAfter = pr.GetRetryAfter().AsDuration()
		}
		if !allowed && r.Outcome == OutcomeOverLimit && !r.Shadow {
			d.RetryAfter = max(d.RetryAfter, r.RetryAfter)
		}
	}
	return d
}

// algorithmName returns a's rule-file name: ALGORITHM_TOKEN_BUCKET is
// "token_bucket"; unspecified is "".
func algorithmName(a ratelimitdv1.Algorithm) string {
	if a == ratelimitdv1.Algorithm_ALGORITHM_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(a.String(), "ALGORITHM_"))
}

// DecisionFromRLS returns the decision of an answer of Envoy's
// RateLimitService. That API says less than the own one: a descriptor over
// its limit reports only the time until its limit is fully restored
// (duration_until_reset), which becomes its RetryAfter; rules, algorithms
// and shadow mode are not told, and neither is a request that waiting never
// admits. A descriptor without a current limit is OutcomeUnlimited when it
// has everything remaining, OutcomeNoLimit otherwise.
func DecisionFromRLS(resp *rlsv3.RateLimitResponse) Decision {
	d := Decision{
		Allowed: resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT,
		Results: make([]Result, len(resp.GetStatuses())),
	}
	for i, st := range resp.GetStatuses() {
		r := &d.Results[i]
		r.Remaining = uint64(st.GetLimitRemaining())
		r.ResetAfter = st.GetDurationUntilReset().AsDuration()
		cl := st.GetCurrentLimit()
		switch {
		case st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			r.Outcome = OutcomeOverLimit
			r.RetryAfter = r.ResetAfter
			d.RetryAfter = max(d.RetryAfter, r.RetryAfter)
		case cl != nil:
			r.Outcome = OutcomeOK
		case st.GetLimitRemaining() == math.MaxUint32:
			r.Outcome = OutcomeUnlimited
		default:
			r.Outcome = OutcomeNoLimit
		}
		if cl != nil {
			m := time.Duration(max(cl.GetUnitMultiplier().GetValue(), 1))
			r.Limit = Limit{Name: cl.GetName(), Requests: uint64(cl.GetRequestsPerUnit()), Window: m * unitDuration(cl.GetUnit())}
		}
	}
	if d.Allowed {
		d.RetryAfter = 0
	}
	return d
}

// unitDuration is the length of an RLS unit, as ratelimitd counts it.
func unitDuration(u rlsv3.RateLimitResponse_RateLimit_Unit) time.Duration {
	const day = 24 * time.Hour
	switch u {
	case rlsv3.RateLimitResponse_RateLimit_SECOND:
		return time.Second
	case rlsv3.RateLimitResponse_RateLimit_MINUTE:
		return time.Minute
	case rlsv3.RateLimitResponse_RateLimit_HOUR:
		return time.Hour
	case rlsv3.RateLimitResponse_RateLimit_DAY:
		return day
	case rlsv3.RateLimitResponse_RateLimit_WEEK:
		return 7 * day
	case rlsv3.RateLimitResponse_RateLimit_MONTH:
		return 30 * day
	case rlsv3.RateLimitResponse_RateLimit_YEAR:
		return 365 * day
	}
	return 0
}
