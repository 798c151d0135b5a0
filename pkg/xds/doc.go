// Package xds receives rate-limit rules from an xDS control plane: a
// State-of-the-World client of the Aggregated Discovery Service (ADS) for
// the resources of type ratelimit.config.ratelimit.v3.RateLimitConfig, the
// protocol envoyproxy/ratelimit speaks with CONFIG_TYPE=GRPC_XDS_SOTW.
//
// A [Client] opens one stream, subscribes to every RateLimitConfig (a
// wildcard subscription) as its node (id and metadata), and for each
// response:
//
//   - converts every resource into the rule file it stands for (YAML of
//     the envoyproxy/ratelimit format, named "xds:" and the resource's
//     name) and parses them all together with config.Parse, so rules from
//     xDS are validated and mean exactly what the same rules in files do;
//   - when they are valid, hands them to [Options.OnRules] and then ACKs
//     the response (version_info and response_nonce of the response);
//   - when anything is wrong (a resource of another type, a rule the
//     parser rejects, two resources for one domain), NACKs it: the request
//     carries the version still in force, the response's nonce, and
//     error_detail with the parser's error text; the last good rules keep
//     serving. A server that sends a rejected version again at once is
//     answered after a growing wait, so that the pair does not spin.
//
// When the stream fails or cannot be opened, the client reconnects after
// a backoff that doubles from [Options.BackoffInitial] to
// [Options.BackoffMax], jittered, and subscribes again with the version in
// force. TLS files are read at each attempt, so rotated certificates are
// used from the next connection on.
//
// Each response holds the whole state: a response with no resources is
// valid and removes every rule.
package xds
