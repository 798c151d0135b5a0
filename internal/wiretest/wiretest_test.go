package wiretest

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// TestRequestIsProtobuf: the hand encoding is protobuf's own for valid
// strings, so what tests send by it is what Envoy sends.
func TestRequestIsProtobuf(t *testing.T) {
	req := &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "burst", Value: "a"}}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}, {Key: "k2", Value: "v2"}}},
	}}
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := Request("messaging", []string{"burst", "a"}, []string{"k", "v", "k2", "v2"}); !bytes.Equal(got, want) {
		t.Fatalf("hand encoding %x, protobuf's %x", got, want)
	}
}

// TestInputsAreWhatTheySay: protobuf refuses every NotUTF8 input for its
// UTF-8 and every Broken input, and decodes every Parses input; the
// issue's 21 kinds are there for Envoy's RateLimitRequest.
func TestInputsAreWhatTheySay(t *testing.T) {
	for _, m := range []proto.Message{&rlsv3.RateLimitRequest{}, &ratelimitdv1.CheckRequest{}, &ratelimitdv1.ReleaseRequest{}, &ratelimitdv1.PushRequest{}} {
		md := m.ProtoReflect().Descriptor()
		kinds := map[Kind]int{}
		for _, in := range Inputs(md) {
			kinds[in.Kind]++
			err := proto.Unmarshal(in.Bytes, dynamicpb.NewMessage(md))
			switch in.Kind {
			case NotUTF8:
				if err == nil || !strings.Contains(err.Error(), "UTF-8") {
					t.Errorf("%s %s: %v, want a UTF-8 error", md.FullName(), in.Name, err)
				}
			case Broken:
				if err == nil || strings.Contains(err.Error(), "UTF-8") {
					t.Errorf("%s %s: %v, want a wire error", md.FullName(), in.Name, err)
				}
			case Parses:
				if err != nil {
					t.Errorf("%s %s: %v, want it decoded", md.FullName(), in.Name, err)
				}
			default:
				t.Errorf("%s %s: kind %d", md.FullName(), in.Name, in.Kind)
			}
		}
		if kinds[Broken] < 9 || kinds[NotUTF8] < 7 {
			t.Errorf("%s: %v inputs by kind; want 9 broken (10 with a message field) and 7 or more not UTF-8", md.FullName(), kinds)
		}
	}
	names := map[string]bool{}
	for _, in := range Inputs((&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor()) {
		names[in.Name] = true
	}
	for _, want := range []string{"domain 0xFF", "domain overlong /", "descriptors[0].entries[0].key 0xFF", "descriptors[0].entries[0].value 0xFF",
		"descriptors[1].entries[1].value 0xFF", "nested message cut short", "groups nested too deep", "domain as a varint", "descriptors as a fixed32"} {
		if !names[want] {
			t.Errorf("no input %q for RateLimitRequest", want)
		}
	}
	if err := proto.Unmarshal(Request("\xff"), &rlsv3.RateLimitRequest{}); !errors.Is(err, proto.Error) {
		t.Errorf("a domain 0xFF: %v, want protobuf to refuse it", err)
	}
}
