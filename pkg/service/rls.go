package service

import (
	"context"
	"log/slog"
	"math"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/key"
)

// maxPooledKeyBytes caps the key buffer kept for reuse, so one huge
// request does not pin its buffer in the pool.
const maxPooledKeyBytes = 64 << 10

// checkKind is what a descriptor turned out to need.
type checkKind uint8

const (
	noMatch   checkKind = iota // no rule: OK without a current limit
	unlimited                  // an unlimited rule: OK with everything remaining
	replaced                   // a rule replaced by another of the request's rules: as noMatch
	counted                    // decided by the backend
	// slotsOnly is a rule with a concurrency limit and no rate limit, in
	// a call that takes no slot (Envoy's API, Check, Peek): answered as
	// noMatch, since only Acquire holds a slot and Release gives it back.
	slotsOnly
)

// check is one descriptor's part in a decision.
type check struct {
	kind     checkKind
	rule     *config.Rule                                // the matched rule, nil for an override
	override *rlv3.RateLimitDescriptor_RateLimitOverride // the descriptor's own limit, if any
	// When counted, the descriptor's backend requests are reqs[req:req+n]:
	// one for an override, one per limit of its rule; and, in Acquire, its
	// rule's concurrency slot is reqs[slot] (-1 for none).
	req, n, slot int
	// quota marks a rule in quota mode (quota_mode, or the service's
	// QuotaMode): its refusal refuses the request only when every quota
	// descriptor of the request is refused.
	quota bool
}

// scratch is one call's working space, pooled so that a decision allocates
// little more than its response.
type scratch struct {
	checks    []check
	reqs      []algo.Request
	decisions []algo.Decision
	keys      []byte
	keyEnds   []int // keyEnds[i] is the end of reqs[i].Key in keys
	quotaMode bool  // every rule is in quota mode (Options.QuotaMode)
	// overLimit is what becomes of hits beyond what remains for limits
	// that do not say, and for limit overrides (Options.OverLimitHits).
	overLimit config.OverLimitHits
	// With reference set (Options.ReferenceKeys), refKeys holds the
	// reference-layout keys of the requests that have one: refSpans[i]
	// is where reqs[i].RefKey lies in refKeys, {0, 0} for none.
	reference bool
	refKeys   []byte
	refSpans  [][2]int
	// reserving holds the limits that reserve and what they learnt.
	reserving *reserving
}

// rlsDescriptor views an RLS descriptor as a config.Descriptor. It is a
// pointer conversion: matching does not copy or allocate.
type rlsDescriptor rlv3.RateLimitDescriptor

func (d *rlsDescriptor) Len() int { return len(d.Entries) }
func (d *rlsDescriptor) Entry(i int) (string, string) {
	e := d.Entries[i]
	return e.Key, e.Value
}

// ShouldRateLimit implements Envoy's RateLimitService v3.
//
// Each descriptor is matched to a rule of the request's domain, or carries
// its own limit override. The backend decides every counted descriptor as
// one atomic batch, each limit of a rule with several limits as a request
// of its own: either all non-shadow descriptors are within all their
// limits and all of them are counted, or the answer is OVER_LIMIT and
// nothing is counted, but for the limits whose hits count whatever the
// answer (over_limit_hits: count, see [Options.OverLimitHits]): those are
// counted either way, past what remains when they are over.
//
// With a [HeaderStyle] other than HeadersNone, the response asks Envoy to
// add rate-limit headers (response_headers_to_add) describing the most
// restrictive descriptor; see HeaderStyle.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := s.bounds.check(req); err != nil {
		return nil, err.Status()
	}
	n := len(req.Descriptors)
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}
	dom := s.rules.Load().Domain(req.Domain)
	if dom == nil {
		s.unknownDomain(req, resp)
		return resp, nil
	}

	sc := s.getScratch(n)
	defer s.putScratch(sc)
	plan(sc, dom, req)
	// Decisions by failure mode open or closed carry no figures to count
	// or to tell the client.
	known, err := s.decideAll(ctx, req.Domain, dom, sc)
	if err != nil {
		return nil, err
	}
	observe := s.observer != nil && known
	taken := s.reporter != nil && sc.admitted()
	var pick headerPick
	figures := s.headers != HeadersNone && s.headers != HeadersReference && known

	for i := range sc.checks {
		c := &sc.checks[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch c.kind {
		case unlimited:
			st.LimitRemaining = math.MaxUint32
			if observe {
				s.observer.Decided(req.Domain, c.rule, req.Descriptors[i], OutcomeUnlimited, hitsOf(req, req.Descriptors[i]))
			}
		case counted:
			j := mostRestrictive(sc.decisions[c.req : c.req+c.n])
			d := &sc.decisions[c.req+j]
			if observe {
				r := &sc.reqs[c.req+j]
				o := s.outcome(c, d, r.Limit)
				s.observer.Decided(req.Domain, c.rule, req.Descriptors[i], o, r.Hits)
				s.report(req.Domain, c, req.Descriptors[i], o, d, r.Limit, r.Hits, taken)
			}
			st.CurrentLimit = currentLimit(c, j)
			st.LimitRemaining = uint32(min(d.Remaining, math.MaxUint32))
			st.DurationUntilReset = durationpb.New(d.ResetAfter)
			if figures && c.takesPart() {
				pick.consider(i, j, d)
			}
			if d.Allowed {
				break
			}
			if c.rule != nil && c.rule.ShadowMode {
				st.LimitRemaining = 0 // over, but shadow rules never refuse
				break
			}
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			if !c.quota {
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if s.log.Enabled(ctx, slog.LevelDebug) {
				s.log.DebugContext(ctx, "over limit", "domain", req.Domain, "descriptor", i,
					"rule", ruleID(c), "limit", j, "retry_after", d.RetryAfter)
			}
		}
	}
	s.finish(req, sc, &pick, known, resp)
	return resp, nil
}

// unknownDomain answers, in resp, every descriptor of req, a request of
// a domain no rule file defines: OK, without a limit, and not counted.
func (s *Service) unknownDomain(req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) {
	if s.reporter != nil {
		s.reporter.UnknownDomain(req.Domain, len(req.Descriptors))
	}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	if s.dynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, nil, resp)
	}
}

// finish ends resp, the answer to req decided in sc whose statuses are
// set: its overall code, as the quota descriptors and the service's
// shadow mode make it, and what it asks Envoy to add: the headers of the
// most restrictive descriptor (pick) or the reference's (known: the
// decisions carry figures), and the dynamic metadata.
func (s *Service) finish(req *rlsv3.RateLimitRequest, sc *scratch, pick *headerPick, known bool, resp *rlsv3.RateLimitResponse) {
	if quotaRefuses(sc) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.shadowMode {
		resp.OverallCode = rlsv3.RateLimitResponse_OK
	}
	if pick.d != nil {
		resp.ResponseHeadersToAdd = s.responseHeaders(sc, pick, resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	if s.headers == HeadersReference && known {
		resp.ResponseHeadersToAdd = s.referenceHeaders(sc, resp)
	}
	if s.dynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, sc.checks, resp)
	}
}

// quotaRefuses reports whether the quota descriptors of a decided request
// refuse it, as envoyproxy/ratelimit's quota mode does
// (src/service/ratelimit.go, shouldRateLimitWorker): when there is at
// least one, and every one of them is over its limit. A quota descriptor
// is one whose rule has quota_mode and, with the service's QuotaMode,
// every descriptor but those of unlimited rules: one that matched no rule
// or a replaced rule is a quota descriptor within its limit, and so is a
// shadow one, whose status is OK even when over.
func quotaRefuses(sc *scratch) bool {
	quotas, over := 0, 0
	for i := range sc.checks {
		c := &sc.checks[i]
		switch {
		case c.kind == unlimited:
		case c.kind == counted && c.quota:
			quotas++
			if c.rule != nil && c.rule.ShadowMode {
				break
			}
			for _, d := range sc.decisions[c.req : c.req+c.n] {
				if !d.Allowed {
					over++
					break
				}
			}
		case sc.quotaMode:
			quotas++
		}
	}
	return quotas > 0 && over == quotas
}

// plan matches every descriptor of req and fills sc with the checks and
// the backend requests they need. With slots (Acquire), a rule's
// concurrency limit takes a slot for holder as well.
func plan(sc *scratch, dom *config.Domain, req *rlsv3.RateLimitRequest) {
	planSlots(sc, dom, req, false, algo.Holder{})
}

// planSlots is plan, and with slots (Acquire) also takes a slot for
// holder of every rule's concurrency limit matched: it matches, drops the
// rules replaced, appends the backend requests of the checks counted, and
// slices their keys.
func planSlots(sc *scratch, dom *config.Domain, req *rlsv3.RateLimitRequest, slots bool, holder algo.Holder) {
	matchChecks(sc, dom, req, slots)
	dropReplaced(sc)
	planRequests(sc, req, slots, holder)
	sc.sliceKeys()
	if cap(sc.decisions) < len(sc.reqs) {
		sc.decisions = make([]algo.Decision, len(sc.reqs))
	}
	sc.decisions = sc.decisions[:len(sc.reqs)]
}

// matchChecks sets the check of every descriptor of req: a limit override
// it carries, or the rule of dom it matches and what the rule does with
// it. Without slots (all but Acquire), a rule with a concurrency limit
// alone is slotsOnly.
func matchChecks(sc *scratch, dom *config.Domain, req *rlsv3.RateLimitRequest, slots bool) {
	for i, d := range req.Descriptors {
		c := &sc.checks[i]
		*c = check{slot: -1}
		if o := d.GetLimit(); o != nil {
			c.kind, c.override = counted, o
			continue
		}
		r := dom.Match((*rlsDescriptor)(d))
		switch {
		case r == nil:
		case r.Unlimited:
			c.kind, c.rule = unlimited, r
		case len(r.Limits) == 0 && !slots:
			c.kind, c.rule = slotsOnly, r
		default:
			c.kind, c.rule = counted, r
		}
	}
}

// dropReplaced drops a counted rule when another rule matched by the same
// request replaces one of its names, as envoyproxy/ratelimit does.
func dropReplaced(sc *scratch) {
	for i := range sc.checks {
		c := &sc.checks[i]
		if c.kind == counted && c.rule != nil && replacedBy(sc.checks, c.rule) {
			c.kind = replaced
		}
	}
}

// planRequests appends to sc the backend requests of each counted
// descriptor of req, and their keys: one for an override, one per limit
// of a rule, and with slots one more taking a slot for holder of a rule's
// concurrency limit.
func planRequests(sc *scratch, req *rlsv3.RateLimitRequest, slots bool, holder algo.Holder) {
	for i, d := range req.Descriptors {
		c := &sc.checks[i]
		if c.kind != counted {
			continue
		}
		h := hitsOf(req, d)
		c.req = len(sc.reqs)
		start := len(sc.keys)
		sc.keys = appendDescriptor(sc.keys, req.Domain, d, c.rule)
		end := len(sc.keys)
		if c.override != nil {
			// With the service's QuotaMode an override is a quota limit too,
			// as envoyproxy/ratelimit's global QUOTA_MODE makes every limit.
			c.quota = sc.quotaMode
			sc.add(overrideLimit(c.override), h, c.quota, false, algo.NotGlobal)
			sc.reqs[c.req].Count = sc.overLimit == config.OverLimitCount
			c.n = 1
			if sc.reference && referenceOverride(c.override) {
				sc.setReference(c.req, req.Domain, d, nil)
			}
			continue
		}
		// Each limit counts under its own key: the descriptor's, ended by
		// the limit's algorithm and window. A quota rule's refusal does not
		// refuse the batch: whether it refuses the request depends on the
		// other quota descriptors (quotaRefuses).
		c.quota = c.rule.QuotaMode || sc.quotaMode
		reserves := false
		for j := range c.rule.Limits {
			if j > 0 {
				sc.keys = append(sc.keys, sc.keys[start:end]...)
			}
			l := &c.rule.Limits[j]
			sc.add(ruleLimit(l), h, c.rule.ShadowMode || c.quota, l.Consistency == config.Leased, globalOf(l))
			q := &sc.reqs[len(sc.reqs)-1]
			q.Count = l.OverLimitHits.Or(sc.overLimit) == config.OverLimitCount
			if sc.reserving.reserveOp(q, c.rule, j, d) {
				reserves = true
			}
		}
		c.n = len(c.rule.Limits)
		if sc.reference && ReferenceRule(c.rule) && !reserves {
			sc.setReference(c.req, req.Domain, d, c.rule)
		}
		if cl := c.rule.Concurrency; slots && cl != nil {
			if c.n > 0 {
				sc.keys = append(sc.keys, sc.keys[start:end]...)
			}
			c.slot = len(sc.reqs)
			sc.add(slotLimit(cl), 1, c.rule.ShadowMode, false, algo.NotGlobal)
			r := &sc.reqs[c.slot]
			r.Op, r.Holder = algo.OpAcquire, holder
		}
	}
}

// sliceKeys gives each request of sc its key, and its reference key if it
// has one, from the buffers planRequests appended them to: only once all
// are appended, since appending may have moved the buffers.
func (sc *scratch) sliceKeys() {
	start := 0
	for i := range sc.reqs {
		sc.reqs[i].Key = sc.keys[start:sc.keyEnds[i]]
		start = sc.keyEnds[i]
	}
	for i, span := range sc.refSpans {
		if span[1] > span[0] {
			sc.reqs[i].RefKey = sc.refKeys[span[0]:span[1]:span[1]]
		}
	}
}

// add appends a backend request under limit l, its key the descriptor
// just appended to sc.keys; leased marks a limit with consistency: leased,
// global one with scope: global.
func (sc *scratch) add(l algo.Limit, hits uint64, shadow, leased bool, global algo.Global) {
	sc.keys = key.AppendLimit(sc.keys, l)
	sc.keyEnds = append(sc.keyEnds, len(sc.keys))
	sc.reqs = append(sc.reqs, algo.Request{Limit: l, Hits: hits, Shadow: shadow, Leased: leased, Global: global})
}

// globalOf says how a request of limit l is decided across regions.
func globalOf(l *config.Limit) algo.Global {
	switch {
	case l.Scope != config.Global:
		return algo.NotGlobal
	case l.OnPartition == config.ExactLocal:
		return algo.GlobalExactLocal
	}
	return algo.GlobalShare
}

// setReference gives request i, the single limit of descriptor d, its
// key in envoyproxy/ratelimit's layout, less the window start the backend
// ends it with: the domain, then each entry's key and value (the wildcard
// pattern of a share_threshold match, as for the native key).
func (sc *scratch) setReference(i int, domain string, d *rlv3.RateLimitDescriptor, r *config.Rule) {
	for len(sc.refSpans) <= i {
		sc.refSpans = append(sc.refSpans, [2]int{})
	}
	start := len(sc.refKeys)
	sc.refKeys = key.AppendReference(sc.refKeys, domain)
	for j, e := range d.Entries {
		if r != nil && r.Path[j].ShareThreshold {
			sc.refKeys = key.AppendReferenceEntry(sc.refKeys, e.Key, r.Path[j].Value)
		} else {
			sc.refKeys = key.AppendReferenceEntry(sc.refKeys, e.Key, e.Value)
		}
	}
	sc.refSpans[i] = [2]int{start, len(sc.refKeys)}
}

// ReferenceRule reports whether envoyproxy/ratelimit could hold rule r's
// limit too, so that with [Options.ReferenceKeys] its count is kept where
// reference pods keep theirs: a single
// fixed window of one unit (no unit_multiplier, which the reference's key
// would not tell apart), decided exactly (not leased) in its region (not
// scope: global, whose count the region engine reads). A rule with several
// limits (rate_limits) is ratelimitd's own: their windows would share
// reference keys wherever they start on the same second.
func ReferenceRule(r *config.Rule) bool {
	if len(r.Limits) != 1 {
		return false
	}
	l := &r.Limits[0]
	return l.Algorithm == algo.FixedWindow && l.Consistency != config.Leased && l.Scope != config.Global && l.UnitMultiplier <= 1
}

// referenceOverride reports whether envoyproxy/ratelimit could hold a
// limit override too: one of a single unit.
func referenceOverride(o *rlv3.RateLimitDescriptor_RateLimitOverride) bool {
	m := o.GetUnitMultiplier()
	return m == nil || m.Value <= 1
}

// replacedBy reports whether any matched rule in checks replaces a name of
// rule r.
func replacedBy(checks []check, r *config.Rule) bool {
	i, _ := replacerOf(checks, r)
	return i >= 0
}

// replacerOf returns the index in checks of the first matched rule that
// replaces a name of rule r, and the name, or -1.
func replacerOf(checks []check, r *config.Rule) (int, string) {
	for i := range checks {
		if other := checks[i].rule; other != nil {
			for _, name := range other.Replaces {
				if r.HasName(name) {
					return i, name
				}
			}
		}
	}
	return -1, ""
}

// mostRestrictive returns the index of the decision that describes a
// descriptor decided under several limits: among refused decisions the one
// with the longest RetryAfter; when all are allowed, the one with the
// least Remaining. Ties go to the longer ResetAfter, then to the first.
func mostRestrictive(ds []algo.Decision) int {
	best := 0
	for i := 1; i < len(ds); i++ {
		a, b := &ds[i], &ds[best]
		var more bool
		switch {
		case a.Allowed != b.Allowed:
			more = !a.Allowed
		case !a.Allowed && a.RetryAfter != b.RetryAfter:
			more = a.RetryAfter > b.RetryAfter
		case a.Allowed && a.Remaining != b.Remaining:
			more = a.Remaining < b.Remaining
		default:
			more = a.ResetAfter > b.ResetAfter
		}
		if more {
			best = i
		}
	}
	return best
}

// appendDescriptor appends the start of the state keys of descriptor d:
// its domain and entries, to be ended by a limit. Entries that matched a
// wildcard with share_threshold contribute the pattern, so every matching
// value shares one counter.
func appendDescriptor(dst []byte, domain string, d *rlv3.RateLimitDescriptor, r *config.Rule) []byte {
	dst = key.AppendDomain(dst, domain)
	for i, e := range d.Entries {
		if r != nil && r.Path[i].ShareThreshold {
			dst = key.AppendShared(dst, e.Key, r.Path[i].Value)
		} else {
			dst = key.AppendEntry(dst, e.Key, e.Value)
		}
	}
	return dst
}

// ruleLimit is a limit of a rule in the form the algorithms take.
func ruleLimit(l *config.Limit) algo.Limit {
	return algo.Limit{
		Algorithm: l.Algorithm,
		Requests:  uint64(l.RequestsPerUnit),
		Window:    l.Window,
		Burst:     l.Burst,
	}
}

// overrideLimit is the limit a validated override asks for. Overrides are
// fixed windows, the algorithm Envoy's callers expect.
func overrideLimit(o *rlv3.RateLimitDescriptor_RateLimitOverride) algo.Limit {
	window := overrideUnit(o.Unit).Duration()
	if m := o.GetUnitMultiplier(); m != nil {
		window *= time.Duration(m.Value)
	}
	return algo.Limit{Algorithm: algo.FixedWindow, Requests: uint64(o.RequestsPerUnit), Window: window}
}

// currentLimit describes limit i of a counted check for the response: its
// requests_per_unit, unit and unit_multiplier as the rule file wrote them,
// whatever the algorithm.
func currentLimit(c *check, i int) *rlsv3.RateLimitResponse_RateLimit {
	if o := c.override; o != nil {
		cl := &rlsv3.RateLimitResponse_RateLimit{
			RequestsPerUnit: o.RequestsPerUnit,
			Unit:            responseUnit(overrideUnit(o.Unit)),
		}
		if m := o.GetUnitMultiplier(); m != nil && m.Value > 1 {
			cl.UnitMultiplier = wrapperspb.UInt32(m.Value)
		}
		return cl
	}
	l := &c.rule.Limits[i]
	cl := &rlsv3.RateLimitResponse_RateLimit{
		Name:            l.Name,
		RequestsPerUnit: l.RequestsPerUnit,
		Unit:            responseUnit(l.Unit),
	}
	if l.UnitMultiplier > 1 {
		cl.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
	}
	return cl
}

func responseUnit(u config.Unit) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch u {
	case config.Second:
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case config.Minute:
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case config.Hour:
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case config.Day:
		return rlsv3.RateLimitResponse_RateLimit_DAY
	case config.Week:
		return rlsv3.RateLimitResponse_RateLimit_WEEK
	case config.Month:
		return rlsv3.RateLimitResponse_RateLimit_MONTH
	case config.Year:
		return rlsv3.RateLimitResponse_RateLimit_YEAR
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

// ruleID names a check's limit in logs.
func ruleID(c *check) string {
	if c.rule != nil {
		return c.rule.ID
	}
	return "limit override"
}

func (s *Service) getScratch(n int) *scratch {
	sc, _ := s.scratch.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	if cap(sc.checks) < n {
		sc.checks = make([]check, n)
		sc.reqs = make([]algo.Request, 0, n)
		sc.decisions = make([]algo.Decision, n)
	}
	sc.checks = sc.checks[:n]
	sc.reqs = sc.reqs[:0]
	sc.decisions = sc.decisions[:cap(sc.decisions)]
	sc.keys = sc.keys[:0]
	sc.keyEnds = sc.keyEnds[:0]
	sc.quotaMode = s.quotaMode
	sc.overLimit = s.overLimit
	sc.reference = s.referenceKeys
	sc.refKeys = sc.refKeys[:0]
	sc.refSpans = sc.refSpans[:0]
	sc.reserving = s.reserving.Load()
	return sc
}

func (s *Service) putScratch(sc *scratch) {
	if cap(sc.keys) > maxPooledKeyBytes {
		return
	}
	clear(sc.checks) // drop references to rules, so replaced rule sets can be freed
	clear(sc.reqs)
	sc.reserving = nil
	s.scratch.Put(sc)
}
