package console

import (
	"fmt"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// RulesList is what GET /ui/api/rules answers: every rule in force.
type RulesList struct {
	Hash   string     `json:"hash"`
	Source Source     `json:"source"`
	Rules  []RuleInfo `json:"rules"`
}

// RuleInfo is a rule as the page lists it.
type RuleInfo struct {
	Domain string `json:"domain"`
	ID     string `json:"id"`
	Name   string `json:"name,omitempty"`
	// Path is the descriptor path from the domain down to the rule.
	Path   []PathElem  `json:"path"`
	Limits []LimitInfo `json:"limits"`
	// Unlimited rules admit without counting; Shadow rules never refuse.
	Unlimited bool `json:"unlimited"`
	Shadow    bool `json:"shadow"`
	// Concurrency describes a concurrency limit, "" for none.
	Concurrency string   `json:"concurrency,omitempty"`
	Replaces    []string `json:"replaces,omitempty"`
	// File and Line locate the rule: a rule file, or an xDS resource.
	File string `json:"file"`
	Line int    `json:"line"`
}

// PathElem is one level of a rule's descriptor path: a key, and a value
// (a pattern when Wildcard; "" for any value).
type PathElem struct {
	Key      string `json:"key"`
	Value    string `json:"value,omitempty"`
	Wildcard bool   `json:"wildcard,omitempty"`
}

// LimitInfo is one limit of a rule.
type LimitInfo struct {
	// Text says it in words: "10 per second", "100 per 5 minutes".
	Text      string `json:"text"`
	Name      string `json:"name,omitempty"`
	Algorithm string `json:"algorithm"`
	// Burst is the bucket capacity of the algorithms that take one.
	Burst       uint64 `json:"burst,omitempty"`
	Consistency string `json:"consistency"`
	Scope       string `json:"scope"`
}

// rulesList lists rules, from source.
func rulesList(rules *config.Rules, source Source) *RulesList {
	out := &RulesList{Hash: rules.Hash(), Source: source, Rules: []RuleInfo{}}
	for _, d := range rules.Domains() {
		for _, r := range d.Rules() {
			out.Rules = append(out.Rules, ruleInfo(d.Name, r))
		}
	}
	return out
}

func ruleInfo(domain string, r *config.Rule) RuleInfo {
	ri := RuleInfo{
		Domain: domain, ID: r.ID, Name: r.Name, Path: make([]PathElem, len(r.Path)), Limits: []LimitInfo{},
		Unlimited: r.Unlimited, Shadow: r.ShadowMode, Replaces: r.Replaces, File: r.File, Line: r.Line,
	}
	for i, p := range r.Path {
		ri.Path[i] = PathElem{Key: p.Key, Value: p.Value, Wildcard: p.Wildcard}
	}
	for _, l := range r.Limits {
		li := LimitInfo{Text: limitText(l), Name: l.Name, Algorithm: l.Algorithm.String(),
			Consistency: l.Consistency.String(), Scope: l.Scope.String()}
		if l.Algorithm.UsesBurst() {
			li.Burst = l.Capacity()
		}
		ri.Limits = append(ri.Limits, li)
	}
	if c := r.Concurrency; c != nil {
		ri.Concurrency = fmt.Sprintf("at most %d in flight, leases of %v", c.MaxInFlight, c.LeaseTTL)
	}
	return ri
}

// limitText says limit l in words: "10 per second", "100 per 5 minutes".
func limitText(l config.Limit) string {
	if l.UnitMultiplier > 1 {
		return fmt.Sprintf("%d per %d %ss", l.RequestsPerUnit, l.UnitMultiplier, l.Unit)
	}
	return fmt.Sprintf("%d per %s", l.RequestsPerUnit, strings.ToLower(l.Unit.String()))
}
