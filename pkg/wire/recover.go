package wire

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Messages of a recovered panic. Neither says more: the panic value and
// the stack go to the log, not to callers.
const (
	internalErrorGRPC = "internal error (logged)"
	internalErrorHTTP = "internal error"
)

// Bounds on what a recovered panic's log line carries from a request or
// the stack, so a request cannot make the line arbitrarily long.
const (
	maxLoggedField = 1 << 10 // bytes of a domain or a path
	maxLoggedStack = 8 << 10 // bytes of the stack
)

// RecoverUnary returns a gRPC unary server interceptor that keeps a panic
// in a handler from ending the process. The panic is logged at error level
// with the method, the request's domain (when the request has a GetDomain
// method, as a RateLimitRequest does), the panic value and the stack from
// the function that panicked down; panics, if not nil, is incremented; and
// the caller gets codes.Internal with the message "internal error
// (logged)". A nil log logs to [slog.Default].
//
// Install it first in the chain, so it also covers the interceptors after
// it:
//
//	grpc.NewServer(grpc.ChainUnaryInterceptor(wire.RecoverUnary(log, &panics), ...))
func RecoverUnary(log *slog.Logger, panics *atomic.Uint64) grpc.UnaryServerInterceptor {
	rec := newRecoverer(log, panics)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			attrs := []slog.Attr{slog.String("method", info.FullMethod)}
			if r, ok := req.(interface{ GetDomain() string }); ok {
				attrs = append(attrs, slog.String("domain", clip(r.GetDomain(), maxLoggedField)))
			}
			rec.report(ctx, "panic in gRPC handler", p, attrs...)
			resp, err = nil, status.Error(codes.Internal, internalErrorGRPC)
		}()
		return handler(ctx, req)
	}
}

// RecoverStream is [RecoverUnary] for streaming calls (grpc.health.v1's
// Watch, server reflection). The stream ends with codes.Internal; the log
// line has no domain.
func RecoverStream(log *slog.Logger, panics *atomic.Uint64) grpc.StreamServerInterceptor {
	rec := newRecoverer(log, panics)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			rec.report(ss.Context(), "panic in gRPC handler", p, slog.String("method", info.FullMethod))
			err = status.Error(codes.Internal, internalErrorGRPC)
		}()
		return handler(srv, ss)
	}
}

// RecoverHTTP wraps next so that a panic in it is logged at error level
// with the method, the path, the panic value and the stack, panics (if
// not nil) is incremented, and the client gets 500 with the JSON body
// {"error":"internal error"}: the only 500 the service answers. A nil log
// logs to [slog.Default].
//
// When next had already started its response, the status can no longer
// change: the response is cut short instead (by panicking with
// [http.ErrAbortHandler], which net/http handles without a log line of its
// own), so the client sees a broken response rather than a whole-looking
// one. A panic with http.ErrAbortHandler itself passes through, neither
// logged nor counted: it is how a handler aborts on purpose.
func RecoverHTTP(log *slog.Logger, panics *atomic.Uint64, next http.Handler) http.Handler {
	rec := newRecoverer(log, panics)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &committedWriter{ResponseWriter: w}
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p == http.ErrAbortHandler {
				panic(p)
			}
			rec.report(r.Context(), "panic in HTTP handler", p,
				slog.String("method", r.Method), slog.String("path", clip(r.URL.Path, maxLoggedField)))
			if cw.committed {
				panic(http.ErrAbortHandler)
			}
			WriteJSONError(w, http.StatusInternalServerError, internalErrorHTTP)
		}()
		next.ServeHTTP(cw, r)
	})
}

// Recovery is the panic recovery of a process: one logger and one count
// of the panics recovered, shared by every server it wraps, so that the
// count covers them all. Create it with [NewRecovery]; it is safe for
// concurrent use.
type Recovery struct {
	log    *slog.Logger
	panics atomic.Uint64
}

// NewRecovery returns a Recovery logging to log; a nil log logs to
// [slog.Default].
func NewRecovery(log *slog.Logger) *Recovery {
	return &Recovery{log: log}
}

// ServerOptions returns the gRPC server options that recover panics in
// unary and streaming handlers ([RecoverUnary], [RecoverStream]). The
// interceptors they chain run after those chained before them.
func (r *Recovery) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(r.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(r.StreamInterceptor()),
	}
}

// UnaryInterceptor recovers panics in unary handlers; see [RecoverUnary].
func (r *Recovery) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return RecoverUnary(r.log, &r.panics)
}

// StreamInterceptor recovers panics in streaming handlers; see
// [RecoverStream].
func (r *Recovery) StreamInterceptor() grpc.StreamServerInterceptor {
	return RecoverStream(r.log, &r.panics)
}

// WrapHTTP recovers panics in h; see [RecoverHTTP].
func (r *Recovery) WrapHTTP(h http.Handler) http.Handler {
	return RecoverHTTP(r.log, &r.panics, h)
}

// Panics returns how many panics were recovered.
func (r *Recovery) Panics() uint64 { return r.panics.Load() }

// recoverer reports recovered panics.
type recoverer struct {
	log    *slog.Logger
	panics *atomic.Uint64
}

func newRecoverer(log *slog.Logger, panics *atomic.Uint64) recoverer {
	if log == nil {
		log = slog.Default()
	}
	return recoverer{log: log, panics: panics}
}

// report counts and logs panic p. It must be called by the deferred
// function that recovered p, so that the stack still holds the frames that
// panicked.
func (r recoverer) report(ctx context.Context, msg string, p any, attrs ...slog.Attr) {
	if r.panics != nil {
		r.panics.Add(1)
	}
	// fmt.Sprint recovers from a String or Error method that panics too.
	attrs = append(attrs, slog.String("panic", fmt.Sprint(p)), slog.String("stack", panicStack()))
	r.log.LogAttrs(ctx, slog.LevelError, msg, attrs...)
}

// panicStack returns the stack of the panicking goroutine from the function
// that panicked down, at most maxLoggedStack bytes of it. The frames above
// it (the goroutine header, debug.Stack, this function, the deferred
// function and runtime's panic frame) say nothing about the bug.
func panicStack() string {
	s := debug.Stack()
	// The first "panic(" frame is the most recent panic, the one being
	// recovered; each frame is a function line and a file:line line.
	if i := bytes.Index(s, []byte("\npanic(")); i >= 0 {
		rest := s[i+1:]
		if j := bytes.IndexByte(rest, '\n'); j >= 0 {
			if k := bytes.IndexByte(rest[j+1:], '\n'); k >= 0 {
				s = rest[j+1+k+1:]
			}
		}
	}
	if len(s) > maxLoggedStack {
		s = append(s[:maxLoggedStack:maxLoggedStack], "\n..."...)
	}
	return string(bytes.TrimRight(s, "\n"))
}

// clip returns s, cut to at most n bytes.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// committedWriter records whether the response has started: after that,
// its status is on its way to the client and can no longer change.
type committedWriter struct {
	http.ResponseWriter
	committed bool
}

func (w *committedWriter) WriteHeader(code int) {
	w.ResponseWriter.WriteHeader(code)
	// 1xx responses are informational: the final status is still to come.
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.committed = true
	}
}

func (w *committedWriter) Write(b []byte) (int, error) {
	w.committed = true
	return w.ResponseWriter.Write(b)
}

// Flush sends what is buffered, which starts the response.
func (w *committedWriter) Flush() {
	if http.NewResponseController(w.ResponseWriter).Flush() == nil {
		w.committed = true
	}
}

// Unwrap lets [http.ResponseController] reach the writer's other methods.
func (w *committedWriter) Unwrap() http.ResponseWriter {
	return w.ResponseWriter
}
