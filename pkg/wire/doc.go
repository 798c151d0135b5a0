// Package wire holds what every ratelimitd server does to a request
// before, and around, the protocol that answers it, whatever the protocol
// (Envoy's RLS and RLQS, ratelimitd's own API, region sync, the HTTP
// endpoints):
//
//   - panic recovery: [Recovery] (and [RecoverUnary], [RecoverStream],
//     [RecoverHTTP]) keeps a panicking handler from ending the process,
//     answers Internal (or 500), logs the panic and counts it, one count
//     for every server that shares it;
//   - the JSON form of an HTTP error, [WriteJSONError].
//
// It imports nothing of ratelimitd's: the protocols' packages import it.
package wire
