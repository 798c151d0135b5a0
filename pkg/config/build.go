package config

// Building: the domain of a rule file from its decoded, validated
// descriptors: the tree that Match walks, level by level, and the rules at
// its nodes.

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// parseFile returns the file's domain, or nil when the file is not even a
// YAML mapping. Problems are in p.errs either way.
func (p *parser) parseFile(data []byte) *Domain {
	if len(data) > MaxFileSize {
		p.fail(nil, "", "the file is larger than %d bytes (%d MiB), the most a rule file may hold; "+
			"a domain lives in one file: write its descriptors shorter (flow style, {key: k, value: v})", MaxFileSize, MaxFileSize>>20)
		return nil
	}
	raw, ok := p.decodeFile(data)
	if !ok {
		return nil
	}
	d := &Domain{File: p.file, Name: raw.name, FailureMode: raw.failureMode}
	p.checkDomain(&raw)
	p.descriptors(d, &d.root, raw.descriptors, "descriptors", nil)
	p.checkReplaces(d.Name)
	return d
}

// descriptors parses a descriptors list into the children of level.
func (p *parser) descriptors(d *Domain, level *node, seq *yaml.Node, field string, path []PathElem) {
	items := p.sequence(seq, field)
	firsts := make(map[pair]int) // key and value -> line of the first such descriptor
	for i, item := range items {
		p.descriptor(d, level, item, fmt.Sprintf("%s[%d]", field, i), path, firsts)
	}
}

// descriptor decodes, checks and adds the descriptor at item to level,
// then its nested descriptors below it.
func (p *parser) descriptor(d *Domain, level *node, item *yaml.Node, field string, parent []PathElem, firsts map[pair]int) {
	raw := p.decodeDescriptor(item, field)
	if !p.checkDescriptor(&raw, firsts) {
		return
	}
	child := level.add(raw.elem)
	path := append(parent[:len(parent):len(parent)], raw.elem)
	if r := p.descriptorRule(&raw); r != nil {
		r.Domain, r.Path, r.File, r.Line = d.Name, path, p.file, item.Line
		r.ID = ruleID(d.Name, path)
		r.ShadowMode, r.DetailedMetric, r.QuotaMode, r.Metadata = raw.shadow, raw.detailed, raw.quota, raw.metadata
		child.rule = r
		d.rules = append(d.rules, r)
	}
	p.descriptors(d, child, raw.children, field+".descriptors", path)
}

// add adds a node for descriptor elem to level n and returns it: an exact
// value, a wildcard (kept in file order, which decides between wildcards)
// or a key-only descriptor. A level stays a list up to smallLevel
// descriptors without a wildcard, and moves into maps past that.
func (n *node) add(elem PathElem) *node {
	child := &node{}
	if n.big == nil && !elem.Wildcard && len(n.edges) < smallLevel {
		n.edges = append(n.edges, edge{key: elem.Key, value: elem.Value, node: child})
		return child
	}
	if n.big == nil {
		n.big = &level{}
		for _, e := range n.edges {
			n.big.add(PathElem{Key: e.key, Value: e.value}, e.node)
		}
		n.edges = nil
	}
	n.big.add(elem, child)
	return child
}

// add adds child, the node of descriptor elem, to level l.
func (l *level) add(elem PathElem, child *node) {
	switch {
	case elem.Value == "":
		if l.keyOnly == nil {
			l.keyOnly = make(map[string]*node)
		}
		l.keyOnly[elem.Key] = child
	case elem.Wildcard:
		l.wildcards = append(l.wildcards, newWildcard(elem.Key, elem.Value, child))
	default:
		if l.exact == nil {
			l.exact = make(map[pair]*node)
		}
		l.exact[pair{elem.Key, elem.Value}] = child
	}
}

// descriptorRule returns the rule of a descriptor: its rate_limit or
// rate_limits, and its concurrency limit; nil when it has none or any of
// them is invalid.
func (p *parser) descriptorRule(raw *rawDescriptor) *Rule {
	var r *Rule
	switch {
	case raw.rateLimit != nil && raw.rateLimits != nil:
		p.rateLimit(raw.rateLimit, raw.field+".rate_limit") // for its own problems and names
		p.rateLimits(raw.rateLimits, raw.field+".rate_limits")
		p.failBothLimits(raw)
	case raw.rateLimit != nil:
		r = p.rateLimit(raw.rateLimit, raw.field+".rate_limit")
	case raw.rateLimits != nil:
		r = p.rateLimits(raw.rateLimits, raw.field+".rate_limits")
	}
	if raw.conc == nil {
		return r
	}
	c := p.concurrency(raw.conc, raw.field+".concurrency")
	switch {
	case c == nil || !p.checkConcurrency(raw, r):
		return nil
	case r != nil:
		r.Concurrency = c
	case raw.rateLimit == nil && raw.rateLimits == nil:
		r = &Rule{Concurrency: c} // a concurrency limit alone
	}
	return r
}

// rateLimit returns the rule of a rate_limit block; nil when it is invalid.
func (p *parser) rateLimit(n *yaml.Node, field string) *Rule {
	b, r := p.decodeRateLimit(n, field)
	if !p.checkRateLimit(&b, r.Unlimited) {
		return nil
	}
	if !r.Unlimited {
		r.setLimits([]Limit{b.lim})
	}
	return r
}

// rateLimits returns the rule of a rate_limits list, several limits of one
// descriptor; nil when it is invalid.
func (p *parser) rateLimits(n *yaml.Node, field string) *Rule {
	limits := p.checkRateLimits(p.decodeRateLimits(n, field))
	if limits == nil {
		return nil
	}
	r := &Rule{}
	r.setLimits(limits)
	return r
}

// ruleID names a rule as envoyproxy/ratelimit names its statistics.
func ruleID(domain string, path []PathElem) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range path {
		b.WriteByte('.')
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}
