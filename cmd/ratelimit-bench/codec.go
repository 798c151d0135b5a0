package main

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// shouldRateLimit is the full method name of Envoy's RLS call.
const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// rawRequest is a RateLimitRequest encoded once, before the run: sending
// it costs no marshalling and no allocation.
type rawRequest struct {
	frame mem.BufferSlice // one SliceBuffer over the encoded message
}

// newRawRequest encodes req.
func newRawRequest(req *rlsv3.RateLimitRequest) (*rawRequest, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	return &rawRequest{frame: mem.BufferSlice{mem.SliceBuffer(b)}}, nil
}

// reply is what the generator keeps of a RateLimitResponse: the overall
// code and how many descriptor statuses had each code.
type reply struct {
	overall                rlsv3.RateLimitResponse_Code
	ok, overLimit, unknown uint32
	statuses               uint32
	scratch                []byte // a reply split over several buffers is joined here
}

// The field numbers the reply parser reads, taken from the generated
// descriptors rather than written down.
var (
	fieldOverallCode = fieldNumber(&rlsv3.RateLimitResponse{}, "overall_code")
	fieldStatuses    = fieldNumber(&rlsv3.RateLimitResponse{}, "statuses")
	fieldStatusCode  = fieldNumber(&rlsv3.RateLimitResponse_DescriptorStatus{}, "code")
)

func fieldNumber(m proto.Message, name string) protowire.Number {
	f := m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(name))
	if f == nil {
		panic(fmt.Sprintf("%T has no field %s", m, name))
	}
	return f.Number()
}

// parse reads an encoded RateLimitResponse, skipping every field but the
// codes: far cheaper than unmarshalling the whole message.
func (r *reply) parse(b []byte) error {
	r.overall, r.ok, r.overLimit, r.unknown, r.statuses = 0, 0, 0, 0, 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == fieldOverallCode && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			r.overall = rlsv3.RateLimitResponse_Code(v)
			b = b[n:]
		case num == fieldStatuses && typ == protowire.BytesType:
			s, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			code, err := statusCode(s)
			if err != nil {
				return err
			}
			r.statuses++
			switch code {
			case rlsv3.RateLimitResponse_OK:
				r.ok++
			case rlsv3.RateLimitResponse_OVER_LIMIT:
				r.overLimit++
			default:
				r.unknown++
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

// statusCode reads the code of an encoded DescriptorStatus.
func statusCode(b []byte) (rlsv3.RateLimitResponse_Code, error) {
	var code rlsv3.RateLimitResponse_Code
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if num == fieldStatusCode && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			code = rlsv3.RateLimitResponse_Code(v)
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return code, nil
}

// rawCodec sends a *rawRequest's bytes as they are and parses answers
// into a *reply. Forced on the generator's calls only: the server sees
// ordinary protobuf (its content-subtype stays "proto").
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*rawRequest)
	if !ok {
		return nil, fmt.Errorf("ratelimit-bench codec: cannot send %T", v)
	}
	return r.frame, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*reply)
	if !ok {
		return fmt.Errorf("ratelimit-bench codec: cannot read into %T", v)
	}
	if len(data) == 1 {
		return r.parse(data[0].ReadOnlyData())
	}
	r.scratch = r.scratch[:0]
	for _, buf := range data {
		r.scratch = append(r.scratch, buf.ReadOnlyData()...)
	}
	return r.parse(r.scratch)
}
