package config

// Validation: what the decoded values of a rule file must satisfy, alone and
// together: bounds, required fields, combinations of fields, duplicates
// and references between rules. Each check reports every problem it finds
// at the file, line and field it concerns, saying what is accepted.

import (
	"fmt"
	"math/bits"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Bounds on what a rule file may say.
const (
	// MaxDomainLen is the longest domain name, the longest a request may
	// carry.
	MaxDomainLen = 255
	// MaxFileSize bounds a rule file, in bytes: 64 MiB, about 450,000
	// descriptors such as route=rN with a nested user limited, some 150
	// bytes each written in block style. It bounds the YAML nodes a file
	// holds, and so the work and memory of loading it; what its aliases
	// add is bounded apart (MaxAliasNodes).
	MaxFileSize = 64 << 20
	// MaxAliasNodes bounds what aliases add to a rule file: the YAML nodes
	// reached through them, each use of an alias counting again the nodes
	// it names, may be at most MaxAliasNodes, or as many as the file holds
	// itself when that is more. That is far above what anchors of shared
	// limits need (each use of a two-field rate_limit adds 5 nodes) and far
	// below what a few lines of nested or repeated aliases expand to (a
	// "billion laughs"), which is refused before anything is walked.
	MaxAliasNodes = 1_000_000
	// MaxWindow is the longest window unit × unit_multiplier may make.
	MaxWindow = 100 * 365 * 24 * time.Hour
	// MaxBucket bounds requests_per_unit and burst of the bucket
	// algorithms (those that use burst), MaxRefill the time their bucket
	// takes to refill from empty (burst × window / requests_per_unit),
	// and MaxLog requests_per_unit of an algorithm that logs hits, which
	// keeps one timestamp per admitted hit. They are package algo's
	// bounds of exact arithmetic, so every limit a rule file states is
	// one algo computes.
	MaxBucket = algo.MaxBucket
	MaxRefill = algo.MaxRefill
	MaxLog    = algo.MaxLog
	maxUint32 = 1<<32 - 1
)

// checkDomain checks the domain's name.
func (p *parser) checkDomain(raw *rawDomain) {
	switch {
	case p.domainNode == nil:
		p.fail(raw.root, "domain", "missing; every rule file names the domain its descriptors belong to")
	case raw.name == "":
		p.fail(p.domainNode, "domain", "must not be empty")
	case len(raw.name) > MaxDomainLen:
		p.fail(p.domainNode, "domain", "is %d bytes long; at most %d are accepted", len(raw.name), MaxDomainLen)
	}
}

// checkReplaces checks, once the whole domain is decoded, that every name
// a replaces list gives is another rule's.
func (p *parser) checkReplaces(domain string) {
	for _, ref := range p.refs {
		if ref.name == ref.owner {
			p.fail(ref.node, ref.field, "rule %q replaces itself; replaces names other rules", ref.name)
		} else if !p.names[ref.name] {
			p.fail(ref.node, ref.field, "no rule in domain %q is named %q; replaces takes the name of another rule, its rate_limit.name or a name in its rate_limits", domain, ref.name)
		}
	}
}

// checkDescriptor checks a decoded descriptor's key, value and flags, and
// that no earlier descriptor of its level (firsts: key and value -> line)
// has the same key and value. False when the descriptor cannot be placed
// in the tree; it is then skipped, its nested descriptors too.
func (p *parser) checkDescriptor(raw *rawDescriptor, firsts map[pair]int) bool {
	elem := &raw.elem
	switch {
	case raw.keyNode == nil:
		p.fail(raw.item, raw.field+".key", "missing; every descriptor has a key")
		return false
	case elem.Key == "":
		p.fail(raw.keyNode, raw.field+".key", "must not be empty")
		return false
	}
	if elem.ShareThreshold && !elem.Wildcard {
		p.fail(raw.share, raw.field+".share_threshold", "applies only to a wildcard value, one holding \"*\" (such as \"files/*\" or \"/api*v1\"); this descriptor's value is %q", elem.Value)
	}
	id := pair{elem.Key, elem.Value}
	if first, dup := firsts[id]; dup {
		what := fmt.Sprintf("key %q with value %q", elem.Key, elem.Value)
		if elem.Value == "" {
			what = fmt.Sprintf("key %q without a value", elem.Key)
		}
		p.fail(raw.keyNode, raw.field, "duplicate descriptor: %s is already defined at line %d of this level", what, first)
		return false
	}
	firsts[id] = raw.keyNode.Line
	return true
}

// failBothLimits reports a descriptor with both rate_limit and rate_limits.
func (p *parser) failBothLimits(raw *rawDescriptor) {
	p.fail(fieldKey(raw.fields, "rate_limits"), raw.field+".rate_limits",
		"a descriptor has either rate_limit (one limit) or rate_limits (a list of limits), not both; move the rate_limit block into the rate_limits list")
}

// checkConcurrency checks that a descriptor with a concurrency limit c
// (nil when invalid) and rule r (nil when none or invalid) can have both:
// an unlimited rule counts nothing, so it takes no concurrency limit.
func (p *parser) checkConcurrency(raw *rawDescriptor, r *Rule) bool {
	if r != nil && r.Unlimited {
		p.fail(fieldKey(raw.fields, "concurrency"), raw.field+".concurrency",
			"a descriptor whose rate_limit is unlimited counts nothing; drop unlimited: true to limit its requests in flight, or drop concurrency")
		return false
	}
	return true
}

// checkRateLimit checks a decoded rate_limit block: an unlimited one sets
// none of the fields of a counted limit, a counted one passes checkLimit.
func (p *parser) checkRateLimit(b *limitBlock, unlimited bool) bool {
	if !unlimited {
		return p.checkLimit(b)
	}
	ok := b.ok
	for _, c := range []struct {
		n    *yaml.Node
		name string
	}{{b.unit, "unit"}, {b.mult, "unit_multiplier"}, {b.alg, "algorithm"}, {b.burst, "burst"}, {b.cons, "consistency"}, {b.scope, "scope"}, {b.part, "on_partition"}, {b.over, "over_limit_hits"}, {b.reserve, "reserve"}} {
		if c.n != nil {
			p.fail(c.n, b.field+"."+c.name, "must not be set together with unlimited: true; an unlimited rule counts nothing")
			ok = false
		}
	}
	return ok
}

// checkRateLimits checks the decoded entries of a rate_limits list, each a
// valid limit and no two counting in one counter (the same algorithm and
// window length), and returns their limits; nil when any is invalid.
func (p *parser) checkRateLimits(blocks []limitBlock) []Limit {
	if len(blocks) == 0 {
		return nil
	}
	limits := make([]Limit, 0, len(blocks))
	from := make([]int, 0, len(blocks)) // the entry each limit comes from
	ok := true
	for i := range blocks {
		b := &blocks[i]
		if b.unlimited || !p.checkLimit(b) {
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
			p.fail(b.node, b.field, "has the same algorithm (%s) and window (%s) as rate_limits[%d] at line %d; "+
				"the two would count in one counter: give each limit its own window or algorithm",
				b.lim.Algorithm, window, from[j], blocks[from[j]].node.Line)
			ok = false
			break
		}
		limits = append(limits, b.lim)
		from = append(from, i)
	}
	if !ok {
		return nil
	}
	return limits
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
	if l.Scope == Global && l.Algorithm != algo.FixedWindow {
		p.fail(b.scope, b.field+".scope", "global counts a limit as the sum of each region's count in a window: "+
			"only %s keeps one count per window, not %s (or scope: region)", algo.FixedWindow, l.Algorithm)
		return false
	}
	if b.part != nil && l.Scope != Global {
		p.fail(b.part, b.field+".on_partition", "is for scope: global, what a region admits while it cannot hear a peer; "+
			"a limit of scope: region never waits on another region")
		return false
	}
	if l.Consistency == Leased && !l.Algorithm.Leasable() {
		p.fail(b.cons, b.field+".consistency", "leased needs a budget that any replica may spend: %s %s; "+
			"leasable: %s (or consistency: exact)", l.Algorithm, l.Algorithm.UnleasableReason(), leasableNames())
		return false
	}
	if !p.checkReserve(b) {
		return false
	}
	n := uint64(l.RequestsPerUnit)
	switch {
	case l.Algorithm.LogsHits():
		if n > MaxLog {
			p.fail(b.rpu, b.field+".requests_per_unit", "%d is above %d, the most %s accepts: it keeps one timestamp per admitted hit; "+
				"use sliding_window_counter or token_bucket for larger limits", n, MaxLog, l.Algorithm)
			ok = false
		}
	case l.Algorithm.UsesBurst():
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

// checkReserve checks a limit's reserve: reservations are held in one
// count per window, decided exactly in the region's backend, so the limit
// is a fixed window, neither leased nor global; over_limit_hits means
// nothing beside it (a settled cost always counts, a request-time call
// that does not fit is refused); and a reservation must fit the limit.
func (p *parser) checkReserve(b *limitBlock) bool {
	l := &b.lim
	if !l.Reserve.On() {
		return true
	}
	why := ""
	switch {
	case l.Algorithm != algo.FixedWindow:
		why = fmt.Sprintf("reservations are held against one count per window: only %s keeps one, not %s", algo.FixedWindow, l.Algorithm)
	case l.Consistency == Leased:
		why = "a leased limit is decided from budget leased to each replica, while a reservation is held in the store that every replica's settle releases: use consistency: exact"
	case l.Scope == Global:
		why = "a global limit is counted across regions that sync in the background, while a request-time call and its settle may reach different regions: use scope: region"
	case b.over != nil:
		p.fail(b.over, b.field+".over_limit_hits", "has no meaning beside reserve: a settled cost always counts, and a request-time call that does not fit is refused; drop over_limit_hits")
		return false
	case l.Reserve.Mode == ReserveFixed && l.Reserve.Hits > uint64(l.RequestsPerUnit):
		p.fail(b.reserve, b.field+".reserve", "%d is above requests_per_unit %d: no request-time call would ever fit; reserve at most the limit", l.Reserve.Hits, l.RequestsPerUnit)
		return false
	default:
		return true
	}
	p.fail(b.reserve, b.field+".reserve", "%s; or drop reserve", why)
	return false
}

// leasableNames lists the algorithms a leased limit may use, for
// messages: "fixed_window, sliding_window_counter, ...".
func leasableNames() string {
	var names []string
	for _, a := range algo.Algorithms() {
		if a.Leasable() {
			names = append(names, a.String())
		}
	}
	return strings.Join(names, ", ")
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
