package main

import (
	"context"
	"flag"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
)

// rlqsMetrics exports the RLQS server's counts (-rlqs) under
// ratelimitd_rlqs_, from one snapshot per scrape.
type rlqsMetrics struct{ s *rlqs.Server }

func rlqsDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "rlqs", name), help, labels, nil)
}

var (
	rlqsStreamsDesc     = rlqsDesc("streams", "Open StreamRateLimitQuotas streams.")
	rlqsBucketsDesc     = rlqsDesc("buckets", "Buckets the open streams hold (reported and not yet abandoned).")
	rlqsReportsDesc     = rlqsDesc("reports_total", "Usage reports received.")
	rlqsPushesDesc      = rlqsDesc("reload_pushes_total", "Responses pushed to a stream without a report, after a rule reload changed its buckets' assignments.")
	rlqsRebalancesDesc  = rlqsDesc("rebalance_pushes_total", "Responses pushed to a stream without a report, after the budget store showed its buckets' shares moved (a stream ended, another replica's demand changed or it freed budget).")
	rlqsAssignmentsDesc = rlqsDesc("assignments_total", "Bucket actions sent, by the strategy sent: token_bucket (a share of a limit), allow_all, deny_all, abandon.", "kind")
	rlqsErrorsDesc      = rlqsDesc("stream_errors_total", "Streams the server ended with an error, by gRPC code: InvalidArgument or ResourceExhausted for bad input, Unavailable at shutdown.", "code")
	rlqsHeldDesc        = rlqsDesc("budget_held", "Budget this replica holds in the backend for the buckets the rule decides (units of the rule's limit, summed; POST /explain/rlqs tells a bucket's units and period): its leases, out of which its streams are assigned.", "domain", "rule")
	rlqsAssignedDesc    = rlqsDesc("assigned", "What this replica's streams are assigned, still in force, for the buckets the rule decides (units of the rule's limit, summed).", "domain", "rule")
	rlqsBudgetOpsDesc   = rlqsDesc("budget_operations_total", "Operations sent to the backend holding the budgets, by op: take (a lease, or an announcement where the budget is contended), give (a lease back), read (a contended budget and its announcements).", "op")
	rlqsBudgetFailDesc  = rlqsDesc("budget_failures_total", "Calls to the backend holding the budgets that failed: reports then answered with this replica's share alone.")
	rlqsNotUTF8Desc     = rlqsDesc("buckets_not_utf8_total", "Bucket reports whose id is not UTF-8 (Envoy builds ids from headers byte for byte): left out of the answers, since Envoy could not read an answer naming them; its no_assignment_behavior decides them.")
	rlqsUsageDesc       = rlqsDesc("rule_usage", "Requests per second the streams of this replica report allowed for buckets the rule decides, at their latest reports; sum over replicas for the rule's global usage.", "domain", "rule")
)

// registerRLQS exports the counts of s.
func registerRLQS(reg prometheus.Registerer, s *rlqs.Server) { reg.MustRegister(rlqsMetrics{s}) }

func (rlqsMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{rlqsStreamsDesc, rlqsBucketsDesc, rlqsReportsDesc, rlqsPushesDesc, rlqsRebalancesDesc, rlqsAssignmentsDesc, rlqsErrorsDesc, rlqsUsageDesc, rlqsHeldDesc, rlqsAssignedDesc, rlqsBudgetOpsDesc, rlqsBudgetFailDesc, rlqsNotUTF8Desc} {
		ch <- d
	}
}

func (m rlqsMetrics) Collect(ch chan<- prometheus.Metric) {
	st := m.s.Stats()
	ch <- prometheus.MustNewConstMetric(rlqsStreamsDesc, prometheus.GaugeValue, float64(st.Streams))
	ch <- prometheus.MustNewConstMetric(rlqsBucketsDesc, prometheus.GaugeValue, float64(st.Buckets))
	ch <- prometheus.MustNewConstMetric(rlqsReportsDesc, prometheus.CounterValue, float64(st.Reports))
	ch <- prometheus.MustNewConstMetric(rlqsPushesDesc, prometheus.CounterValue, float64(st.Pushes))
	ch <- prometheus.MustNewConstMetric(rlqsRebalancesDesc, prometheus.CounterValue, float64(st.Rebalances))
	for kind, n := range map[string]uint64{
		"token_bucket": st.Assignments.TokenBucket, "allow_all": st.Assignments.AllowAll,
		"deny_all": st.Assignments.DenyAll, "abandon": st.Assignments.Abandon,
	} {
		ch <- prometheus.MustNewConstMetric(rlqsAssignmentsDesc, prometheus.CounterValue, float64(n), kind)
	}
	for code, n := range st.StreamErrors {
		ch <- prometheus.MustNewConstMetric(rlqsErrorsDesc, prometheus.CounterValue, float64(n), code.String())
	}
	for _, u := range st.Usage {
		ch <- prometheus.MustNewConstMetric(rlqsUsageDesc, prometheus.GaugeValue, u.Allowed, u.Domain, u.Rule)
		ch <- prometheus.MustNewConstMetric(rlqsHeldDesc, prometheus.GaugeValue, float64(u.Held), u.Domain, u.Rule)
		ch <- prometheus.MustNewConstMetric(rlqsAssignedDesc, prometheus.GaugeValue, float64(u.Assigned), u.Domain, u.Rule)
	}
	for op, n := range map[string]uint64{"take": st.Budget.Takes, "give": st.Budget.Gives, "read": st.Budget.Reads} {
		ch <- prometheus.MustNewConstMetric(rlqsBudgetOpsDesc, prometheus.CounterValue, float64(n), op)
	}
	ch <- prometheus.MustNewConstMetric(rlqsBudgetFailDesc, prometheus.CounterValue, float64(st.Budget.Failed))
	ch <- prometheus.MustNewConstMetric(rlqsNotUTF8Desc, prometheus.CounterValue, float64(st.NotUTF8))
}

// rlqsFrontEnd is the component of Envoy's Rate Limit Quota Service
// (-rlqs, docs/rlqs.md) on the gRPC port: each limit's budget is held in
// the bottom of the backend stack, shared by the replicas on one Redis,
// behind a circuit breaker of its own; every rule set put in force
// pushes what it changed to the open streams.
type rlqsFrontEnd struct {
	config rlqsConfig
	server *rlqs.Server // nil with -rlqs=false
}

func (r *rlqsFrontEnd) addFlags(fs *flag.FlagSet) { addRLQSFlags(fs, &r.config) }

func (r *rlqsFrontEnd) check(flagName func(string) string) error { return r.config.validate(flagName) }

func (r *rlqsFrontEnd) build(_ context.Context, s *server) (hooks, error) {
	if !r.config.on {
		return hooks{}, nil
	}
	opts := r.config.options()
	// A budget call is off Envoy's request path and may carry a whole
	// report's buckets: one slower than an RLS decision's deadline
	// neither fails nor opens the circuit that RLS decisions go through.
	opts.Budget = s.stack.guarded(r.config.budgetTimeout, "rlqs budget",
		"budget calls fail at once until a probe succeeds; reports are answered with this replica's share alone")
	opts.Rules, opts.Now, opts.Logger = s.svc.Rules, s.now, s.log
	quota, err := rlqs.New(opts)
	if err != nil {
		return hooks{}, err
	}
	r.server = quota
	registerRLQS(s.reg, quota)
	return hooks{
		grpc: func(gs *grpc.Server) {
			quota.Register(gs)
			s.log.Info("serving Envoy's Rate Limit Quota Service (RLQS) on the gRPC port; each limit's budget is held in the backend, shared by every replica on it (docs/rlqs.md)", "backend", s.stack.kind)
		},
		http:  func(mux *http.ServeMux) { mux.Handle("POST /explain/rlqs", quota.ExplainHandler()) },
		rules: func(*config.Rules) { quota.Reload() }, // after RLS's: the pushes read the rules it put in force
		// RLQS streams never end on their own: end them, so that the
		// graceful stop waits only for calls in flight.
		drain: quota.Close,
	}, nil
}
