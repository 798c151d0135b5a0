package service

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// Tolerance is what this service asks of [wire.DecodeOptions]: Envoy's
// RateLimitRequest whose strings are not UTF-8 is decoded as it came, each
// string holding the bytes sent, and decided: a descriptor's key and value
// are opaque keys. Envoy copies header values into descriptors byte for
// byte (RequestHeadersAction::populateDescriptor,
// source/common/router/router_ratelimit.cc) and sends them unchecked
// (GrpcClientImpl::createRequest,
// source/extensions/filters/common/ratelimit/ratelimit_impl.cc); an HTTP/1
// header may carry any byte from 0x80 (obs-text). A call that failed
// instead would be admitted by Envoy's default failure_mode_deny: false
// (Filter::complete, source/extensions/filters/http/ratelimit/ratelimit.cc):
// a bypass of every limit keyed on a header.
//
// ratelimitd's own API (ratelimitd.v1.RateLimiter) is not tolerant: a
// string that is not UTF-8 is refused as InvalidArgument naming the field.
func Tolerance() wire.Tolerance {
	return wire.Tolerate[*rlsv3.RateLimitRequest](nil)
}
