package service

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/ratelimitd/ratelimitd/internal/wiretest"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// callRaw calls method with the wire form b and returns the answer.
func callRaw[T any, P interface {
	*T
	proto.Message
}](t *testing.T, conn *grpc.ClientConn, method string, b []byte) (P, error) {
	t.Helper()
	resp := P(new(T))
	err := conn.Invoke(context.Background(), method, wiretest.Raw(b), resp, wiretest.CallOption())
	return resp, err
}

// TestDescriptorBytesAreOpaqueKeys: a descriptor value that is not UTF-8,
// as Envoy copies it from a request header, is decided under a key of its
// own and refused at the limit like any other value; in particular, not
// under the value its invalid bytes would become as UTF-8 (U+FFFD).
func TestDescriptorBytesAreOpaqueKeys(t *testing.T) {
	f := newFixture(t, testRules)
	// burst: 3 per 10 s, whatever the value. Each value below gets its
	// whole budget: had two shared a key, the later would be refused early.
	values := []string{"\xff", "\ufffd", "\xfe", "\xff\xff", "a\xffb", "ab", "\xc0\xaf", "/", "\xed\xa0\x80", ""}
	for _, v := range values {
		for i := range 4 {
			resp, err := callRaw[rlsv3.RateLimitResponse](t, f.conn, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, wiretest.Request("messaging", []string{"burst", v}))
			if err != nil {
				t.Fatalf("value %q, call %d: %v", v, i+1, err)
			}
			st := resp.Statuses[0]
			want, remaining := ok, uint32(2-i)
			if i == 3 {
				want, remaining = over, 0
			}
			if resp.OverallCode != want || st.Code != want || st.LimitRemaining != remaining || st.CurrentLimit.GetRequestsPerUnit() != 3 {
				t.Fatalf("value %q, call %d: %v, want %v with %d remaining of 3", v, i+1, resp, want, remaining)
			}
		}
	}
	// The Go client cannot send such a value, but sees the counts: its
	// own "\ufffd" is the one counted above, and refused.
	if st := f.call(t, request("messaging", desc("burst", "\ufffd"))).Statuses[0]; st.Code != over {
		t.Errorf("U+FFFD from a Go client: %v, want it refused as counted above", st)
	}

	// Not UTF-8 in a domain or a key: matched like any other bytes (no
	// rule here), and answered.
	for name, b := range map[string][]byte{
		"domain": wiretest.Request("messaging\xff", []string{"burst", "x"}),
		"key":    wiretest.Request("messaging", []string{"burst\xff", "x"}),
	} {
		resp, err := callRaw[rlsv3.RateLimitResponse](t, f.conn, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, b)
		if err != nil || resp.OverallCode != ok || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit != nil {
			t.Errorf("%s not UTF-8: %v, %v; want OK, no rule matched", name, resp, err)
		}
	}
}

// TestUndecodableRequests: a request that does not decode is answered
// InvalidArgument naming the field, in the message and in a BadRequest
// detail, never Internal: on Envoy's API when the wire form is broken, on
// ratelimitd's own API also when a string is not UTF-8.
func TestUndecodableRequests(t *testing.T) {
	f, _ := newOwnFixture(t, Options{EnableReset: true})
	valid := wiretest.Request("messaging", []string{"burst", "a"})
	cut := func(b []byte, n int) []byte { return b[:len(b)-n] }
	tag := func(b []byte, num protowire.Number, typ protowire.Type) []byte {
		return protowire.AppendTag(append([]byte(nil), b...), num, typ)
	}
	cases := []struct {
		name, method string
		b            []byte
		field, msg   string
	}{
		{"RLS truncated", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, cut(valid, 1), "descriptors[0]", "truncated"},
		{"RLS truncated entry", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName,
			append(wiretest.Request("messaging"), 0x12, 0x05, 0x0a, 0x07, 'k', 'e', 'y'), "descriptors[0].entries[0]", "truncated"},
		{"RLS field number 0", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, append(valid, 0x00), "envoy.service.ratelimit.v3.RateLimitRequest", "tag"},
		{"RLS varint overflow", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName,
			append(tag(valid, 3, protowire.VarintType), bytes.Repeat([]byte{0xff}, 11)...), "hits_addend", "overflow"},
		{"RLS end group never opened", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, tag(valid, 9, protowire.EndGroupType), "field 9", "does not parse"},
		{"Check value", ratelimitdv1.RateLimiter_Check_FullMethodName, wiretest.Request("messaging", []string{"burst", "a\xffb"}),
			"descriptors[0].entries[0].value", "not valid UTF-8 (byte 0xff at offset 1 of 3)"},
		{"Check second value", ratelimitdv1.RateLimiter_Check_FullMethodName, wiretest.Request("messaging", []string{"burst", "a"}, []string{"burst", "a", "k", "\xc0\xaf"}),
			"descriptors[1].entries[1].value", "not valid UTF-8 (byte 0xc0 at offset 0 of 2)"},
		{"Peek key", ratelimitdv1.RateLimiter_Peek_FullMethodName, wiretest.Request("messaging", []string{"\xed\xa0\x80", "a"}),
			"descriptors[0].entries[0].key", "not valid UTF-8"},
		{"Acquire domain", ratelimitdv1.RateLimiter_Acquire_FullMethodName, wiretest.Request("\xfe"), "domain", "not valid UTF-8"},
		{"Release lease", ratelimitdv1.RateLimiter_Release_FullMethodName, protowire.AppendString([]byte{0x0a}, "\xff"), "lease_id", "not valid UTF-8"},
		{"Reset truncated", ratelimitdv1.RateLimiter_Reset_FullMethodName, cut(wiretest.Request("messaging", []string{"burst", "a"}), 3), "descriptor", "truncated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := callRaw[rlsv3.RateLimitResponse](t, f.conn, c.method, c.b)
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("%v, want InvalidArgument", err)
			}
			if !strings.HasPrefix(st.Message(), c.field+": ") || !strings.Contains(st.Message(), c.msg) {
				t.Errorf("message %q, want %q: ...%s...", st.Message(), c.field, c.msg)
			}
			if field := wiretest.Violation(err); field != c.field {
				t.Errorf("BadRequest names %q, want %q", field, c.field)
			}
		})
	}
	if n := f.svc.Panics(); n != 0 {
		t.Errorf("%d panics", n)
	}
}

// TestNoInputIsInternal sends wiretest.Inputs of its request type to every
// method RegisterGRPC serves: none is answered Internal. Envoy's
// ShouldRateLimit decides strings that are not UTF-8; every other method
// refuses them as InvalidArgument naming the field, in the message and in
// a BadRequest detail; a broken message is InvalidArgument everywhere.
func TestNoInputIsInternal(t *testing.T) {
	f, _ := newOwnFixture(t, Options{EnableReset: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	services := []grpc.ServiceDesc{rlsv3.RateLimitService_ServiceDesc, ratelimitdv1.RateLimiter_ServiceDesc, healthpb.Health_ServiceDesc, reflectionpb.ServerReflection_ServiceDesc}
	calls := 0
	for _, sd := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(sd.ServiceName))
		if err != nil {
			t.Fatal(err)
		}
		methods := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range methods.Len() {
			md := methods.Get(i)
			for _, in := range wiretest.Inputs(md.Input()) {
				calls++
				out, err := wiretest.Call(ctx, f.conn, md, in.Bytes)
				wiretest.Check(t, md, in, out, err)
			}
		}
	}
	if calls < 100 {
		t.Fatalf("%d calls: methods or inputs are missing", calls)
	}
	if n := f.svc.Panics(); n != 0 {
		t.Errorf("%d handler panics", n)
	}
}
