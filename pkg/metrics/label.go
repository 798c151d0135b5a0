package metrics

import (
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// detailed reports whether rule's label may name descriptor values: the
// rule has detailed_metric, or a level of its path has value_to_metric and
// matches more than one value (by key alone, or by a wildcard that does not
// share one counter).
func detailed(rule *config.Rule) bool {
	if rule.DetailedMetric {
		return true
	}
	for i := range rule.Path {
		p := &rule.Path[i]
		if p.ValueToMetric && (p.Value == "" || p.Wildcard && !p.ShareThreshold) {
			return true
		}
	}
	return false
}

// appendLabel appends to b the label rule gives descriptor d, as
// envoyproxy/ratelimit names the statistics of a decision: the domain, then
// one element per entry, after a dot:
//
//   - key_pattern for a level with share_threshold, whose values share one
//     counter (pattern is the wildcard, "*" included);
//   - else, when the rule has detailed_metric, key_value with the entry's
//     value (key_ when the value is empty);
//   - else key_value for a level matching one exact value;
//   - else, for a level with value_to_metric, key_value with the entry's
//     value (key alone when it is empty);
//   - else key_pattern for a wildcard level and key for a key-only level.
//
// Without detailed_metric and value_to_metric this is rule.ID. ok is false
// when d does not have one entry per level of the rule's path, so could not
// have matched it.
func appendLabel(b []byte, rule *config.Rule, d *rlv3.RateLimitDescriptor) (_ []byte, ok bool) {
	entries := d.GetEntries()
	if len(entries) != len(rule.Path) {
		return b, false
	}
	b = append(b, rule.Domain...)
	for i, e := range entries {
		p := &rule.Path[i]
		b = append(b, '.')
		b = append(b, p.Key...)
		switch v := e.GetValue(); {
		case p.Wildcard && p.ShareThreshold:
			b = append(append(b, '_'), p.Value...)
		case rule.DetailedMetric:
			b = append(append(b, '_'), v...)
		case p.Value != "" && !p.Wildcard:
			b = append(append(b, '_'), p.Value...)
		case p.ValueToMetric:
			if v != "" {
				b = append(append(b, '_'), v...)
			}
		case p.Wildcard:
			b = append(append(b, '_'), p.Value...)
		}
	}
	return b, true
}

// AppendStatKey appends to b the key envoyproxy/ratelimit names the
// statistics of a decision by, before the ratelimit.service.rate_limit.
// prefix and the stat's own suffix, unsanitized:
//
//   - for a rule, its label as described at appendLabel: the rule ID, or
//     descriptor values where the rule opts in with detailed_metric or
//     value_to_metric;
//   - for a descriptor's own limit override (rule nil), the domain and
//     every entry as key_value (key alone when the value is empty), joined
//     by dots, as the reference names an override's statistics.
func AppendStatKey(b []byte, domain string, rule *config.Rule, d *rlv3.RateLimitDescriptor) []byte {
	if rule == nil {
		b = append(b, domain...)
		for _, e := range d.GetEntries() {
			b = append(append(b, '.'), e.GetKey()...)
			if v := e.GetValue(); v != "" {
				b = append(append(b, '_'), v...)
			}
		}
		return b
	}
	if !detailed(rule) {
		return append(b, rule.ID...)
	}
	start := len(b)
	if out, ok := appendLabel(b, rule, d); ok {
		return out
	}
	return append(b[:start], rule.ID...)
}
