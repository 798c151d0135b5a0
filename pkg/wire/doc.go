// Package wire holds what every ratelimitd gRPC or HTTP server does to a
// request before, and around, the protocol that answers it, whatever the
// protocol (Envoy's RLS and RLQS, ratelimitd's own API, region sync, the
// HTTP endpoints):
//
//   - decoding: [DecodeOptions] decodes requests as grpc-go does, but
//     answers one that does not decode InvalidArgument naming the field
//     ([BadRequest]) instead of Internal, and decodes as they came the
//     message types a protocol tolerates ([Tolerance]) whose strings are
//     not UTF-8. Each protocol's package names its own (service.Tolerance,
//     rlqs.Tolerance); this package knows none of them.
//   - refusals: [BadRequest] is InvalidArgument with a google.rpc.BadRequest
//     detail naming the field, for a request that does not decode or that
//     breaks a protocol's bounds.
//   - panic recovery: [Recovery] (and [RecoverUnary], [RecoverStream],
//     [RecoverHTTP]) keeps a panicking handler from ending the process,
//     answers Internal (or 500), logs the panic and counts it, one count
//     for every server that shares it; [WriteJSONError] is the JSON form
//     of an HTTP error.
//
// It imports nothing of ratelimitd's: the protocols' packages import it.
package wire
