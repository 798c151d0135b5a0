package wire

import (
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// BadRequest is a request refused for what it carries: a field that does
// not decode, breaks a bound or the API's rules. Make one with [Bad].
type BadRequest struct {
	field string // such as "descriptors[2].entries[0].key"
	msg   string
}

// Bad returns the refusal of field (empty: the request as a whole) for
// the reason format and args say.
func Bad(field, format string, args ...any) *BadRequest {
	return &BadRequest{field: field, msg: fmt.Sprintf(format, args...)}
}

// Error is the field, a colon and the reason; the reason alone when no
// field is named.
func (e *BadRequest) Error() string {
	if e.field == "" {
		return e.msg
	}
	return e.field + ": " + e.msg
}

// Status returns e as gRPC InvalidArgument with a BadRequest detail, so
// clients can tell which field was wrong.
func (e *BadRequest) Status() error {
	st := status.New(codes.InvalidArgument, e.Error())
	if d, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: e.field, Description: e.msg}},
	}); err == nil {
		st = d
	}
	return st.Err()
}
