package wire

import (
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/wiretest"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// TestLenientDecodeKeepsEveryField: the decoding that takes strings as
// bytes reads every field of a RateLimitRequest as protobuf does, nested
// messages, wrappers, enums and fields unknown to this build included.
func TestLenientDecodeKeepsEveryField(t *testing.T) {
	want := &rlsv3.RateLimitRequest{
		Domain:     "messaging",
		HitsAddend: 7,
		Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries:        []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}, {Key: "k2"}},
			Limit:          &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 9, Unit: 3, UnitMultiplier: wrapperspb.UInt32(2)},
			HitsAddend:     wrapperspb.UInt64(5),
			IsNegativeHits: true,
		}},
	}
	b, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	// A field this build does not know, kept as protobuf keeps it.
	b = protowire.AppendTag(b, 99, protowire.VarintType)
	b = protowire.AppendVarint(b, 1)
	if err := proto.Unmarshal(b, want); err != nil {
		t.Fatal(err)
	}
	got := &rlsv3.RateLimitRequest{}
	if err := Tolerate[*rlsv3.RateLimitRequest](nil).mirror.decode(b, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("decoded %v\nwant    %v", got, want)
	}
	// Every field of the request and the messages it holds is set above,
	// so that a field go-control-plane adds fails this test until it is.
	var check func(m protoreflect.Message)
	check = func(m protoreflect.Message) {
		fields := m.Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if m.Descriptor().FullName() == "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry" && fd.Name() == "value" {
				continue // the second entry shows an empty value
			}
			if !m.Has(fd) {
				t.Errorf("%s is not set in the test's request", fd.FullName())
				continue
			}
			if fd.IsList() {
				for j := range m.Get(fd).List().Len() {
					if fd.Message() != nil {
						check(m.Get(fd).List().Get(j).Message())
					}
				}
			} else if fd.Message() != nil && !strings.HasPrefix(string(fd.Message().FullName()), "google.protobuf.") {
				check(m.Get(fd).Message())
			}
		}
	}
	check(want.ProtoReflect())
}

// TestDecoderForgetsRefusals: each refused message is answered once, and
// its note is dropped; a valid message then decodes as usual.
func TestDecoderForgetsRefusals(t *testing.T) {
	d := newDecoder()
	m := &ratelimitdv1.CheckRequest{}
	if err := d.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wiretest.Request("\xff"))}, m); err != nil {
		t.Fatal(err)
	}
	if err := d.take(m); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("take: %v, want InvalidArgument", err)
	}
	if err := d.take(m); err != nil || d.pending.Load() != 0 {
		t.Fatalf("second take: %v, %d pending; want nothing left", err, d.pending.Load())
	}
	if err := d.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wiretest.Request("ok"))}, m); err != nil || d.take(m) != nil || m.Domain != "ok" {
		t.Fatalf("valid message after a refusal: %v, %v", err, m)
	}
}

// BenchmarkDecodeRequest decodes RateLimitRequests as the gRPC server
// does, with grpc-go's codec and with DecodeOptions' (codec=ratelimitd),
// tolerant of RateLimitRequest as service.Tolerance asks: valid ones cost
// the same; one whose value is not UTF-8 grpc-go refuses, ratelimitd
// decodes a second time with strings as bytes.
func BenchmarkDecodeRequest(b *testing.B) {
	codecs := []struct {
		name  string
		codec encoding.CodecV2
	}{{"grpc", encoding.GetCodecV2(encproto.Name)}, {"ratelimitd", newDecoder(Tolerate[*rlsv3.RateLimitRequest](nil))}}
	inputs := []struct {
		name string
		b    []byte
	}{
		{"one_descriptor", wiretest.Request("messaging", []string{"to_number", "2061111111"})},
		{"two_descriptors", wiretest.Request("messaging", []string{"message_type", "marketing", "to_number", "2061111111"}, []string{"to_number", "2061111111"})},
		{"value_not_utf8", wiretest.Request("messaging", []string{"message_type", "marketing", "to_number", "2061111111\xff"}, []string{"to_number", "2061111111"})},
	}
	for _, in := range inputs {
		for _, c := range codecs {
			b.Run("input="+in.name+"/codec="+c.name, func(b *testing.B) {
				b.ReportAllocs()
				data := mem.BufferSlice{mem.SliceBuffer(in.b)}
				for b.Loop() {
					var req rlsv3.RateLimitRequest
					err := c.codec.Unmarshal(data, &req)
					if d, ok := c.codec.(*decoder); ok {
						err = d.take(&req)
					}
					if (err == nil) != (c.name == "ratelimitd" || in.name != "value_not_utf8") {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestTolerateAccept: a request of a tolerated type whose strings are not
// UTF-8 is decoded with the bytes sent when its Tolerance accepts it; it is
// refused naming the first field that is not UTF-8 when accept does not,
// and when its type is not the one tolerated.
func TestTolerateAccept(t *testing.T) {
	messaging := Tolerate(func(r *rlsv3.RateLimitRequest) bool { return r.Domain == "messaging" })
	cases := []struct {
		name  string
		d     *decoder
		in    []byte
		field string // the refusal's; "" when decoded
	}{
		{"accepted", newDecoder(messaging), wiretest.Request("messaging", []string{"k", "v\xff"}), ""},
		{"refused by accept", newDecoder(messaging), wiretest.Request("other", []string{"k", "v\xff"}), "descriptors[0].entries[0].value"},
		{"no tolerance", newDecoder(), wiretest.Request("messaging", []string{"k", "v\xff"}), "descriptors[0].entries[0].value"},
		{"another type tolerated", newDecoder(Tolerate[*ratelimitdv1.CheckRequest](nil)), wiretest.Request("messaging", []string{"k\xfe", "v"}), "descriptors[0].entries[0].key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var req rlsv3.RateLimitRequest
			if err := c.d.Unmarshal(mem.BufferSlice{mem.SliceBuffer(c.in)}, &req); err != nil {
				t.Fatal(err)
			}
			err := c.d.take(&req)
			if c.field == "" {
				if err != nil || req.Domain != "messaging" || req.Descriptors[0].Entries[0].Value != "v\xff" {
					t.Fatalf("%v, %v; want it decoded with the bytes sent", err, &req)
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument || wiretest.Violation(err) != c.field || !proto.Equal(&req, &rlsv3.RateLimitRequest{}) {
				t.Fatalf("%v (request %v); want InvalidArgument naming %s, and the request left empty", err, &req, c.field)
			}
		})
	}
}

// FuzzDecode decodes arbitrary bytes as the gRPC server does, tolerant of
// RateLimitRequest and not of ratelimitd.v1's CheckRequest, which shares
// its wire form: what protobuf decodes decodes alike; anything else is
// either decided, only a RateLimitRequest and only when protobuf refused a
// string that is not UTF-8 (nothing else it refuses is forgiven), or
// refused as InvalidArgument whose message starts with the field its
// BadRequest detail names. Unmarshal itself never fails: grpc-go would
// answer Internal.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(wiretest.Request("messaging", []string{"k", "v"})))
	f.Add([]byte(wiretest.Request("messaging\xff", []string{"k\xfe", "v\xc0\xaf"}, []string{"a", "b"})))
	for _, in := range wiretest.Inputs((*rlsv3.RateLimitRequest)(nil).ProtoReflect().Descriptor()) {
		f.Add([]byte(in.Bytes))
	}
	d := newDecoder(Tolerate[*rlsv3.RateLimitRequest](nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []proto.Message{&rlsv3.RateLimitRequest{}, &ratelimitdv1.CheckRequest{}} {
			if err := d.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m); err != nil {
				t.Fatalf("%T: Unmarshal failed: %v", m, err)
			}
			err := d.take(m)
			want := m.ProtoReflect().New().Interface()
			perr := proto.Unmarshal(b, want)
			switch {
			case perr == nil:
				if err != nil || !proto.Equal(m, want) {
					t.Fatalf("%T that protobuf decodes: %v, %v; want %v", m, err, m, want)
				}
			case err == nil:
				if _, ok := m.(*rlsv3.RateLimitRequest); !ok {
					t.Fatalf("%T that protobuf refuses (%v) decided: %v", m, perr, m)
				}
				if !strings.Contains(perr.Error(), "invalid UTF-8") {
					t.Fatalf("decided %v, which protobuf refuses for something other than a string not UTF-8: %v", m, perr)
				}
			default:
				st := status.Convert(err)
				field := wiretest.Violation(err)
				if st.Code() != codes.InvalidArgument || st.Message() == "" || (field != "" && !strings.HasPrefix(st.Message(), field+": ")) {
					t.Fatalf("%T refused with %v (field %q)", m, err, field)
				}
			}
		}
	})
}
