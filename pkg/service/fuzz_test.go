package service

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// fuzzService returns a function that makes a service under the example
// rules on a fresh memory backend with a stopped clock, so that each fuzz
// input is decided the same way whatever ran before it: the fuzzer keeps
// an input for the code it reaches, and minimizes it, only when that is
// reproducible.
func fuzzService(f *testing.F) func() *Service {
	f.Helper()
	rules, err := config.Load("../../examples")
	if err != nil {
		f.Fatal(err)
	}
	now := func() time.Time { return start }
	return func() *Service {
		be := memory.New(memory.Options{Now: now, Shards: 16, SweepInterval: -1})
		svc, err := New(be, rules, Options{})
		if err != nil {
			panic(err)
		}
		return svc
	}
}

// generatedSeeds are JSON requests too long to write out in testdata: as
// many descriptors as the bounds accept, then one past each bound. The
// handwritten seeds are in testdata/fuzz/FuzzJSON and
// testdata/fuzz/FuzzShouldRateLimit.
func generatedSeeds() [][]byte {
	descs := func(n int) string {
		return strings.Repeat(`{"entries":[{"key":"user_id","value":"u"}]},`, n-1) + `{"entries":[{"key":"user_id","value":"u"}]}`
	}
	entries := strings.Repeat(`{"key":"k","value":"v"},`, DefaultMaxEntries) + `{"key":"k","value":"v"}`
	return [][]byte{
		fmt.Appendf(nil, `{"domain":"posts","descriptors":[%s]}`, descs(DefaultMaxDescriptors)),
		fmt.Appendf(nil, `{"domain":"posts","descriptors":[%s]}`, descs(DefaultMaxDescriptors+1)),
		fmt.Appendf(nil, `{"domain":"posts","descriptors":[{"entries":[%s]}]}`, entries),
		fmt.Appendf(nil, `{"domain":%q,"descriptors":[%s]}`, strings.Repeat("d", DefaultMaxDomainLen+1), descs(1)),
		fmt.Appendf(nil, `{"domain":"posts","descriptors":[{"entries":[{"key":%q,"value":"v"}]}]}`, strings.Repeat("k", DefaultMaxKeyLen+1)),
		fmt.Appendf(nil, `{"domain":"posts","descriptors":[{"entries":[{"key":"user_id","value":%q}]}]}`, strings.Repeat("v", DefaultMaxValueLen+1)),
		fmt.Appendf(nil, `{"domain":"posts","descriptors":[{"entries":[{"key":"user_id","value":"u"}],"hitsAddend":"%d"}]}`, DefaultMaxHits+1),
		fmt.Appendf(nil, `{"domain":"posts","hitsAddend":%d,"descriptors":[%s]}`, DefaultMaxHits+1, descs(1)),
	}
}

// FuzzJSON posts arbitrary bodies to /json. Whatever the body, the handler
// must not panic and must answer JSON with a status it documents, never
// 500: 200 or 429 with a RateLimitResponse of one status per descriptor,
// 400 with a non-empty "error" exactly when the body is not a
// RateLimitRequest or breaks a bound, 413 for a body too large, 503 or 504
// when the backend fails.
func FuzzJSON(f *testing.F) {
	newService := fuzzService(f)
	for _, s := range generatedSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		svc := newService()
		rec := httptest.NewRecorder()
		svc.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", bytes.NewReader(body)))
		code, out := rec.Code, rec.Body.Bytes()
		switch code {
		case http.StatusOK, http.StatusTooManyRequests, http.StatusBadRequest,
			http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		default:
			t.Fatalf("status %d for %q: %s", code, body, out)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("status %d with Content-Type %q", code, ct)
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("status %d, the body is not a JSON object: %v\n%s", code, err, out)
		}

		var req rlsv3.RateLimitRequest
		parseErr := protojson.Unmarshal(body, &req)
		var boundsErr *wire.BadRequest
		if parseErr == nil {
			boundsErr = svc.bounds.check(&req)
		}
		if code == http.StatusOK || code == http.StatusTooManyRequests {
			if parseErr != nil || boundsErr != nil {
				t.Fatalf("status %d for a bad request (%v, %v): %q", code, parseErr, boundsErr, body)
			}
			var resp rlsv3.RateLimitResponse
			if err := protojson.Unmarshal(out, &resp); err != nil {
				t.Fatalf("status %d, the body is not a RateLimitResponse: %v\n%s", code, err, out)
			}
			checkResponse(t, &req, &resp)
			if over := resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT; over != (code == http.StatusTooManyRequests) {
				t.Fatalf("status %d with overall code %v", code, resp.OverallCode)
			}
			return
		}
		msg, _ := m["error"].(string)
		if msg == "" || len(m) != 1 {
			t.Fatalf("status %d without an error message: %s", code, out)
		}
		if code != http.StatusBadRequest {
			return
		}
		switch {
		case parseErr == nil && boundsErr == nil:
			t.Fatalf("400 (%s) for a request within bounds: %q", msg, body)
		case boundsErr != nil && msg != boundsErr.Error():
			t.Fatalf("400 says %q, the bounds say %q", msg, boundsErr)
		}
	})
}

// FuzzShouldRateLimit decodes arbitrary bytes as a protobuf
// RateLimitRequest, as the gRPC server would, and asks for a decision.
// Whatever the request, the answer is an error exactly when the request
// breaks a bound, and then it is InvalidArgument whose message starts with
// the field its BadRequest detail names; otherwise it is one status per
// descriptor.
func FuzzShouldRateLimit(f *testing.F) {
	newService := fuzzService(f)
	for _, s := range generatedSeeds() {
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(s, &req); err != nil {
			f.Fatalf("seed %.80s: %v", s, err)
		}
		b, err := proto.Marshal(&req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(data, &req) != nil {
			return // the gRPC codec refuses it before any handler runs
		}
		svc := newService()
		resp, err := svc.ShouldRateLimit(context.Background(), &req)
		boundsErr := svc.bounds.check(&req)
		if err == nil {
			if boundsErr != nil {
				t.Fatalf("decided a request that breaks a bound (%v): %v", boundsErr, &req)
			}
			checkResponse(t, &req, resp)
			return
		}
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || boundsErr == nil {
			t.Fatalf("error %v (bounds: %v) for %v", err, boundsErr, &req)
		}
		var field string
		for _, d := range st.Details() {
			if br, ok := d.(*errdetails.BadRequest); ok && len(br.FieldViolations) == 1 {
				field = br.FieldViolations[0].Field
			}
		}
		if field == "" || !strings.HasPrefix(st.Message(), field+": ") {
			t.Fatalf("message %q does not start with the field its detail names (%q)", st.Message(), field)
		}
	})
}

// checkResponse checks that resp answers req: one status per descriptor,
// and an overall code that is OVER_LIMIT exactly when a status is.
func checkResponse(t *testing.T, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) {
	t.Helper()
	if len(resp.Statuses) != len(req.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
	}
	over := false
	for _, s := range resp.Statuses {
		switch s.GetCode() {
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			over = true
		case rlsv3.RateLimitResponse_OK:
		default:
			t.Fatalf("status code %v", s.GetCode())
		}
	}
	if want := map[bool]rlsv3.RateLimitResponse_Code{false: rlsv3.RateLimitResponse_OK, true: rlsv3.RateLimitResponse_OVER_LIMIT}[over]; resp.OverallCode != want {
		t.Fatalf("overall code %v with statuses %v", resp.OverallCode, resp.Statuses)
	}
}
