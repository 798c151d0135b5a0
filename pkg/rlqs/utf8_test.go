package rlqs_test

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/wiretest"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// TestBucketIDNotUTF8: Envoy's filter builds bucket ids from request
// headers byte for byte (as it builds RLS descriptors) and sends them, but
// its protobuf refuses to parse a response holding a string that is not
// UTF-8 (proto3 strings are checked when parsed). A report holding such a
// bucket id is answered for its other buckets, in a response that parses,
// and the stream goes on; the bucket is left unanswered and counted. Ending
// the stream instead would leave every bucket of that Envoy unassigned:
// with no_assignment_behavior ALLOW_ALL, every limit of it bypassed by one
// header.
func TestBucketIDNotUTF8(t *testing.T) {
	var logs bytes.Buffer
	f := startWith(t, rlqs.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, clocktest.New(time.Unix(1_700_000_000, 0)),
		wire.DecodeOptions(rlqs.Tolerance())...) // as ratelimitd serves it
	srv, clk, conn := f.srv, f.clock, f.conn
	ctx := ctxT(t)
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		"/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas", wiretest.CallOption())
	if err != nil {
		t.Fatal(err)
	}

	// The report, encoded with a placeholder that 0xFF then overwrites in
	// place: Go's protobuf encodes no string that is not UTF-8.
	const placeholder = "HEADERVALUE"
	report := func(route string) wiretest.Raw {
		u := func(bucket map[string]string) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
			return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: bucket}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1}
		}
		b, err := proto.Marshal(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			u(map[string]string{"name": "acme", "route": route}), u(map[string]string{"name": "acme", "route": "/pay"}),
		}})
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Replace(b, []byte(placeholder), []byte("\xff"+placeholder[1:]), 1)
	}
	exchange := func(r wiretest.Raw) *rlqsv3.RateLimitQuotaResponse {
		t.Helper()
		if err := st.SendMsg(r); err != nil {
			t.Fatal(err)
		}
		var out wiretest.Raw
		if err := st.RecvMsg(&out); err != nil {
			t.Fatalf("a report with a bucket id that is not UTF-8: %v; want the other buckets answered", err)
		}
		// What Envoy's parser needs: a response it can read.
		var resp rlqsv3.RateLimitQuotaResponse
		if err := proto.Unmarshal(out, &resp); err != nil {
			t.Fatalf("the answer does not parse, as Envoy's protobuf would not parse it: %v", err)
		}
		return &resp
	}
	resp := exchange(report(placeholder))
	if len(resp.BucketAction) != 1 || resp.BucketAction[0].GetBucketId().GetBucket()["route"] != "/pay" || resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("answer %v: want a token bucket for route /pay alone", resp)
	}
	// The stream goes on: the next report is answered too.
	clk.Advance(5 * time.Second)
	if resp := exchange(report(placeholder)); len(resp.BucketAction) != 1 {
		t.Fatalf("the next report: %v", resp)
	}
	if got := srv.Stats(); got.NotUTF8 != 2 || got.Buckets != 1 || len(got.StreamErrors) != 0 {
		t.Fatalf("stats %+v: want 2 reports of a bucket not UTF-8 counted, one bucket held, no stream ended", got)
	}
	if n := bytes.Count(logs.Bytes(), []byte("not UTF-8")); n != 1 {
		t.Errorf("logged %d times, want once per stream:\n%s", n, logs.String())
	}
}

// TestDomainNotUTF8: a report whose domain is not UTF-8 is refused as
// InvalidArgument naming the domain, though its bucket ids may hold any
// bytes: the domain comes from Envoy's config, not from headers
// (rlqs.Tolerance).
func TestDomainNotUTF8(t *testing.T) {
	f := startWith(t, rlqs.Options{}, clocktest.New(time.Unix(1_700_000_000, 0)), wire.DecodeOptions(rlqs.Tolerance())...)
	st, err := f.conn.NewStream(ctxT(t), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		"/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas", wiretest.CallOption())
	if err != nil {
		t.Fatal(err)
	}
	const placeholder = "QUOTA"
	b, err := proto.Marshal(&rlqsv3.RateLimitQuotaUsageReports{Domain: placeholder, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"name": "acme"}}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(wiretest.Raw(bytes.Replace(b, []byte(placeholder), []byte("\xff"+placeholder[1:]), 1))); err != nil {
		t.Fatal(err)
	}
	var out wiretest.Raw
	err = st.RecvMsg(&out)
	if status.Code(err) != codes.InvalidArgument || wiretest.Violation(err) != "domain" {
		t.Fatalf("%v (field %q); want InvalidArgument naming domain", err, wiretest.Violation(err))
	}
}
