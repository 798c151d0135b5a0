package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// MaxSlotKeys bounds the keys of concurrency limits whose slots a
// [Metrics] follows for ratelimitd_concurrency_in_flight; past it, the
// slots of keys not yet followed are left out of the gauge until some
// followed key's slots have all ended.
const MaxSlotKeys = 10_000

const (
	helpSlots = "Concurrency slots, by domain, rule and event: acquired (taken by Acquire), refused (Acquire found every slot held), " +
		"released (given back by Release), expired (a holder's lease TTL ended before it released: a crashed or leaky caller; " +
		"counted by the first later call on the same key)."
	helpInFlight = "Concurrency slots held now, by domain and rule: for each key of the rule this replica served, the count its latest " +
		"Acquire, Release or Renew found, until that count's last slot ends; summed over keys. Replicas that serve the same keys " +
		"each count them: take max over replicas for a rule of one key."
)

// Slot events, the event label of ratelimitd_concurrency_slots_total.
var slotEvents = [...]string{"acquired", "refused", "released", "expired"}

// slots is the concurrency metrics of a [Metrics].
type slots struct {
	now    func() time.Time
	events *prometheus.CounterVec // domain, rule, event
	gauge  *prometheus.Desc

	mu   sync.Mutex
	keys map[string]slotKey // by counter key
	// rules are the (domain, rule) pairs seen, so that the gauge reports
	// a rule whose slots all ended as 0 rather than dropping it.
	rules map[ruleKey]struct{}
}

// slotKey is the latest count of one key's slots.
type slotKey struct {
	rule     ruleKey
	inFlight uint64
	until    time.Time // when the last of them ends, unless renewed
}

func newSlots(now func() time.Time) *slots {
	return &slots{
		now: now,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "concurrency", Name: "slots_total", Help: helpSlots,
		}, []string{"domain", "rule", "event"}),
		gauge: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "concurrency", "in_flight"), helpInFlight,
			[]string{"domain", "rule"}, nil),
		keys:  make(map[string]slotKey),
		rules: make(map[ruleKey]struct{}),
	}
}

// Slots counts what one call did to a concurrency limit's slots; it
// implements [service.SlotObserver].
func (m *Metrics) Slots(r *service.SlotReport) {
	s := m.slots
	for i, n := range [...]uint64{r.Acquired, r.Refused, r.Released, r.Expired} {
		if n > 0 {
			s.events.WithLabelValues(r.Domain, r.Rule, slotEvents[i]).Add(float64(n))
		}
	}
	rk := ruleKey{r.Domain, r.Rule}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules[rk] = struct{}{}
	if r.InFlight == 0 {
		delete(s.keys, string(r.Key))
		return
	}
	if _, ok := s.keys[string(r.Key)]; !ok && len(s.keys) >= MaxSlotKeys {
		s.dropEnded(s.now())
		if len(s.keys) >= MaxSlotKeys {
			return
		}
	}
	s.keys[string(r.Key)] = slotKey{rule: rk, inFlight: r.InFlight, until: s.now().Add(r.Until)}
}

// ruleSlots makes the series of every rule of rules with a concurrency
// limit, at zero.
func (s *slots) ruleSlots(rules *config.Rules) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range rules.Domains() {
		for _, r := range d.Rules() {
			if r.Concurrency == nil {
				continue
			}
			s.rules[ruleKey{d.Name, r.ID}] = struct{}{}
			for _, e := range slotEvents {
				s.events.WithLabelValues(d.Name, r.ID, e)
			}
		}
	}
}

// dropEnded forgets the keys whose slots have all ended. s.mu is held.
func (s *slots) dropEnded(now time.Time) {
	for k, v := range s.keys {
		if !now.Before(v.until) {
			delete(s.keys, k)
		}
	}
}

// Describe implements prometheus.Collector.
func (s *slots) Describe(ch chan<- *prometheus.Desc) {
	s.events.Describe(ch)
	ch <- s.gauge
}

// Collect implements prometheus.Collector.
func (s *slots) Collect(ch chan<- prometheus.Metric) {
	s.events.Collect(ch)
	s.mu.Lock()
	s.dropEnded(s.now())
	sums := make(map[ruleKey]uint64, len(s.rules))
	for rk := range s.rules {
		sums[rk] = 0
	}
	for _, v := range s.keys {
		sums[v.rule] += v.inFlight
	}
	s.mu.Unlock()
	for rk, n := range sums {
		ch <- prometheus.MustNewConstMetric(s.gauge, prometheus.GaugeValue, float64(n), rk.domain, rk.id)
	}
}
