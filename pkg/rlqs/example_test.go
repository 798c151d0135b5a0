package rlqs_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	rlqfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3" // HttpRequestHeaderMatchInput, named in "@type"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
)

// TestExampleFilterConfig keeps the example of docs/rlqs.md honest: the
// Envoy rate_limit_quota filter in testdata is valid for go-control-plane's
// Envoy 1.40 types, its bucket_id_builders produce the bucket ids the
// documentation lists, and those buckets are decided by the rules of
// testdata/quota.yaml as documented.
func TestExampleFilterConfig(t *testing.T) {
	path := filepath.Join("testdata", "envoy-rate-limit-quota.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	hf := &hcmv3.HttpFilter{}
	if err := protojson.Unmarshal(js, hf); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := hf.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	cfg := &rlqfilterv3.RateLimitQuotaFilterConfig{}
	if err := hf.GetTypedConfig().UnmarshalTo(cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if cfg.GetDomain() != "quota" {
		t.Fatalf("domain %q, want quota (the rule file's)", cfg.GetDomain())
	}

	// Each action's bucket_id_builder: static values as given, values from
	// the request as "<from request>".
	var built []map[string]string
	actions := cfg.GetBucketMatchers().GetMatcherList().GetMatchers()
	for _, m := range actions {
		built = append(built, bucketBuilder(t, m.GetOnMatch().GetAction().GetTypedConfig()))
	}
	built = append(built, bucketBuilder(t, cfg.GetBucketMatchers().GetOnNoMatch().GetAction().GetTypedConfig()))

	// The buckets those builders produce for one request each, and what the
	// server assigns them.
	const fromRequest = "<from request>"
	examples := []struct {
		pattern map[string]string // the builder's output, fromRequest where the request decides
		bucket  map[string]string
		want    string
	}{
		{map[string]string{"name": "acme", "route": fromRequest}, map[string]string{"name": "acme", "route": "/pay"}, "1000/10s max 100"},
		{map[string]string{"name": fromRequest}, map[string]string{"name": "bigcorp"}, "1200/2m0s max 10"},
		{map[string]string{"name": "other"}, map[string]string{"name": "other"}, "ALLOW_ALL"},
	}
	if len(built) != len(examples) {
		t.Fatalf("%d bucket builders, the documentation lists %d", len(built), len(examples))
	}
	rules, err := config.Load(filepath.Join("testdata", "quota.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, rlqs.Options{Rules: func() *config.Rules { return rules }, Headroom: wholeShare})
	for i, ex := range examples {
		if !maps.Equal(built[i], ex.pattern) {
			t.Errorf("builder %d builds %v, the documentation says %v", i, built[i], ex.pattern)
		}
		kv := make([]string, 0, 2*len(ex.bucket))
		for _, k := range slices.Sorted(maps.Keys(ex.bucket)) {
			kv = append(kv, k, ex.bucket[k])
		}
		st := f.rawStream(t)
		resp, err := exchange(t, st, cfg.GetDomain(), usage(1, 0, kv...))
		if err != nil {
			t.Fatal(err)
		}
		if got := describe(resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy()); got != ex.want {
			t.Errorf("bucket %v: %s, want %s", ex.bucket, got, ex.want)
		}
		st.CloseSend()
	}
}

// bucketBuilder unpacks and validates one action's bucket settings and
// returns its bucket_id_builder, "<from request>" for the values a request
// supplies.
func bucketBuilder(t *testing.T, a *anypb.Any) map[string]string {
	t.Helper()
	bs := &rlqfilterv3.RateLimitQuotaBucketSettings{}
	if err := a.UnmarshalTo(bs); err != nil {
		t.Fatal(err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, vb := range bs.GetBucketIdBuilder().GetBucketIdBuilder() {
		if vb.GetCustomValue() != nil {
			out[k] = "<from request>"
		} else {
			out[k] = vb.GetStringValue()
		}
	}
	return out
}
