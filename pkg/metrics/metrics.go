// Package metrics exports what the rate-limit service decides as Prometheus
// metrics. A [Metrics] is a [service.Observer]: hand it to the service as
// service.Options.Observer and it counts every descriptor's decision by
// domain, rule and result, the hits asked for, and times and classifies
// every backend call. Its collectors live on a registry the caller owns.
//
// # Metrics
//
//	ratelimitd_decisions_total{domain, rule, result}     counter
//	ratelimitd_hits_total{domain, rule}                  counter
//	ratelimitd_metric_series_dropped_total               counter
//	ratelimitd_backend_call_duration_seconds             histogram
//	ratelimitd_backend_call_errors_total{kind}           counter
//	ratelimitd_concurrency_slots_total{domain, rule, event} counter
//	ratelimitd_concurrency_in_flight{domain, rule}       gauge
//
// result is [service.Outcome.String]: ok, near_limit, over_limit,
// shadow_mode or unlimited. kind is timeout, circuit_open, canceled or
// other; see [Classify]. event is acquired, refused, released or expired:
// what Acquire, Release and Renew did to the slots of concurrency limits
// (a [Metrics] is a [service.SlotObserver] too). The backend metrics are the service's view of
// each call, every failure included; ratelimitd_backend_calls_total,
// ratelimitd_backend_errors_total and the like, which the command exports
// from the circuit breaker's own counters, are other names: these do not
// clash with them on one registry. circuit_open is recognized as
// [breaker.ErrOpen], which is why the package imports the breaker.
//
// # Cardinality
//
// Label values come from the loaded rule files, never from requests, except
// where a rule opts in. domain is a domain of the rule files (the service
// reports decisions of loaded domains only), and rule is the rule's
// [config.Rule.ID], such as "messaging.message_type_marketing.to_number", or
// [OverrideRule] for a descriptor decided by its own limit override.
//
// A rule opts in to descriptor values as envoyproxy/ratelimit names its
// statistics:
//
//   - detailed_metric on the rule: the rule label is the domain and every
//     entry of the descriptor as key_value, joined by dots, such as
//     "messaging.to_number_2061111111".
//   - value_to_metric on a level of the rule's path that matched by key
//     alone or by a wildcard: that level is key_value with the request's
//     value, the others as in the rule ID, such as
//     "messaging.route_/api.method" for a rule route → method with
//     value_to_metric on route.
//
// A level with share_threshold keeps its wildcard pattern in both cases, as
// every value matching it shares one counter. Options.MaxDetailedSeries
// caps the distinct rule labels so made, over the life of the Metrics;
// past the cap, a decision that would start a new one is counted under the
// plain rule ID instead, and in ratelimitd_metric_series_dropped_total,
// and the first such decision logs a warning. So is a label longer than
// 1024 bytes.
//
// # Cost
//
// Decided does not allocate for a rule without detailed metrics, for an
// override, nor for a detailed label already seen, and its cost does not
// grow with the rules: series are looked up in a table by
// [config.Rule.Index] that [Metrics.Rules] makes for the rules in force,
// or in caches keyed by the domain or by the label built in a stack
// buffer. A series is a few atomic counters, some 300 bytes a rule with
// its labels, exported by a collector of the package's own. Rules the
// table does not hold (Rules not called, or a decision under the rules
// just replaced) are found in a cache keyed by the rule's pointer, which
// Rules clears and which is cleared when it grows past twice the rule IDs
// seen, so that neither reloads nor the old rules stay in it.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// Namespace starts the name of every metric of the package.
const Namespace = "ratelimitd"

// OverrideRule is the rule label of a descriptor decided by its own limit
// override rather than by a rule.
const OverrideRule = "override"

// DefaultMaxDetailedSeries is the default of Options.MaxDetailedSeries.
const DefaultMaxDetailedSeries = 1000

// maxDetailedLabel is the longest detailed rule label, in bytes; a longer
// one is counted under the plain rule ID, as a dropped series.
const maxDetailedLabel = 1024

// Help texts of the metrics.
const (
	helpDecisions = "Descriptors decided, by domain, rule and result (ok, near_limit, over_limit, shadow_mode, unlimited). " +
		"rule is the rule ID, override for a descriptor's own limit, or a label naming descriptor values where the rule opts in."
	helpHits     = "Hits asked for by decided descriptors, whatever the result, by domain and rule."
	helpDropped  = "Decisions counted under their plain rule ID because their detailed rule label was not made: the cap on detailed labels was reached, or the label was over 1024 bytes."
	helpLatency  = "Time taken by backend calls, failed ones included, except those refused at once by an open circuit."
	helpErrors   = "Backend calls that failed, by kind: timeout, circuit_open (refused by the open circuit), canceled (by the caller) or other."
	helpDegraded = "Requests decided by a failure mode (open, closed, error, local) because the backend failed, by domain and mode."
)

// Options configure [New]. The zero value selects every default.
type Options struct {
	// MaxDetailedSeries caps how many distinct rule labels naming
	// descriptor values (of rules with detailed_metric or value_to_metric)
	// are ever made. Each label makes a series of ratelimitd_hits_total and
	// one of ratelimitd_decisions_total per result the rule can have.
	// Default DefaultMaxDetailedSeries; negative: none, every decision is
	// counted under its plain rule ID.
	MaxDetailedSeries int
	// Logger receives the one warning logged at the first dropped
	// detailed label. Default: discard.
	Logger *slog.Logger
	// Now is the clock that tells when held slots end, for
	// ratelimitd_concurrency_in_flight. Default time.Now.
	Now func() time.Time
}

// ErrorKind classifies a failed backend call for
// ratelimitd_backend_call_errors_total.
type ErrorKind uint8

// Error kinds.
const (
	// KindTimeout: the call ran out of time: its error is, or wraps,
	// context.DeadlineExceeded or an error whose Timeout method reports
	// true (a network timeout, or a deadline of the circuit breaker).
	KindTimeout ErrorKind = iota
	// KindCircuitOpen: the circuit breaker refused the call without
	// calling the backend (breaker.ErrOpen).
	KindCircuitOpen
	// KindCanceled: the caller gave up (context.Canceled).
	KindCanceled
	// KindOther: any other error.
	KindOther
	numKinds
)

// String returns the kind's label: timeout, circuit_open, canceled or other.
func (k ErrorKind) String() string {
	switch k {
	case KindTimeout:
		return "timeout"
	case KindCircuitOpen:
		return "circuit_open"
	case KindCanceled:
		return "canceled"
	}
	return "other"
}

// Classify returns the kind of a backend call's error err, which must not
// be nil.
func Classify(err error) ErrorKind {
	var t interface{ Timeout() bool }
	switch {
	case errors.Is(err, breaker.ErrOpen):
		return KindCircuitOpen
	case errors.Is(err, context.Canceled):
		return KindCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &t) && t.Timeout():
		return KindTimeout
	}
	return KindOther
}

// numOutcomes is the number of service outcomes.
const numOutcomes = int(service.OutcomeUnlimited) + 1

// Metrics counts decisions and backend calls; see the package
// documentation. Create it with [New]. It is safe for concurrent use.
type Metrics struct {
	series   *seriesCollector // decisions_total and hits_total
	dropped  prometheus.Counter
	latency  prometheus.Histogram
	degraded *prometheus.CounterVec // domain, mode
	errs     [numKinds]prometheus.Counter
	slots    *slots

	log         *slog.Logger
	maxDetailed int // < 0: no detailed labels

	// table holds the entry of every rule of the rules in force, by
	// config.Rule.Index, made by Rules; byRule caches the entries of
	// other rules by their pointer. See entry.
	table  atomic.Pointer[ruleTable]
	byRule sync.Map // *config.Rule -> *ruleEntry

	// mu guards the slow paths: making series of rules and overrides.
	mu       sync.Mutex
	byID     map[ruleKey]*series // every rule ID seen, with its plain series once made
	cached   int                 // entries stored in byRule since last cleared
	override atomic.Pointer[map[string]*series]

	// detailed holds the series of detailed labels, at most maxDetailed.
	detailedMu sync.RWMutex
	detailed   map[string]*series
	full       atomic.Bool // len(detailed) reached maxDetailed
	warned     atomic.Bool
}

var (
	_ service.Observer     = (*Metrics)(nil)
	_ service.SlotObserver = (*Metrics)(nil)
)

// ruleKey names a plain rule series.
type ruleKey struct{ domain, id string }

// ruleTable is the entries of a rule set, by config.Rule.Index.
type ruleTable struct {
	entries []ruleEntry
}

// ruleEntry is what Decided needs of a rule.
type ruleEntry struct {
	key    ruleKey
	rule   *config.Rule
	detail bool // the rule's label may name descriptor values
	// plain is the series of the rule's ID: made with the entry for a
	// rule without detailed labels, when first needed for one with them.
	plain atomic.Pointer[series]
}

// New returns metrics whose collectors are registered on reg.
func New(reg prometheus.Registerer, opts Options) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("metrics: nil registerer")
	}
	if opts.MaxDetailedSeries == 0 {
		opts.MaxDetailedSeries = DefaultMaxDetailedSeries
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Metrics{
		series: newSeriesCollector(time.Now),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "metric_series_dropped_total",
			Help: helpDropped,
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "backend", Name: "call_duration_seconds",
			Help:    helpLatency,
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 12), // 50µs to 102.4ms
		}),
		slots:       newSlots(opts.Now),
		log:         opts.Logger,
		maxDetailed: opts.MaxDetailedSeries,
		byID:        make(map[ruleKey]*series),
		detailed:    make(map[string]*series),
	}
	m.degraded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "failure_mode_decisions_total",
		Help: helpDegraded,
	}, []string{"domain", "mode"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "backend", Name: "call_errors_total",
		Help: helpErrors,
	}, []string{"kind"})
	for k := range numKinds {
		m.errs[k] = errs.WithLabelValues(k.String())
	}
	m.override.Store(&map[string]*series{})
	for _, c := range []prometheus.Collector{m.series, m.dropped, m.latency, errs, m.degraded, m.slots} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return m, nil
}

// Decided counts one descriptor's decision; it implements
// [service.Observer].
func (m *Metrics) Decided(domain string, rule *config.Rule, d *rlv3.RateLimitDescriptor, o service.Outcome, hits uint64) {
	var s *series
	if rule == nil {
		s = m.overrideSeries(domain)
	} else {
		e := m.entry(domain, rule)
		if e.detail {
			s = m.detailedSeries(e, d)
		} else {
			s = m.plain(e)
		}
	}
	s.count(o, hits)
}

// Rules makes the failure-mode series of every domain of rules, and the
// concurrency series of every rule with a concurrency limit, at zero, so
// that dashboards and alerts see them before the first event. Call it
// with the rules at start and after each reload; series of domains and
// rules that went away stay, bounded by those ever loaded.
//
// It also makes the table in which Decided finds the rules' series by
// [config.Rule.Index], whatever their number, and forgets the rules put
// in force before, so that they can be freed: decisions of rules it was
// not told of find their series in a cache keyed by the rule's pointer,
// at a cost that grows with the rules.
func (m *Metrics) Rules(rules *config.Rules) {
	m.slots.ruleSlots(rules)
	t := &ruleTable{entries: make([]ruleEntry, rules.NumRules())}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range rules.Domains() {
		for _, mode := range []config.FailureMode{config.FailOpen, config.FailClosed, config.FailError, config.FailLocal} {
			m.degraded.WithLabelValues(d.Name, string(mode))
		}
		for _, r := range d.Rules() {
			e := &t.entries[r.Index()]
			e.key, e.rule, e.detail = ruleKey{d.Name, r.ID}, r, m.maxDetailed > 0 && detailed(r)
			if s := m.byID[e.key]; s != nil {
				e.plain.Store(s) // made under an earlier rule set
			}
		}
	}
	m.table.Store(t)
	m.byRule.Clear()
	m.cached = 0
}

// FailureMode counts a request decided by a failure mode; it implements
// [service.Observer]. Domains come from the rule files: the service
// reports none for an unknown domain.
func (m *Metrics) FailureMode(domain string, mode config.FailureMode) {
	m.degraded.WithLabelValues(domain, string(mode)).Inc()
}

// BackendCall times and classifies one backend call; it implements
// [service.Observer]. A call refused by the open circuit is counted as an
// error but not timed: it never reached the backend.
func (m *Metrics) BackendCall(took time.Duration, err error) {
	if err == nil {
		m.latency.Observe(took.Seconds())
		return
	}
	k := Classify(err)
	m.errs[k].Inc()
	if k != KindCircuitOpen {
		m.latency.Observe(took.Seconds())
	}
}

// entry returns rule's entry: in the table of the rules in force, else
// cached by its pointer, made on first sight.
func (m *Metrics) entry(domain string, rule *config.Rule) *ruleEntry {
	if t := m.table.Load(); t != nil {
		if i := rule.Index(); i < len(t.entries) && t.entries[i].rule == rule {
			return &t.entries[i]
		}
	}
	if e, ok := m.byRule.Load(rule); ok {
		return e.(*ruleEntry)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.byRule.Load(rule); ok {
		return e.(*ruleEntry)
	}
	if rule.Domain != "" {
		domain = rule.Domain // the rule file's, the same as the request's
	}
	e := &ruleEntry{key: ruleKey{domain, rule.ID}, rule: rule, detail: m.maxDetailed > 0 && detailed(rule)}
	if _, seen := m.byID[e.key]; !seen {
		m.byID[e.key] = nil
	}
	if !e.detail {
		e.plain.Store(m.plainLocked(e))
	}
	// A reload brings new pointers for the same IDs: forget the old ones
	// once they could be half the cache. The series stay in byID.
	if m.cached >= 2*len(m.byID)+16 {
		m.byRule.Clear()
		m.cached = 0
	}
	m.byRule.Store(rule, e)
	m.cached++
	return e
}

// plain returns the series of e's rule ID.
func (m *Metrics) plain(e *ruleEntry) *series {
	if s := e.plain.Load(); s != nil {
		return s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.plainLocked(e)
	e.plain.Store(s)
	return s
}

// plainLocked is plain with m.mu held.
func (m *Metrics) plainLocked(e *ruleEntry) *series {
	s := m.byID[e.key]
	if s == nil {
		s = m.newSeries(e.key.domain, e.key.id, outcomesOf(e.rule))
		m.byID[e.key] = s
	}
	return s
}

// overrideSeries returns the series of overrides in domain.
func (m *Metrics) overrideSeries(domain string) *series {
	if s := (*m.override.Load())[domain]; s != nil {
		return s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.override.Load()
	if s := old[domain]; s != nil {
		return s
	}
	s := m.newSeries(domain, OverrideRule, outcomesOf(nil))
	next := make(map[string]*series, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[domain] = s
	m.override.Store(&next)
	return s
}

// detailedSeries returns the series of e's detailed label for d, or the
// plain one when the label names no descriptor value or cannot be made.
func (m *Metrics) detailedSeries(e *ruleEntry, d *rlv3.RateLimitDescriptor) *series {
	var buf [256]byte
	b, ok := appendLabel(buf[:0], e.rule, d)
	if !ok || string(b) == e.rule.ID {
		return m.plain(e)
	}
	m.detailedMu.RLock()
	s := m.detailed[string(b)]
	m.detailedMu.RUnlock()
	if s != nil {
		return s
	}
	switch {
	case len(b) > maxDetailedLabel:
		return m.drop(e, "label too long")
	case m.full.Load():
		return m.drop(e, "cap reached")
	}
	return m.addDetailed(e, string(b))
}

// addDetailed makes the series of a new detailed label, unless the cap is
// reached.
func (m *Metrics) addDetailed(e *ruleEntry, label string) *series {
	m.detailedMu.Lock()
	defer m.detailedMu.Unlock()
	if s := m.detailed[label]; s != nil {
		return s
	}
	if len(m.detailed) >= m.maxDetailed {
		m.full.Store(true)
		return m.drop(e, "cap reached")
	}
	s := m.newSeries(e.key.domain, label, outcomesOf(e.rule))
	m.detailed[label] = s
	if len(m.detailed) >= m.maxDetailed {
		m.full.Store(true)
	}
	return s
}

// drop counts a decision that could not have its detailed label, for
// reason, and returns the plain series to count it under. The first drop
// is logged.
func (m *Metrics) drop(e *ruleEntry, reason string) *series {
	m.dropped.Inc()
	if !m.warned.Swap(true) {
		m.log.Warn("metrics: a detailed rule label was not made; such decisions are counted under the plain rule ID "+
			"and in ratelimitd_metric_series_dropped_total, and only this first one is logged",
			"reason", reason, "max_detailed_series", m.maxDetailed, "max_label_bytes", maxDetailedLabel, "rule", e.key.id)
	}
	return m.plain(e)
}

// newSeries makes the series of (domain, rule), with a counter for each
// of outcomes at zero; see seriesCollector.add.
func (m *Metrics) newSeries(domain, rule string, outcomes []service.Outcome) *series {
	return m.series.add(domain, rule, outcomes)
}

// outcomesOf returns the outcomes a rule can have (nil for an override):
// unlimited for an unlimited rule; ok, near_limit and shadow_mode for a
// shadow rule; ok, near_limit and over_limit otherwise. Their counters are
// made, at zero, with the rule's first decision, so that rates see their
// first increase.
func outcomesOf(rule *config.Rule) []service.Outcome {
	switch {
	case rule != nil && rule.Unlimited:
		return []service.Outcome{service.OutcomeUnlimited}
	case rule != nil && rule.ShadowMode:
		return []service.Outcome{service.OutcomeOK, service.OutcomeNearLimit, service.OutcomeShadowOverride}
	}
	return []service.Outcome{service.OutcomeOK, service.OutcomeNearLimit, service.OutcomeOverLimit}
}
