package service

import (
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata returns the dynamic_metadata of the answer resp to req,
// with Options.DynamicMetadata (envoyproxy/ratelimit's
// RESPONSE_DYNAMIC_METADATA), in the reference's shape
// (src/service/ratelimit.go, ratelimitToMetadata):
//
//	domain       the request's domain
//	descriptors  one struct per descriptor: entries, a list of "key=value";
//	             limit, the descriptor's limit override in protobuf's text
//	             form; hitsAddend, its hits_addend when set (0 included)
//	hitsAddend   the request's hits_addend, when not 0
//	metadata     the metadata of the rules of the descriptors that passed
//	             (answered OK, but unlimited ones), merged in request order:
//	             a key the earlier rules set keeps their value, but for two
//	             structs, which merge the same way
//
// Envoy's ratelimit filter puts it under envoy.filters.http.ratelimit in
// the request's dynamic metadata, for later filters (quota-aware routing)
// and access logs. checks are the request's decided checks, nil for a
// domain without rules (no descriptor matched, none passes with
// metadata).
func dynamicMetadata(req *rlsv3.RateLimitRequest, checks []check, resp *rlsv3.RateLimitResponse) *structpb.Struct {
	descriptors := make([]*structpb.Value, 0, len(req.Descriptors))
	for _, d := range req.Descriptors {
		if d != nil {
			descriptors = append(descriptors, structpb.NewStructValue(descriptorMetadata(d)))
		}
	}
	fields := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(text(req.Domain)),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descriptors}),
	}
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	merged := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range checks {
		c := &checks[i]
		if c.kind != counted || c.rule == nil || len(c.rule.Metadata) == 0 || resp.Statuses[i].Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			continue
		}
		// A fresh struct each time: merging never writes into the rules.
		md, err := structpb.NewStruct(c.rule.Metadata)
		if err != nil {
			continue // unreachable: package config makes only JSON values
		}
		mergeMetadata(merged, md)
	}
	if len(merged.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(merged)
	}
	return &structpb.Struct{Fields: fields}
}

// descriptorMetadata is one descriptor's struct in dynamicMetadata.
func descriptorMetadata(d *rlv3.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, len(d.Entries))
	for i, e := range d.Entries {
		entries[i] = structpb.NewStringValue(text(e.GetKey() + "=" + e.GetValue()))
	}
	fields := map[string]*structpb.Value{
		"entries": structpb.NewListValue(&structpb.ListValue{Values: entries}),
	}
	if d.Limit != nil {
		// protobuf's text form, as the reference sends it; protobuf varies
		// its spacing from build to build, on purpose.
		fields["limit"] = structpb.NewStringValue(d.Limit.String())
	}
	if h := d.HitsAddend; h != nil {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h.Value))
	}
	return &structpb.Struct{Fields: fields}
}

// text returns s with each byte that is not UTF-8 replaced by U+FFFD.
// Tolerance has requests whose descriptors hold such bytes decided, as
// Envoy copies them from headers; protobuf encodes no string that is not
// UTF-8, and an answer that fails to encode reaches Envoy as Internal,
// which its default failure_mode_deny: false admits.
func text(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// mergeMetadata adds src's fields to dst: a field dst lacks is added; one
// both hold as structs is merged the same way; any other keeps dst's.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.Fields {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if a, b := have.GetStructValue(), v.GetStructValue(); a != nil && b != nil {
			mergeMetadata(a, b)
		}
	}
}
