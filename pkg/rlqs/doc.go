// Package rlqs serves Envoy's Rate Limit Quota Service (RLQS):
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas.
//
// Each Envoy decides requests itself from quota assignments and reports its
// usage per bucket every reporting interval on one bidirectional stream. The
// server answers every report with an assignment for each bucket reported.
//
// # Bucket matching
//
// A bucket id {k: v, …} reported on a stream of domain D is decided by the
// rule that the descriptor of its entries sorted by key, [(k1,v1),(k2,v2),…],
// matches in rule-file domain D ([config.Domain.Match]: exact values,
// wildcards and key-only descriptors as for RLS). A bucket that matches no
// rule, or a domain no rule file defines, gets [Options.Default]
// (ALLOW_ALL unless configured). An unlimited or shadow-mode rule assigns
// ALLOW_ALL; a limit of 0 assigns DENY_ALL.
//
// # Fairness policy (phase 1)
//
// The streams of one replica that report the same bucket of the same rule
// share the rule's limit L (its most restrictive limit, as a count per Envoy
// time unit U: see [unitFor]). Each stream s has a demand d_s: allowed plus
// denied requests per second, an exponentially weighted average over its
// reports. Its target is
//
//	floor(F·L / n) + floor((L − n·floor(F·L/n)) · d_s / Σd)
//
// with n the streams reporting the bucket and F = [Options.FloorFraction]
// (default 0.1): a tenth of the limit is split evenly, so a new or idle
// stream is never starved, and the rest follows demand (evenly when no
// stream has any). A stream is assigned min(target, L − Σ assignments still
// in force for the other streams), so the assignments in force on a replica
// never sum to more than L, even while shares move: a stream whose share
// grows takes what the others gave back at their own reports, within one or
// two reporting intervals.
//
// # Across replicas (phase 2)
//
// With [Options.Budget] (ratelimitd's backend: the lease engine in front of
// Redis, or the memory backend), every assignment is backed by a lease of
// as many hits taken from a store shared by all replicas, where the limit
// is a semaphore of L units (budget.go): the assignments in force across
// every replica sum to at most L. Each report gives back the stream's
// previous lease and takes the new one (at most its target) in one atomic
// call, which also announces the stream's demand, so that n and Σd above
// count the streams of all replicas. Without a Budget, a replica shares L
// among its own streams only (phase 1). See docs/rlqs.md.
//
// # Reload and metrics
//
// [Server.Reload], called once new rules are in force, pushes to every
// open stream the assignments of the buckets the new rules decide
// otherwise, without waiting for a report. [Server.Stats] is a snapshot
// of the counts that ratelimitd exports as ratelimitd_rlqs_* metrics.
package rlqs
