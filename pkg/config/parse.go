package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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
	maxUint32 = 1<<32 - 1
	// maxNodes bounds the YAML nodes walked in one file, every use of an
	// alias counting its nodes again: far above any real rule file, far
	// below what a file of nested or repeated aliases can expand to.
	maxNodes = 200_000
)

// The fields each mapping accepts, as error messages list them.
const (
	domainFields     = "domain, descriptors, failure_mode"
	descriptorFields = "key, value, rate_limit, descriptors, shadow_mode, detailed_metric, value_to_metric, " +
		"share_threshold, quota_mode, metadata"
	rateLimitFields = "requests_per_unit, unit, unit_multiplier, name, replaces, unlimited, algorithm, burst"
	replacesFields  = "name"
)

// parser walks the YAML tree of one file, building its domain and recording
// every problem it meets; it never stops at the first.
type parser struct {
	file       string
	errs       []*Error
	domainNode *yaml.Node
	names      map[string]bool // every rate_limit.name, valid rule or not
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
	d := &Domain{File: p.file}
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
			p.fail(ref.node, ref.field, "no rule in domain %q is named %q; replaces takes the rate_limit.name of another rule", d.Name, ref.name)
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
	var keyNode, rateLimit, children, share *yaml.Node
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
	elem.Wildcard = strings.HasSuffix(elem.Value, "*")
	switch {
	case keyNode == nil:
		p.fail(item, field+".key", "missing; every descriptor has a key")
		return
	case elem.Key == "":
		p.fail(keyNode, field+".key", "must not be empty")
		return
	}
	if elem.ShareThreshold && !elem.Wildcard {
		p.fail(share, field+".share_threshold", "applies only to a wildcard value, one ending in \"*\"; this descriptor's value is %q", elem.Value)
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
		level.wildcards = append(level.wildcards, wildcard{key: elem.Key, prefix: strings.TrimSuffix(elem.Value, "*"), node: child})
	default:
		if level.exact == nil {
			level.exact = make(map[pair]*node)
		}
		level.exact[id] = child
	}
	path := append(parent[:len(parent):len(parent)], elem)
	if rateLimit != nil {
		r := p.rateLimit(rateLimit, field+".rate_limit")
		if r != nil {
			r.Domain, r.Path, r.File, r.Line = d.Name, path, p.file, item.Line
			r.ID = ruleID(d.Name, path)
			r.ShadowMode, r.DetailedMetric, r.QuotaMode, r.Metadata = shadow, detailed, quota, metadata
			child.rule = r
			d.rules = append(d.rules, r)
		}
	}
	p.descriptors(d, child, children, field+".descriptors", path)
}

// rateLimit parses a rate_limit block; nil when it is invalid.
func (p *parser) rateLimit(n *yaml.Node, field string) *Rule {
	r := &Rule{UnitMultiplier: 1}
	var rpu, unit, mult, alg, burst *yaml.Node
	var burstN uint64
	ok := true
	for _, f := range p.mapping(n, field) {
		sub := field + "." + f.name
		switch f.name {
		case "requests_per_unit":
			rpu = f.val
			v, good := p.uint(f.val, sub, 0, maxUint32)
			r.RequestsPerUnit, ok = uint32(v), ok && good
		case "unit":
			unit = f.val
			var good bool
			r.Unit, good = keyword(p, f.val, sub, ParseUnit)
			ok = ok && good
		case "unit_multiplier":
			mult = f.val
			v, good := p.uint(f.val, sub, 1, maxUint32)
			r.UnitMultiplier, ok = uint32(v), ok && good
		case "name":
			r.Name, _ = p.str(f.val, sub)
			if r.Name != "" {
				if p.names == nil {
					p.names = make(map[string]bool)
				}
				p.names[r.Name] = true
			}
		case "replaces":
			r.Replaces = p.replaces(f.val, sub) // also appended to p.refs
		case "unlimited":
			r.Unlimited = p.boolean(f.val, sub)
		case "algorithm":
			alg = f.val
			var good bool
			r.Algorithm, good = keyword(p, f.val, sub, ParseAlgorithm)
			ok = ok && good
		case "burst":
			burst = f.val
			var good bool
			burstN, good = p.uint(f.val, sub, 1, maxUint32)
			ok = ok && good
		default:
			p.unknown(f, field, rateLimitFields)
		}
	}
	for i := len(p.refs) - len(r.Replaces); i < len(p.refs); i++ {
		p.refs[i].owner = r.Name
	}

	if r.Unlimited {
		for _, c := range []struct {
			n    *yaml.Node
			name string
		}{{unit, "unit"}, {mult, "unit_multiplier"}, {alg, "algorithm"}, {burst, "burst"}} {
			if c.n != nil {
				p.fail(c.n, field+"."+c.name, "must not be set together with unlimited: true; an unlimited rule counts nothing")
				ok = false
			}
		}
		r.RequestsPerUnit, r.Unit, r.UnitMultiplier = 0, 0, 0
		if !ok {
			return nil
		}
		return r
	}
	if unit == nil {
		p.fail(n, field+".unit", "missing; accepted: second, minute, hour, day, week, month, year (or unlimited: true)")
		ok = false
	}
	if rpu == nil {
		p.fail(n, field+".requests_per_unit", "missing; the number of requests each unit admits (0 admits none)")
		ok = false
	}
	if !ok {
		return nil
	}
	if r.UnitMultiplier > uint32(MaxWindow/r.Unit.Duration()) {
		p.fail(mult, field+".unit_multiplier", "%d %ss is longer than the longest window, 100 years", r.UnitMultiplier, r.Unit)
		return nil
	}
	if burst != nil && !r.Algorithm.UsesBurst() {
		p.fail(burst, field+".burst", "%s does not use burst; only bucket algorithms take a capacity", r.Algorithm)
		return nil
	}
	r.Window = time.Duration(r.UnitMultiplier) * r.Unit.Duration()
	r.Burst = burstN
	return r
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
