package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Bounds on what a rule file may say.
const (
	// MaxDomainLen is the longest domain name, the longest a request may
	// carry.
	MaxDomainLen = 255
	// MaxWindow is the longest window unit × unit_multiplier may make.
	MaxWindow = 100 * 365 * 24 * time.Hour
	// MaxBucket bounds requests_per_unit and burst of the bucket
	// algorithms (token_bucket, leaky_bucket, gcra), MaxRefill the time
	// their bucket takes to refill from empty (burst × window /
	// requests_per_unit), and MaxLog requests_per_unit of
	// sliding_window_log, which keeps one timestamp per admitted hit.
	// They mirror package algo's bounds of exact arithmetic, so every
	// limit a rule file states is one algo computes.
	MaxBucket = 1 << 26
	MaxRefill = MaxWindow
	MaxLog    = 10_000
	maxUint32 = 1<<32 - 1
	// maxNodes bounds the YAML nodes walked in one file, every use of an
	// alias counting its nodes again: far above any real rule file, far
	// below what a file of nested or repeated aliases can expand to.
	maxNodes = 200_000
)

// The fields each mapping accepts, as error messages list them.
const (
	domainFields     = "domain, descriptors, failure_mode"
	descriptorFields = "key, value, rate_limit, rate_limits, concurrency, descriptors, shadow_mode, detailed_metric, value_to_metric, " +
		"share_threshold, quota_mode, metadata"
	rateLimitFields  = "requests_per_unit, unit, unit_multiplier, name, replaces, unlimited, algorithm, burst, consistency"
	rateLimitsFields = "requests_per_unit, unit, unit_multiplier, name, algorithm, burst, consistency"
	replacesFields   = "name"
)

// parser walks the YAML tree of one file, building its domain and recording
// every problem it meets; it never stops at the first.
type parser struct {
	file       string
	errs       []*Error
	domainNode *yaml.Node
	names      map[string]bool // every limit's name, valid rule or not
	refs       []replacesRef
	nodes      int // nodes walked so far
}

// replacesRef is one name in a replaces list, checked once the whole domain
// is known.
type replacesRef struct {
	name  string
	owner string // the name of the rule whose list it is
	node  *yaml.Node
	field string
}

func (p *parser) fail(n *yaml.Node, field, format string, args ...any) {
	e := &Error{File: p.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	p.errs = append(p.errs, e)
}

func (p *parser) failEmpty() {
	p.fail(&yaml.Node{Line: 1, Column: 1}, "", "the file is empty; a rule file holds a domain and its descriptors")
}

// parseFile returns the file's domain, or nil when the file is not even a
// YAML mapping. Problems are in p.errs either way.
func (p *parser) parseFile(data []byte) *Domain {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.failEmpty()
		} else {
			p.yamlError(err)
		}
		return nil
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		p.fail(&extra, "", "a second YAML document; a rule file holds one document with one domain")
		return nil
	case !errors.Is(err, io.EOF):
		p.yamlError(err)
		return nil
	}

	if len(doc.Content) == 0 {
		p.failEmpty()
		return nil
	}
	root := resolve(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		p.fail(root, "", "a rule file must be a mapping with domain and descriptors; found %s", describe(root))
		return nil
	}
	d := &Domain{File: p.file, byID: make(map[string]*Rule)}
	var descriptors *yaml.Node
	for _, f := range p.mapping(root, "") {
		switch f.name {
		case "domain":
			p.domainNode = f.val
			d.Name, _ = p.str(f.val, "domain")
		case "descriptors":
			descriptors = f.val
		case "failure_mode":
			d.FailureMode, _ = keyword(p, f.val, "failure_mode", ParseFailureMode)
		default:
			p.unknown(f, "", domainFields)
		}
	}
	switch {
	case p.domainNode == nil:
		p.fail(root, "domain", "missing; every rule file names the domain its descriptors belong to")
	case d.Name == "":
		p.fail(p.domainNode, "domain", "must not be empty")
	case len(d.Name) > MaxDomainLen:
		p.fail(p.domainNode, "domain", "is %d bytes long; at most %d are accepted", len(d.Name), MaxDomainLen)
	}
	p.descriptors(d, &d.root, descriptors, "descriptors", nil)

	for _, ref := range p.refs {
		if ref.name == ref.owner {
			p.fail(ref.node, ref.field, "rule %q replaces itself; replaces names other rules", ref.name)
		} else if !p.names[ref.name] {
			p.fail(ref.node, ref.field, "no rule in domain %q is named %q; replaces takes the name of another rule, its rate_limit.name or a name in its rate_limits", d.Name, ref.name)
		}
	}
	return d
}

// descriptors parses a descriptors list into the children of level.
func (p *parser) descriptors(d *Domain, level *node, seq *yaml.Node, field string, path []PathElem) {
	items := p.sequence(seq, field)
	firsts := make(map[pair]int) // key and value -> line of the first such descriptor
	for i, item := range items {
		if p.nodes > maxNodes {
			return // refused already; the rest would only echo it
		}
		p.descriptor(d, level, item, fmt.Sprintf("%s[%d]", field, i), path, firsts)
	}
}

func (p *parser) descriptor(d *Domain, level *node, item *yaml.Node, field string, parent []PathElem, firsts map[pair]int) {
	elem := PathElem{}
	var keyNode, rateLimit, rateLimits, conc, children, share *yaml.Node
	var shadow, detailed, quota bool
	var metadata map[string]any
	fields := p.mapping(item, field)
	if p.nodes > maxNodes {
		return
	}
	for _, f := range fields {
		sub := field + "." + f.name
		switch f.name {
		case "key":
			keyNode = f.val
			elem.Key, _ = p.str(f.val, sub)
		case "value":
			elem.Value, _ = p.str(f.val, sub)
		case "rate_limit":
			rateLimit = f.val
		case "rate_limits":
			rateLimits = f.val
		case "concurrency":
			conc = f.val
		case "descriptors":
			children = f.val
		case "shadow_mode":
			shadow = p.boolean(f.val, sub)
		case "detailed_metric":
			detailed = p.boolean(f.val, sub)
		case "value_to_metric":
			elem.ValueToMetric = p.boolean(f.val, sub)
		case "share_threshold":
			share = f.val
			elem.ShareThreshold = p.boolean(f.val, sub)
		case "quota_mode":
			quota = p.boolean(f.val, sub)
		case "metadata":
			metadata = p.metadata(f.val, sub)
		default:
			p.unknown(f, field, descriptorFields)
		}
	}
	elem.Wildcard = isWildcard(elem.Value)
	switch {
	case keyNode == nil:
		p.fail(item, field+".key", "missing; every descriptor has a key")
		return
	case elem.Key == "":
		p.fail(keyNode, field+".key", "must not be empty")
		return
	}
	if elem.ShareThreshold && !elem.Wildcard {
		p.fail(share, field+".share_threshold", "applies only to a wildcard value, one holding \"*\" (such as \"files/*\" or \"/api*v1\"); this descriptor's value is %q", elem.Value)
	}
	id := pair{elem.Key, elem.Value}
	if first, dup := firsts[id]; dup {
		what := fmt.Sprintf("key %q with value %q", elem.Key, elem.Value)
		if elem.Value == "" {
			what = fmt.Sprintf("key %q without a value", elem.Key)
		}
		p.fail(keyNode, field, "duplicate descriptor: %s is already defined at line %d of this level", what, first)
		return
	}
	firsts[id] = keyNode.Line

	child := &node{}
	switch {
	case elem.Value == "":
		if level.keyOnly == nil {
			level.keyOnly = make(map[string]*node)
		}
		level.keyOnly[elem.Key] = child
	case elem.Wildcard:
		level.wildcards = append(level.wildcards, newWildcard(elem.Key, elem.Value, child))
	default:
		if level.exact == nil {
			level.exact = make(map[pair]*node)
		}
		level.exact[id] = child
	}
	path := append(parent[:len(parent):len(parent)], elem)
	var r *Rule
	switch {
	case rateLimit != nil && rateLimits != nil:
		p.rateLimit(rateLimit, field+".rate_limit") // for its own problems and names
		p.rateLimits(rateLimits, field+".rate_limits")
		p.fail(fieldKey(fields, "rate_limits"), field+".rate_limits",
			"a descriptor has either rate_limit (one limit) or rate_limits (a list of limits), not both; move the rate_limit block into the rate_limits list")
	case rateLimit != nil:
		r = p.rateLimit(rateLimit, field+".rate_limit")
	case rateLimits != nil:
		r = p.rateLimits(rateLimits, field+".rate_limits")
	}
	if conc != nil {
		c := p.concurrency(conc, field+".concurrency")
		switch {
		case c == nil:
			r = nil
		case r != nil && r.Unlimited:
			p.fail(fieldKey(fields, "concurrency"), field+".concurrency",
				"a descriptor whose rate_limit is unlimited counts nothing; drop unlimited: true to limit its requests in flight, or drop concurrency")
			r = nil
		case r != nil:
			r.Concurrency = c
		case rateLimit == nil && rateLimits == nil:
			r = &Rule{Concurrency: c} // a concurrency limit alone
		}
	}
	if r != nil {
		r.Domain, r.Path, r.File, r.Line = d.Name, path, p.file, item.Line
		r.ID = ruleID(d.Name, path)
		r.ShadowMode, r.DetailedMetric, r.QuotaMode, r.Metadata = shadow, detailed, quota, metadata
		child.rule = r
		d.rules = append(d.rules, r)
		d.byID[r.ID] = r
	}
	p.descriptors(d, child, children, field+".descriptors", path)
}

// rateLimit parses a rate_limit block; nil when it is invalid.
func (p *parser) rateLimit(n *yaml.Node, field string) *Rule {
	r := &Rule{}
	b := limitBlock{node: n, field: field, ok: true}
	for _, f := range p.mapping(n, field) {
		sub := field + "." + f.name
		if p.limitField(&b, f, sub) {
			continue
		}
		switch f.name {
		case "replaces":
			r.Replaces = p.replaces(f.val, sub) // also appended to p.refs
		case "unlimited":
			r.Unlimited = p.boolean(f.val, sub)
		default:
			p.unknown(f, field, rateLimitFields)
		}
	}
	for i := len(p.refs) - len(r.Replaces); i < len(p.refs); i++ {
		p.refs[i].owner = b.lim.Name
	}

	r.Name = b.lim.Name
	if r.Unlimited {
		ok := b.ok
		for _, c := range []struct {
			n    *yaml.Node
			name string
		}{{b.unit, "unit"}, {b.mult, "unit_multiplier"}, {b.alg, "algorithm"}, {b.burst, "burst"}, {b.cons, "consistency"}} {
			if c.n != nil {
				p.fail(c.n, field+"."+c.name, "must not be set together with unlimited: true; an unlimited rule counts nothing")
				ok = false
			}
		}
		if !ok {
			return nil
		}
		return r
	}
	if !p.checkLimit(&b) {
		return nil
	}
	r.setLimits([]Limit{b.lim})
	return r
}

// rateLimits parses a rate_limits list, several limits of one descriptor;
// nil when it is invalid.
func (p *parser) rateLimits(n *yaml.Node, field string) *Rule {
	items := p.sequence(n, field)
	if len(items) == 0 {
		if m := resolve(n); isNull(m) || m.Kind == yaml.SequenceNode && len(m.Content) == 0 {
			p.fail(n, field, "must list at least one limit, each a mapping like rate_limit's (requests_per_unit, unit, ...)")
		}
		return nil
	}
	limits := make([]Limit, 0, len(items))
	ok := true
	for i, item := range items {
		sub := fmt.Sprintf("%s[%d]", field, i)
		b := limitBlock{node: item, field: sub, ok: true, listed: true}
		unlimited := false // an entry saying unlimited lacks a unit for a reason
		for _, f := range p.mapping(item, sub) {
			if p.limitField(&b, f, sub+"."+f.name) {
				continue
			}
			switch f.name {
			case "replaces":
				p.fail(f.key, sub+"."+f.name, "belongs to a whole descriptor and is accepted only in rate_limit; "+
					"a descriptor with rate_limits cannot replace other rules, but each of its names can be replaced")
				b.ok = false
			case "unlimited":
				unlimited = true
				p.fail(f.key, sub+"."+f.name, "belongs to a whole descriptor: write rate_limit: {unlimited: true} instead of rate_limits")
				b.ok = false
			default:
				p.unknown(f, sub, rateLimitsFields)
			}
		}
		if unlimited || !p.checkLimit(&b) {
			ok = false
			continue
		}
		for j, prev := range limits {
			if prev.Algorithm != b.lim.Algorithm || prev.Window != b.lim.Window {
				continue
			}
			window := windowText(b.lim)
			if prev.Unit != b.lim.Unit {
				window += ", as long as " + windowText(prev)
			}
			p.fail(item, sub, "has the same algorithm (%s) and window (%s) as rate_limits[%d] at line %d; "+
				"the two would count in one counter: give each limit its own window or algorithm",
				b.lim.Algorithm, window, j, items[j].Line)
			ok = false
			break
		}
		limits = append(limits, b.lim)
	}
	if !ok {
		return nil
	}
	r := &Rule{}
	r.setLimits(limits)
	return r
}

// limitBlock is one limit being parsed: a rate_limit block or an entry of
// rate_limits, with the nodes of the fields it set.
type limitBlock struct {
	node                              *yaml.Node
	field                             string
	rpu, unit, mult, alg, burst, cons *yaml.Node
	lim                               Limit
	ok                                bool // every field given is well-formed
	listed                            bool // an entry of rate_limits
}

// limitField parses field f of a limit block when it is one of the fields
// every limit takes, and reports whether it was.
func (p *parser) limitField(b *limitBlock, f mappingField, sub string) bool {
	good := true
	switch f.name {
	case "requests_per_unit":
		b.rpu = f.val
		var v uint64
		v, good = p.uint(f.val, sub, 0, maxUint32)
		b.lim.RequestsPerUnit = uint32(v)
	case "unit":
		b.unit = f.val
		b.lim.Unit, good = keyword(p, f.val, sub, ParseUnit)
	case "unit_multiplier":
		b.mult = f.val
		var v uint64
		v, good = p.uint(f.val, sub, 1, maxUint32)
		b.lim.UnitMultiplier = uint32(v)
	case "name":
		b.lim.Name, _ = p.str(f.val, sub)
		if b.lim.Name != "" {
			if p.names == nil {
				p.names = make(map[string]bool)
			}
			p.names[b.lim.Name] = true
		}
	case "algorithm":
		b.alg = f.val
		b.lim.Algorithm, good = keyword(p, f.val, sub, ParseAlgorithm)
	case "burst":
		b.burst = f.val
		b.lim.Burst, good = p.uint(f.val, sub, 0, maxUint32) // 0: see checkLimit
	case "consistency":
		b.cons = f.val
		b.lim.Consistency, good = keyword(p, f.val, sub, ParseConsistency)
	default:
		return false
	}
	b.ok = b.ok && good
	return true
}

// checkLimit checks a counted limit block whose fields are parsed: its
// required fields, its window, and the bounds within which its algorithm
// computes exactly (package algo's Limit.Check, mirrored). It completes
// b.lim and reports whether the limit is valid.
func (p *parser) checkLimit(b *limitBlock) bool {
	if n := resolve(b.node); n.Kind != yaml.MappingNode && !isNull(n) {
		return false // reported by mapping; missing fields would only echo it
	}
	ok := b.ok
	if b.unit == nil {
		msg := "missing; accepted: second, minute, hour, day, week, month, year"
		if !b.listed {
			msg += " (or unlimited: true)"
		}
		p.fail(b.node, b.field+".unit", "%s", msg)
		ok = false
	}
	if b.rpu == nil {
		p.fail(b.node, b.field+".requests_per_unit", "missing; the number of requests each unit admits (0 admits none)")
		ok = false
	}
	if !ok {
		return false
	}
	l := &b.lim
	if b.mult == nil {
		l.UnitMultiplier = 1
	}
	if l.UnitMultiplier > uint32(MaxWindow/l.Unit.Duration()) {
		p.fail(b.mult, b.field+".unit_multiplier", "%d %ss is longer than the longest window, 100 years", l.UnitMultiplier, l.Unit)
		return false
	}
	l.Window = time.Duration(l.UnitMultiplier) * l.Unit.Duration()
	if b.burst != nil && !l.Algorithm.UsesBurst() {
		p.fail(b.burst, b.field+".burst", "%s does not use burst; only bucket algorithms take a capacity", l.Algorithm)
		return false
	}
	if l.Consistency == Leased && !l.Algorithm.Leasable() {
		p.fail(b.cons, b.field+".consistency", "leased needs a budget that any replica may spend: %s %s; "+
			"leasable: fixed_window, sliding_window_counter, token_bucket, gcra (or consistency: exact)", l.Algorithm, unleasableWhy(l.Algorithm))
		return false
	}
	n := uint64(l.RequestsPerUnit)
	switch l.Algorithm {
	case SlidingWindowLog:
		if n > MaxLog {
			p.fail(b.rpu, b.field+".requests_per_unit", "%d is above %d, the most sliding_window_log accepts: it keeps one timestamp per admitted hit; "+
				"use sliding_window_counter or token_bucket for larger limits", n, MaxLog)
			ok = false
		}
	case TokenBucket, LeakyBucket, GCRA:
		if n > MaxBucket {
			p.fail(b.rpu, b.field+".requests_per_unit", "%d is above %d (2^26), the most %s computes exactly; "+
				"state the same rate per a shorter unit, or use a window algorithm", n, MaxBucket, l.Algorithm)
			ok = false
		}
		switch {
		case b.burst != nil && l.Burst == 0:
			p.fail(b.burst, b.field+".burst", "must be at least 1: a bucket of capacity 0 admits nothing; "+
				"give a capacity from 1 to %d, or leave burst out for a capacity of requests_per_unit", MaxBucket)
			ok = false
		case l.Burst > MaxBucket:
			p.fail(b.burst, b.field+".burst", "%d is above %d (2^26), the largest bucket %s computes exactly; lower burst", l.Burst, MaxBucket, l.Algorithm)
			ok = false
		}
		if ok && n > 0 && refillTooLong(l.Capacity(), l.Window, n) {
			p.fail(b.burst, b.field+".burst", "refilling a burst of %d at %d per %s takes longer than 100 years (burst × window / requests_per_unit); "+
				"lower burst or raise requests_per_unit", l.Capacity(), n, per(*l))
			ok = false
		}
	}
	return ok
}

// refillTooLong reports whether a bucket of capacity b refilled at n per
// window takes longer than MaxRefill to refill from empty, computed as
// package algo computes it: b × window µs / n, in 128 bits.
func refillTooLong(b uint64, window time.Duration, n uint64) bool {
	hi, lo := bits.Mul64(b, uint64(max(window.Microseconds(), 1)))
	return hi != 0 || lo/n > uint64(MaxRefill.Microseconds())
}

// windowText writes a limit's window as written, for messages: "1
// minute", "60 seconds".
func windowText(l Limit) string {
	if l.UnitMultiplier == 1 {
		return "1 " + l.Unit.String()
	}
	return fmt.Sprintf("%d %ss", l.UnitMultiplier, l.Unit)
}

// per writes a limit's window after "per": "minute", "60 seconds".
func per(l Limit) string {
	if l.UnitMultiplier == 1 {
		return l.Unit.String()
	}
	return windowText(l)
}

// fieldKey returns the key node of the field named name.
func fieldKey(fields []mappingField, name string) *yaml.Node {
	for _, f := range fields {
		if f.name == name {
			return f.key
		}
	}
	return nil
}

// replaces parses a replaces list: a sequence of {name: ...} mappings.
func (p *parser) replaces(n *yaml.Node, field string) []string {
	var names []string
	for i, item := range p.sequence(n, field) {
		sub := fmt.Sprintf("%s[%d]", field, i)
		var name *yaml.Node
		for _, f := range p.mapping(item, sub) {
			if f.name == "name" {
				name = f.val
			} else {
				p.unknown(f, sub, replacesFields)
			}
		}
		if name == nil {
			p.fail(item, sub+".name", "missing; each replaces entry is {name: <rate_limit.name of another rule>}")
			continue
		}
		s, ok := p.str(name, sub+".name")
		switch {
		case !ok:
		case s == "":
			p.fail(name, sub+".name", "must not be empty")
		default:
			names = append(names, s)
			p.refs = append(p.refs, replacesRef{name: s, node: name, field: sub + ".name"})
		}
	}
	return names
}

func (p *parser) metadata(n *yaml.Node, field string) map[string]any {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.fail(n, field, "must be a mapping; found %s", describe(n))
		return nil
	}
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		p.fail(n, field, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return m
}

// mappingField is one key: value pair of a mapping.
type mappingField struct {
	name     string
	key, val *yaml.Node
}

// mapping returns the fields of mapping n, with aliases resolved and merge
// keys (<<) expanded. A null node is an empty mapping. Anything else, keys
// that are not plain names and keys given twice are reported.
func (p *parser) mapping(n *yaml.Node, field string) []mappingField {
	n = resolve(n)
	if n == nil || isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.fail(n, field, "must be a mapping of fields; found %s", describe(n))
		return nil
	}
	if !p.charge(n, len(n.Content)/2) {
		return nil
	}
	var fields, merged []mappingField
	seen := make(map[string]*yaml.Node)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			src := resolve(v)
			if src.Kind == yaml.SequenceNode {
				for _, m := range src.Content {
					merged = append(merged, p.mapping(m, field)...)
				}
			} else {
				merged = append(merged, p.mapping(src, field)...)
			}
			continue
		}
		if k.Kind != yaml.ScalarNode || isNull(k) {
			p.fail(k, field, "field names must be plain words; found %s", describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			p.fail(k, joinField(field, k.Value), "given twice in one mapping; the first is at line %d", first.Line)
			continue
		}
		seen[k.Value] = k
		fields = append(fields, mappingField{name: k.Value, key: k, val: v})
	}
	for _, f := range merged { // explicit fields win over merged ones
		if seen[f.name] == nil {
			seen[f.name] = f.key
			fields = append(fields, f)
		}
	}
	return fields
}

// sequence returns the items of list n; a null node is an empty list.
func (p *parser) sequence(n *yaml.Node, field string) []*yaml.Node {
	n = resolve(n)
	if n == nil || isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, field, "must be a list (lines starting with \"- \"); found %s", describe(n))
		return nil
	}
	if !p.charge(n, len(n.Content)) {
		return nil
	}
	return n.Content
}

// str returns scalar n as a string. Null is the empty string; numbers and
// booleans are taken as written, as envoyproxy/ratelimit does.
func (p *parser) str(n *yaml.Node, field string) (string, bool) {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode {
		p.fail(n, field, "must be a string; found %s", describe(n))
		return "", false
	}
	if isNull(n) {
		return "", true
	}
	return n.Value, true
}

// keyword returns scalar n parsed by parse, such as a unit name; a value
// parse refuses is reported with parse's message.
func keyword[T any](p *parser, n *yaml.Node, field string, parse func(string) (T, error)) (T, bool) {
	var v T
	s, ok := p.str(n, field)
	if !ok {
		return v, false
	}
	v, err := parse(s)
	if err != nil {
		p.fail(n, field, "%v", err)
		return v, false
	}
	return v, true
}

// boolean returns scalar n as a bool. Besides true and false, the YAML 1.1
// spellings (yes, no, on, off) that envoyproxy/ratelimit's parser accepts
// are accepted.
func (p *parser) boolean(n *yaml.Node, field string) bool {
	n = resolve(n)
	var b bool
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!bool" && n.Tag != "!!str") || n.Decode(&b) != nil {
		p.fail(n, field, "must be true or false; found %s", describe(n))
		return false
	}
	return b
}

// uint returns scalar n as a whole number in [lo, hi].
func (p *parser) uint(n *yaml.Node, field string, lo, hi uint64) (uint64, bool) {
	n = resolve(n)
	var v uint64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil || v < lo || v > hi {
		p.fail(n, field, "must be a whole number from %d to %d; found %s", lo, hi, describe(n))
		return 0, false
	}
	return v, true
}

// unknown reports field f, which the mapping at field does not accept.
func (p *parser) unknown(f mappingField, field string, accepted string) {
	msg := fmt.Sprintf("unknown field %q; accepted: %s", f.name, accepted)
	if s := suggest(f.name, strings.Split(accepted, ", ")); s != "" {
		msg = fmt.Sprintf("unknown field %q (did you mean %q?); accepted: %s", f.name, s, accepted)
	}
	p.fail(f.key, joinField(field, f.name), "%s", msg)
}

// yamlError reports a YAML syntax error, at its line when the parser says.
func (p *parser) yamlError(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	var line int
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if l, err := strconv.Atoi(n); err == nil {
				line, msg = l, after
			}
		}
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Column: min(line, 1), Msg: "invalid YAML: " + msg})
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// charge counts n more nodes walked and reports whether the walk may go on.
// Each use of an alias walks its node again, so a few lines of nested or
// repeated aliases can expand to billions of nodes ("billion laughs"); past
// maxNodes the file is refused.
func (p *parser) charge(at *yaml.Node, n int) bool {
	before := p.nodes
	p.nodes += n
	if p.nodes <= maxNodes {
		return true
	}
	if before <= maxNodes {
		p.fail(at, "", "the file expands to more than %d YAML nodes, its aliases counted at every use; a rule file may hold at most that many", maxNodes)
	}
	return false
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describe names what node n holds, for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch {
		case isNull(n):
			return "nothing (null)"
		case n.Tag == "!!str":
			return strconv.Quote(n.Value)
		default:
			return n.Value // a number or boolean, as written
		}
	}
	return "an unexpected YAML node"
}

func joinField(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
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

// suggest returns the accepted name closest to name when it is close
// enough to be a likely typo: at most max(2, len(name)/3) edits away.
func suggest(name string, accepted []string) string {
	best, bestDist := "", max(2, len(name)/3)+1
	for _, a := range accepted {
		if d := editDistance(name, a); d < bestDist {
			best, bestDist = a, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
