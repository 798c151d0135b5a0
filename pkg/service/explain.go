package service

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// Results of an explained descriptor (ExplainDescriptor.Result).
const (
	// ExplainMatched: a rule applies and the descriptor is counted under
	// every limit of it.
	ExplainMatched = "matched"
	// ExplainNoMatch: no rule applies (or the domain is unknown); the
	// descriptor is answered OK without a limit and is not counted.
	ExplainNoMatch = "no_match"
	// ExplainOverride: the descriptor carries its own limit, counted in a
	// counter of its own; rules are not consulted.
	ExplainOverride = "override"
	// ExplainReplaced: a rule matched, but another rule matched by the
	// same request replaces it; answered as ExplainNoMatch.
	ExplainReplaced = "replaced"
	// ExplainUnlimited: an unlimited rule applies; admitted, not counted.
	ExplainUnlimited = "unlimited"
	// ExplainConcurrency: a rule with a concurrency limit alone applies:
	// Acquire takes one of its slots; ShouldRateLimit, Check and Peek
	// answer the descriptor OK without a limit, as for no match.
	ExplainConcurrency = "concurrency"
)

// ExplainResponse is the body of a 200 answer of POST /explain: for a
// RateLimitRequest, how each descriptor would be decided, without deciding
// it. Nothing is counted; the backend is called only to read how many
// slots of a concurrency limit are held, with a read that stores nothing.
type ExplainResponse struct {
	// Domain is the request's domain; DomainKnown whether a rule file
	// defines it, and DomainFile which one.
	Domain      string `json:"domain"`
	DomainKnown bool   `json:"domainKnown"`
	DomainFile  string `json:"domainFile,omitempty"`
	// RulesHash identifies the rules in force (as GET /rlconfig shows it).
	RulesHash string `json:"rulesHash"`
	// FailureMode is how the request would be decided if the backend
	// failed: the domain's failure_mode, or else the server's ("local"
	// without a fallback backend decides as "open"). FailureModeFrom says
	// which: "domain" or "server". Both are empty for an unknown domain,
	// whose requests never reach the backend.
	FailureMode     string `json:"failureMode,omitempty"`
	FailureModeFrom string `json:"failureModeFrom,omitempty"`
	// Descriptors has one explanation per descriptor, in request order.
	Descriptors []ExplainDescriptor `json:"descriptors"`
}

// ExplainDescriptor explains one descriptor of the request.
type ExplainDescriptor struct {
	// Entries are the descriptor's entries, as sent.
	Entries []ExplainEntry `json:"entries"`
	// Result is one of "matched", "no_match", "override", "replaced",
	// "unlimited" or "concurrency"; see the Explain* constants.
	Result string `json:"result"`
	// NoMatchReason says, for result "no_match", why no rule applies:
	// "unknown_domain", "entry_unmatched" (an entry matched nothing at its
	// level), "no_rate_limit" (the descriptor ends on a rule-file
	// descriptor without a rate_limit) or "empty_descriptor".
	NoMatchReason string `json:"noMatchReason,omitempty"`
	// Shadow is true when the descriptor is counted under a shadow_mode
	// rule: decided and counted, but it never causes a refusal.
	Shadow bool `json:"shadow"`
	// Hits is what the descriptor would count: its hits_addend, else the
	// request's, else 1.
	Hits uint64 `json:"hits"`
	// Rule is the rule matched, for results "matched", "replaced" and
	// "unlimited".
	Rule *ExplainRule `json:"rule,omitempty"`
	// Override is the descriptor's own limit, for result "override".
	Override *ExplainLimit `json:"override,omitempty"`
	// ReplacedBy is, for result "replaced", the ID of the rule that
	// replaces Rule; ReplacedName the name of Rule it names.
	ReplacedBy   string `json:"replacedBy,omitempty"`
	ReplacedName string `json:"replacedName,omitempty"`
	// Keys are the counter keys the descriptor would be counted under,
	// one per limit in the order of Rule.Limits (one for an override), as
	// the service builds them (package key); a Redis backend prepends its
	// key prefix. A key that is not printable UTF-8 is given Go-quoted,
	// starting with a double quote (a key itself starts with a digit).
	Keys []string `json:"keys,omitempty"`
	// Leases is, for each key of a leased limit (in the order of Keys, nil
	// for the others), what this replica holds of it now; omitted when no
	// limit of the descriptor is leased or the server does not lease.
	Leases []*ExplainLease `json:"leases,omitempty"`
	// Global is, for each key of a limit of scope: global (in the order
	// of Keys, nil for the others), what this replica knows of the count
	// of every region; omitted when no limit of the descriptor is global
	// or the server has no region.
	Global []*ExplainGlobal `json:"global,omitempty"`
	// Slots is, for a rule with a concurrency limit, its slots now.
	Slots *ExplainSlots `json:"slots,omitempty"`
	// Levels is the walk down the domain's rules, one level per entry
	// walked; empty for an override or an unknown domain.
	Levels []ExplainLevel `json:"levels,omitempty"`
	// Why says all of the above in sentences, for people.
	Why []string `json:"why"`
}

// ExplainSlots is a concurrency limit's slots, as the backend holds them.
type ExplainSlots struct {
	// Key is the counter key of the slots (see ExplainDescriptor.Keys).
	Key string `json:"key"`
	// Holders is how many slots are held now, by leases whose TTL has not
	// ended; nil when the backend could not be read, and Error says why.
	Holders *uint64 `json:"holders,omitempty"`
	Error   string  `json:"error,omitempty"`
}

// ExplainEntry is one entry of a descriptor.
type ExplainEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// ExplainLevel is how one entry matched its level of the rules.
type ExplainLevel struct {
	// Key and Value are the descriptor's entry.
	Key   string `json:"key"`
	Value string `json:"value"`
	// Match is "value" (exactly), "wildcard", "key_default" (a rule-file
	// descriptor with the key and no value) or "no_match".
	Match string `json:"match"`
	// Descriptor is the rule-file descriptor matched; nil for "no_match".
	Descriptor *ExplainRuleDescriptor `json:"descriptor,omitempty"`
	// Rule is the ID of the rule the matched descriptor holds, empty when
	// it has no rate_limit.
	Rule string `json:"rule,omitempty"`
}

// ExplainRuleDescriptor is a descriptor of a rule file: its key, its value
// (a pattern holding "*" for a wildcard, empty for a key-only
// descriptor) and its share_threshold.
type ExplainRuleDescriptor struct {
	Key            string `json:"key"`
	Value          string `json:"value,omitempty"`
	Wildcard       bool   `json:"wildcard,omitempty"`
	ShareThreshold bool   `json:"shareThreshold,omitempty"`
}

// ExplainRule is a rule as the explain API shows it.
type ExplainRule struct {
	// ID names the rule as envoyproxy/ratelimit's statistics do; Name is
	// its rate_limit.name.
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// File and Line locate the rule-file descriptor holding the rule.
	File string `json:"file"`
	Line int    `json:"line"`
	// Unlimited, ShadowMode and Replaces are as in the rule file.
	Unlimited  bool     `json:"unlimited,omitempty"`
	ShadowMode bool     `json:"shadowMode"`
	Replaces   []string `json:"replaces,omitempty"`
	// Limits are the rule's limits; none for an unlimited rule.
	Limits []ExplainLimit `json:"limits,omitempty"`
	// Concurrency is the rule's concurrency limit, if any.
	Concurrency *ExplainConcurrencyLimit `json:"concurrency,omitempty"`
}

// ExplainConcurrencyLimit is a rule's concurrency block.
type ExplainConcurrencyLimit struct {
	MaxInFlight uint32 `json:"maxInFlight"`
	// LeaseTTL is a Go duration ("30s").
	LeaseTTL string `json:"leaseTTL"`
}

// ExplainLimit is one limit.
type ExplainLimit struct {
	Name            string `json:"name,omitempty"`
	RequestsPerUnit uint32 `json:"requestsPerUnit"`
	// Unit is spelled as in RLS responses: SECOND, MINUTE, ...
	Unit           string `json:"unit"`
	UnitMultiplier uint32 `json:"unitMultiplier"`
	Algorithm      string `json:"algorithm"`
	// Burst is the bucket capacity of the algorithms that take one
	// (burst, else requests_per_unit); omitted for the others.
	Burst uint64 `json:"burst,omitempty"`
	// Consistency is "exact" or "leased" (rate_limit.consistency).
	Consistency string `json:"consistency"`
	// OverLimitHits is "drop" or "count": what becomes of hits beyond
	// what remains (rate_limit.over_limit_hits, else the server's).
	OverLimitHits string `json:"overLimitHits"`
	// Reserve is what a request-time call of the limit holds until its
	// cost is settled: "auto" or a number of hits (rate_limit.reserve,
	// else the server's -reserve); omitted when it reserves nothing.
	// ReserveHits and ReserveTTL are what the replica that answered holds
	// now and for how long (a Go duration); Settles and SettlesReleased
	// count the settles it saw and those that found a reservation.
	Reserve         string `json:"reserve,omitempty"`
	ReserveHits     uint64 `json:"reserveHits,omitempty"`
	ReserveTTL      string `json:"reserveTtl,omitempty"`
	Settles         uint64 `json:"settles,omitempty"`
	SettlesReleased uint64 `json:"settlesReleased,omitempty"`
}

// ExplainLease is what the replica that answered holds of a leased
// limit's counter: budget leased from the backend, not yet spent.
type ExplainLease struct {
	// Held is the hits it may still admit without asking the backend.
	Held uint64 `json:"held"`
	// EndsIn is the time until the first lease it holds ends, as a Go
	// duration ("1.5s"); what is unspent then goes back.
	EndsIn string `json:"endsIn"`
	// Rate is the counter's rate on this replica, hits per second.
	Rate float64 `json:"rate"`
	// Fetching is set while a lease is being taken.
	Fetching bool `json:"fetching"`
}

// ExplainGlobal is what the replica that answered knows of a limit of
// scope: global, in the window that holds now (docs/multi-region.md).
type ExplainGlobal struct {
	// WindowStart is the window's start, RFC 3339 on this replica's clock.
	WindowStart string `json:"windowStart"`
	// Regions are the counts of every region: this one first, then each
	// peer as last heard.
	Regions []ExplainRegion `json:"regions"`
	// Count is their sum: the global count as this region knows it.
	Count uint64 `json:"count"`
	// Offset is what a request now counts for the peers against the
	// limit: their counts, or what is reserved for a peer cut off.
	Offset uint64 `json:"offset"`
	// Unseen estimates the hits the peers admitted that this region has
	// not heard yet (each peer's rate times how long it has been unheard,
	// plus one sync interval and one push's way): how far the global
	// count may now be over what is known.
	Unseen float64 `json:"unseen"`
}

// ExplainRegion is one region's count of a global limit.
type ExplainRegion struct {
	Region string `json:"region"`
	Count  uint64 `json:"count"`
	// Unheard is how long since the region was last heard from, as a Go
	// duration; empty for this region, "never" for a peer never heard.
	Unheard string `json:"unheard,omitempty"`
	// CutOff is set for a peer unheard for longer than the partition
	// threshold; Reserved is then what is counted for it (on_partition:
	// share).
	CutOff   bool   `json:"cutOff,omitempty"`
	Reserved uint64 `json:"reserved,omitempty"`
	// Rate is how fast its count grew when last heard, hits per second.
	Rate float64 `json:"rate,omitempty"`
}

// serveExplain answers POST /explain. It takes the body of POST /json, a
// RateLimitRequest in JSON (protojson), refuses it as POST /json does (400
// with {"error": ...} naming the bound broken), and answers 200 with an
// [ExplainResponse]: for each descriptor, the rule it matches and why,
// whether another rule replaces it, and the counter keys it would use.
//
// It decides nothing: the fallback and the observer are not called, and
// the backend only to read the holders of concurrency limits (stored
// nothing), so nothing is counted.
func (s *Service) serveExplain(w http.ResponseWriter, r *http.Request) {
	req, ok := ReadRLSRequest(w, r, MaxJSONBody)
	if !ok {
		return
	}
	if err := s.bounds.check(req); err != nil {
		WriteJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	out, err := json.Marshal(s.explain(r.Context(), req))
	if err != nil {
		WriteJSONError(w, http.StatusInternalServerError, "encoding the response: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(out, '\n'))
}

// explain explains req, a request within the bounds, under the rules in
// force. It plans the request exactly as Acquire does (planSlots), so the
// results and keys are the ones a decision would use, reads the holders
// of its concurrency limits, and stops there.
func (s *Service) explain(ctx context.Context, req *rlsv3.RateLimitRequest) *ExplainResponse {
	rules := s.rules.Load()
	resp := &ExplainResponse{
		Domain:      req.Domain,
		RulesHash:   rules.Hash(),
		Descriptors: make([]ExplainDescriptor, len(req.Descriptors)),
	}
	for i, d := range req.Descriptors {
		ed := &resp.Descriptors[i]
		ed.Entries = make([]ExplainEntry, len(d.Entries))
		for j, e := range d.Entries {
			ed.Entries[j] = ExplainEntry{Key: e.Key, Value: e.Value}
		}
		ed.Hits = hitsOf(req, d)
	}

	dom := rules.Domain(req.Domain)
	if dom == nil {
		unknownDomainExplained(req, rules, resp)
		return resp
	}
	resp.DomainKnown, resp.DomainFile = true, dom.File
	mode, from := s.failureModeOf(dom)
	resp.FailureMode, resp.FailureModeFrom = string(mode), from

	// The same plan as Acquire's, on a scratch of its own; only its slots
	// reach the backend, as reads.
	sc := &scratch{checks: make([]check, len(req.Descriptors))}
	planSlots(sc, dom, req, true, algo.Holder{})
	s.slotsExplained(ctx, sc, resp)
	for i, d := range req.Descriptors {
		s.descriptorExplained(dom, sc, i, d, &resp.Descriptors[i])
	}
	return resp
}

// unknownDomainExplained explains every descriptor of req, whose domain
// no rule file of rules defines, in resp: no match.
func unknownDomainExplained(req *rlsv3.RateLimitRequest, rules *config.Rules, resp *ExplainResponse) {
	why := fmt.Sprintf("domain %q is not defined by any rule file (%s): the descriptor is answered OK without a limit and is not counted",
		req.Domain, knownDomains(rules))
	for i, d := range req.Descriptors {
		ed := &resp.Descriptors[i]
		ed.Result, ed.NoMatchReason = ExplainNoMatch, "unknown_domain"
		ed.Why = []string{why}
		if d.GetLimit() != nil {
			ed.Why = append(ed.Why, "its limit override does not apply either: overrides apply only in a known domain")
		}
	}
}

// descriptorExplained explains in ed descriptor d, the i-th of a request
// of domain dom planned in sc (its slots already explained): its keys,
// leases and global counts when it is counted, then its override, or the
// walk down dom's rules, the rule matched and the result.
func (s *Service) descriptorExplained(dom *config.Domain, sc *scratch, i int, d *rlv3.RateLimitDescriptor, ed *ExplainDescriptor) {
	c := &sc.checks[i]
	if c.kind == counted {
		for _, r := range sc.reqs[c.req : c.req+c.n] {
			ed.Keys = append(ed.Keys, printableKey(r.Key))
		}
		ed.Leases = s.leasesExplained(sc.reqs[c.req : c.req+c.n])
		ed.Global = s.globalExplained(sc.reqs[c.req : c.req+c.n])
	}
	if c.override != nil {
		ed.Result = ExplainOverride
		ed.Override = overrideExplained(c.override, s.overLimit)
		ed.Why = []string{fmt.Sprintf("the descriptor carries its own limit (%s): it is counted under it, in a counter of its own, and the rules are not consulted",
			limitText(*ed.Override))}
		return
	}
	// plan matched with Match; Explain says how, and agrees with it.
	x := dom.Explain((*rlsDescriptor)(d))
	ed.Levels = levelsExplained(x.Steps)
	ed.Why = x.Why()
	if c.rule != nil {
		ed.Rule = ruleExplained(c.rule, s.overLimit)
		s.reserving.Load().explain(ed.Rule, c.rule)
	}
	switch c.kind {
	case noMatch:
		ed.Result, ed.NoMatchReason = ExplainNoMatch, x.Outcome.String()
		ed.Why = append(ed.Why, "the descriptor is answered OK without a limit and is not counted")
	case unlimited:
		ed.Result = ExplainUnlimited
		ed.Why = append(ed.Why, fmt.Sprintf("rule %s is unlimited: the descriptor is admitted without being counted", c.rule.ID))
	case replaced:
		ed.Result = ExplainReplaced
		if j, name := replacerOf(sc.checks, c.rule); j >= 0 {
			by := sc.checks[j].rule
			ed.ReplacedBy, ed.ReplacedName = by.ID, name
			ed.Why = append(ed.Why, fmt.Sprintf("rule %s is replaced by rule %s (%s:%d), matched by descriptors[%d] of this request, which replaces %q: the descriptor is answered OK without a limit and is not counted",
				c.rule.ID, by.ID, by.File, by.Line, j, name))
		}
	case counted:
		s.countedExplained(c, ed)
	}
}

// countedExplained sets the result of ed, a descriptor counted under the
// rule of check c, and says in its Why what it is counted under: the
// rule's rate limits, its leases and global counts, its slots.
func (s *Service) countedExplained(c *check, ed *ExplainDescriptor) {
	ed.Shadow = c.rule.ShadowMode
	if c.n == 0 {
		ed.Result = ExplainConcurrency
		ed.Why = append(ed.Why, fmt.Sprintf("rule %s limits only requests in flight: Acquire takes one of its slots; ShouldRateLimit, Check and Peek answer OK without a limit, having no way to give a slot back",
			c.rule.ID))
		ed.Why = append(ed.Why, slotsWhy(c.rule, ed.Slots)...)
		return
	}
	ed.Result = ExplainMatched
	limits := make([]string, len(ed.Rule.Limits))
	for j, l := range ed.Rule.Limits {
		limits[j] = limitText(l)
	}
	if len(limits) == 1 {
		ed.Why = append(ed.Why, "the descriptor is counted under "+limits[0])
	} else {
		ed.Why = append(ed.Why, fmt.Sprintf("the descriptor is counted under %s, decided together: over any of them refuses it", strings.Join(limits, " and ")))
	}
	if ed.Shadow {
		ed.Why = append(ed.Why, fmt.Sprintf("rule %s is in shadow mode: decided and counted like any other, but it never causes a refusal (OK, with 0 remaining when over)", c.rule.ID))
	}
	ed.Why = append(ed.Why, s.leasesWhy(c.rule, ed.Leases)...)
	ed.Why = append(ed.Why, s.globalWhy(c.rule, ed.Global)...)
	if c.slot >= 0 {
		ed.Why = append(ed.Why, fmt.Sprintf("rule %s also limits requests in flight: Acquire takes one of its slots with the count; ShouldRateLimit, Check and Peek decide its rate limits only", c.rule.ID))
		ed.Why = append(ed.Why, slotsWhy(c.rule, ed.Slots)...)
	}
}

// slotsExplained reads, in one backend call that stores nothing, the
// holders of every concurrency limit planned in sc, and sets each
// descriptor's Slots.
func (s *Service) slotsExplained(ctx context.Context, sc *scratch, resp *ExplainResponse) {
	var reqs []algo.Request
	for i := range sc.checks {
		if c := &sc.checks[i]; c.slot >= 0 {
			q := sc.reqs[c.slot]
			q.Op, q.Hits, q.Peek, q.Holder = algo.OpDecide, 0, true, algo.Holder{}
			reqs = append(reqs, q)
		}
	}
	if len(reqs) == 0 {
		return
	}
	out := make([]algo.Decision, len(reqs))
	err := s.backend.Decide(ctx, reqs, out)
	k := 0
	for i := range sc.checks {
		c := &sc.checks[i]
		if c.slot < 0 {
			continue
		}
		es := &ExplainSlots{Key: printableKey(reqs[k].Key)}
		if err != nil {
			es.Error = "reading the backend: " + err.Error()
		} else {
			held := reqs[k].Limit.Requests - min(out[k].Remaining, reqs[k].Limit.Requests)
			es.Holders = &held
		}
		resp.Descriptors[i].Slots = es
		k++
	}
}

// slotsWhy says what a concurrency limit holds now.
func slotsWhy(r *config.Rule, es *ExplainSlots) []string {
	c := r.Concurrency
	why := fmt.Sprintf("at most %d in flight, each slot held until Release or for %v unless renewed", c.MaxInFlight, c.LeaseTTL)
	switch {
	case es == nil:
	case es.Holders == nil:
		why += "; how many are held now is unknown (" + es.Error + ")"
	default:
		why += fmt.Sprintf("; %d held now", *es.Holders)
	}
	return []string{why}
}

// leasesExplained returns what this replica holds of each leased key of
// reqs, nil when none is leased or the server does not lease.
func (s *Service) leasesExplained(reqs []algo.Request) []*ExplainLease {
	if s.leases == nil {
		return nil
	}
	var out []*ExplainLease
	for i := range reqs {
		if !reqs[i].Leased {
			continue
		}
		if out == nil {
			out = make([]*ExplainLease, len(reqs))
		}
		st, ok := s.leases.LeaseState(reqs[i].Key)
		if !ok {
			st = algo.LeaseState{}
		}
		out[i] = &ExplainLease{Held: st.Held, EndsIn: st.Ends.String(), Rate: st.Rate, Fetching: st.Fetching}
	}
	return out
}

// globalExplained returns what this replica knows of each global key of
// reqs, nil when none is global or the server has no region.
func (s *Service) globalExplained(reqs []algo.Request) []*ExplainGlobal {
	if s.global == nil {
		return nil
	}
	var out []*ExplainGlobal
	for i := range reqs {
		st, ok := s.global.GlobalState(reqs[i].Key, reqs[i].Limit, reqs[i].Global)
		if !ok {
			continue
		}
		if out == nil {
			out = make([]*ExplainGlobal, len(reqs))
		}
		eg := &ExplainGlobal{WindowStart: st.Start.UTC().Format(time.RFC3339Nano), Offset: st.Offset, Unseen: st.Unseen}
		for j, c := range st.Counts {
			er := ExplainRegion{Region: c.Region, Count: c.Count, CutOff: c.CutOff, Reserved: c.Reserved, Rate: c.Rate}
			switch {
			case j == 0:
			case c.Unheard < 0:
				er.Unheard = "never"
			default:
				er.Unheard = c.Unheard.Round(time.Millisecond).String()
			}
			eg.Count += c.Count
			eg.Regions = append(eg.Regions, er)
		}
		out[i] = eg
	}
	return out
}

// globalWhy says, for a rule with global limits, how the regions count
// them.
func (s *Service) globalWhy(r *config.Rule, global []*ExplainGlobal) []string {
	var why []string
	for j, l := range r.Limits {
		if l.Scope != config.Global {
			continue
		}
		if global == nil || global[j] == nil {
			why = append(why, fmt.Sprintf("limit %d is global, but this server has no region (-region): it is counted here alone", j))
			continue
		}
		g := global[j]
		var parts []string
		for k, rg := range g.Regions {
			switch {
			case k == 0:
				parts = append(parts, fmt.Sprintf("%s %d (this region)", rg.Region, rg.Count))
			case rg.CutOff:
				parts = append(parts, fmt.Sprintf("%s %d (cut off, unheard for %s; %d counted for it)", rg.Region, rg.Count, rg.Unheard, rg.Reserved))
			default:
				parts = append(parts, fmt.Sprintf("%s %d (heard %s ago)", rg.Region, rg.Count, rg.Unheard))
			}
		}
		w := fmt.Sprintf("limit %d is global (on_partition: %s): in the window from %s the regions count %s, %d in all of %d; a request counts against %d less %d for the peers",
			j, l.OnPartition, g.WindowStart, strings.Join(parts, ", "), g.Count, l.RequestsPerUnit, l.RequestsPerUnit, g.Offset)
		if g.Unseen >= 1 {
			w += fmt.Sprintf("; the peers may have admitted about %.0f more not heard of yet", g.Unseen)
		}
		why = append(why, w)
	}
	return why
}

// leasesWhy says, for a rule with leased limits, where they are decided.
func (s *Service) leasesWhy(r *config.Rule, leases []*ExplainLease) []string {
	var why []string
	for j, l := range r.Limits {
		if l.Consistency != config.Leased {
			continue
		}
		switch {
		case s.leases == nil:
			why = append(why, fmt.Sprintf("limit %d is leased, and decided exactly: this server holds every count itself (the memory backend)", j))
		case leases != nil && leases[j] != nil && leases[j].Held > 0:
			why = append(why, fmt.Sprintf("limit %d is leased: this replica holds %d hits of it, spent without asking the backend; the first lease ends in %s",
				j, leases[j].Held, leases[j].EndsIn))
		default:
			why = append(why, fmt.Sprintf("limit %d is leased: this replica holds none of it now, so the next request asks the backend", j))
		}
	}
	return why
}

func levelsExplained(steps []config.Step) []ExplainLevel {
	out := make([]ExplainLevel, len(steps))
	for i, st := range steps {
		l := ExplainLevel{Key: st.Key, Value: st.Value, Match: st.Kind.String()}
		if st.Kind != config.NoMatch {
			l.Descriptor = &ExplainRuleDescriptor{Key: st.Elem.Key, Value: st.Elem.Value, Wildcard: st.Elem.Wildcard, ShareThreshold: st.Elem.ShareThreshold}
		}
		if st.Rule != nil {
			l.Rule = st.Rule.ID
		}
		out[i] = l
	}
	return out
}

// ruleExplained describes rule r; overLimit is the server's
// over_limit_hits, for the limits that do not say.
func ruleExplained(r *config.Rule, overLimit config.OverLimitHits) *ExplainRule {
	er := &ExplainRule{
		ID: r.ID, Name: r.Name, File: r.File, Line: r.Line,
		Unlimited: r.Unlimited, ShadowMode: r.ShadowMode, Replaces: r.Replaces,
	}
	if c := r.Concurrency; c != nil {
		er.Concurrency = &ExplainConcurrencyLimit{MaxInFlight: c.MaxInFlight, LeaseTTL: c.LeaseTTL.String()}
	}
	for _, l := range r.Limits {
		el := ExplainLimit{
			Name:            l.Name,
			RequestsPerUnit: l.RequestsPerUnit,
			Unit:            strings.ToUpper(l.Unit.String()),
			UnitMultiplier:  max(l.UnitMultiplier, 1),
			Algorithm:       l.Algorithm.String(),
			Consistency:     l.Consistency.String(),
			OverLimitHits:   l.OverLimitHits.Or(overLimit).String(),
		}
		if l.Algorithm.UsesBurst() {
			el.Burst = l.Capacity()
		}
		er.Limits = append(er.Limits, el)
	}
	return er
}

func overrideExplained(o *rlv3.RateLimitDescriptor_RateLimitOverride, overLimit config.OverLimitHits) *ExplainLimit {
	l := overrideLimit(o)
	el := &ExplainLimit{
		RequestsPerUnit: o.RequestsPerUnit,
		Unit:            strings.ToUpper(overrideUnit(o.Unit).String()),
		UnitMultiplier:  1,
		Algorithm:       l.Algorithm.String(),
		Consistency:     config.Exact.String(),
		OverLimitHits:   overLimit.String(),
	}
	if m := o.GetUnitMultiplier(); m != nil {
		el.UnitMultiplier = m.Value
	}
	return el
}

// limitText describes a limit, such as "10 per 5 minutes (token_bucket,
// burst 20)".
func limitText(l ExplainLimit) string {
	var b strings.Builder
	unit := strings.ToLower(l.Unit)
	if l.UnitMultiplier > 1 {
		fmt.Fprintf(&b, "%d per %d %ss", l.RequestsPerUnit, l.UnitMultiplier, unit)
	} else {
		fmt.Fprintf(&b, "%d per %s", l.RequestsPerUnit, unit)
	}
	fmt.Fprintf(&b, " (%s", l.Algorithm)
	if l.Burst != 0 {
		fmt.Fprintf(&b, ", burst %d", l.Burst)
	}
	if l.Consistency == config.Leased.String() {
		b.WriteString(", leased")
	}
	if l.OverLimitHits == config.OverLimitCount.String() {
		b.WriteString(", over-limit hits counted")
	}
	b.WriteByte(')')
	if l.Name != "" {
		fmt.Fprintf(&b, " named %q", l.Name)
	}
	return b.String()
}

// knownDomains lists the domains rules define, for a message: at most
// ten names.
func knownDomains(rules *config.Rules) string {
	ds := rules.Domains()
	if len(ds) == 0 {
		return "no domain is defined"
	}
	const most = 10
	names := make([]string, 0, min(len(ds), most))
	for _, d := range ds[:min(len(ds), most)] {
		names = append(names, strconv.Quote(d.Name))
	}
	s := "defined: " + strings.Join(names, ", ")
	if len(ds) > most {
		s += fmt.Sprintf(" and %d more", len(ds)-most)
	}
	return s
}

// printableKey returns key as it is when it is printable UTF-8, and
// Go-quoted otherwise.
func printableKey(key []byte) string {
	if utf8.Valid(key) && strings.IndexFunc(string(key), func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return string(key)
	}
	return strconv.Quote(string(key))
}
