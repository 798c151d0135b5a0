package aigwsim

import (
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The names AI Gateway's rules and route actions use
// (internal/ratelimit/translator/translator.go, ai-gateway c217da8a).
const (
	// Domain is translator.QuotaDomain: every QuotaPolicy's domain.
	Domain = "ai-gateway-quota"
	// BackendNameKey is translator.BackendNameDescriptorKey.
	BackendNameKey = "backend_name"
	// ModelNameKey is translator.ModelNameDescriptorKey.
	ModelNameKey = "model_name_override"
)

// maxHitsAddend is the largest hits_addend Envoy's hits_addend format
// yields; past it the descriptor is dropped (RateLimitPolicy::
// populateDescriptors in source/extensions/filters/common/
// ratelimit_config/ratelimit_config.cc).
const maxHitsAddend = 1_000_000_000

// Route is the simple case of a QuotaPolicy on one AI Gateway route: one
// perModelQuota without bucket rules, its defaultBucket a fixed window,
// targeting one AIServiceBackend. Its rule on the rate limit service is
// the descriptor tree backend_name "<Namespace>/<Backend>" →
// model_name_override <Model> (translator.BuildRateLimitConfigs).
type Route struct {
	Namespace string // the QuotaPolicy's namespace, also its backend's
	Backend   string // the AIServiceBackend the policy targets
	Model     string // the perModelQuota's modelName (the route's modelNameOverride)
}

// RequestTimeDescriptors are the descriptors of the request-time call.
// enableQuotaRateLimitOnRoute (internal/extensionserver/quota_ratelimit.go,
// ai-gateway c217da8a) adds, through buildSimpleModelEntries, one
// rate_limits entry per target backend made of requestTimeBaseActions: two
// generic keys with the values known when the route is built, and no
// hits_addend. Envoy's GrpcClientImpl::createRequest (source/extensions/
// filters/common/ratelimit/ratelimit_impl.cc) sets a descriptor's
// hits_addend only when the descriptor has one (hits_addend_.has_value()),
// so these go out with the wrapper unset.
func (r Route) RequestTimeDescriptors() []*rlv3.RateLimitDescriptor {
	return []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
		{Key: BackendNameKey, Value: r.Namespace + "/" + r.Backend},
		{Key: ModelNameKey, Value: r.Model},
	}}}
}

// metadata is what the stream's dynamic metadata namespace
// io.envoy.ai_gateway holds when the stream ends, as far as the rate limit
// filter reads it. AI Gateway's external processor writes it in one go,
// from upstreamProcessor.ProcessResponseBody through buildDynamicMetadata
// (internal/extproc/processor_impl.go, c217da8a), and only at the end of
// a 2xx response body: a failed upstream or a stream cut short leaves it
// unset.
type metadata struct {
	set         bool
	serviceName string // ai_service_backend_name: "<namespace>/<backend>"
	model       string // model_name_override
	quotaCost   uint64 // quota_cost, the tokens the response used
}

// endOfStream2xx is the metadata buildDynamicMetadata writes at the end of
// a 2xx body of r that used cost tokens.
func (r Route) endOfStream2xx(cost uint64) metadata {
	return metadata{set: true, serviceName: r.Namespace + "/" + r.Backend, model: r.Model, quotaCost: cost}
}

// streamDoneDescriptors are the descriptors of the stream-done call, from
// the metadata the stream ended with; none means no call.
//
// enableQuotaRateLimitOnRoute adds one entry with ApplyOnStreamDone: true
// made of baseDescriptorActions (two metadata actions reading
// ai_service_backend_name and model_name_override from dynamic metadata
// io.envoy.ai_gateway) and quotaHitsAddend, the format
// %DYNAMIC_METADATA(io.envoy.ai_gateway:quota_cost)%. Envoy's
// RateLimitPolicy::populateDescriptors (ratelimit_config.cc) drops the
// descriptor when an action finds no value (the metadata is absent) or the
// hits_addend format yields no number in [0, 1e9]; otherwise the
// descriptor carries its hits_addend, sent as a UInt64Value even when 0
// (GrpcClientImpl::createRequest).
func streamDoneDescriptors(md metadata) []*rlv3.RateLimitDescriptor {
	if !md.set || md.quotaCost > maxHitsAddend {
		return nil
	}
	return []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{
			{Key: BackendNameKey, Value: md.serviceName},
			{Key: ModelNameKey, Value: md.model},
		},
		HitsAddend: wrapperspb.UInt64(md.quotaCost),
	}}
}
