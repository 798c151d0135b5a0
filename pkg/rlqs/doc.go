// Package rlqs serves Envoy's Rate Limit Quota Service (RLQS):
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas.
//
// Each Envoy decides requests itself from quota assignments and reports its
// usage per bucket every 5 s on one bidirectional stream. The server
// answers every report with an assignment for each bucket reported, in the
// form Envoy's rate_limit_quota filter enforces: a token bucket with a
// whole-second fill interval, or a blanket rule, with a TTL in whole
// seconds (docs/rlqs.md, "What Envoy enforces").
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
// # Fairness policy
//
// The streams of one replica that report the same bucket of the same rule
// share the rule's limit: its most restrictive limit, as L units per period
// of S whole seconds, at least 1,000 units (see [periodFor]). Each stream s
// has a demand d_s: allowed plus denied requests per second of its reports.
// Its target, in units, is
//
//	min(floor(F·L/n) + floor((L − n·floor(F·L/n)) · d_s / Σd),  max(floor(F·L/n), ceil(H · d_s · S)))
//
// with n the streams reporting the bucket, F = [Options.FloorFraction]
// (0.1) and H = [Options.Headroom] (2): a tenth of the limit is split
// evenly, so a new or idle stream is never starved, the rest follows
// demand, and no stream is given more than twice what it uses, so unused
// budget stays free for whoever grows. A stream is assigned min(target,
// B − Σ assignments still in force for the other streams), B being the
// limit or the budget the replica holds, so the assignments in force on a
// replica never sum to more than B. An assignment in force is kept rather
// than lowered by under an eighth or raised by under a thirty-second, since
// Envoy starts every changed token bucket full. A pool keeps running sums
// of its streams (share.go), so a report costs the same however many share
// it.
//
// # Across replicas
//
// With [Options.Budget] (ratelimitd's backend: the lease engine in front of
// Redis, or the memory backend), the limit is a semaphore of L units in a
// store shared by all replicas, and each replica holds one lease of it per
// pool, out of which its streams are assigned (budget.go): the
// assignments in force across every replica sum to at most L. A replica
// renews its lease (the old one given back, the new one taken, in one
// atomic call for all the pools of a report) when its targets drift from
// it or before it ends too soon. Where the budget is scarce, the pool also
// announces its demand and streams, reads the others' between renewals,
// and pushes its streams new assignments as soon as a call shows their
// shares moved. Without a Budget, a replica shares L among its own streams
// only. See docs/rlqs.md.
//
// # Reload, explain and metrics
//
// [Server.Reload], called once new rules are in force, pushes to every
// open stream the assignments of the buckets the new rules decide
// otherwise, without waiting for a report. [Server.Explain] tells how a
// bucket id is decided and what is held for it. [Server.Stats] is a
// snapshot of the counts that ratelimitd exports as ratelimitd_rlqs_*
// metrics.
package rlqs
