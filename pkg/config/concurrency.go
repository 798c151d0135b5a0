package config

import (
	"time"

	"go.yaml.in/yaml/v3"
)

// Bounds of a concurrency block. They mirror package algo's Concurrency
// bounds: a decision reads every holder of its key.
const (
	MaxInFlight     = 10_000
	MinLeaseTTL     = time.Second
	MaxLeaseTTL     = 24 * time.Hour
	DefaultLeaseTTL = 30 * time.Second
)

// concurrencyFields are the fields a concurrency block accepts, as error
// messages list them.
const concurrencyFields = "max_in_flight, lease_ttl"

// Concurrency is a descriptor's concurrency block: at most MaxInFlight
// requests of the rule in flight at once, each holding a slot taken with
// the own API's Acquire until it is released, or LeaseTTL after it was
// taken or last renewed.
type Concurrency struct {
	MaxInFlight uint32
	LeaseTTL    time.Duration
}

// concurrency parses a descriptor's concurrency block; nil when it is
// invalid.
func (p *parser) concurrency(n *yaml.Node, field string) *Concurrency {
	c := &Concurrency{LeaseTTL: DefaultLeaseTTL}
	var most *yaml.Node
	ok := true
	for _, f := range p.mapping(n, field) {
		sub := field + "." + f.name
		switch f.name {
		case "max_in_flight":
			most = f.val
			v, good := p.uint(f.val, sub, 0, MaxInFlight)
			c.MaxInFlight, ok = uint32(v), ok && good
		case "lease_ttl":
			s, good := p.str(f.val, sub)
			if !good {
				ok = false
				break
			}
			d, err := time.ParseDuration(s)
			switch {
			case err != nil:
				p.fail(f.val, sub, "%q is not a duration; write one such as 30s or 5m", s)
				ok = false
			case d < MinLeaseTTL || d > MaxLeaseTTL:
				p.fail(f.val, sub, "%v is not between %v and %v: a holder that dies keeps its slot this long", d, MinLeaseTTL, MaxLeaseTTL)
				ok = false
			}
			c.LeaseTTL = d
		case "over_limit_hits":
			p.fail(f.key, sub, "a concurrency limit counts slots, not hits: an Acquire takes one slot or is refused, "+
				"and nothing can be counted beyond max_in_flight; over_limit_hits belongs in rate_limit")
			ok = false
		default:
			p.unknown(f, field, concurrencyFields)
			ok = false
		}
	}
	if n := resolve(n); n.Kind != yaml.MappingNode {
		return nil // reported by mapping
	}
	if most == nil {
		p.fail(n, field+".max_in_flight", "missing; the most requests of the rule in flight at once (0 admits none)")
		return nil
	}
	if !ok {
		return nil
	}
	return c
}
