package main

import (
	"flag"
	"fmt"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
)

// rlqsConfig is the RLQS server's configuration (-rlqs and -rlqs-*).
type rlqsConfig struct {
	on               bool
	defaultAction    string // allow or deny
	ttl              time.Duration
	interval         time.Duration
	burst            time.Duration
	abandonAfter     int
	floor            float64
	headroom         float64
	maxBuckets       int
	maxStreamBuckets int
	budgetTimeout    time.Duration
}

func addRLQSFlags(fs *flag.FlagSet, c *rlqsConfig) {
	fs.BoolVar(&c.on, "rlqs", true, "serve Envoy's Rate Limit Quota Service (envoy.service.rate_limit_quota.v3) on the gRPC port; each limit's budget is held in the backend, shared by the replicas on one Redis (docs/rlqs.md)")
	fs.StringVar(&c.defaultAction, "rlqs-default", "allow", "RLQS assignment of a bucket no rule limits: allow (ALLOW_ALL, as RLS answers OK for what no rule names) or deny (DENY_ALL)")
	fs.DurationVar(&c.ttl, "rlqs-assignment-ttl", 0, "RLQS assignment_time_to_live of every assignment, in whole seconds (Envoy reads only the seconds); 0 means twice the stream's reporting interval, rounded up")
	fs.DurationVar(&c.interval, "rlqs-reporting-interval", rlqs.DefaultReportingInterval, "RLQS reporting interval assumed for a stream until its reports tell the real one (Envoy's filter reports every 5s whatever its reporting_interval says)")
	fs.DurationVar(&c.burst, "rlqs-burst", rlqs.DefaultBurst, "RLQS: an assignment's max_tokens is its rate times this (at least 1, at most a period's share); Envoy starts every new token bucket full, so each change of a share may admit this much of it on top of the rate (docs/rlqs.md, the bound)")
	fs.IntVar(&c.abandonAfter, "rlqs-abandon-after", rlqs.DefaultAbandonAfter, "RLQS: reporting intervals a stream may leave a bucket out of its reports before it is sent abandon_action and its share goes to the others")
	fs.Float64Var(&c.floor, "rlqs-floor", rlqs.DefaultFloorFraction, "RLQS: `fraction` of each limit split evenly among the streams sharing it, whatever their demand (the rest follows demand); 1 splits it evenly")
	fs.Float64Var(&c.headroom, "rlqs-headroom", rlqs.DefaultHeadroom, "RLQS: a stream is assigned at most this many times its demand (at least its floor), so that unused budget stays free for the others; +Inf assigns the whole share")
	fs.IntVar(&c.maxBuckets, "rlqs-max-buckets", rlqs.DefaultMaxBuckets, "RLQS: most buckets one usage report may hold (InvalidArgument above)")
	fs.IntVar(&c.maxStreamBuckets, "rlqs-max-stream-buckets", rlqs.DefaultMaxStreamBuckets, "RLQS: most buckets one stream may hold at once (ResourceExhausted above)")
	fs.DurationVar(&c.budgetTimeout, "rlqs-budget-timeout", rlqs.DefaultBudgetTimeout, "RLQS: deadline of each call to the backend holding the budgets (on Redis, through a circuit breaker of its own, not RLS's); past it a report is answered with this replica's share alone")
}

// validate checks the -rlqs-* flags; source names a flag as the user set it.
func (c *rlqsConfig) validate(source func(string) string) error {
	switch {
	case c.defaultAction != "allow" && c.defaultAction != "deny":
		return fmt.Errorf("invalid %s %q; accepted: allow, deny", source("rlqs-default"), c.defaultAction)
	case c.ttl < 0 || c.ttl%time.Second != 0:
		return fmt.Errorf("invalid %s %v; it must be a whole number of seconds, as Envoy reads only the seconds of assignment_time_to_live (0: twice the reporting interval)", source("rlqs-assignment-ttl"), c.ttl)
	case c.interval < time.Millisecond:
		return fmt.Errorf("invalid %s %v; it must be at least 1ms", source("rlqs-reporting-interval"), c.interval)
	case c.burst <= 0:
		return fmt.Errorf("invalid %s %v; it must be positive (max_tokens is the rate times it, at least 1)", source("rlqs-burst"), c.burst)
	case c.abandonAfter < 1:
		return fmt.Errorf("invalid %s %d; it must be at least 1", source("rlqs-abandon-after"), c.abandonAfter)
	case !(c.floor > 0 && c.floor <= 1):
		return fmt.Errorf("invalid %s %v; it must be above 0 (a new stream needs a share to show its demand) and at most 1", source("rlqs-floor"), c.floor)
	case !(c.headroom >= 1):
		return fmt.Errorf("invalid %s %v; it must be at least 1 (a stream assigned less than it uses is refused at once), or +Inf", source("rlqs-headroom"), c.headroom)
	case c.maxBuckets < 1:
		return fmt.Errorf("invalid %s %d; it must be at least 1", source("rlqs-max-buckets"), c.maxBuckets)
	case c.maxStreamBuckets < c.maxBuckets:
		return fmt.Errorf("invalid %s %d; it must be at least %s (%d)", source("rlqs-max-stream-buckets"), c.maxStreamBuckets, source("rlqs-max-buckets"), c.maxBuckets)
	case c.budgetTimeout <= 0:
		return fmt.Errorf("invalid %s %v; it must be positive", source("rlqs-budget-timeout"), c.budgetTimeout)
	}
	return nil
}

// options returns the rlqs.Options the flags set; the caller adds the
// rules, the budget store, the clock and the logger.
func (c *rlqsConfig) options() rlqs.Options {
	o := rlqs.Options{
		AssignmentTTL: c.ttl, ReportingInterval: c.interval, Burst: c.burst, AbandonAfter: c.abandonAfter,
		FloorFraction: c.floor, Headroom: c.headroom, MaxBuckets: c.maxBuckets, MaxStreamBuckets: c.maxStreamBuckets,
		BudgetTimeout: c.budgetTimeout,
	}
	if c.defaultAction == "deny" {
		o.Default = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	}
	return o
}
