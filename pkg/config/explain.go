package config

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// MatchKind is how one descriptor entry matched a level of a domain's
// descriptor tree, in the order [Domain.Match] tries them.
type MatchKind uint8

// Match kinds.
const (
	// NoMatch: nothing at the level matches the entry.
	NoMatch MatchKind = iota
	// ByValue: a descriptor with the entry's key and exactly its value.
	// A wildcard whose pattern is the entry's value, byte for byte, is
	// matched this way too, as envoyproxy/ratelimit does.
	ByValue
	// ByWildcard: the first descriptor, in file order, with the entry's
	// key and a wildcard value (holding "*") that matches the entry's
	// value.
	ByWildcard
	// ByKeyDefault: a descriptor with the entry's key and no value, which
	// matches any value.
	ByKeyDefault
)

// String returns the kind as the explain API spells it: "no_match",
// "value", "wildcard" or "key_default".
func (k MatchKind) String() string {
	switch k {
	case NoMatch:
		return "no_match"
	case ByValue:
		return "value"
	case ByWildcard:
		return "wildcard"
	case ByKeyDefault:
		return "key_default"
	}
	return fmt.Sprintf("match_kind(%d)", uint8(k))
}

// Outcome is why an [Explanation] ends with the rule it does.
type Outcome uint8

// Outcomes.
const (
	// Matched: every entry matched and the last one reached a descriptor
	// with a rate_limit; Explanation.Rule is its rule.
	Matched Outcome = iota + 1
	// EntryUnmatched: an entry matched nothing at its level; it is the
	// last step. This is also the outcome of a descriptor with more
	// entries than the rules' nesting: the level below the deepest rule
	// offers nothing.
	EntryUnmatched
	// NoRateLimit: every entry matched, but the last one reached a
	// descriptor without a rate_limit of its own, such as a level that
	// only holds nested descriptors (the descriptor is shorter than the
	// rules below it) or a descriptor listed to be left unlimited.
	NoRateLimit
	// EmptyDescriptor: the descriptor has no entries.
	EmptyDescriptor
)

// String returns the outcome as the explain API spells it: "matched",
// "entry_unmatched", "no_rate_limit" or "empty_descriptor".
func (o Outcome) String() string {
	switch o {
	case Matched:
		return "matched"
	case EntryUnmatched:
		return "entry_unmatched"
	case NoRateLimit:
		return "no_rate_limit"
	case EmptyDescriptor:
		return "empty_descriptor"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// MaxListed caps the descriptors an [Explanation] lists for one level
// (Step.Available, Explanation.Deeper); the rest are only counted.
const MaxListed = 20

// Explanation is how [Domain.Match] decides a descriptor, level by level.
// Its Rule is always what Match returns for the same descriptor.
type Explanation struct {
	// Domain is the domain's name.
	Domain string
	// Steps has one step per entry walked, in order. The walk stops at
	// the first entry that matches nothing, so it may be shorter than the
	// descriptor.
	Steps []Step
	// Rule is the rule the descriptor matches, the one Match returns;
	// nil when none does.
	Rule *Rule
	// Outcome says why Rule is what it is.
	Outcome Outcome
	// Deeper lists, when Outcome is NoRateLimit, the descriptors nested
	// below the last one reached (those with the entry's key first), at
	// most MaxListed; MoreDeeper counts the others.
	Deeper     []PathElem
	MoreDeeper int
}

// Step is one level of an [Explanation]: one entry of the descriptor and
// the rule-file descriptor it matched.
type Step struct {
	// Key and Value are the descriptor's entry.
	Key, Value string
	// Kind is how the entry matched.
	Kind MatchKind
	// Elem is the rule-file descriptor matched: its key, its value (a
	// pattern holding "*" for a wildcard, empty for a key-only
	// descriptor) and flags. Zero when Kind is NoMatch.
	Elem PathElem
	// Rule is the rule of the descriptor matched, nil when it has no
	// rate_limit (it only holds nested descriptors, or is the last level
	// walked and leaves the entry unlimited) or when Kind is NoMatch.
	Rule *Rule
	// Outranked lists the other descriptors of the level that match the
	// entry too but lose to Elem by precedence (exact value, then the
	// first wildcard in file order, then the key-only descriptor).
	Outranked []PathElem
	// Available lists, when Kind is NoMatch, every descriptor the level
	// offers, those with the entry's key first, at most MaxListed;
	// MoreAvailable counts the others. Empty when the level has none,
	// which happens below a descriptor without nested descriptors.
	Available     []PathElem
	MoreAvailable int
}

// Explain walks the domain's rules for desc as [Domain.Match] does and
// tells, for each entry, what was tried and what matched, and which rule
// applies in the end. Unlike Match it allocates; it is meant for operators
// and tools, not for deciding requests.
func (d *Domain) Explain(desc Descriptor) Explanation {
	e := Explanation{Domain: d.Name}
	last := desc.Len() - 1
	if last < 0 {
		e.Outcome = EmptyDescriptor
		return e
	}
	n := &d.root
	for i := 0; i <= last; i++ {
		k, v := desc.Entry(i)
		// child decides, exactly as in Match; explainChild only says why.
		next := n.child(k, v)
		st := n.explainChild(i, k, v, next)
		e.Steps = append(e.Steps, st)
		if next == nil {
			e.Outcome = EntryUnmatched
			return e
		}
		if i == last {
			e.Rule = next.rule
			if e.Rule != nil {
				e.Outcome = Matched
			} else {
				e.Outcome = NoRateLimit
				e.Deeper, e.MoreDeeper = capList(next.candidates(i+1, ""))
			}
			return e
		}
		n = next
	}
	return e // not reached: the loop returns at its last entry
}

// explainChild tells how entry (k, v) at depth matched next, the child
// that n.child returned for it (nil when none).
func (n *node) explainChild(depth int, k, v string, next *node) Step {
	st := Step{Key: k, Value: v}
	// Every descriptor of the level that matches the entry, in precedence
	// order: the first is the one child returns.
	type hit struct {
		kind MatchKind
		node *node
		elem PathElem
	}
	var hits []hit
	if c := n.exactChild(k, v); c != nil {
		hits = append(hits, hit{ByValue, c, PathElem{Key: k, Value: v}})
	}
	lit := n.literal(k, v)
	if lit != nil {
		hits = append(hits, hit{ByValue, lit.node, PathElem{Key: k, Value: v, Wildcard: true}})
	}
	wildcards := n.wildcards()
	for i := range wildcards {
		w := &wildcards[i]
		if w != lit && w.key == k && w.matches(v) {
			hits = append(hits, hit{ByWildcard, w.node, PathElem{Key: k, Value: w.pattern, Wildcard: true}})
		}
	}
	if c := n.keyOnlyChild(k); c != nil {
		hits = append(hits, hit{ByKeyDefault, c, PathElem{Key: k}})
	}
	if next == nil {
		st.Available, st.MoreAvailable = capList(n.candidates(depth, k))
		return st
	}
	for i, h := range hits {
		if h.node == next && st.Kind == NoMatch {
			st.Kind, st.Elem, st.Rule = h.kind, h.node.elem(depth, h.elem), next.rule
			continue
		}
		st.Outranked = append(st.Outranked, hits[i].node.elem(depth, h.elem))
	}
	return st
}

// candidates lists the descriptors of level n (at depth): those with key
// first, then by key; within a key, exact values sorted, then wildcards in
// file order, then the key-only descriptor.
func (n *node) candidates(depth int, key string) []PathElem {
	var out, keyOnly []PathElem
	n.eachChild(func(k, v string, c *node) {
		if v == "" {
			keyOnly = append(keyOnly, c.elem(depth, PathElem{Key: k}))
		} else {
			out = append(out, c.elem(depth, PathElem{Key: k, Value: v}))
		}
	})
	slices.SortFunc(out, func(a, b PathElem) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Value, b.Value))
	})
	wildcards := n.wildcards()
	for i := range wildcards {
		w := &wildcards[i]
		out = append(out, w.node.elem(depth, PathElem{Key: w.key, Value: w.pattern, Wildcard: true}))
	}
	out = append(out, keyOnly...)
	rank := func(e PathElem) int {
		switch {
		case e.Value == "":
			return 2
		case e.Wildcard:
			return 1
		}
		return 0
	}
	slices.SortStableFunc(out, func(a, b PathElem) int {
		aOther, bOther := a.Key != key, b.Key != key
		if aOther != bOther {
			if aOther {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(rank(a), rank(b)))
	})
	return out
}

func capList(l []PathElem) ([]PathElem, int) {
	if len(l) > MaxListed {
		return l[:MaxListed], len(l) - MaxListed
	}
	return l, 0
}

// elem returns the rule-file descriptor of node n, at depth: the element
// at that depth of the path of any rule at or below n, which carries its
// flags (share_threshold, value_to_metric). When no rule lies below n the
// flags cannot matter, and fallback is returned as it is.
func (n *node) elem(depth int, fallback PathElem) PathElem {
	if r := n.firstRule(); r != nil && depth < len(r.Path) {
		return r.Path[depth]
	}
	return fallback
}

// firstRule returns a rule at or below n, or nil when there is none.
func (n *node) firstRule() *Rule {
	if n.rule != nil {
		return n.rule
	}
	var found *Rule
	n.eachChild(func(_, _ string, c *node) {
		if found == nil {
			found = c.firstRule()
		}
	})
	wildcards := n.wildcards()
	for i := 0; found == nil && i < len(wildcards); i++ {
		found = wildcards[i].node.firstRule()
	}
	return found
}

// Why returns the explanation as sentences for people: one per step, then
// one for the outcome. Levels are numbered from 1.
func (e *Explanation) Why() []string {
	var out []string
	for i := range e.Steps {
		out = append(out, e.Steps[i].why(i+1))
	}
	switch e.Outcome {
	case Matched:
		out = append(out, fmt.Sprintf("result: rule %s (%s) matches", e.Rule.ID, location(e.Rule)))
	case EntryUnmatched:
		out = append(out, fmt.Sprintf("result: no rule, level %d matched nothing", len(e.Steps)))
	case NoRateLimit:
		s := fmt.Sprintf("result: no rule, the descriptor ends at level %d on a descriptor without a rate_limit of its own", len(e.Steps))
		if len(e.Deeper) > 0 {
			s += "; the rules below it need more entries: " + listElems(e.Deeper, e.MoreDeeper)
		}
		out = append(out, s)
	case EmptyDescriptor:
		out = append(out, "result: no rule, the descriptor has no entries")
	}
	return out
}

// why describes step s, at 1-based level.
func (s *Step) why(level int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "level %d: entry %s ", level, entryText(s.Key, s.Value))
	switch s.Kind {
	case ByValue:
		fmt.Fprintf(&b, "matched the descriptor with key %q and value %q exactly", s.Elem.Key, s.Elem.Value)
		if s.Elem.Wildcard {
			b.WriteString(" (a wildcard's pattern, taken literally)")
		}
	case ByWildcard:
		how := "whose pattern matches the value"
		if i := strings.IndexByte(s.Elem.Value, '*'); i == len(s.Elem.Value)-1 {
			how = "whose prefix starts the value"
		}
		fmt.Fprintf(&b, "matched the wildcard %s, the first wildcard of key %q in file order %s (no descriptor has the exact value)",
			elemText(s.Elem), s.Elem.Key, how)
		if s.Elem.ShareThreshold {
			b.WriteString("; with share_threshold, every value matching it shares one counter")
		} else {
			b.WriteString("; without share_threshold, each value has its own counter")
		}
	case ByKeyDefault:
		fmt.Fprintf(&b, "matched the key-only descriptor %s: no descriptor of key %q has the exact value and no wildcard of it matches",
			elemText(s.Elem), s.Key)
	case NoMatch:
		b.WriteString("matches nothing at this level: ")
		b.WriteString(s.unmatchedText(level))
		return b.String()
	}
	if s.Rule != nil {
		fmt.Fprintf(&b, "; it holds rule %s (%s)", s.Rule.ID, location(s.Rule))
	}
	if len(s.Outranked) > 0 {
		verb := "match"
		if len(s.Outranked) == 1 {
			verb = "matches"
		}
		fmt.Fprintf(&b, "; it outranks %s, which %s too", listElems(s.Outranked, 0), verb)
	}
	return b.String()
}

// unmatchedText says what a level that matched nothing offered.
func (s *Step) unmatchedText(level int) string {
	if len(s.Available) == 0 {
		if level == 1 {
			return "the domain has no descriptors"
		}
		return fmt.Sprintf("the descriptor matched at level %d has no nested descriptors, so no rule has as many entries as this descriptor", level-1)
	}
	sameKey := 0
	for _, e := range s.Available {
		if e.Key == s.Key {
			sameKey++
		}
	}
	if sameKey == 0 {
		return fmt.Sprintf("no descriptor has key %q; the level offers %s", s.Key, listElems(s.Available, s.MoreAvailable))
	}
	more := 0
	if sameKey == len(s.Available) {
		more = s.MoreAvailable // the others may have the key too
	}
	return fmt.Sprintf("key %q is here only as %s, and there is no key-only descriptor %q for any value",
		s.Key, listElems(s.Available[:sameKey], more), s.Key)
}

// location returns where rule r is defined, "file:line".
func location(r *Rule) string {
	return fmt.Sprintf("%s:%d", r.File, r.Line)
}

func entryText(k, v string) string {
	return fmt.Sprintf("%q=%q", k, v)
}

// elemText describes a rule-file descriptor.
func elemText(e PathElem) string {
	switch {
	case e.Value == "":
		return fmt.Sprintf("%q (any value)", e.Key)
	case e.Wildcard:
		return fmt.Sprintf("%q=%q (wildcard)", e.Key, e.Value)
	}
	return fmt.Sprintf("%q=%q", e.Key, e.Value)
}

func listElems(l []PathElem, more int) string {
	parts := make([]string, len(l), len(l)+1)
	for i, e := range l {
		parts[i] = elemText(e)
	}
	if more > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", more))
	}
	return strings.Join(parts, ", ")
}
