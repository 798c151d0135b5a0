package config

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Rules is a validated set of rule files: one [Domain] per file. It is
// immutable once loaded and safe for concurrent use; a reload builds new
// Rules and swaps them in whole.
type Rules struct {
	domains  map[string]*Domain
	files    []string
	hash     string
	warnings []*Error
	numRules int
}

// Domain returns the domain named name, or nil when no rule file defines it.
func (r *Rules) Domain(name string) *Domain {
	return r.domains[name]
}

// Domains returns every domain, sorted by name.
func (r *Rules) Domains() []*Domain {
	ds := make([]*Domain, 0, len(r.domains))
	for _, d := range r.domains {
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].Name < ds[j].Name })
	return ds
}

// NumRules returns how many rules the set holds, in all its domains:
// every rule's [Rule.Index] is below it.
func (r *Rules) NumRules() int {
	return r.numRules
}

// Files returns the rule files the set was loaded from, in load order.
func (r *Rules) Files() []string {
	return append([]string(nil), r.files...)
}

// Warnings returns what the rules were loaded despite, each naming its
// file and, where it has one, its line: a file that looks like a rule file
// but was not read, a field not used, and in [Options.Reference] mode what
// envoyproxy/ratelimit accepts but ratelimitd would refuse (a document not
// read, a field given twice). Empty for a clean set.
func (r *Rules) Warnings() []*Error {
	return append([]*Error(nil), r.warnings...)
}

// Hash identifies the loaded rules: the hex SHA-256 of every file's name
// and content, in load order. Equal hashes mean identical rule files.
func (r *Rules) Hash() string {
	return r.hash
}

// Domain is the rules of one domain, from one file.
type Domain struct {
	Name string
	// FailureMode overrides the server's failure mode for this domain;
	// empty means the server default.
	FailureMode FailureMode
	// File is the rule file that defines the domain.
	File  string
	root  node
	rules []*Rule
	// byID indexes rules by ID, made at the first call of Rule: what
	// decides requests never needs it.
	byIDOnce sync.Once
	byID     map[string]*Rule
}

// Rules returns every rule of the domain in file order.
func (d *Domain) Rules() []*Rule {
	return append([]*Rule(nil), d.rules...)
}

// Rule returns the domain's rule with ID id, or nil.
func (d *Domain) Rule(id string) *Rule {
	d.byIDOnce.Do(func() {
		d.byID = make(map[string]*Rule, len(d.rules))
		for _, r := range d.rules {
			d.byID[r.ID] = r // the last of an ID, as ever
		}
	})
	return d.byID[id]
}

// Descriptor is the read-only view of a request descriptor that matching
// needs: its entries, in order.
type Descriptor interface {
	Len() int
	Entry(i int) (key, value string)
}

// Match returns the rule for descriptor desc, or nil when none applies.
// It matches as envoyproxy/ratelimit does: level by level, an entry first
// matches a descriptor with the same key and value (a wildcard's pattern
// included, taken literally), then the first wildcard descriptor (in file
// order) whose pattern matches the entry's value, each "*" standing for any
// run of bytes, then a key-only descriptor; the descriptor matches when
// every entry matched, level by level, and the last one reached a rule (a
// rate_limit, rate_limits or concurrency). A descriptor with more or fewer
// entries than the rule's nesting does not match.
//
// Match does not allocate.
func (d *Domain) Match(desc Descriptor) *Rule {
	n := &d.root
	last := desc.Len() - 1
	for i := 0; i <= last; i++ {
		k, v := desc.Entry(i)
		next := n.child(k, v)
		if next == nil {
			return nil
		}
		if i == last {
			return next.rule
		}
		n = next
	}
	return nil
}

// node is one descriptor of a domain's tree, and the level of the
// descriptors nested in it, which Match walks. A small level (at most
// smallLevel descriptors, none a wildcard), as most below the first are,
// is a list looked through in place; a larger one is in maps.
type node struct {
	rule  *Rule  // nil when the descriptor has no rate_limit
	edges []edge // the nested descriptors of a small level, in file order
	big   *level // those of a larger level, or of one with a wildcard
}

// smallLevel is the most descriptors a level keeps in a list: comparing
// that many interned keys costs about what one map lookup does, and the
// list is in the node Match holds already, where a map is a cache miss
// away and takes some 200 bytes more for one descriptor.
const smallLevel = 8

// edge is one descriptor of a small level: its key and exact value, or an
// empty value for a key-only descriptor.
type edge struct {
	key, value string
	node       *node
}

// level is the nested descriptors of a large level, or of one with a
// wildcard.
type level struct {
	exact     map[pair]*node   // key with an exact value
	wildcards []wildcard       // key with a value holding "*", in file order
	keyOnly   map[string]*node // key without a value: matches any value
}

type pair struct{ key, value string }

// child returns the child node matching entry (k, v), or nil.
func (n *node) child(k, v string) *node {
	if n.big != nil {
		return n.big.child(k, v)
	}
	var keyOnly *node
	for i := range n.edges {
		switch e := &n.edges[i]; {
		case e.key != k:
		case e.value == "":
			keyOnly = e.node
		case e.value == v:
			return e.node
		}
	}
	return keyOnly
}

// child returns the child node matching entry (k, v), or nil: the
// exact value, a wildcard's pattern taken literally, the first wildcard
// in file order that matches, the key-only descriptor.
func (l *level) child(k, v string) *node {
	if c := l.exact[pair{k, v}]; c != nil {
		return c
	}
	if w := l.literal(k, v); w != nil {
		return w.node
	}
	for i := range l.wildcards {
		w := &l.wildcards[i]
		if w.key == k && w.matches(v) {
			return w.node
		}
	}
	return l.keyOnly[k]
}

// literal returns the wildcard of key k whose pattern is exactly v, or nil.
// envoyproxy/ratelimit looks such a value up as an exact one, before any
// wildcard is tried, so it wins over a wildcard earlier in the file.
func (l *level) literal(k, v string) *wildcard {
	if len(l.wildcards) == 0 || !isWildcard(v) {
		return nil
	}
	for i := range l.wildcards {
		if w := &l.wildcards[i]; w.key == k && w.pattern == v {
			return w
		}
	}
	return nil
}

// exactChild returns the child of key k and exact value v, or nil.
func (n *node) exactChild(k, v string) *node {
	if n.big != nil {
		return n.big.exact[pair{k, v}]
	}
	for i := range n.edges {
		if e := &n.edges[i]; e.key == k && e.value == v && v != "" {
			return e.node
		}
	}
	return nil
}

// keyOnlyChild returns the key-only child of key k, or nil.
func (n *node) keyOnlyChild(k string) *node {
	if n.big != nil {
		return n.big.keyOnly[k]
	}
	for i := range n.edges {
		if e := &n.edges[i]; e.key == k && e.value == "" {
			return e.node
		}
	}
	return nil
}

// literal is level.literal of a large level; a small one has no
// wildcards.
func (n *node) literal(k, v string) *wildcard {
	if n.big == nil {
		return nil
	}
	return n.big.literal(k, v)
}

// wildcards returns the wildcards of the level, in file order.
func (n *node) wildcards() []wildcard {
	if n.big == nil {
		return nil
	}
	return n.big.wildcards
}

// eachChild calls f with every child of the level but wildcards: the
// exact values and the key-only descriptors (value empty), in no order.
func (n *node) eachChild(f func(key, value string, c *node)) {
	if n.big == nil {
		for _, e := range n.edges {
			f(e.key, e.value, e.node)
		}
		return
	}
	for p, c := range n.big.exact {
		f(p.key, p.value, c)
	}
	for k, c := range n.big.keyOnly {
		f(k, "", c)
	}
}

// Rule is a descriptor with a rate_limit block, or with a rate_limits list
// of several limits decided together.
type Rule struct {
	// Domain is the name of the rule's domain.
	Domain string
	// ID names the rule as envoyproxy/ratelimit names its statistics: the
	// domain and the path of key or key_value elements, joined by dots,
	// such as "messaging.message_type_marketing.to_number".
	ID string
	// Path is the descriptor path from the domain down to the rule.
	Path []PathElem

	// Name is rate_limit.name, used by replaces and reported to Envoy. A
	// rule with several limits has one name per limit, in Limits; Name is
	// the first limit's. See [Rule.HasName].
	Name string
	// Replaces lists the names of rules this rule replaces when both
	// match one request.
	Replaces []string
	// Unlimited rules admit everything without counting.
	Unlimited bool
	// RequestsPerUnit, Unit and UnitMultiplier are the limit as written,
	// and Window is Unit × UnitMultiplier. All zero for unlimited rules
	// and for a concurrency limit alone. For a rule with several limits
	// they are the first one's.
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32
	Window          time.Duration
	// Algorithm decides the rule; Burst is its bucket capacity, 0 when the
	// algorithm takes none or the rule leaves it to the default. For a
	// rule with several limits they are the first one's.
	Algorithm algo.Algorithm
	Burst     uint64
	// Limits lists every limit of the rule, in file order: the one of
	// rate_limit, or each entry of rate_limits. Limits[0] repeats the
	// fields above. A request matching the rule is counted against every
	// limit at once, and refused when any of them refuses. Nil for
	// unlimited rules and for a concurrency limit alone; never empty
	// otherwise.
	Limits []Limit

	// Concurrency limits the rule's requests in flight at once, counted
	// by slots the own API's Acquire takes and Release gives back; nil for
	// none. A rule may have one beside its limits, or instead of them.
	Concurrency *Concurrency

	// ShadowMode rules are decided and counted but never refuse.
	ShadowMode bool
	// DetailedMetric, QuotaMode and Metadata are carried over from
	// envoyproxy/ratelimit's format.
	DetailedMetric bool
	QuotaMode      bool
	Metadata       map[string]any

	// File and Line locate the descriptor that holds the rule.
	File string
	Line int

	index int // see Index
}

// Index returns the rule's place among every rule of its [Rules], from 0
// to [Rules.NumRules]-1: the domains in load order, each one's rules in
// file order. What keeps state per rule (metrics, say) can keep it in a
// slice by Index, made when a rule set is put in force, instead of looking
// rules up in a map on every decision. Rules of different sets share
// indexes: compare the rule too.
func (r *Rule) Index() int {
	return r.index
}

// HasName reports whether name names the rule: its rate_limit.name, or the
// name of any of its limits. replaces naming any of them drops the whole
// rule.
func (r *Rule) HasName(name string) bool {
	if name == "" {
		return false
	}
	if r.Name == name {
		return true
	}
	for i := 1; i < len(r.Limits); i++ {
		if r.Limits[i].Name == name {
			return true
		}
	}
	return false
}

// setLimits makes limits the rule's, the first one also in the rule's own
// fields.
func (r *Rule) setLimits(limits []Limit) {
	first := limits[0]
	r.Name = first.Name
	r.RequestsPerUnit, r.Unit, r.UnitMultiplier, r.Window = first.RequestsPerUnit, first.Unit, first.UnitMultiplier, first.Window
	r.Algorithm, r.Burst = first.Algorithm, first.Burst
	r.Limits = limits
}

// Limit is one limit of a rule: a rate_limit block, or one entry of a
// rate_limits list.
type Limit struct {
	// Name is the limit's name: reported to Envoy when this limit is the
	// one a decision describes, and a name replaces may use for the rule.
	Name string
	// RequestsPerUnit, Unit and UnitMultiplier are the limit as written,
	// and Window is Unit × UnitMultiplier.
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32
	Window          time.Duration
	// Algorithm decides the limit; Burst is its bucket capacity, 0 when
	// the algorithm takes none or the rule leaves it to the default.
	Algorithm algo.Algorithm
	Burst     uint64
	// Consistency says where the limit is decided: in the backend (Exact)
	// or by each replica from leased budget (Leased).
	Consistency Consistency
	// Scope says whether the limit is counted in each region (Region) or
	// across all regions (Global); OnPartition, what a region admits of a
	// global limit while it cannot hear a peer region.
	Scope       Scope
	OnPartition Partition
	// OverLimitHits says what becomes of hits beyond what remains: counted
	// anyway, or refused and dropped; the zero value leaves it to the
	// server's default.
	OverLimitHits OverLimitHits
	// Reserve says what a request-time call holds until its cost is
	// settled (rate_limit.reserve); the zero value leaves it to the
	// server's default.
	Reserve Reserve
}

// Capacity returns the limit's bucket capacity: Burst, or RequestsPerUnit
// when Burst is 0.
func (l Limit) Capacity() uint64 {
	if l.Burst == 0 {
		return uint64(l.RequestsPerUnit)
	}
	return l.Burst
}

// PathElem is one level of the descriptor path that leads to a rule.
type PathElem struct {
	Key string
	// Value is the value the level matches: empty for any value, or a
	// pattern holding "*" when Wildcard, each "*" matching any run of
	// bytes ("files/*", "/api*v1", "svc*ep*rpc", "*").
	Value    string
	Wildcard bool
	// ShareThreshold makes every value matching the wildcard share one
	// counter, keyed by the pattern, instead of one counter per value.
	ShareThreshold bool
	ValueToMetric  bool
}

// Unit is a rate_limit unit. The zero value is not a valid unit.
type Unit uint8

// Units, as written in rule files (case-insensitive).
const (
	Second Unit = iota + 1
	Minute
	Hour
	Day
	Week
	Month // 30 days
	Year  // 365 days
)

// String returns the unit's rule-file name, such as "minute".
func (u Unit) String() string {
	switch u {
	case Second:
		return "second"
	case Minute:
		return "minute"
	case Hour:
		return "hour"
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return fmt.Sprintf("unit(%d)", uint8(u))
}

// Duration returns the unit's length. A month is 30 days and a year 365,
// as in envoyproxy/ratelimit.
func (u Unit) Duration() time.Duration {
	const day = 24 * time.Hour
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return day
	case Week:
		return 7 * day
	case Month:
		return 30 * day
	case Year:
		return 365 * day
	}
	return 0
}

// ParseUnit returns the unit named s, case-insensitively.
func ParseUnit(s string) (Unit, error) {
	var names []string
	for u := Second; u <= Year; u++ {
		if strings.EqualFold(s, u.String()) {
			return u, nil
		}
		names = append(names, u.String())
	}
	return 0, fmt.Errorf("unknown unit %q; accepted: %s", s, strings.Join(names, ", "))
}

// FailureMode is what a decision is when the backend fails. The empty
// value means "the server's default".
type FailureMode string

// Failure modes.
const (
	FailOpen   FailureMode = "open"   // admit
	FailClosed FailureMode = "closed" // refuse
	FailError  FailureMode = "error"  // answer with an error; the caller decides
	FailLocal  FailureMode = "local"  // decide with the in-memory backend
)

// ParseFailureMode returns the failure mode named s.
func ParseFailureMode(s string) (FailureMode, error) {
	switch m := FailureMode(s); m {
	case FailOpen, FailClosed, FailError, FailLocal:
		return m, nil
	}
	return "", fmt.Errorf("unknown failure mode %q; accepted: open, closed, error, local", s)
}
