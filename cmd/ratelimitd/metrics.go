package main

import (
	"context"
	"flag"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/lease"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/overlimit"
	"github.com/ratelimitd/ratelimitd/pkg/metrics"
	"github.com/ratelimitd/ratelimitd/pkg/reload"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// metricsNamespace starts the name of every ratelimitd metric.
const metricsNamespace = "ratelimitd"

// ownMetrics is the component of ratelimitd's own metrics of decisions,
// per domain and rule (pkg/metrics): an observer of the service. GET
// /metrics serves them with every component's and the Go runtime's.
type ownMetrics struct {
	maxDetailedSeries int
}

func (m *ownMetrics) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&m.maxDetailedSeries, "metrics-max-detailed-series", metrics.DefaultMaxDetailedSeries, "most metric series that name descriptor values (rules with detailed_metric or value_to_metric); beyond it decisions count under the rule")
}

func (m *ownMetrics) check(func(string) string) error { return nil }

func (m *ownMetrics) build(_ context.Context, s *server) (hooks, error) {
	mets, err := metrics.New(s.reg, metrics.Options{Logger: s.log, MaxDetailedSeries: m.maxDetailedSeries})
	if err != nil {
		return hooks{}, err
	}
	mets.Rules(s.source.initial)
	s.observers = append(s.observers, mets)
	return hooks{
		rules: mets.Rules,
		http: func(mux *http.ServeMux) {
			mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
		},
	}, nil
}

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

// counter is a counter ratelimitd_<subsystem>_<name> read from v.
func counter[N uint64 | int](subsystem, name, help string, labels prometheus.Labels, v func() N) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: metricsNamespace, Subsystem: subsystem, Name: name, Help: help, ConstLabels: labels,
	}, func() float64 { return float64(v()) })
}

// gauge is a gauge ratelimitd_<subsystem>_<name> read from v.
func gauge(subsystem, name, help string, v func() float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Subsystem: subsystem, Name: name, Help: help,
	}, v)
}

// registerCache exports the local over-limit cache's counters.
func registerCache(reg prometheus.Registerer, c *overlimit.Cache) {
	reg.MustRegister(
		counter("local_cache", "hits_total", "Requests (each with all its descriptors) refused by the local over-limit cache without calling the backend.", nil, c.Hits),
		counter("local_cache", "misses_total", "Requests the local over-limit cache passed on to the backend.", nil, c.Misses),
		gauge("local_cache", "keys", "Over-limit keys the local cache holds.", func() float64 { return float64(c.Len()) }),
	)
}

// registerLease exports what the lease engine did: leases taken, given
// back and expired, budget held and stranded, keys tracked and evicted,
// and decisions made in process or with a backend call.
func registerLease(reg prometheus.Registerer, e *lease.Engine) {
	stat := func(f func(lease.Stats) uint64) func() uint64 { return func() uint64 { return f(e.Stats()) } }
	reg.MustRegister(
		counter("lease", "taken_total", "Leases taken: budget counted in the backend at once, to be spent in process.", nil, stat(func(s lease.Stats) uint64 { return s.Takes })),
		counter("lease", "taken_hits_total", "Hits of the leases taken.", nil, stat(func(s lease.Stats) uint64 { return s.Taken })),
		counter("lease", "returned_total", "Gives: unspent hits of leases sent back to the backend (lease ended, key gone cold, shutdown).", nil, stat(func(s lease.Stats) uint64 { return s.Gives })),
		counter("lease", "returned_hits_total", "Hits given back to the backend.", nil, stat(func(s lease.Stats) uint64 { return s.Given })),
		counter("lease", "expired_hits_total", "Hits unspent when their lease came to its end (then given back while the backend still counts them).", nil, stat(func(s lease.Stats) uint64 { return s.Expired })),
		counter("lease", "stranded_hits_total", "Hits that could not be given back because the call failed: unusable by any replica until their lease ends in the backend.", nil, stat(func(s lease.Stats) uint64 { return s.Stranded })),
		gauge("lease", "held_hits", "Hits this replica holds in leases, unspent: budget other replicas cannot use until it is spent or given back.", func() float64 { return float64(e.Stats().Held) }),
		gauge("lease", "keys", "Keys of leased limits this replica tracks.", func() float64 { return float64(e.Stats().Keys) }),
		counter("lease", "evictions_total", "Keys of leased limits the lease engine evicted, their leases given back and their traffic forgotten, because -lease-max-keys was reached.", nil, stat(func(s lease.Stats) uint64 { return s.Evicted })),
		counter("lease", "decisions_total", leaseDecisionsHelp, prometheus.Labels{"path": "local"}, stat(func(s lease.Stats) uint64 { return s.Local })),
		counter("lease", "decisions_total", leaseDecisionsHelp, prometheus.Labels{"path": "backend"}, stat(func(s lease.Stats) uint64 { return s.Backend })),
		counter("lease", "backend_calls_total", "Backend calls that carried leased work: decisions' (with their batch's exact requests), prefetches' and gives'. Divided by ratelimitd_lease_decisions_total, the backend calls per leased decision.", nil, stat(func(s lease.Stats) uint64 { return s.Calls })),
		counter("lease", "background_errors_total", "Prefetches and gives that failed.", nil, stat(func(s lease.Stats) uint64 { return s.Errors })),
	)
}

const leaseDecisionsHelp = "Decisions of leased limits, by path: local (from leases held, no backend call) or backend (the leases lacked hits)."

// registerMemory exports the memory backend's size and evictions.
func registerMemory(reg prometheus.Registerer, b *memory.Backend) {
	reg.MustRegister(
		gauge("memory", "keys", "Keys the memory backend holds.", func() float64 { return float64(b.Len()) }),
		counter("memory", "evictions_total", "Live keys the memory backend evicted, forgetting their counts, because -memory-max-keys was reached.", nil, b.Evictions),
	)
}

// registerBreaker exports the Redis circuit breaker's state and counters,
// and for a Cluster each primary's circuit.
func registerBreaker(reg prometheus.Registerer, b *breaker.Breaker) {
	stat := func(f func(breaker.Stats) uint64) func() uint64 { return func() uint64 { return f(b.Stats()) } }
	reg.MustRegister(
		gauge("backend", "circuit_state", "The backend circuit: 0 closed (calling), 1 open (failing at once), 2 half-open (probing). For a Redis Cluster, the most open of its primaries' circuits.",
			func() float64 { return float64(b.State()) }),
		counter("backend", "calls_total", "Calls that reached the backend.", nil, stat(func(s breaker.Stats) uint64 { return s.Calls })),
		counter("backend", "errors_total", "Backend calls that failed, timeouts included.", nil, stat(func(s breaker.Stats) uint64 { return s.Errors })),
		counter("backend", "timeouts_total", "Backend calls cut off by -backend-timeout.", nil, stat(func(s breaker.Stats) uint64 { return s.Timeouts })),
		counter("backend", "rejected_total", "Calls refused at once because the circuit was open (for a Cluster, the circuit of a primary the call needed).", nil, stat(func(s breaker.Stats) uint64 { return s.Rejected })),
		counter("backend", "circuit_opens_total", "Times the backend circuit (for a Cluster, a primary's) opened.", nil, stat(func(s breaker.Stats) uint64 { return s.Opens })),
		nodeCircuits{b},
	)
}

// nodeCircuits exports the circuit of each Redis Cluster primary that calls
// asked for lately, labelled by its address. A primary no key maps to any
// more (replaced by its replica) leaves the series once the breaker
// forgets it.
type nodeCircuits struct{ b *breaker.Breaker }

var (
	nodeStateDesc = prometheus.NewDesc(metricsNamespace+"_backend_node_circuit_state",
		"The circuit of a Redis Cluster primary: 0 closed, 1 open (its slots' keys decided by the failure mode), 2 half-open.", []string{"node"}, nil)
	nodeOpensDesc = prometheus.NewDesc(metricsNamespace+"_backend_node_circuit_opens_total",
		"Times the circuit of a Redis Cluster primary opened.", []string{"node"}, nil)
	nodeErrorsDesc = prometheus.NewDesc(metricsNamespace+"_backend_node_errors_total",
		"Calls that failed on a Redis Cluster primary.", []string{"node"}, nil)
	nodeRejectedDesc = prometheus.NewDesc(metricsNamespace+"_backend_node_rejected_total",
		"Calls refused at once because a Redis Cluster primary they needed had its circuit open.", []string{"node"}, nil)
)

func (nodeCircuits) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodeStateDesc
	ch <- nodeOpensDesc
	ch <- nodeErrorsDesc
	ch <- nodeRejectedDesc
}

func (n nodeCircuits) Collect(ch chan<- prometheus.Metric) {
	for _, st := range n.b.Nodes() {
		node := breaker.NodeName(st.Node)
		ch <- prometheus.MustNewConstMetric(nodeStateDesc, prometheus.GaugeValue, float64(st.State), node)
		ch <- prometheus.MustNewConstMetric(nodeOpensDesc, prometheus.CounterValue, float64(st.Opens), node)
		ch <- prometheus.MustNewConstMetric(nodeErrorsDesc, prometheus.CounterValue, float64(st.Errors), node)
		ch <- prometheus.MustNewConstMetric(nodeRejectedDesc, prometheus.CounterValue, float64(st.Rejected), node)
	}
}

// registerService exports the panics the service recovered and the rules
// in force: their hash (as a label of ratelimitd_config_info) and when
// they were loaded. Its decisions are pkg/metrics'.
func registerService(reg prometheus.Registerer, s *service.Service, loaded func() time.Time) {
	reg.MustRegister(
		counter("", "panics_total", "Handler panics recovered: answered Internal (or 500) and logged.", nil, s.Panics),
		rulesInfo{s},
		gauge("config", "loaded_timestamp_seconds", "Unix time the rules in force were loaded.", func() float64 {
			return float64(loaded().UnixNano()) / 1e9
		}),
	)
}

// rulesInfo exports ratelimitd_config_info{hash} 1 for the rules in force.
type rulesInfo struct{ s *service.Service }

var rulesInfoDesc = prometheus.NewDesc(metricsNamespace+"_config_info",
	"The rules in force: 1, with their hash (as logged and shown by /rlconfig) as a label.", []string{"hash"}, nil)

func (rulesInfo) Describe(ch chan<- *prometheus.Desc) { ch <- rulesInfoDesc }

func (r rulesInfo) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(rulesInfoDesc, prometheus.GaugeValue, 1, r.s.Rules().Hash())
}

// registerReload exports the rule watcher's reloads and rejections.
func registerReload(reg prometheus.Registerer, w *reload.Watcher) {
	reg.MustRegister(
		counter("config", "reloads_total", "Changed rule sets loaded and put in force.", nil, w.Reloads),
		counter("config", "reload_rejections_total", "Changed rule sets rejected as invalid; the last good rules kept serving.", nil, w.Rejections),
		gauge("config", "last_reload_timestamp_seconds", "Unix time of the last rules reload; 0 if none.", func() float64 {
			if t := w.LastReload(); !t.IsZero() {
				return float64(t.UnixNano()) / 1e9
			}
			return 0
		}),
	)
}

// reserveMetrics exports, for each limit that reserves, what this replica
// learnt and the settles it saw, under ratelimitd_reserve_.
type reserveMetrics struct{ s *service.Service }

func reserveDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "reserve", name), help, append([]string{"domain", "rule", "limit"}, labels...), nil)
}

var (
	reserveHitsDesc    = reserveDesc("hits", "What a request-time call of the limit holds until its cost is settled: the learnt reservation (the 97th percentile of the last costs settled) with reserve: auto, else the fixed one.")
	reserveTTLDesc     = reserveDesc("ttl_seconds", "How long a reservation of the limit lasts when no settle releases it: six times the median of the last check-to-settle times (longer while settles find their reservation ended), 1 s to 15 min, 30 s until learnt.")
	reserveSettlesDesc = reserveDesc("settles_total", "Stream-done calls (a descriptor with its own hits_addend) of the limit this replica decided, by whether they released a reservation (released=false: it had ended, or none was made).", "released")
)

func (reserveMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- reserveHitsDesc
	ch <- reserveTTLDesc
	ch <- reserveSettlesDesc
}

func (m reserveMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, st := range m.s.Reservations() {
		limit := strconv.Itoa(st.Limit)
		ch <- prometheus.MustNewConstMetric(reserveHitsDesc, prometheus.GaugeValue, float64(st.Hits), st.Domain, st.Rule, limit)
		ch <- prometheus.MustNewConstMetric(reserveTTLDesc, prometheus.GaugeValue, st.TTL.Seconds(), st.Domain, st.Rule, limit)
		ch <- prometheus.MustNewConstMetric(reserveSettlesDesc, prometheus.CounterValue, float64(st.Released), st.Domain, st.Rule, limit, "true")
		ch <- prometheus.MustNewConstMetric(reserveSettlesDesc, prometheus.CounterValue, float64(st.Settles-st.Released), st.Domain, st.Rule, limit, "false")
	}
}
