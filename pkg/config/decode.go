package config

// Decoding: walking the YAML tree of one rule file into the values of its
// fields. Every mapping's fields are checked against the fields it accepts
// and every scalar against its type here; what the values must satisfy
// together is validate.go's, and building the domain from them build.go's.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// The fields each mapping accepts, as error messages list them.
const (
	domainFields     = "domain, descriptors, failure_mode, name"
	descriptorFields = "key, value, rate_limit, rate_limits, concurrency, descriptors, shadow_mode, detailed_metric, value_to_metric, " +
		"share_threshold, quota_mode, metadata"
	rateLimitFields  = "requests_per_unit, unit, unit_multiplier, name, replaces, unlimited, algorithm, burst, consistency, scope, on_partition, over_limit_hits, reserve"
	rateLimitsFields = "requests_per_unit, unit, unit_multiplier, name, algorithm, burst, consistency, scope, on_partition, over_limit_hits, reserve"
	replacesFields   = "name"
)

// parser walks the YAML tree of one file, building its domain and recording
// every problem it meets; it never stops at the first. Its methods are
// spread by concern over decode.go, validate.go and build.go.
type parser struct {
	file       string
	reference  bool // decode as envoyproxy/ratelimit does (Options.Reference)
	errs       []*Error
	warns      []*Error // accepted, but said
	domainNode *yaml.Node
	names      map[string]bool // every limit's name, valid rule or not
	refs       []replacesRef
	keys       map[string]string // descriptor keys, each kept once
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

// warn records what the file is accepted despite.
func (p *parser) warn(n *yaml.Node, field, format string, args ...any) {
	e := &Error{File: p.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	p.warns = append(p.warns, e)
}

func (p *parser) failEmpty() {
	p.fail(&yaml.Node{Line: 1, Column: 1}, "", "the file is empty; a rule file holds a domain and its descriptors")
}

// rawDomain is the top level of a rule file, decoded.
type rawDomain struct {
	root        *yaml.Node // the file's mapping
	name        string
	failureMode FailureMode
	descriptors *yaml.Node // nil when absent
}

// decodeFile decodes the one YAML document of a rule file and the fields
// of its top level; false when the file is not even a YAML mapping.
// p.domainNode is the domain field's value, nil when it is missing.
func (p *parser) decodeFile(data []byte) (rawDomain, bool) {
	var raw rawDomain
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.failEmpty()
		} else {
			p.yamlError(err)
		}
		return raw, false
	}
	if !p.moreDocuments(dec) {
		return raw, false
	}
	if len(doc.Content) == 0 {
		p.failEmpty()
		return raw, false
	}
	if !p.checkAliases(doc.Content[0]) {
		return raw, false
	}
	raw.root = resolve(doc.Content[0])
	if raw.root.Kind != yaml.MappingNode {
		p.fail(raw.root, "", "a rule file must be a mapping with domain and descriptors; found %s", describe(raw.root))
		return raw, false
	}
	for _, f := range p.mapping(raw.root, "") {
		switch f.name {
		case "domain":
			p.domainNode = f.val
			raw.name, _ = p.str(f.val, "domain")
		case "descriptors":
			raw.descriptors = f.val
		case "failure_mode":
			raw.failureMode, _ = keyword(p, f.val, "failure_mode", ParseFailureMode)
		case "name":
			// RateLimitConfig's name (rls_conf.proto), which Envoy
			// Gateway writes; envoyproxy/ratelimit reads and ignores it.
			if _, ok := p.str(f.val, "name"); ok {
				p.warn(f.key, "name", "not used: a rule set is known by its domain; envoyproxy/ratelimit ignores it too")
			}
		default:
			p.unknown(f, "", domainFields)
		}
	}
	return raw, true
}

// moreDocuments reads what follows a file's first YAML document: false
// when that refuses the file. An empty document (a trailing "---") is
// nothing, in every mode, and said; a document with content is refused in
// native mode and, in reference mode, not read: envoyproxy/ratelimit's
// yaml.v2 Unmarshal reads only the first document
// (src/config/config_impl.go, ConfigFileContentToYaml).
func (p *parser) moreDocuments(dec *yaml.Decoder) bool {
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		switch {
		case errors.Is(err, io.EOF):
			return true
		case err != nil:
			p.yamlError(err)
			return false
		case len(extra.Content) == 0 || isNull(resolve(extra.Content[0])):
			p.warn(&extra, "", "an empty YAML document (a \"---\" with nothing after it): nothing to read")
		case p.reference:
			p.warn(&extra, "", "a second YAML document, not read: envoyproxy/ratelimit reads only a file's first document, so its rules are not enforced; move them into a file of their own")
		default:
			p.fail(&extra, "", "a second YAML document; a rule file holds one document with one domain (envoyproxy/ratelimit's compatibility mode reads the first and ignores the rest)")
			return false
		}
	}
}

// rawDescriptor is one descriptor of a descriptors list, decoded: its key,
// value and flags, and the nodes of the fields decoded apart (limits,
// concurrency, nested descriptors).
type rawDescriptor struct {
	item                                           *yaml.Node // the descriptor's mapping
	field                                          string     // its path, such as "descriptors[0]"
	fields                                         []mappingField
	elem                                           PathElem
	keyNode, rateLimit, rateLimits, conc, children *yaml.Node
	share                                          *yaml.Node // share_threshold's value
	shadow, detailed, quota                        bool
	metadata                                       map[string]any
}

// decodeDescriptor decodes the descriptor at item.
func (p *parser) decodeDescriptor(item *yaml.Node, field string) rawDescriptor {
	raw := rawDescriptor{item: item, field: field}
	raw.fields = p.mapping(item, field)
	for _, f := range raw.fields {
		sub := field + "." + f.name
		switch f.name {
		case "key":
			raw.keyNode = f.val
			k, _ := p.str(f.val, sub)
			raw.elem.Key = p.intern(k)
		case "value":
			raw.elem.Value, _ = p.str(f.val, sub)
		case "rate_limit":
			// null (or ~) is no limit at this level, as
			// envoyproxy/ratelimit reads it; Envoy Gateway writes it on
			// every descriptor that only leads to nested ones.
			if !isNull(resolve(f.val)) {
				raw.rateLimit = f.val
			}
		case "rate_limits":
			raw.rateLimits = f.val
		case "concurrency":
			raw.conc = f.val
		case "descriptors":
			raw.children = f.val
		case "shadow_mode":
			raw.shadow = p.boolean(f.val, sub)
		case "detailed_metric":
			raw.detailed = p.boolean(f.val, sub)
		case "value_to_metric":
			raw.elem.ValueToMetric = p.boolean(f.val, sub)
		case "share_threshold":
			raw.share = f.val
			raw.elem.ShareThreshold = p.boolean(f.val, sub)
		case "quota_mode":
			raw.quota = p.boolean(f.val, sub)
		case "metadata":
			raw.metadata = p.metadata(f.val, sub)
		default:
			p.unknown(f, field, descriptorFields)
		}
	}
	raw.elem.Wildcard = isWildcard(raw.elem.Value)
	return raw
}

// intern returns key, kept once per file: a domain's keys are few and its
// descriptors many, each of which holds its key in the tree, in its
// rules' paths, and compares it on every match.
func (p *parser) intern(key string) string {
	if k, ok := p.keys[key]; ok {
		return k
	}
	if p.keys == nil {
		p.keys = make(map[string]string)
	}
	p.keys[key] = key
	return key
}

// decodeRateLimit decodes a rate_limit block: its limit into a limitBlock,
// its replaces and unlimited into r.
func (p *parser) decodeRateLimit(n *yaml.Node, field string) (b limitBlock, r *Rule) {
	r = &Rule{}
	b = limitBlock{node: n, field: field, ok: true}
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
	return b, r
}

// decodeRateLimits decodes a rate_limits list, one limitBlock per entry.
// An entry's replaces and unlimited belong to a whole descriptor and are
// refused here; such an entry is not ok.
func (p *parser) decodeRateLimits(n *yaml.Node, field string) []limitBlock {
	items := p.sequence(n, field)
	if len(items) == 0 {
		if m := resolve(n); isNull(m) || m.Kind == yaml.SequenceNode && len(m.Content) == 0 {
			p.fail(n, field, "must list at least one limit, each a mapping like rate_limit's (requests_per_unit, unit, ...)")
		}
		return nil
	}
	blocks := make([]limitBlock, len(items))
	for i, item := range items {
		sub := fmt.Sprintf("%s[%d]", field, i)
		b := limitBlock{node: item, field: sub, ok: true, listed: true}
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
				b.unlimited = true
				p.fail(f.key, sub+"."+f.name, "belongs to a whole descriptor: write rate_limit: {unlimited: true} instead of rate_limits")
				b.ok = false
			default:
				p.unknown(f, sub, rateLimitsFields)
			}
		}
		blocks[i] = b
	}
	return blocks
}

// limitBlock is one limit being parsed: a rate_limit block or an entry of
// rate_limits, with the nodes of the fields it set.
type limitBlock struct {
	node                                           *yaml.Node
	field                                          string
	rpu, unit, mult, alg, burst, cons, scope, part *yaml.Node
	over, reserve                                  *yaml.Node
	lim                                            Limit
	ok                                             bool // every field given is well-formed
	listed                                         bool // an entry of rate_limits
	unlimited                                      bool // an entry of rate_limits saying unlimited, refused
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
		b.lim.Algorithm, good = keyword(p, f.val, sub, algo.ParseAlgorithm)
	case "burst":
		b.burst = f.val
		b.lim.Burst, good = p.uint(f.val, sub, 0, maxUint32) // 0: see checkLimit
	case "consistency":
		b.cons = f.val
		b.lim.Consistency, good = keyword(p, f.val, sub, ParseConsistency)
	case "scope":
		b.scope = f.val
		b.lim.Scope, good = keyword(p, f.val, sub, ParseScope)
	case "on_partition":
		b.part = f.val
		b.lim.OnPartition, good = keyword(p, f.val, sub, ParsePartition)
	case "over_limit_hits":
		b.over = f.val
		b.lim.OverLimitHits, good = keyword(p, f.val, sub, ParseOverLimitHits)
	case "reserve":
		b.reserve = f.val
		b.lim.Reserve, good = keyword(p, f.val, sub, ParseReserve)
	default:
		return false
	}
	b.ok = b.ok && good
	return true
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

// metadata parses a descriptor's metadata mapping into the values
// envoyproxy/ratelimit reads from it with gopkg.in/yaml.v2 (YAML 1.1), and
// sends back in dynamic metadata: see metadataValue.
func (p *parser) metadata(n *yaml.Node, field string) map[string]any {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.fail(n, field, "must be a mapping; found %s", describe(n))
		return nil
	}
	m, _ := p.metadataValue(n, field).(map[string]any)
	return m
}

// yaml11Bools are the plain words YAML 1.1 reads as booleans and YAML 1.2
// (yaml.v3) as strings.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

// metadataValue returns the value of metadata node n: a map[string]any
// for a mapping (keys as written; merge keys expanded, explicit keys
// first), an []any for a list, and for a scalar nil, a bool, an int (or
// a uint64 past int's range), a float64 or a string. As in YAML 1.1, which the reference's parser
// speaks, the plain words yes, no, on, off, y and n (in any of their
// cases) are booleans, and a timestamp stays the string it was written as.
func (p *parser) metadataValue(n *yaml.Node, field string) any {
	n = resolve(n)
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		var merged []*yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := resolve(n.Content[i])
			if k.Tag == "!!merge" {
				src := resolve(n.Content[i+1])
				if src.Kind == yaml.SequenceNode {
					merged = append(merged, src.Content...)
				} else {
					merged = append(merged, src)
				}
				continue
			}
			m[k.Value] = p.metadataValue(n.Content[i+1], joinField(field, k.Value))
		}
		for _, src := range merged {
			if sm, ok := p.metadataValue(src, field).(map[string]any); ok {
				for k, v := range sm {
					if _, set := m[k]; !set {
						m[k] = v
					}
				}
			}
		}
		return m
	case yaml.SequenceNode:
		l := make([]any, len(n.Content))
		for i, item := range n.Content {
			l[i] = p.metadataValue(item, fmt.Sprintf("%s[%d]", field, i))
		}
		return l
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return nil
		case "!!bool", "!!int", "!!float":
			var v any
			if err := n.Decode(&v); err != nil {
				p.fail(n, field, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
			}
			return v
		case "!!str":
			if b, ok := yaml11Bools[n.Value]; ok && n.Style == 0 {
				return b
			}
		}
		return n.Value
	}
	return nil
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
			if !p.reference {
				p.fail(k, joinField(field, k.Value), "given twice in one mapping; the first is at line %d", first.Line)
				continue
			}
			// envoyproxy/ratelimit's yaml.v2 keeps the last value.
			p.warn(k, joinField(field, k.Value), "given twice in one mapping; this value is used and the one at line %d ignored, as envoyproxy/ratelimit does", first.Line)
			fields = slices.DeleteFunc(fields, func(f mappingField) bool { return f.name == k.Value })
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
