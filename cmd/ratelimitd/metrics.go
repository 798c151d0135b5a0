package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/overlimit"
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

// withMetrics serves GET /metrics from reg beside the service's endpoints.
func withMetrics(service http.Handler, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("/", service)
	return mux
}
