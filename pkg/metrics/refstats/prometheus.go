package refstats

import (
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
	"go.yaml.in/yaml/v3"
)

// DefaultMapping is the statsd_exporter mapping applied by default: it
// gives the reference's statistics the Prometheus names and labels
// envoyproxy/ratelimit's USE_PROMETHEUS gives them, such as
// ratelimit_service_rate_limit_total_hits{domain, key1[, key2]}.
//
//go:embed mapping.yaml
var DefaultMapping string

// PrometheusOptions configure [NewPrometheus].
type PrometheusOptions struct {
	// Registry receives the mapped series and statsd_exporter's own
	// statsd_exporter_* metrics. Default: a new registry.
	Registry *prometheus.Registry
	// Mapping is a statsd_exporter mapping, in YAML. Default
	// DefaultMapping. The deprecated timer_type of older statsd_exporter
	// versions (which envoyproxy/ratelimit's examples use) is read as
	// observer_type.
	Mapping string
	// Tags become labels of every series.
	Tags map[string]string
	// Logger receives statsd_exporter's logs. Default: discard.
	Logger *slog.Logger
}

// PrometheusSink maps flushes through a statsd_exporter mapping into
// Prometheus series, served by Handler. Create it with [NewPrometheus];
// Close it when done.
type PrometheusSink struct {
	reg    *prometheus.Registry
	tags   map[string]string
	events chan event.Events
	done   chan struct{}
	mu     sync.Mutex // guards closed and sending on events
	closed bool
}

var _ Sink = (*PrometheusSink)(nil)

// ReadMapping reads a mapping file for PrometheusOptions.Mapping.
func ReadMapping(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// NewPrometheus returns a sink whose series are on opts.Registry. An
// invalid mapping is an error.
func NewPrometheus(opts PrometheusOptions) (*PrometheusSink, error) {
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Mapping == "" {
		opts.Mapping = DefaultMapping
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	mapping, err := upgradeMapping(opts.Mapping)
	if err != nil {
		return nil, fmt.Errorf("statsd mapping: %w", err)
	}
	m := &mapper.MetricMapper{Logger: opts.Logger}
	if err := m.InitFromYAMLString(mapping); err != nil {
		return nil, fmt.Errorf("statsd mapping: %w", err)
	}
	reg := opts.Registry
	// statsd_exporter's own metrics, as its exporter and the reference
	// name them.
	actions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "statsd_exporter_events_actions_total", Help: "The total number of StatsD events by action.",
	}, []string{"action"})
	unmapped := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "statsd_exporter_events_unmapped_total", Help: "The total number of StatsD events no mapping was found for.",
	})
	count := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "statsd_exporter_metrics_total", Help: "The total number of metrics.",
	}, []string{"type"})
	// By type and name, as statsd_exporter's main.go makes it: its
	// exporter counts a conflict with both (Exporter.handleEvent), and a
	// counter of one label would panic there.
	conflicts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "statsd_exporter_events_conflict_total", Help: "The total number of StatsD events with conflicting names.",
	}, []string{"type", "metric_name"})
	seen := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "statsd_exporter_events_total", Help: "The total number of StatsD events seen.",
	}, []string{"type"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "statsd_exporter_events_error_total", Help: "The total number of StatsD events discarded due to errors.",
	}, []string{"reason"})
	for _, c := range []prometheus.Collector{actions, unmapped, count, conflicts, seen, errs} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("statsd exporter metrics: %w", err)
		}
	}
	exp := exporter.NewExporter(reg, m, opts.Logger, actions, unmapped, errs, seen, conflicts, count)
	s := &PrometheusSink{
		reg: reg, tags: make(map[string]string, len(opts.Tags)),
		events: make(chan event.Events), done: make(chan struct{}),
	}
	for k, v := range opts.Tags {
		s.tags[mapper.EscapeMetricName(k)] = v
	}
	go func() {
		defer close(s.done)
		exp.Listen(s.events)
	}()
	return s, nil
}

// Registry returns the registry the series are on.
func (s *PrometheusSink) Registry() *prometheus.Registry { return s.reg }

// Handler serves the registry in the Prometheus text format.
func (s *PrometheusSink) Handler() http.Handler {
	return promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg})
}

// Flush hands samples to the exporter as statsd events and returns once
// it has applied them: a scrape after Flush sees them.
func (s *PrometheusSink) Flush(samples []Sample) {
	evs := make(event.Events, 0, len(samples))
	for i := 0; i < len(samples); i++ {
		x := &samples[i]
		if x.Kind != Timer {
			evs = append(evs, &event.CounterEvent{CMetricName: x.Name, CValue: x.Value, CLabels: s.labels()})
			continue
		}
		// The values of one timer come together. When sampled, they
		// stand for len/Rate values: repeat them, spread evenly, so that
		// the histogram counts them all.
		j := i + 1
		for j < len(samples) && samples[j].Kind == Timer && samples[j].Name == x.Name {
			j++
		}
		n := j - i
		total := n
		if x.Rate > 0 && x.Rate < 1 {
			total = int(float64(n)/x.Rate + 0.5)
		}
		for k := range n {
			for range (k+1)*total/n - k*total/n {
				evs = append(evs, &event.ObserverEvent{OMetricName: x.Name, OValue: samples[i+k].Value, OLabels: s.labels()})
			}
		}
		i = j - 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.events <- evs
	// The exporter handles one batch at a time: once it takes this empty
	// one, it has applied the last.
	s.events <- nil
}

// labels returns a fresh copy of the tags: the exporter keeps the map.
func (s *PrometheusSink) labels() map[string]string {
	l := make(map[string]string, len(s.tags))
	for k, v := range s.tags {
		l[k] = v
	}
	return l
}

// Close stops the exporter.
func (s *PrometheusSink) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.events)
	}
	s.mu.Unlock()
	<-s.done
	return nil
}

// upgradeMapping renames timer_type, which statsd_exporter no longer
// reads, to observer_type in mapping's defaults and mappings, unless
// observer_type is there too.
func upgradeMapping(mapping string) (string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(mapping), &doc); err != nil {
		return "", err
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return "", errors.New("not a YAML mapping")
	}
	changed := false
	rename := func(n *yaml.Node) {
		if n == nil || n.Kind != yaml.MappingNode {
			return
		}
		var timer *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			switch n.Content[i].Value {
			case "observer_type":
				return
			case "timer_type":
				timer = n.Content[i]
			}
		}
		if timer != nil {
			timer.Value = "observer_type"
			changed = true
		}
	}
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch v := root.Content[i+1]; root.Content[i].Value {
		case "defaults":
			rename(v)
		case "mappings":
			if v.Kind == yaml.SequenceNode {
				for _, m := range v.Content {
					rename(m)
				}
			}
		}
	}
	if !changed {
		return mapping, nil
	}
	out, err := yaml.Marshal(&doc)
	return string(out), err
}
