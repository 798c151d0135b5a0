// Package aigwsim simulates the two rate-limit calls Envoy makes for a
// request under an Envoy AI Gateway QuotaPolicy, and measures what a rate
// limit service lets through: test support for issue 31 (SPEC section 12),
// where a token budget must hold under concurrency.
//
// # The model
//
// A [Client] is Envoy's ratelimit HTTP filter as AI Gateway configures it,
// in front of one or more replicas of the service, picked round-robin. For
// each [Stream]:
//
//  1. The request-time call: domain ai-gateway-quota, one descriptor
//     backend_name "<namespace>/<backend>", model_name_override <model>,
//     with no hits_addend of its own (the wrapper unset), and the request's
//     hits_addend 0 (read as 1 by servers).
//  2. Its answer: OVER_LIMIT is a 429; an error (or the filter's timeout)
//     is a 500 with failure_mode_deny, else the request goes on. A client
//     that resets while the call is in flight cancels it, and nothing more
//     is sent.
//  3. Admitted, the stream runs its Duration and ends by its [Fate]: a 2xx
//     to the end of the body (Cost tokens, 0 allowed), an upstream failure,
//     or a client reset.
//  4. The stream-done call, made when the filter is destroyed, with the
//     same two keys read from dynamic metadata and hits_addend set to the
//     cost, only when the stream was a 2xx that reached its end: no other
//     stream leaves the metadata it is built from. It is fire-and-forget:
//     not tied to the client's context, its answer and errors ignored.
//
// A [Load] runs concurrent users sending streams back to back through one
// Client, drawn from a seeded [Workload] (log-normal costs, durations from
// the cost, shares of failures and resets), bounded in time and count, on
// an injected [Clock]. [Measure] turns its [Run] into a [Report]: per
// epoch-aligned window of the limit, the tokens charged (the stream-done
// calls sent in it, which is what was spent upstream), the demand, and, over
// full windows only, the largest charged/limit ratio and the utilisation
// where demand exceeded the limit.
//
// # Sources
//
// Each branch cites the function it models. Read at:
//
//   - Envoy, main of 2025-26 (no commit pinned: read as stored copies of
//     the files):
//     source/extensions/filters/http/ratelimit/ratelimit.cc,
//     Filter::initiateCall, Filter::complete, Filter::onDestroy and
//     OnStreamDoneCallBack::complete (declared in ratelimit.h);
//     source/extensions/filters/common/ratelimit_config/ratelimit_config.cc,
//     RateLimitPolicy::populateDescriptors (a hits_addend format without a
//     number in [0, 1e9] drops the descriptor) and
//     RateLimitConfig::populateDescriptors (request-time and stream-done
//     entries apart by applyOnStreamDone());
//     source/extensions/filters/common/ratelimit/ratelimit_impl.cc,
//     GrpcClientImpl::createRequest (a descriptor's hits_addend is a
//     UInt64Value set only when it has one) and GrpcClientImpl::onSuccess.
//     Versions differ: before 1.33 onDestroy only cancels (no stream-done
//     call); in some since, the filter splits the entries itself
//     (Filter::populateRateLimitDescriptorsForPolicy, on_stream_done) rather
//     than RateLimitConfig; the status of a refused or failed call became
//     configurable (rate_limited_status, status_on_error), 429 and 500 by
//     default, as AI Gateway leaves them.
//   - envoyproxy/ai-gateway c217da8a (2026-08-21):
//     internal/extensionserver/quota_ratelimit.go,
//     enableQuotaRateLimitOnRoute, buildSimpleModelEntries,
//     requestTimeBaseActions, baseDescriptorActions, quotaHitsAddend,
//     buildQuotaRateLimitFilter and buildQuotaRateLimitCluster;
//     internal/ratelimit/translator/translator.go, QuotaDomain and
//     BuildRateLimitConfigs (the rule: backend_name → model_name_override,
//     a fixed window, sent to the service over xDS);
//     internal/extproc/processor_impl.go,
//     upstreamProcessor.ProcessResponseBody and buildDynamicMetadata
//     (quota_cost and ai_service_backend_name written only at the end of a
//     2xx body).
//
// Only the simple case of a QuotaPolicy is modelled: one perModelQuota
// without bucket rules, targeting one backend.
package aigwsim
