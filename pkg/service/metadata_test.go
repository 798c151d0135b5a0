package service

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/wiretest"
)

// TestDynamicMetadata builds the dynamic_metadata of Options.DynamicMetadata
// (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA): the descriptors, the
// request's hits_addend, and the metadata of the rules that passed,
// merged without writing into the rules. None without the option.
func TestDynamicMetadata(t *testing.T) {
	rules := `domain: dm
descriptors:
  - key: a
    metadata: {backend: primary, tier: {name: gold}}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    metadata: {backend: fallback, tier: {region: eu}, cost: 0.5}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: zero
    metadata: {blocked: yes}
    rate_limit: {unit: minute, requests_per_unit: 0}
`
	f := newHeaderFixture(t, rules, HeadersNone)
	if resp := f.call(t, request("dm", desc("a", "1"))); resp.DynamicMetadata != nil {
		t.Fatalf("dynamic_metadata without the option: %v", resp.DynamicMetadata)
	}
	f = costFixture(t, "memory", rules, Options{DynamicMetadata: true})
	asJSON := func(s *structpb.Struct) string {
		b, err := protojson.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		json.Unmarshal(b, &v)
		out, _ := json.Marshal(v) // keys sorted
		return string(out)
	}
	override := desc("c", "1")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_HOUR}
	override.HitsAddend = wrapperspb.UInt64(0)
	for i, c := range []struct {
		req  func() []*rlv3.RateLimitDescriptor
		hits uint32
		want string
	}{
		{func() []*rlv3.RateLimitDescriptor { return []*rlv3.RateLimitDescriptor{desc("a", "1"), desc("b", "1")} }, 2,
			`{"descriptors":[{"entries":["a=1"]},{"entries":["b=1"]}],"domain":"dm","hitsAddend":2,"metadata":{"backend":"primary","cost":0.5,"tier":{"name":"gold","region":"eu"}}}`},
		// The merge of the call before wrote nothing into rule a.
		{func() []*rlv3.RateLimitDescriptor { return []*rlv3.RateLimitDescriptor{desc("a", "1")} }, 0,
			`{"descriptors":[{"entries":["a=1"]}],"domain":"dm","metadata":{"backend":"primary","tier":{"name":"gold"}}}`},
		// Over its limit: left out. An override: its limit, no metadata.
		{func() []*rlv3.RateLimitDescriptor { return []*rlv3.RateLimitDescriptor{desc("zero", "1"), override} }, 0,
			`{"descriptors":[{"entries":["zero=1"]},{"entries":["c=1"],"hitsAddend":0,"limit":"<override>"}],"domain":"dm"}`},
	} {
		req := request("dm", c.req()...)
		req.HitsAddend = c.hits
		got := asJSON(f.call(t, req).DynamicMetadata)
		want := strings.Replace(c.want, "<override>", strings.Join(strings.Fields(override.Limit.String()), " "), 1)
		got = strings.Replace(got, override.Limit.String(), strings.Join(strings.Fields(override.Limit.String()), " "), 1)
		var g, w any
		json.Unmarshal([]byte(got), &g)
		json.Unmarshal([]byte(want), &w)
		if !reflect.DeepEqual(g, w) {
			t.Errorf("call %d:\n got %s\nwant %s", i, got, want)
		}
	}
	if resp := f.call(t, request("elsewhere", desc("a", "1"))); asJSON(resp.DynamicMetadata) != `{"descriptors":[{"entries":["a=1"]}],"domain":"elsewhere"}` {
		t.Errorf("an unknown domain: %s", asJSON(resp.DynamicMetadata))
	}
}

// TestDynamicMetadataOfBytesNotUTF8: a descriptor or domain that is not
// UTF-8 (Envoy copies header bytes into descriptors; Tolerance has them
// decided) is decided and answered with the dynamic metadata too, each bad
// byte shown as U+FFFD: protobuf encodes no string that is not UTF-8, and
// a call answered Internal instead is admitted by Envoy's default
// failure_mode_deny: false, a bypass of the limit.
func TestDynamicMetadataOfBytesNotUTF8(t *testing.T) {
	f := costFixture(t, "memory", "domain: dm\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n", Options{DynamicMetadata: true})
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
		resp, err := callRaw[rlsv3.RateLimitResponse](t, f.conn, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, wiretest.Request("dm", []string{"a\xff", "v\xfe"}, []string{"a", "x\xff"}))
		if err != nil {
			t.Fatalf("call %d with dynamic metadata: %v; want it answered", i+1, err)
		}
		if resp.OverallCode != want {
			t.Errorf("call %d: %v, want %v: the value not UTF-8 is counted", i+1, resp.OverallCode, want)
		}
		entries := resp.GetDynamicMetadata().GetFields()["descriptors"].GetListValue().GetValues()
		if len(entries) != 2 || entries[1].GetStructValue().GetFields()["entries"].GetListValue().GetValues()[0].GetStringValue() != "a=x\ufffd" {
			t.Errorf("call %d: dynamic metadata %v, want the second descriptor's entry as a=x\\ufffd", i+1, resp.GetDynamicMetadata())
		}
	}
	resp, err := callRaw[rlsv3.RateLimitResponse](t, f.conn, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, wiretest.Request("dm\xff", []string{"a", "1"}))
	if err != nil || resp.GetDynamicMetadata().GetFields()["domain"].GetStringValue() != "dm\ufffd" {
		t.Errorf("a domain not UTF-8: %v, %v; want it answered, the domain as dm\\ufffd", resp, err)
	}
}
