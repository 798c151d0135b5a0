package rlqs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// Explanation is how the server decides a bucket id of a domain, and what
// it holds for it now: the answer of [Server.Explain].
type Explanation struct {
	Domain      string            `json:"domain"`
	DomainKnown bool              `json:"domainKnown"`
	BucketID    map[string]string `json:"bucketId"`
	// Descriptor is the bucket id's entries sorted by key: the descriptor
	// matched against the domain's rules.
	Descriptor [][2]string `json:"descriptor"`
	// Decision is what decides the bucket's assignments: "rule" (a share
	// of Limit), "allow_all" (an unlimited or shadow-mode rule),
	// "deny_all" (a limit of 0) or "default" (no rule, or none RLQS can
	// express: the server's default assignment).
	Decision string        `json:"decision"`
	Rule     *ExplainRule  `json:"rule,omitempty"`
	Limit    *ExplainLimit `json:"limit,omitempty"`
	// Why says it in sentences: the rule match level by level, then how
	// the rule's limit becomes an Envoy rate.
	Why []string `json:"why"`
	// Replica is this replica's share of the limit: present while a
	// stream of this replica reports the bucket.
	Replica *ExplainPool `json:"replica,omitempty"`
	// Budget is the limit's budget as the shared store holds it now,
	// read without changing it (with a budget store, for a "rule").
	Budget *ExplainBudget `json:"budget,omitempty"`
}

// ExplainRule names the rule that decides a bucket.
type ExplainRule struct {
	ID        string `json:"id"`
	Name      string `json:"name,omitempty"`
	File      string `json:"file,omitempty"`
	Line      int    `json:"line,omitempty"`
	Shadow    bool   `json:"shadow,omitempty"`
	Unlimited bool   `json:"unlimited,omitempty"`
}

// ExplainLimit is a rule's limit as RLQS shares it: Units per Period,
// shared among the streams as whole units.
type ExplainLimit struct {
	Units  uint64 `json:"units"`
	Period string `json:"period"`
	// TokenBucket is the whole limit as the token bucket Envoy would be
	// assigned: a stream sharing the bucket with no other, demanding it
	// all, gets this; the others a share of it.
	TokenBucket ExplainTokenBucket `json:"tokenBucket"`
}

// ExplainTokenBucket is an assignment as Envoy's rate_limit_quota filter
// applies it: a token bucket of MaxTokens, refilled with TokensPerFill
// every FillInterval, so PerSecond requests a second.
type ExplainTokenBucket struct {
	MaxTokens     uint32  `json:"maxTokens"`
	TokensPerFill uint32  `json:"tokensPerFill"`
	FillInterval  string  `json:"fillInterval"`
	PerSecond     float64 `json:"perSecond"`
}

// explainTokenBucket describes token bucket strategy st (nil: not one).
func explainTokenBucket(st *typev3.RateLimitStrategy) *ExplainTokenBucket {
	tb := st.GetTokenBucket()
	if tb == nil {
		return nil
	}
	iv := tb.GetFillInterval().AsDuration()
	return &ExplainTokenBucket{
		MaxTokens: tb.GetMaxTokens(), TokensPerFill: tb.GetTokensPerFill().GetValue(),
		FillInterval: iv.String(), PerSecond: float64(tb.GetTokensPerFill().GetValue()) / iv.Seconds(),
	}
}

// ExplainPool is what this replica holds of one bucket's limit.
type ExplainPool struct {
	// Streams, Demand (requests per second) and Targets are sums over the
	// streams of this replica that report the bucket; Assigned sums their
	// assignments in force.
	Streams  int     `json:"streams"`
	Demand   float64 `json:"demand"`
	Targets  uint64  `json:"targets"`
	Assigned uint64  `json:"assigned"`
	// Members lists the streams, by id, at most maxExplained of them;
	// MoreMembers counts the others.
	Members     []ExplainMember `json:"members"`
	MoreMembers int             `json:"moreMembers,omitempty"`
	// Lease is the budget this replica holds for the bucket in the
	// shared store (with a budget store).
	Lease *ExplainLease `json:"lease,omitempty"`
}

// ExplainMember is one stream's part of a bucket's limit.
type ExplainMember struct {
	Stream   uint64  `json:"stream"`
	Demand   float64 `json:"demand"`
	Target   uint64  `json:"target"`
	Assigned uint64  `json:"assigned"`
	// InForceFor is how long its assignment still counts, and
	// TokenBucket the token bucket it was sent (none for an assignment
	// of 0, sent as DENY_ALL).
	InForceFor  string              `json:"inForceFor,omitempty"`
	TokenBucket *ExplainTokenBucket `json:"tokenBucket,omitempty"`
}

// ExplainLease is the lease a replica holds for one bucket.
type ExplainLease struct {
	Held uint64 `json:"held"`
	// EndsIn is how long the store still counts it; RenewIn, how long it
	// may still back assignments before it must be renewed.
	EndsIn  string `json:"endsIn,omitempty"`
	RenewIn string `json:"renewIn,omitempty"`
	// Contended is whether the budget was scarce at the last call (then
	// the replica announces its demand and reads the others').
	Contended bool `json:"contended"`
	Announced bool `json:"announced"`
	// GlobalDemand and GlobalStreams are the bucket's demand (requests
	// per second) and streams across the replicas that announce them, as
	// the last call showed.
	GlobalDemand  float64 `json:"globalDemand"`
	GlobalStreams float64 `json:"globalStreams"`
}

// ExplainBudget is a bucket's budget in the shared store.
type ExplainBudget struct {
	Limit uint64 `json:"limit"`
	// Free is what no replica holds; Held, what the leases of all
	// replicas hold together (Limit − Free).
	Free uint64 `json:"free"`
	Held uint64 `json:"held"`
	// Demand (requests per second) and Streams are what the replicas
	// whose budget is contended announce.
	Demand  float64 `json:"demand"`
	Streams float64 `json:"streams"`
	// Error says why the store could not be read; the figures are then 0.
	Error string `json:"error,omitempty"`
}

// maxExplained bounds the streams an explanation lists for one bucket.
const maxExplained = 100

// ErrBadExplainRequest marks what [Server.Explain] refuses: an empty or
// too long domain, or a bucket id the protocol would refuse.
var ErrBadExplainRequest = errors.New("bad explain request")

// Explain tells which rule decides bucket id in domain, as a report of it
// would be decided, what this replica holds for it and, with a budget
// store, what the store holds: read with a call that changes nothing.
// It never creates a share.
func (s *Server) Explain(ctx context.Context, domain string, id map[string]string) (*Explanation, error) {
	switch {
	case domain == "":
		return nil, fmt.Errorf("%w: domain is empty", ErrBadExplainRequest)
	case len(domain) > maxDomainLen:
		return nil, fmt.Errorf("%w: domain of %d bytes: at most %d are accepted", ErrBadExplainRequest, len(domain), maxDomainLen)
	}
	desc, err := newBucketDescriptor(id)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadExplainRequest, err)
	}
	e := &Explanation{Domain: domain, BucketID: id, Decision: "default"}
	for _, en := range desc {
		e.Descriptor = append(e.Descriptor, [2]string{en.key, en.value})
	}
	var r *config.Rule
	if rules := s.opts.Rules(); rules != nil {
		if dom := rules.Domain(domain); dom != nil {
			e.DomainKnown = true
			ex := dom.Explain(desc)
			r, e.Why = ex.Rule, ex.Why()
		}
	}
	if !e.DomainKnown {
		e.Why = []string{fmt.Sprintf("domain %q is not defined by any rule file: its buckets get the default assignment", domain)}
	}
	if r != nil {
		e.Rule = &ExplainRule{ID: r.ID, Name: r.Name, File: r.File, Line: r.Line, Shadow: r.ShadowMode, Unlimited: r.Unlimited}
	}
	d := decisionFor(r)
	switch d.kind {
	case decidedAllow:
		e.Decision = "allow_all"
		e.Why = append(e.Why, "assignment: ALLOW_ALL (an unlimited or shadow-mode rule never refuses)")
	case decidedDeny:
		e.Decision = "deny_all"
		e.Why = append(e.Why, "assignment: DENY_ALL (the limit is 0, or under one request a day)")
	case decidedByDefault:
		if r != nil {
			e.Why = append(e.Why, "assignment: the default (the rule has no rate RLQS can express, only a concurrency limit)")
		} else {
			e.Why = append(e.Why, "assignment: the default")
		}
	case decidedByRule:
		e.Decision = "rule"
		period := time.Duration(d.period) * time.Second
		whole := explainTokenBucket(tokenBucket(d.limit, d.period, s.opts.Burst))
		e.Limit = &ExplainLimit{Units: d.limit, Period: period.String(), TokenBucket: *whole}
		e.Why = append(e.Why, fmt.Sprintf("assignment: a share of %d units per %v (the rule's most restrictive limit, in at least %d units), sent as a token bucket of that many tokens per %v; "+
			"alone, a stream would get max_tokens %d, tokens_per_fill %d, fill_interval %v (%.4g requests a second)",
			d.limit, period, minUnits, period, whole.MaxTokens, whole.TokensPerFill, whole.FillInterval, whole.PerSecond))
	}
	if d.kind != decidedByRule {
		return e, nil
	}

	now := s.opts.Now()
	s.mu.Lock()
	if p := s.pools[poolKey{domain: domain, rule: r.ID, bucket: desc.key()}]; p != nil {
		e.Replica = p.explain(now, s.opts.Budget != nil)
	}
	s.mu.Unlock()
	if s.opts.Budget != nil {
		e.Budget = s.readBudget(ctx, domain, r.ID, desc, d.limit)
	}
	return e, nil
}

// explain describes the pool at now. Called with Server.mu held.
func (p *pool) explain(now time.Time, budget bool) *ExplainPool {
	ep := &ExplainPool{Streams: p.n, Demand: p.demand, Targets: p.target, Assigned: p.assigned}
	ids := make([]uint64, 0, len(p.members))
	for id := range p.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if len(ids) > maxExplained {
		ep.MoreMembers = len(ids) - maxExplained
		ids = ids[:maxExplained]
	}
	for _, id := range ids {
		m := p.members[id]
		em := ExplainMember{Stream: id, Demand: m.demand, Target: m.target, Assigned: m.assigned}
		if m.assigned > 0 && now.Before(m.until) {
			em.InForceFor = m.until.Sub(now).String()
			em.TokenBucket = explainTokenBucket(m.sent)
		}
		ep.Members = append(ep.Members, em)
	}
	if budget {
		l := &p.lease
		el := &ExplainLease{Held: l.held(), Contended: l.contended(p.limit), Announced: l.announced, GlobalDemand: l.gDemand, GlobalStreams: l.gCount}
		if end := l.leases[0].end; l.held() > 0 && now.Before(end) {
			el.EndsIn = end.Sub(now).String()
		}
		if now.Before(l.renewBy) {
			el.RenewIn = l.renewBy.Sub(now).String()
		}
		ep.Lease = el
	}
	return ep
}

// readBudget reads a bucket's budget and announcements from the store,
// with reads that store nothing.
func (s *Server) readBudget(ctx context.Context, domain, rule string, desc bucketDescriptor, limit uint64) *ExplainBudget {
	p := newPool(0, limit)
	keys := p.storeKeys(domain, rule, desc)
	peek := func(k []byte, l algo.Limit) algo.Request {
		return algo.Request{Key: k, Limit: l, Peek: true, Shadow: true}
	}
	batch := []algo.Request{peek(keys[0], budgetLimit(limit)), peek(keys[1], announceLimit()), peek(keys[2], announceLimit())}
	out := make([]algo.Decision, len(batch))
	ctx, cancel := context.WithTimeout(ctx, s.opts.BudgetTimeout)
	defer cancel()
	eb := &ExplainBudget{Limit: limit}
	if err := s.opts.Budget.Decide(ctx, batch, out); err != nil {
		eb.Error = err.Error()
		return eb
	}
	eb.Free = min(out[0].Remaining, limit)
	eb.Held = limit - eb.Free
	eb.Demand, eb.Streams = estimate(out[1], out[2])
	return eb
}

// maxExplainBody bounds the body of an explain request.
const maxExplainBody = 64 << 10

// ExplainRequest is the body of POST /explain/rlqs.
type ExplainRequest struct {
	Domain   string            `json:"domain"`
	BucketID map[string]string `json:"bucketId"`
}

// ExplainHandler serves [Server.Explain] over HTTP: POST a JSON
// [ExplainRequest], answered 200 with the [Explanation] as JSON, or 400
// (bad JSON, domain or bucket id) and 413 (a body over 64 KiB) with
// {"error": "..."}.
func (s *Server) ExplainHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxExplainBody))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": fmt.Sprintf("body over %d bytes", maxExplainBody)})
				return
			}
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "reading the body: " + err.Error()})
			return
		}
		var req ExplainRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `the body must be {"domain": "...", "bucketId": {"key": "value", ...}}: ` + err.Error()})
			return
		}
		e, err := s.Explain(r.Context(), req.Domain, req.BucketID)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, e)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
