package rlqs

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// envoyUnits are the Envoy time units an assignment is expressed in, longest
// first. Envoy's MONTH and YEAR are left out: their length is not defined
// the way a rule file's month (30 days) and year (365 days) are.
var envoyUnits = [...]struct {
	unit typev3.RateLimitUnit
	d    time.Duration
}{
	{typev3.RateLimitUnit_DAY, 24 * time.Hour},
	{typev3.RateLimitUnit_HOUR, time.Hour},
	{typev3.RateLimitUnit_MINUTE, time.Minute},
	{typev3.RateLimitUnit_SECOND, time.Second},
}

// unitFor expresses a rule's limit as a whole count per Envoy time unit: the
// longest of second, minute, hour and day not longer than the limit's window,
// and the limit's requests per unit scaled to it, rounded down (never more
// than the rule admits). A rule with several limits is assigned its most
// restrictive rate. So 100 per minute is 100 per MINUTE, 10 per 5 seconds
// is 2 per SECOND, and 700 per week 100 per DAY. A rate below one per day
// becomes 0, which assigns DENY_ALL.
func unitFor(r *config.Rule) (typev3.RateLimitUnit, uint64) {
	bestUnit, bestN, bestRate := typev3.RateLimitUnit_SECOND, uint64(0), math.Inf(1)
	for _, l := range r.Limits {
		if l.Window <= 0 {
			continue
		}
		rate := float64(l.RequestsPerUnit) / l.Window.Seconds()
		if rate >= bestRate {
			continue
		}
		u := envoyUnits[len(envoyUnits)-1]
		for _, c := range envoyUnits {
			if c.d <= l.Window {
				u = c
				break
			}
		}
		bestRate, bestUnit = rate, u.unit
		bestN = uint64(l.RequestsPerUnit) * uint64(u.d) / uint64(l.Window)
	}
	return bestUnit, bestN
}

// poolKey names what the streams of a replica share: one bucket of one rule.
type poolKey struct{ domain, rule, bucket string }

// pool is one limit shared by the streams reporting its bucket.
type pool struct {
	unit    typev3.RateLimitUnit
	limit   uint64 // L: requests per unit
	members map[uint64]*member
	// With a Budget: the pool's store keys (budget, demand, streams), made
	// for a limit of keysLimit.
	keys      [3][]byte
	keysLimit uint64
}

// member is one stream's part of a pool.
type member struct {
	demand   float64       // requests per second, allowed + denied, smoothed
	observed bool          // demand holds at least one report
	last     time.Time     // the stream's last report of the bucket
	stale    time.Duration // after last+stale the member's demand no longer counts
	assigned uint64        // the assignment last sent, per unit
	until    time.Time     // when the client stops applying it (at the latest)
	// With a Budget: the leases of the assignment and of the two
	// announcements (demand, streams), and the pool's demand (requests per
	// second) and streams across all replicas as the last announcements
	// showed (0 before the first).
	leases          [3]lease // hits 0: none
	gDemand, gCount float64
	// renewBy is when the leases must be taken again, before the first of
	// them ends too soon to back an assignment (zero: at the next report).
	renewBy time.Time
	under   uint64 // the pool limit the leases were taken under
	// sent is the strategy last made for the member: reused, unchanged,
	// while the assignment stays the same (only the member's stream sends
	// it, one response at a time).
	sent *typev3.RateLimitStrategy
}

// strategy returns the strategy assigning a per unit.
func (m *member) strategy(a uint64, unit typev3.RateLimitUnit) *typev3.RateLimitStrategy {
	if rp := m.sent.GetRequestsPerTimeUnit(); rp == nil || rp.GetRequestsPerTimeUnit() != a || rp.GetTimeUnit() != unit {
		m.sent = requestsPer(a, unit)
	}
	return m.sent
}

// observe folds one report's rate into the member's demand: an exponential
// average giving the latest report weight alpha.
func (m *member) observe(rate, alpha float64, now time.Time) {
	if m.observed {
		m.demand = alpha*rate + (1-alpha)*m.demand
	} else {
		m.demand, m.observed = rate, true
	}
	m.last = now
}

// assign computes and records member id's assignment at now (see the package
// documentation for the policy). The assignment stays counted against the
// limit until until, whatever the other members are assigned meanwhile, so
// the assignments in force never sum to more than the limit.
func (p *pool) assign(id uint64, floorFraction float64, now, until time.Time) uint64 {
	target := p.target(id, floorFraction, now, 0, 0)
	var others uint64
	for mid, m := range p.members {
		if mid != id && now.Before(m.until) {
			others += m.assigned
		}
	}
	me := p.members[id]
	var free uint64
	if others < p.limit {
		free = p.limit - others
	}
	a := min(target, free)
	me.assigned, me.until = a, until
	return a
}

// target returns member id's share of the limit at now: the floor split
// evenly among the streams, the rest in proportion to demand. Streams and
// demand are this pool's members', or at least gCount streams and gDemand
// requests per second when the streams of all replicas are counted
// (phase 2: see budget.go).
func (p *pool) target(id uint64, floorFraction float64, now time.Time, gCount, gDemand float64) uint64 {
	me := p.members[id]
	var n uint64
	var total float64
	for mid, m := range p.members {
		if mid == id || now.Sub(m.last) <= m.stale {
			n++
			total += m.demand
		}
	}
	n = max(n, uint64(gCount))
	total = max(total, gDemand)
	floorEach := uint64(floorFraction*float64(p.limit)) / n
	rest := p.limit - floorEach*n
	target := floorEach
	if total > 0 {
		target += uint64(math.Floor(float64(rest) * (me.demand / total)))
	} else {
		target += rest / n
	}
	return target
}
