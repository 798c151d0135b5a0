package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// DecodeOptions returns the gRPC server options under which requests are
// decoded as ratelimitd answers them; give them to every gRPC server of
// ratelimitd, before any other interceptor, with the message types its
// protocols decode tolerantly:
//
//   - A request of a type tolerate names, whose strings are not UTF-8, is
//     decoded as it came, each string holding the bytes sent, when its
//     [Tolerance] accepts it: the protocol's package says which of its
//     requests are keyed on bytes a proxy copies from headers, and why
//     (service.Tolerance for Envoy's RLS, rlqs.Tolerance for RLQS).
//   - Any other request that does not decode (a string that is not UTF-8
//     in a type not named, or one its Tolerance does not accept; a
//     truncated message; a malformed tag or varint) is answered
//     InvalidArgument, its message and BadRequest detail naming the field
//     ([BadRequest]), where grpc-go alone answers Internal for every
//     request its codec refuses.
//
// Valid requests decode exactly as with grpc-go's own codec, at the same
// cost.
func DecodeOptions(tolerate ...Tolerance) []grpc.ServerOption {
	d := newDecoder(tolerate...)
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(d),
		grpc.ChainUnaryInterceptor(d.unary),
		grpc.ChainStreamInterceptor(d.stream),
	}
}

// Tolerance is a message type decoded whatever bytes its strings hold, as
// a protocol asks of [DecodeOptions]. Make one with [Tolerate].
type Tolerance struct {
	name   protoreflect.FullName // of the message type
	mirror *lenient
	accept func(proto.Message) bool // nil: every message
}

// Tolerate returns the Tolerance of M, a generated message type (a
// pointer): a request of type M whose strings are not UTF-8 is decoded as
// it came, then handed to accept, when not nil, which may still refuse it
// (false: refused as any request that does not decode, naming the first
// field that is not UTF-8).
//
// It panics when M cannot be decoded so (not proto3): its descriptor is
// compiled in, so the tests of the package that asks catch it.
func Tolerate[M proto.Message](accept func(M) bool) Tolerance {
	var m M
	md := m.ProtoReflect().Descriptor()
	mirror, err := newLenient(md)
	if err != nil {
		panic(err)
	}
	t := Tolerance{name: md.FullName(), mirror: mirror}
	if accept != nil {
		t.accept = func(m proto.Message) bool { return accept(m.(M)) }
	}
	return t
}

// decode decodes b, which protobuf refused, into m, m's strings taking
// the bytes sent, and reports whether m is accepted so.
func (t *Tolerance) decode(b []byte, m proto.Message) bool {
	return t.mirror.decode(b, m) == nil && (t.accept == nil || t.accept(m))
}

// decoder is the server codec of DecodeOptions. grpc-go turns any error
// of a codec into Internal (recv in rpc_util.go), so a request that does
// not decode is not refused by Unmarshal: Unmarshal leaves it empty, notes
// what was wrong under the message's address, and the interceptors, which
// receive the same message once decoded, answer with the note.
type decoder struct {
	proto    encoding.CodecV2 // grpc-go's, for answers
	tolerate []Tolerance
	// failed holds, by message (a pointer), the *BadRequest of a message
	// Unmarshal refused, until the interceptor that receives it takes it;
	// pending counts them, so that calls skip the map while it is empty.
	failed  sync.Map
	pending atomic.Int64
}

func newDecoder(tolerate ...Tolerance) *decoder {
	return &decoder{proto: encoding.GetCodecV2(encproto.Name), tolerate: tolerate}
}

// Name is the content subtype the codec serves: grpc-go's default.
func (d *decoder) Name() string { return encproto.Name }

// Marshal encodes answers as grpc-go's codec does.
func (d *decoder) Marshal(v any) (mem.BufferSlice, error) { return d.proto.Marshal(v) }

// Unmarshal decodes a request into v. It fails only for a v that is not a
// protobuf message, which no registered service has.
func (d *decoder) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("wire: cannot decode into %T: not a protobuf message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	err := proto.Unmarshal(b, m)
	if err == nil {
		return nil
	}
	proto.Reset(m) // no handler sees half a message
	md := m.ProtoReflect().Descriptor()
	if t := d.tolerance(md.FullName()); t != nil && t.decode(b, m) {
		return nil
	}
	proto.Reset(m)
	d.failed.Store(v, decodeProblem(b, md, err))
	d.pending.Add(1)
	return nil
}

// tolerance returns the Tolerance of the message type name; nil when none.
func (d *decoder) tolerance(name protoreflect.FullName) *Tolerance {
	for i := range d.tolerate {
		if d.tolerate[i].name == name {
			return &d.tolerate[i]
		}
	}
	return nil
}

// take returns, and forgets, the refusal of a message Unmarshal refused;
// nil for any other.
func (d *decoder) take(m any) error {
	if d.pending.Load() == 0 {
		return nil
	}
	bad, ok := d.failed.LoadAndDelete(m)
	if !ok {
		return nil
	}
	d.pending.Add(-1)
	return bad.(*BadRequest).Status()
}

func (d *decoder) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := d.take(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (d *decoder) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, checkedStream{ServerStream: ss, d: d})
}

// checkedStream refuses, from RecvMsg, a message Unmarshal refused.
type checkedStream struct {
	grpc.ServerStream
	d *decoder
}

func (s checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.d.take(m)
}

// lenient decodes a message type whose strings may hold any bytes: a
// message of the same wire form, its strings made bytes (which protobuf
// does not check) and its enums int32, decoded and then copied into the
// real type. It reads every field the real type has, so no field of a
// newer go-control-plane is silently dropped.
type lenient struct {
	typ protoreflect.MessageType // of the mirror, a dynamic message
}

// lenientPackage is the protobuf package of the mirrors, which are
// registered nowhere.
const lenientPackage = "ratelimitd.internal.lenient"

// newLenient builds the mirror of md and of every message it reaches.
func newLenient(md protoreflect.MessageDescriptor) (*lenient, error) {
	file := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("ratelimitd/internal/lenient/" + string(md.FullName()) + ".proto"),
		Package: proto.String(lenientPackage),
		Syntax:  proto.String("proto3"),
	}
	names := map[protoreflect.FullName]string{}
	var queue []protoreflect.MessageDescriptor
	mirror := func(m protoreflect.MessageDescriptor) string {
		n, ok := names[m.FullName()]
		if !ok {
			n = "M" + strconv.Itoa(len(names))
			names[m.FullName()] = n
			queue = append(queue, m)
		}
		return n
	}
	mirror(md)
	for i := 0; i < len(queue); i++ {
		m := queue[i]
		if m.Syntax() != protoreflect.Proto3 {
			return nil, fmt.Errorf("wire: %s is not proto3: its mirror would not decode alike", m.FullName())
		}
		msg := &descriptorpb.DescriptorProto{Name: proto.String(names[m.FullName()])}
		for j := range m.Oneofs().Len() {
			msg.OneofDecl = append(msg.OneofDecl, &descriptorpb.OneofDescriptorProto{Name: proto.String(string(m.Oneofs().Get(j).Name()))})
		}
		for j := range m.Fields().Len() {
			f := m.Fields().Get(j)
			fp := protodesc.ToFieldDescriptorProto(f)
			fp.Options = nil
			switch f.Kind() {
			case protoreflect.StringKind:
				fp.Type = descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum()
			case protoreflect.EnumKind:
				fp.Type, fp.TypeName = descriptorpb.FieldDescriptorProto_TYPE_INT32.Enum(), nil
			case protoreflect.MessageKind:
				// A map's entry becomes a message like any other: the same
				// bytes as a repeated field of key and value.
				fp.TypeName = proto.String("." + lenientPackage + "." + mirror(f.Message()))
			default:
				if f.Message() != nil || f.Enum() != nil {
					return nil, fmt.Errorf("wire: field %s of kind %s cannot be mirrored", f.FullName(), f.Kind())
				}
			}
			msg.Field = append(msg.Field, fp)
		}
		file.MessageType = append(file.MessageType, msg)
	}
	fd, err := protodesc.NewFile(file, new(protoregistry.Files))
	if err != nil {
		return nil, fmt.Errorf("wire: mirror of %s: %w", md.FullName(), err)
	}
	return &lenient{typ: dynamicpb.NewMessageType(fd.Messages().ByName(protoreflect.Name(names[md.FullName()])))}, nil
}

// decode decodes b into m, m's strings taking the bytes sent.
func (l *lenient) decode(b []byte, m proto.Message) error {
	mirror := l.typ.New()
	if err := proto.Unmarshal(b, mirror.Interface()); err != nil {
		return err
	}
	copyMirror(m.ProtoReflect(), mirror)
	return nil
}

// copyMirror copies src, a mirror, into dst, of the real type.
func copyMirror(dst, src protoreflect.Message) {
	fields := dst.Descriptor().Fields()
	src.Range(func(sf protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		df := fields.ByNumber(sf.Number())
		switch {
		case df.IsMap():
			dm := dst.Mutable(df).Map()
			entries := v.List()
			for i := range entries.Len() {
				e := entries.Get(i).Message()
				ef := e.Descriptor().Fields()
				k := fromMirror(df.MapKey(), e.Get(ef.ByNumber(1))).MapKey()
				ev := e.Get(ef.ByNumber(2))
				if df.MapValue().Message() != nil {
					nv := dm.NewValue()
					copyMirror(nv.Message(), ev.Message())
					dm.Set(k, nv)
				} else {
					dm.Set(k, fromMirror(df.MapValue(), ev))
				}
			}
		case df.IsList():
			dl, sl := dst.Mutable(df).List(), v.List()
			for i := range sl.Len() {
				if df.Message() != nil {
					ne := dl.NewElement()
					copyMirror(ne.Message(), sl.Get(i).Message())
					dl.Append(ne)
				} else {
					dl.Append(fromMirror(df, sl.Get(i)))
				}
			}
		case df.Message() != nil:
			copyMirror(dst.Mutable(df).Message(), v.Message())
		default:
			dst.Set(df, fromMirror(df, v))
		}
		return true
	})
	if u := src.GetUnknown(); len(u) > 0 {
		dst.SetUnknown(append(protoreflect.RawFields(nil), u...))
	}
}

// fromMirror converts a scalar of a mirror to field f's kind.
func fromMirror(f protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch f.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(string(v.Bytes()))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(v.Int()))
	}
	return v
}

// decodeProblem says what in b, the wire form of a message of type md,
// protobuf refused (err): the field, and what is wrong with it.
func decodeProblem(b []byte, md protoreflect.MessageDescriptor, err error) *BadRequest {
	if field, msg, found := findProblem(b, md, "", 0); found {
		return &BadRequest{field: field, msg: msg}
	}
	// Not found by the walk (protobuf refuses something it does not
	// know of): protobuf's own words.
	return Bad("", "the request is not a %s: %v", md.FullName(), err)
}

// findProblem walks b, a message of type md at path, as protobuf decodes
// it, and returns the path of the first field protobuf refuses, and why.
func findProblem(b []byte, md protoreflect.MessageDescriptor, path string, depth int) (field, msg string, found bool) {
	if depth > protowire.DefaultRecursionLimit {
		return path, fmt.Sprintf("messages nested deeper than %d levels", protowire.DefaultRecursionLimit), true
	}
	var seen map[protowire.Number]int // occurrences of each repeated field
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return orMessage(path, md), "a field tag does not parse: " + wireError(n), true
		}
		b = b[n:]
		f := md.Fields().ByNumber(num)
		fp := fieldPath(path, f, num)
		if f != nil && (f.IsList() || f.IsMap()) {
			if seen == nil {
				seen = map[protowire.Number]int{}
			}
			fp += "[" + strconv.Itoa(seen[num]) + "]"
			seen[num]++
		}
		var v []byte
		switch {
		case f != nil && typ == protowire.BytesType && f.Message() != nil:
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				if field, msg, found := findProblem(v, f.Message(), fp, depth+1); found {
					return field, msg, true
				}
			}
		case f != nil && typ == protowire.StartGroupType && f.Kind() == protoreflect.GroupKind:
			if v, n = protowire.ConsumeGroup(num, b); n >= 0 {
				if field, msg, found := findProblem(v, f.Message(), fp, depth+1); found {
					return field, msg, true
				}
			}
		case f != nil && typ == protowire.BytesType && f.Kind() == protoreflect.StringKind && enforcesUTF8(f):
			if v, n = protowire.ConsumeBytes(b); n >= 0 && !utf8.Valid(v) {
				i := firstInvalid(v)
				return fp, fmt.Sprintf("not valid UTF-8 (byte %#02x at offset %d of %d): the field carries text", v[i], i, len(v)), true
			}
		case f != nil && typ == protowire.BytesType && f.IsList() && f.Message() == nil && f.Kind() != protoreflect.StringKind && f.Kind() != protoreflect.BytesKind:
			// A packed list: values one after another.
			if v, n = protowire.ConsumeBytes(b); n >= 0 {
				if m := consumePacked(v, f.Kind()); m < 0 {
					return fp, "a packed list does not parse: " + wireError(m), true
				}
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fp, "the value does not parse: " + wireError(n), true
		}
		b = b[n:]
	}
	return "", "", false
}

// consumePacked consumes b as packed values of kind k, returning a
// negative protowire error code if they do not parse.
func consumePacked(b []byte, k protoreflect.Kind) int {
	typ := protowire.VarintType
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		typ = protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		typ = protowire.Fixed64Type
	}
	for len(b) > 0 {
		n := protowire.ConsumeFieldValue(1, typ, b)
		if n < 0 {
			return n
		}
		b = b[n:]
	}
	return 0
}

// fieldPath is the path of field number num (f, nil when md has none
// such) of the message at path: its name as the .proto file spells it.
func fieldPath(path string, f protoreflect.FieldDescriptor, num protowire.Number) string {
	name := "field " + strconv.Itoa(int(num))
	if f != nil {
		name = string(f.Name())
	}
	if path == "" {
		return name
	}
	return path + "." + name
}

// orMessage names the message at path, the request itself at the top.
func orMessage(path string, md protoreflect.MessageDescriptor) string {
	if path == "" {
		return string(md.FullName())
	}
	return path
}

// wireError describes a negative protowire code in words.
func wireError(n int) string {
	err := protowire.ParseError(n)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "the message ends inside it (truncated)"
	}
	return err.Error()
}

// enforcesUTF8 reports whether protobuf refuses field f when it is not
// UTF-8: proto3 strings, and editions strings unless the file opts out.
func enforcesUTF8(f protoreflect.FieldDescriptor) bool {
	if f.Syntax() == protoreflect.Editions {
		if e, ok := f.(interface{ EnforceUTF8() bool }); ok {
			return e.EnforceUTF8()
		}
	}
	return f.Syntax() == protoreflect.Proto3
}

// firstInvalid returns the offset of the first byte of b that does not
// start a valid UTF-8 sequence.
func firstInvalid(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return 0
}
