package client

import (
	"context"
	"errors"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// DefaultTimeout is the deadline of a call whose context has none, unless
// [WithTimeout] says otherwise. A rate-limit decision is on the path of the
// request it decides: it should be quick, or be given up on.
const DefaultTimeout = 100 * time.Millisecond

// Client calls a ratelimitd server. Create it with [New]; it is safe for
// concurrent use.
//
// Every call whose context has no deadline gets one, [DefaultTimeout]
// unless [WithTimeout] says otherwise. Errors are gRPC status errors, as
// grpc/status reads them: Unavailable when the server cannot be reached,
// DeadlineExceeded when it did not answer in time, InvalidArgument for a
// request its bounds refuse.
type Client struct {
	conn    *grpc.ClientConn
	owned   bool // Close closes conn
	own     ratelimitdv1.RateLimiterClient
	rls     rlsv3.RateLimitServiceClient
	timeout time.Duration
}

// Option configures a [Client].
type Option func(*options)

type options struct {
	dial    []grpc.DialOption
	creds   credentials.TransportCredentials
	timeout time.Duration
	conn    *grpc.ClientConn
}

// WithDialOptions adds gRPC dial options to the connection [New] makes,
// after the transport credentials (so a credentials option among them
// wins).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// WithTransportCredentials makes the connection with creds, such as
// credentials.NewTLS for a server started with -grpc-tls-cert.
func WithTransportCredentials(creds credentials.TransportCredentials) Option {
	return func(o *options) { o.creds = creds }
}

// WithInsecure makes the connection in plaintext, the default: it says so
// where the code is read.
func WithInsecure() Option {
	return WithTransportCredentials(insecure.NewCredentials())
}

// WithTimeout sets the deadline of calls whose context has none; d <= 0
// leaves such calls without one. Default [DefaultTimeout].
func WithTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// WithConn makes the client use conn, a connection the caller made and
// closes, instead of making its own: [New] ignores its target, and
// [Client.Close] leaves conn open. It excludes [WithDialOptions] and the
// credentials options, which apply to making a connection.
func WithConn(conn *grpc.ClientConn) Option {
	return func(o *options) { o.conn = conn }
}

// New returns a client of the ratelimitd server at target, a gRPC target
// such as "ratelimitd:8081" or "dns:///ratelimitd.default.svc:8081".
//
// The connection is made lazily, with grpc.NewClient, and in plaintext
// unless [WithTransportCredentials] says otherwise: ratelimitd serves
// plaintext gRPC unless started with -grpc-tls-cert, and is usually
// reached on a private network or a loopback sidecar. Pass TLS
// credentials when the path to it is not trusted.
func New(target string, opts ...Option) (*Client, error) {
	o := options{timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	c := &Client{timeout: o.timeout}
	if o.conn != nil {
		if len(o.dial) > 0 || o.creds != nil {
			return nil, errors.New("client: WithConn excludes WithDialOptions and credentials options: its connection is already made")
		}
		c.conn = o.conn
	} else {
		if target == "" {
			return nil, errors.New("client: empty target")
		}
		creds := o.creds
		if creds == nil {
			creds = insecure.NewCredentials()
		}
		dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, o.dial...)
		conn, err := grpc.NewClient(target, dial...)
		if err != nil {
			return nil, err
		}
		c.conn, c.owned = conn, true
	}
	c.own = ratelimitdv1.NewRateLimiterClient(c.conn)
	c.rls = rlsv3.NewRateLimitServiceClient(c.conn)
	return c, nil
}

// Close closes the client's connection, unless it came from [WithConn].
func (c *Client) Close() error {
	if c.owned {
		return c.conn.Close()
	}
	return nil
}

// Conn returns the client's connection, for other services of the same
// server such as grpc.health.v1.
func (c *Client) Conn() *grpc.ClientConn {
	return c.conn
}

// withDeadline returns ctx with the client's timeout when it has no
// deadline.
func (c *Client) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.timeout > 0 {
		if _, ok := ctx.Deadline(); !ok {
			return context.WithTimeout(ctx, c.timeout)
		}
	}
	return ctx, func() {}
}

// Allow decides a request of domain with ratelimitd.v1.RateLimiter/Check:
// when it is admitted, its hits are counted. The descriptors are decided
// together: either every non-shadow descriptor is within its limits and
// all are counted, or the request is refused and nothing is counted.
//
// An error means no decision was made: the caller chooses whether to
// admit the request anyway (fail open) or not.
func (c *Client) Allow(ctx context.Context, domain string, descriptors ...Descriptor) (Decision, error) {
	resp, err := c.Check(ctx, domain, descriptors...)
	if err != nil {
		return Decision{}, err
	}
	return NewDecision(resp.GetAllowed(), resp.GetResults()), nil
}

// Check is [Client.Allow] with the server's full answer.
func (c *Client) Check(ctx context.Context, domain string, descriptors ...Descriptor) (*ratelimitdv1.CheckResponse, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	return c.own.Check(ctx, &ratelimitdv1.CheckRequest{Domain: domain, Descriptors: protos(descriptors)})
}

// Peek answers as [Client.Check] would, for the same hits, and consumes
// nothing: whether a request would be admitted, and the figures of its
// limits. [NewDecision] makes a [Decision] of its answer.
func (c *Client) Peek(ctx context.Context, domain string, descriptors ...Descriptor) (*ratelimitdv1.PeekResponse, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	return c.own.Peek(ctx, &ratelimitdv1.PeekRequest{Domain: domain, Descriptors: protos(descriptors)})
}

// Reset clears the counters of descriptor d of domain: every limit of the
// rule it matches. It is for operators: the server answers PermissionDenied
// unless started with -enable-reset, and NotFound when no rule with a limit
// matches d.
func (c *Client) Reset(ctx context.Context, domain string, d Descriptor) (*ratelimitdv1.ResetResponse, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	return c.own.Reset(ctx, &ratelimitdv1.ResetRequest{Domain: domain, Descriptor_: d.proto()})
}

// ShouldRateLimit calls Envoy's RateLimitService v3 as Envoy does, for
// callers that build Envoy's requests themselves.
func (c *Client) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	return c.rls.ShouldRateLimit(ctx, req)
}

// AllowRLS is [Client.Allow] through Envoy's RateLimitService v3: the same
// decision and counters, with the fewer figures that API answers (see
// [DecisionFromRLS]). LimiterFunc(c.AllowRLS) is a [Limiter] deciding
// through it.
func (c *Client) AllowRLS(ctx context.Context, domain string, descriptors ...Descriptor) (Decision, error) {
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: make([]*rlv3.RateLimitDescriptor, len(descriptors))}
	for i, d := range descriptors {
		rd := &rlv3.RateLimitDescriptor{Entries: make([]*rlv3.RateLimitDescriptor_Entry, len(d.Entries))}
		for j, e := range d.Entries {
			rd.Entries[j] = &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		if d.HitsAddend > 0 {
			rd.HitsAddend = wrapperspb.UInt64(d.HitsAddend)
		}
		req.Descriptors[i] = rd
	}
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		return Decision{}, err
	}
	return DecisionFromRLS(resp), nil
}

// Limiter decides requests: a [*Client], a [LimiterFunc], or a fake in
// tests. An error means no decision was made.
type Limiter interface {
	Allow(ctx context.Context, domain string, descriptors ...Descriptor) (Decision, error)
}

// LimiterFunc is a function as a [Limiter].
type LimiterFunc func(ctx context.Context, domain string, descriptors ...Descriptor) (Decision, error)

// Allow returns f(ctx, domain, descriptors...).
func (f LimiterFunc) Allow(ctx context.Context, domain string, descriptors ...Descriptor) (Decision, error) {
	return f(ctx, domain, descriptors...)
}

var _ Limiter = (*Client)(nil)
