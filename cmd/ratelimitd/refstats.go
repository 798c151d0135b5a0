package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/metrics/refstats"
	"github.com/ratelimitd/ratelimitd/pkg/service"
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

// refStats is the running reference statistics; the zero value (off)
// does nothing.
type refStats struct {
	stats  *refstats.Stats
	statsd *refstats.StatsdSink
	prom   *refstats.PrometheusSink
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// newRefStats builds the reference statistics c asks for, exporting how
// many were dropped on reg, ratelimitd's own registry. Call close when
// the servers have stopped.
func newRefStats(c *serveConfig, log *slog.Logger, reg prometheus.Registerer) (*refStats, error) {
	rc := &c.refStats
	if !rc.on() {
		return &refStats{}, nil
	}
	tags, _ := parseTags(rc.tags) // validated
	r := &refStats{}
	var sinks []refstats.Sink
	if rc.statsdAddr != "" {
		s, err := refstats.NewStatsd(refstats.StatsdOptions{Addr: rc.statsdAddr, Tags: tags, DogStatsD: rc.dogStatsD, Logger: log})
		if err != nil {
			return nil, err
		}
		r.statsd = s
		sinks = append(sinks, s)
		reg.MustRegister(counter("statsd", "send_errors_total", "Datagrams of reference statistics that could not be sent to -statsd-addr.", nil, s.Errors))
	}
	if rc.promAddr != "" {
		mapping := ""
		if rc.promMapping != "" {
			m, err := refstats.ReadMapping(rc.promMapping)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.source("reference-metrics-mapping"), err)
			}
			mapping = m
		}
		p, err := refstats.NewPrometheus(refstats.PrometheusOptions{Registry: newRegistry(), Mapping: mapping, Tags: tags, Logger: log})
		if err != nil {
			if rc.promMapping != "" {
				return nil, fmt.Errorf("%s %s: %w", c.source("reference-metrics-mapping"), rc.promMapping, err)
			}
			return nil, err
		}
		r.prom = p
		sinks = append(sinks, p)
	}
	r.stats = refstats.New(refstats.Options{NearLimitRatio: c.nearLimitRatio, MaxKeys: rc.maxKeys, Sinks: sinks, Logger: log})
	reg.MustRegister(
		counter("reference_stats", "dropped_total", "Decisions not counted in envoyproxy/ratelimit's statistics because -reference-stats-max-keys keys were already named.", nil, r.stats.Dropped),
		gauge("reference_stats", "keys", "Rule, descriptor and domain keys envoyproxy/ratelimit's statistics name.", func() float64 { return float64(r.stats.Keys()) }),
	)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		r.stats.Run(ctx, rc.flushInterval)
	}()
	attrs := []any{"flush_interval", rc.flushInterval}
	if r.statsd != nil {
		attrs = append(attrs, "statsd", rc.statsdAddr, "dogstatsd", rc.dogStatsD)
	}
	log.Info("envoyproxy/ratelimit statistics on", attrs...)
	return r, nil
}

// observer returns the service observer of the statistics, nil when off.
func (r *refStats) observer() service.Observer {
	if r.stats == nil {
		return nil
	}
	return r.stats
}

// serverOptions returns the gRPC options that count and time calls.
func (r *refStats) serverOptions() []grpc.ServerOption {
	if r.stats == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(r.stats.UnaryServerInterceptor())}
}

// configLoaded counts a rule set loaded or rejected.
func (r *refStats) configLoaded(ok bool) {
	if r.stats != nil {
		r.stats.ConfigLoaded(ok)
	}
}

// listen opens the reference's Prometheus endpoint, when on, and serves
// it, reporting the end of serving to failed. It returns the server to
// shut down, nil when off.
func (r *refStats) listen(c *serveConfig, log *slog.Logger, failed chan<- error) (*http.Server, error) {
	if r.prom == nil {
		return nil, nil
	}
	lis, err := net.Listen("tcp", c.refStats.promAddr)
	if err != nil {
		return nil, fmt.Errorf("reference metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+c.refStats.promPath, r.prom.Handler())
	hs := newHTTPServer(mux, log)
	go func() {
		if err := hs.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			failed <- fmt.Errorf("reference metrics server: %w", err)
		}
	}()
	log.Info("serving reference metrics", "addr", lis.Addr().String(), "path", c.refStats.promPath)
	return hs, nil
}

// close stops flushing, after a last flush, and closes the sinks.
func (r *refStats) close() {
	if r.stats == nil {
		return
	}
	r.cancel()
	r.done.Wait()
	if r.statsd != nil {
		r.statsd.Close()
	}
	if r.prom != nil {
		r.prom.Close()
	}
}
