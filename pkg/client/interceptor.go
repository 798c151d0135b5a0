package client

import (
	"context"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// UnaryServerInterceptor returns a gRPC server interceptor deciding every
// unary call with l in domain, for the descriptors descriptors extracts
// from the call (its full method, such as "/pkg.Service/Method", and its
// request message). A call with no descriptor is handled undecided.
//
// A refused call fails with codes.ResourceExhausted and, unless waiting
// never admits it, an errdetails.RetryInfo detail whose retry_delay is the
// decision's RetryAfter. When no decision can be made, the call is handled
// anyway with failOpen, and fails with codes.Unavailable otherwise (or
// with the caller's own cancellation or deadline, when that is what ended
// the decision).
//
// It panics when descriptors is nil.
func UnaryServerInterceptor(l Limiter, domain string, descriptors func(ctx context.Context, fullMethod string, req any) []Descriptor, failOpen bool) grpc.UnaryServerInterceptor {
	if descriptors == nil {
		panic("client.UnaryServerInterceptor: nil descriptors function")
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ds := descriptors(ctx, info.FullMethod, req)
		if len(ds) == 0 {
			return handler(ctx, req)
		}
		d, err := l.Allow(ctx, domain, ds...)
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return nil, status.FromContextError(ctxErr).Err()
			}
			if failOpen {
				return handler(ctx, req)
			}
			return nil, status.Errorf(codes.Unavailable, "rate limit service unavailable: %v", status.Convert(err).Message())
		}
		if !d.Allowed {
			return nil, LimitedStatus(d).Err()
		}
		return handler(ctx, req)
	}
}

// LimitedStatus returns the status [UnaryServerInterceptor] fails refused
// calls with: codes.ResourceExhausted with an errdetails.RetryInfo of
// d.RetryAfter, without one when d.RetryAfter is [Never].
func LimitedStatus(d Decision) *status.Status {
	if d.RetryAfter == Never {
		return status.New(codes.ResourceExhausted, "rate limit exceeded: the request asks for more than the limit ever holds")
	}
	st := status.New(codes.ResourceExhausted, "rate limit exceeded")
	if withRetry, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}); err == nil {
		st = withRetry
	}
	return st
}
