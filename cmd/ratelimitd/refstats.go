package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/metrics/refstats"
)

// refStatsConfig configures envoyproxy/ratelimit's statistics: statsd
// and the reference's Prometheus endpoint. Both off by default.
type refStatsConfig struct {
	statsdAddr    string
	tags          string
	dogStatsD     bool
	flushInterval time.Duration
	maxKeys       int
	promAddr      string
	promPath      string
	promMapping   string
}

// addRefStatsFlags declares the flags of c on fs.
func addRefStatsFlags(fs *flag.FlagSet, c *refStatsConfig) {
	fs.StringVar(&c.statsdAddr, "statsd-addr", "", "send envoyproxy/ratelimit's statistics (ratelimit.service.rate_limit.…) to this statsd `host:port` over UDP; off when empty")
	fs.StringVar(&c.tags, "statsd-tags", "", "tags of every reference statistic, `k:v,…` (the reference's EXTRA_TAGS): DogStatsD tags with -statsd-dogstatsd, else .__k=v in the name; labels on -reference-metrics-addr")
	fs.BoolVar(&c.dogStatsD, "statsd-dogstatsd", false, "speak DogStatsD to -statsd-addr: tags as |#k:v (the reference's USE_DOG_STATSD)")
	fs.DurationVar(&c.flushInterval, "statsd-flush-interval", refstats.DefaultFlushInterval, "how often the reference statistics are sent to statsd and to -reference-metrics-addr")
	fs.IntVar(&c.maxKeys, "reference-stats-max-keys", refstats.DefaultMaxKeys, "most rule, descriptor and domain keys the reference statistics name; beyond it decisions of new keys are not counted there (ratelimitd_reference_stats_dropped_total counts them)")
	fs.StringVar(&c.promAddr, "reference-metrics-addr", "", "serve envoyproxy/ratelimit's statistics as Prometheus series, mapped as its USE_PROMETHEUS does, on this listen `address` (the reference's PROMETHEUS_ADDR, :9090); off when empty")
	fs.StringVar(&c.promPath, "reference-metrics-path", "/metrics", "HTTP `path` of -reference-metrics-addr (the reference's PROMETHEUS_PATH)")
	fs.StringVar(&c.promMapping, "reference-metrics-mapping", "", "statsd_exporter mapping `file` for -reference-metrics-addr, replacing the default that gives the reference's series names (the reference's PROMETHEUS_MAPPER_YAML)")
}

// on reports whether any sink of the reference statistics is on.
func (c *refStatsConfig) on() bool { return c.statsdAddr != "" || c.promAddr != "" }

// validate checks c; source names where a flag was set.
func (c *refStatsConfig) validate(source func(string) string) error {
	if c.statsdAddr != "" {
		if _, _, err := net.SplitHostPort(c.statsdAddr); err != nil {
			return fmt.Errorf("invalid %s %q; want host:port", source("statsd-addr"), c.statsdAddr)
		}
	}
	if c.dogStatsD && c.statsdAddr == "" {
		return fmt.Errorf("%s needs %s", source("statsd-dogstatsd"), source("statsd-addr"))
	}
	if _, err := parseTags(c.tags); err != nil {
		return fmt.Errorf("invalid %s: %v", source("statsd-tags"), err)
	}
	if c.flushInterval <= 0 {
		return fmt.Errorf("invalid %s %v; it must be positive", source("statsd-flush-interval"), c.flushInterval)
	}
	if c.maxKeys < 1 {
		return fmt.Errorf("invalid %s %d; it must be at least 1", source("reference-stats-max-keys"), c.maxKeys)
	}
	if !strings.HasPrefix(c.promPath, "/") {
		return fmt.Errorf("invalid %s %q; it must start with /", source("reference-metrics-path"), c.promPath)
	}
	if c.promMapping != "" && c.promAddr == "" {
		return fmt.Errorf("%s needs %s", source("reference-metrics-mapping"), source("reference-metrics-addr"))
	}
	return nil
}

// parseTags parses k:v,… as the reference reads EXTRA_TAGS.
func parseTags(s string) (map[string]string, error) {
	tags := map[string]string{}
	if s == "" {
		return tags, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key:value", kv)
		}
		tags[k] = v
	}
	return tags, nil
}

// referenceStats is the component that emits envoyproxy/ratelimit's
// statistics (-statsd-*, -reference-metrics-*): an observer of every
// decision, a gRPC interceptor counting calls, and the reference's
// Prometheus endpoint on a listener of its own. Off by default.
type referenceStats struct {
	config refStatsConfig
	// nearLimitRatio is the RLS front end's -near-limit-ratio, which
	// decides near_limit here too.
	nearLimitRatio *float64

	stats  *refstats.Stats
	statsd *refstats.StatsdSink
	prom   *refstats.PrometheusSink
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func (r *referenceStats) addFlags(fs *flag.FlagSet) { addRefStatsFlags(fs, &r.config) }

func (r *referenceStats) check(flagName func(string) string) error {
	return r.config.validate(flagName)
}

// build starts the statistics the flags ask for, exporting how many were
// dropped on s.reg, ratelimitd's own registry.
func (r *referenceStats) build(_ context.Context, s *server) (hooks, error) {
	rc := &r.config
	if !rc.on() {
		return hooks{}, nil
	}
	sinks, err := r.sinks(s)
	if err != nil {
		return hooks{}, err
	}
	r.stats = refstats.New(refstats.Options{NearLimitRatio: *r.nearLimitRatio, MaxKeys: rc.maxKeys, Sinks: sinks, Logger: s.log})
	s.reg.MustRegister(
		counter("reference_stats", "dropped_total", "Decisions not counted in envoyproxy/ratelimit's statistics because -reference-stats-max-keys keys were already named.", nil, r.stats.Dropped),
		gauge("reference_stats", "keys", "Rule, descriptor and domain keys envoyproxy/ratelimit's statistics name.", func() float64 { return float64(r.stats.Keys()) }),
	)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.done.Go(func() { r.stats.Run(ctx, rc.flushInterval) })
	attrs := []any{"flush_interval", rc.flushInterval}
	if r.statsd != nil {
		attrs = append(attrs, "statsd", rc.statsdAddr, "dogstatsd", rc.dogStatsD)
	}
	s.log.Info("envoyproxy/ratelimit statistics on", attrs...)
	s.observers = append(s.observers, r.stats)
	r.stats.ConfigLoaded(true) // the rules at start
	return hooks{
		grpcOptions: []grpc.ServerOption{grpc.ChainUnaryInterceptor(r.stats.UnaryServerInterceptor())},
		rules:       func(*config.Rules) { r.stats.ConfigLoaded(true) },
		rejected:    func(error) { r.stats.ConfigLoaded(false) },
		listeners:   func() []listener { return r.listeners(s) },
		close:       r.close,
	}, nil
}

// sinks returns the sinks the flags ask for: statsd, the reference's
// Prometheus endpoint, or both.
func (r *referenceStats) sinks(s *server) ([]refstats.Sink, error) {
	rc := &r.config
	tags, _ := parseTags(rc.tags) // checked
	var sinks []refstats.Sink
	if rc.statsdAddr != "" {
		st, err := refstats.NewStatsd(refstats.StatsdOptions{Addr: rc.statsdAddr, Tags: tags, DogStatsD: rc.dogStatsD, Logger: s.log})
		if err != nil {
			return nil, err
		}
		r.statsd = st
		sinks = append(sinks, st)
		s.reg.MustRegister(counter("statsd", "send_errors_total", "Datagrams of reference statistics that could not be sent to -statsd-addr.", nil, st.Errors))
	}
	if rc.promAddr != "" {
		p, err := r.newPrometheus(s)
		if err != nil {
			return nil, err
		}
		r.prom = p
		sinks = append(sinks, p)
	}
	return sinks, nil
}

// newPrometheus returns the sink of the reference's Prometheus endpoint,
// mapped by -reference-metrics-mapping or the default mapping.
func (r *referenceStats) newPrometheus(s *server) (*refstats.PrometheusSink, error) {
	rc := &r.config
	tags, _ := parseTags(rc.tags) // checked
	mapping := ""
	if rc.promMapping != "" {
		m, err := refstats.ReadMapping(rc.promMapping)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.flagName("reference-metrics-mapping"), err)
		}
		mapping = m
	}
	p, err := refstats.NewPrometheus(refstats.PrometheusOptions{Registry: newRegistry(), Mapping: mapping, Tags: tags, Logger: s.log})
	if err != nil {
		if rc.promMapping != "" {
			return nil, fmt.Errorf("%s %s: %w", s.flagName("reference-metrics-mapping"), rc.promMapping, err)
		}
		return nil, err
	}
	return p, nil
}

// listeners serves the reference's Prometheus endpoint, when on.
func (r *referenceStats) listeners(s *server) []listener {
	if r.prom == nil {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+r.config.promPath, r.prom.Handler())
	return []listener{httpListener("reference metrics", r.config.promAddr, newHTTPServer(mux, s.log), s.log,
		logServing(s.log, "serving reference metrics", "path", r.config.promPath))}
}

// close stops flushing, after a last flush, and closes the sinks.
func (r *referenceStats) close() {
	r.cancel()
	r.done.Wait()
	if r.statsd != nil {
		r.statsd.Close()
	}
	if r.prom != nil {
		r.prom.Close()
	}
}
