package metrics

// Series: the counters of ratelimitd_decisions_total and
// ratelimitd_hits_total, kept as plain atomics, one small struct per
// (domain, rule) label pair, and exported by a collector of the package's
// own. A prometheus.CounterVec made four counters per rule, each with its
// label pairs, its creation time and a place in the vector's map: some
// 2.8 KB a rule, and four cache misses a decision.

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// series is the counters of one (domain, rule) label pair: the hits asked
// for, and the decisions by outcome. made has bit o set once the series of
// outcome o exists: at zero from the start for the outcomes the rule can
// have, else from the first decision with it.
type series struct {
	domain, rule string
	hits         atomic.Uint64
	counts       [numOutcomes]atomic.Uint64
	made         atomic.Uint32
	// domainLabel and ruleLabel are the series' label pairs, and created
	// the time it was made: shared by every scrape, as a
	// prometheus.Counter shares its own.
	domainLabel, ruleLabel *dto.LabelPair
	created                *timestamppb.Timestamp
}

// count counts a decision of outcome o for hits.
func (s *series) count(o service.Outcome, hits uint64) {
	s.hits.Add(hits)
	if int(o) >= numOutcomes {
		return // not an outcome the service reports
	}
	s.counts[o].Add(1)
	if bit := uint32(1) << o; s.made.Load()&bit == 0 {
		s.made.Or(bit)
	}
}

// seriesCollector exports every series made: the hits of each, and its
// decisions by outcome, of the outcomes made.
type seriesCollector struct {
	decisions, hits *prometheus.Desc
	results         [numOutcomes]*dto.LabelPair

	mu      sync.Mutex
	all     []*series                 // in the order made; never shrinks
	domains map[string]*dto.LabelPair // the domain label pair of each domain
	// replaced holds the series whose labels hold U+FFFD, which is what
	// bytes that are not UTF-8 become: labels that differ only there are
	// one series, as they were one prometheus counter.
	replaced map[ruleKey]*series
	now      func() time.Time
}

func newSeriesCollector(now func() time.Time) *seriesCollector {
	c := &seriesCollector{
		decisions: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "decisions_total"), helpDecisions, []string{"domain", "rule", "result"}, nil),
		hits:      prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "hits_total"), helpHits, []string{"domain", "rule"}, nil),
		domains:   make(map[string]*dto.LabelPair),
		replaced:  make(map[ruleKey]*series),
		now:       now,
	}
	for o := range service.Outcome(numOutcomes) {
		c.results[o] = labelPair("result", o.String())
	}
	return c
}

func labelPair(name, value string) *dto.LabelPair {
	return &dto.LabelPair{Name: proto.String(name), Value: proto.String(value)}
}

// add makes the series of (domain, rule), with outcomes made at zero, or
// returns the one made already with the same labels. Label values must be
// UTF-8: bytes that are not, which neither rule files nor protobuf
// requests let through, become U+FFFD.
func (c *seriesCollector) add(domain, rule string, outcomes []service.Outcome) *series {
	domain, rule = strings.ToValidUTF8(domain, "\uFFFD"), strings.ToValidUTF8(rule, "\uFFFD")
	var made uint32
	for _, o := range outcomes {
		made |= 1 << o
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := ruleKey{domain, rule}
	replaced := strings.ContainsRune(domain+rule, utf8.RuneError)
	if s := c.replaced[k]; replaced && s != nil {
		s.made.Or(made)
		return s
	}
	s := &series{domain: domain, rule: rule, ruleLabel: labelPair("rule", rule), created: timestamppb.New(c.now())}
	s.made.Store(made)
	if replaced {
		c.replaced[k] = s
	}
	if s.domainLabel = c.domains[domain]; s.domainLabel == nil {
		s.domainLabel = labelPair("domain", domain)
		c.domains[domain] = s.domainLabel
	}
	c.all = append(c.all, s)
	return s
}

// Describe implements prometheus.Collector.
func (c *seriesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.decisions
	ch <- c.hits
}

// Collect implements prometheus.Collector.
func (c *seriesCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	all := c.all // append-only: the series below len stay as they are
	c.mu.Unlock()
	for _, s := range all {
		ch <- counter{c.hits, []*dto.LabelPair{s.domainLabel, s.ruleLabel}, float64(s.hits.Load()), s.created}
		made := s.made.Load()
		for o := range numOutcomes {
			if made&(1<<o) != 0 {
				// Label pairs sorted by name, as the registry wants them.
				ch <- counter{c.decisions, []*dto.LabelPair{s.domainLabel, c.results[o], s.ruleLabel}, float64(s.counts[o].Load()), s.created}
			}
		}
	}
}

// counter is one counter of a series, as a scrape reads it.
type counter struct {
	desc    *prometheus.Desc
	labels  []*dto.LabelPair
	value   float64
	created *timestamppb.Timestamp
}

func (m counter) Desc() *prometheus.Desc { return m.desc }

func (m counter) Write(out *dto.Metric) error {
	out.Label = m.labels
	out.Counter = &dto.Counter{Value: proto.Float64(m.value), CreatedTimestamp: m.created}
	return nil
}
