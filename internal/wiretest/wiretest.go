// Package wiretest sends gRPC requests as bytes, so that tests can send
// what protobuf's Go encoder refuses to make: strings that are not UTF-8,
// as Envoy sends a descriptor value copied from a header byte for byte,
// and messages that are broken on the wire. [Inputs] makes such requests
// for any message type.
package wiretest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Raw is a message's wire form. Sent through [Codec], it goes as it is;
// received, it takes the answer's bytes.
type Raw []byte

// Codec is a client codec sending a [Raw] as it is and decoding an answer
// into a *Raw as it came; any other message goes through protobuf.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// CallOption has a call use [Codec].
func CallOption() grpc.CallOption { return grpc.ForceCodecV2(Codec{}) }

// Name is grpc-go's content subtype for protobuf: the server sees a
// protobuf call.
func (Codec) Name() string { return encproto.Name }

// Marshal implements encoding.CodecV2.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(Raw); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("wiretest: cannot send %T", v)
	}
	b, err := proto.Marshal(m)
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

// Unmarshal implements encoding.CodecV2.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*Raw); ok {
		*r = data.Materialize()
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("wiretest: cannot decode into %T", v)
	}
	return proto.Unmarshal(data.Materialize(), m)
}

// Call sends b as the request of method md on conn, with [Codec], and
// returns the answer: for a unary method its bytes or its error; for a
// stream, which is closed after b, the first message it answers, or the
// status it ends with when it answers none.
func Call(ctx context.Context, conn grpc.ClientConnInterface, md protoreflect.MethodDescriptor, b Raw) (Raw, error) {
	name := "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
	var out Raw
	if !md.IsStreamingClient() && !md.IsStreamingServer() {
		err := conn.Invoke(ctx, name, b, &out, CallOption())
		return out, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	desc := &grpc.StreamDesc{StreamName: string(md.Name()), ClientStreams: md.IsStreamingClient(), ServerStreams: md.IsStreamingServer()}
	st, err := conn.NewStream(ctx, desc, name, CallOption())
	if err != nil {
		return nil, err
	}
	if err := st.SendMsg(b); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if err := st.CloseSend(); err != nil {
		return nil, err
	}
	if err := st.RecvMsg(&out); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	return out, nil
}

// Check fails t unless err and out, the answer of method md to in, are
// what ratelimitd owes it: never Internal or Unknown; for Envoy's
// ShouldRateLimit, a decision of an input whose strings are not UTF-8 (a
// status for each of its two descriptors); for any other method,
// InvalidArgument naming the field that is not UTF-8; and InvalidArgument
// for a broken message, on every method.
func Check(t testing.TB, md protoreflect.MethodDescriptor, in Input, out Raw, err error) {
	t.Helper()
	code := status.Code(err)
	switch {
	case code == codes.Internal || code == codes.Unknown:
		t.Errorf("%s, %s: %v", md.FullName(), in.Name, err)
	case in.Kind == NotUTF8 && md.FullName() == "envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit":
		var resp rlsv3.RateLimitResponse
		if err != nil || proto.Unmarshal(out, &resp) != nil || len(resp.Statuses) != 2 {
			t.Errorf("%s, %s: %v (%d statuses); want it decided", md.FullName(), in.Name, err, len(resp.Statuses))
		}
	case in.Kind == NotUTF8:
		if code != codes.InvalidArgument || Violation(err) != in.Field || !strings.HasPrefix(status.Convert(err).Message(), in.Field+": not valid UTF-8") {
			t.Errorf("%s, %s: %v (field %q); want InvalidArgument naming %s", md.FullName(), in.Name, err, Violation(err), in.Field)
		}
	case in.Kind == Broken:
		if code != codes.InvalidArgument || status.Convert(err).Message() == "" {
			t.Errorf("%s, %s: %v; want InvalidArgument", md.FullName(), in.Name, err)
		}
	}
}

// Violation returns the field the google.rpc.BadRequest detail of err's
// gRPC status names; "" when it has none, or several.
func Violation(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.FieldViolations) == 1 {
			return br.FieldViolations[0].Field
		}
	}
	return ""
}

// Request encodes, by hand, a RateLimitRequest of Envoy's RLS v3 (or a
// ratelimitd.v1 CheckRequest, PeekRequest or AcquireRequest, which share
// its wire form) of domain and descriptors of key, value pairs, every
// string with the bytes given, in the order protobuf's encoder writes.
func Request(domain string, descriptors ...[]string) Raw {
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	for _, kv := range descriptors {
		var d []byte
		for i := 0; i+1 < len(kv); i += 2 {
			e := protowire.AppendTag(nil, 1, protowire.BytesType)
			e = protowire.AppendString(e, kv[i])
			e = protowire.AppendTag(e, 2, protowire.BytesType)
			e = protowire.AppendString(e, kv[i+1])
			d = protowire.AppendTag(d, 1, protowire.BytesType)
			d = protowire.AppendBytes(d, e)
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	return b
}

// Kind is a kind of input [Inputs] makes.
type Kind uint8

const (
	// NotUTF8 inputs are well formed, a string holding bytes that are not
	// UTF-8: Envoy's ShouldRateLimit decides them; anything else refuses
	// them as InvalidArgument naming Input.Field.
	NotUTF8 Kind = iota + 1
	// Broken inputs do not parse as protobuf: refused as InvalidArgument.
	Broken
	// Parses inputs are odd but parse as protobuf does (a known field of
	// the wrong wire type is kept as an unknown field): answered as their
	// handler answers what they decode to, never Internal.
	Parses
)

// Input is one request that [Inputs] makes.
type Input struct {
	Name  string
	Kind  Kind
	Field string // the field a refusal should name; "" when none
	Bytes Raw
}

// notUTF8 are byte strings that are not UTF-8, each a way a header value
// copied byte for byte may not be.
var notUTF8 = []struct{ name, b string }{
	{"0xFF", "\xff"},
	{"0xFE", "\xfe"},
	{"overlong /", "\xc0\xaf"},
	{"surrogate U+D800", "\xed\xa0\x80"},
	{"sequence cut short", "\xe2\x82"},
	{"lone continuation byte", "\x80"},
	{"above U+10FFFF", "\xf4\x90\x80\x80"},
}

// Inputs returns requests of type md that do not decode as they should,
// from a message with every field set, lists with two elements (fill):
//
//   - for its first string field, each of seven byte strings that are not
//     UTF-8 (0xFF, 0xFE, an overlong form, a surrogate, a sequence cut
//     short, a lone continuation byte, a code point above U+10FFFF); for
//     every other string field, nested ones included, 0xFF;
//   - the message cut short; a nested message cut short; a length beyond
//     the end; a varint cut short; a varint of 11 bytes; field number 0;
//     the reserved wire type 6; an end-group marker with no group open; a
//     group never closed; groups nested past protobuf's recursion limit;
//   - and a string field sent as a varint and a message field sent as a
//     fixed32, which protobuf keeps as unknown fields.
//
// On Envoy's RateLimitRequest the strings are the domain, and the key and
// value of each of two entries of each of two descriptors: the 21
// inputs (seven byte strings on the domain, 0xFF on a key, a value and a
// nested value, ten broken messages and a known field of the wrong wire
// type) are among them.
func Inputs(md protoreflect.MessageDescriptor) []Input {
	full := dynamicpb.NewMessage(md)
	fill(full, 0)
	var strs []stringField
	findStrings(full, "", &strs)
	enc := func(m proto.Message) []byte {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			panic(err) // a dynamic message of valid strings encodes
		}
		return b
	}
	valid := enc(full)

	var out []Input
	// A string holding bad bytes: the field's placeholder, unique in the
	// encoding, is overwritten in place by the bytes and ASCII padding,
	// so that every length before it still holds.
	for i, s := range strs {
		kinds := notUTF8[:1]
		if i == 0 {
			kinds = notUTF8
		}
		for _, k := range kinds {
			bad := k.b + strings.Repeat("_", len(s.placeholder)-len(k.b))
			b := slices.Clone(valid)
			at := strings.Index(string(b), s.placeholder)
			copy(b[at:], bad)
			out = append(out, Input{Name: fmt.Sprintf("%s %s", s.path, k.name), Kind: NotUTF8, Field: s.path, Bytes: b})
		}
	}

	broken := func(name, field string, b []byte) {
		out = append(out, Input{Name: name, Kind: Broken, Field: field, Bytes: b})
	}
	top := md.Fields()
	// The last field cut short.
	if len(valid) > 1 {
		broken("message cut short", "", valid[:len(valid)-1])
	}
	// The first message field's value cut short inside.
	for i := range top.Len() {
		f := top.Get(i)
		if f.Message() == nil || f.IsMap() {
			continue
		}
		v := full.Get(f)
		var inner protoreflect.Message
		if f.IsList() {
			inner = v.List().Get(0).Message()
		} else {
			inner = v.Message()
		}
		ib := enc(inner.Interface())
		if len(ib) == 0 {
			continue
		}
		b := protowire.AppendTag(nil, f.Number(), protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(len(ib)-1))
		b = append(b, ib[:len(ib)-1]...)
		broken("nested message cut short", "", b)
		break
	}
	unused := unusedNumber(md)
	broken("length beyond the end", "", protowire.AppendVarint(protowire.AppendTag(slices.Clone(valid), unused, protowire.BytesType), 1<<40))
	broken("varint cut short", "", append(protowire.AppendTag(slices.Clone(valid), unused, protowire.VarintType), 0x80))
	broken("varint of 11 bytes", "", append(protowire.AppendTag(slices.Clone(valid), unused, protowire.VarintType), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}...))
	broken("field number 0", "", append(slices.Clone(valid), 0x00, 0x00))
	broken("wire type 6", "", append(slices.Clone(valid), byte(unused)<<3|6))
	broken("end group never opened", "", protowire.AppendTag(slices.Clone(valid), unused, protowire.EndGroupType))
	broken("group never closed", "", protowire.AppendTag(slices.Clone(valid), unused, protowire.StartGroupType))
	deep := slices.Clone(valid)
	const depth = protowire.DefaultRecursionLimit + 10
	for range depth {
		deep = protowire.AppendTag(deep, unused, protowire.StartGroupType)
	}
	for range depth {
		deep = protowire.AppendTag(deep, unused, protowire.EndGroupType)
	}
	broken("groups nested too deep", "", deep)

	for i := range top.Len() {
		if f := top.Get(i); f.Kind() == protoreflect.StringKind {
			b := protowire.AppendVarint(protowire.AppendTag(nil, f.Number(), protowire.VarintType), 7)
			out = append(out, Input{Name: string(f.Name()) + " as a varint", Kind: Parses, Bytes: b})
			break
		}
	}
	for i := range top.Len() {
		if f := top.Get(i); f.Message() != nil {
			b := protowire.AppendFixed32(protowire.AppendTag(nil, f.Number(), protowire.Fixed32Type), 7)
			out = append(out, Input{Name: string(f.Name()) + " as a fixed32", Kind: Parses, Bytes: b})
			break
		}
	}
	return out
}

// stringField is a string field of the full message, at path, holding
// placeholder.
type stringField struct{ path, placeholder string }

// fill sets every field of m but its flags: strings to a placeholder
// unique in the message (findStrings), numbers and enums to 1, lists to
// two elements, the first field of each oneof; messages to depth 3.
func fill(m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() && o.Fields().Get(0) != f {
			continue
		}
		switch {
		case f.IsMap():
			// Left empty: ratelimitd's requests have no maps.
		case f.IsList():
			if f.Message() != nil && depth >= 3 {
				continue
			}
			l := m.Mutable(f).List()
			for range 2 {
				if f.Message() != nil {
					e := l.NewElement()
					fill(e.Message(), depth+1)
					l.Append(e)
				} else {
					l.Append(scalar(f))
				}
			}
		case f.Message() != nil:
			if depth < 3 {
				fill(m.Mutable(f).Message(), depth+1)
			}
		default:
			m.Set(f, scalar(f))
		}
	}
}

// scalar is the value fill gives a field of f's kind.
func scalar(f protoreflect.FieldDescriptor) protoreflect.Value {
	switch f.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("") // replaced by findStrings
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("b"))
	case protoreflect.BoolKind:
		// False: a flag set could change what the request asks for (Envoy's
		// is_negative_hits is refused), and the inputs are about decoding.
		return protoreflect.ValueOfBool(false)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(1)
	}
	return protoreflect.ValueOfUint64(1)
}

// findStrings gives every string field of m, at path, a placeholder of
// its own and lists them in field order, depth first.
func findStrings(m protoreflect.Message, path string, out *[]stringField) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if !m.Has(f) && f.Kind() != protoreflect.StringKind {
			continue
		}
		p := string(f.Name())
		if path != "" {
			p = path + "." + p
		}
		switch {
		case f.IsMap():
		case f.IsList() && f.Message() != nil:
			l := m.Get(f).List()
			for j := range l.Len() {
				findStrings(l.Get(j).Message(), fmt.Sprintf("%s[%d]", p, j), out)
			}
		case f.IsList() && f.Kind() == protoreflect.StringKind:
			l := m.Mutable(f).List()
			for j := range l.Len() {
				ph := placeholder(len(*out))
				l.Set(j, protoreflect.ValueOfString(ph))
				*out = append(*out, stringField{fmt.Sprintf("%s[%d]", p, j), ph})
			}
		case f.Message() != nil:
			findStrings(m.Get(f).Message(), p, out)
		case f.Kind() == protoreflect.StringKind:
			if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() && o.Fields().Get(0) != f {
				continue
			}
			ph := placeholder(len(*out))
			m.Set(f, protoreflect.ValueOfString(ph))
			*out = append(*out, stringField{p, ph})
		}
	}
}

// placeholder is the n-th placeholder: 8 bytes no encoding of the other
// fields holds.
func placeholder(n int) string { return fmt.Sprintf("~PH%04d~", n) }

// unusedNumber is a field number md does not use.
func unusedNumber(md protoreflect.MessageDescriptor) protowire.Number {
	n := protowire.Number(1000)
	for md.Fields().ByNumber(n) != nil {
		n++
	}
	return n
}
