package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/overlimit"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/reload"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// metricsNamespace starts the name of every ratelimitd metric.
const metricsNamespace = "ratelimitd"

// newRegistry returns the registry GET /metrics serves, holding the Go
// runtime's and the process's metrics.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// registerCache exports the local over-limit cache's counters.
func registerCache(reg prometheus.Registerer, c *overlimit.Cache) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: "local_cache", Name: "hits_total",
			Help: "Requests (each with all its descriptors) refused by the local over-limit cache without calling the backend.",
		}, func() float64 { return float64(c.Hits()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: "local_cache", Name: "misses_total",
			Help: "Requests the local over-limit cache passed on to the backend.",
		}, func() float64 { return float64(c.Misses()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: "local_cache", Name: "keys",
			Help: "Over-limit keys the local cache holds.",
		}, func() float64 { return float64(c.Len()) }),
	)
}

// registerMemory exports the memory backend's size and evictions.
func registerMemory(reg prometheus.Registerer, b *memory.Backend) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: "memory", Name: "keys",
			Help: "Keys the memory backend holds.",
		}, func() float64 { return float64(b.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: "memory", Name: "evictions_total",
			Help: "Live keys the memory backend evicted, forgetting their counts, because -memory-max-keys was reached.",
		}, func() float64 { return float64(b.Evictions()) }),
	)
}

// registerBreaker exports the Redis circuit breaker's state and counters.
func registerBreaker(reg prometheus.Registerer, b *breaker.Breaker) {
	counter := func(name, help string, v func(breaker.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: metricsNamespace, Subsystem: "backend", Name: name, Help: help},
			func() float64 { return float64(v(b.Stats())) })
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: "backend", Name: "circuit_state",
			Help: "The backend circuit: 0 closed (calling), 1 open (failing at once), 2 half-open (probing).",
		}, func() float64 { return float64(b.State()) }),
		counter("calls_total", "Calls that reached the backend.", func(s breaker.Stats) uint64 { return s.Calls }),
		counter("errors_total", "Backend calls that failed, timeouts included.", func(s breaker.Stats) uint64 { return s.Errors }),
		counter("timeouts_total", "Backend calls cut off by -backend-timeout.", func(s breaker.Stats) uint64 { return s.Timeouts }),
		counter("rejected_total", "Calls refused at once because the circuit was open.", func(s breaker.Stats) uint64 { return s.Rejected }),
		counter("circuit_opens_total", "Times the backend circuit opened.", func(s breaker.Stats) uint64 { return s.Opens }),
	)
}

// registerService exports the service's decisions taken by a failure mode
// and the panics it recovered.
func registerService(reg prometheus.Registerer, s *service.Service) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: metricsNamespace, Name: "panics_total",
		Help: "Handler panics recovered: answered Internal (or 500) and logged.",
	}, func() float64 { return float64(s.Panics()) }))
	for _, m := range []config.FailureMode{config.FailOpen, config.FailClosed, config.FailError, config.FailLocal} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "failure_mode_decisions_total",
			Help:        "Requests decided by a failure mode because the backend failed.",
			ConstLabels: prometheus.Labels{"mode": string(m)},
		}, func() float64 { return float64(s.DegradedDecisions(m)) }))
	}
}

// registerReload exports the rule watcher's reloads and rejections.
func registerReload(reg prometheus.Registerer, w *reload.Watcher) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: "config", Name: "reloads_total",
			Help: "Changed rule sets loaded and put in force.",
		}, func() float64 { return float64(w.Reloads()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: "config", Name: "reload_rejections_total",
			Help: "Changed rule sets rejected as invalid; the last good rules kept serving.",
		}, func() float64 { return float64(w.Rejections()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: "config", Name: "last_reload_timestamp_seconds",
			Help: "Unix time of the last rules reload; 0 if none.",
		}, func() float64 {
			if t := w.LastReload(); !t.IsZero() {
				return float64(t.UnixNano()) / 1e9
			}
			return 0
		}),
	)
}

// withMetrics serves GET /metrics from reg beside the service's endpoints.
func withMetrics(service http.Handler, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("/", service)
	return mux
}
