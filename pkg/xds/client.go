package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// TypeURL is the type of the resources the client subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Defaults of [Options].
const (
	DefaultNodeID         = "default"
	DefaultBackoffInitial = time.Second
	DefaultBackoffMax     = time.Minute
)

// A stream whose connection died silently (a peer gone without a FIN) is
// found by pings: after keepaliveTime without traffic, one ping, answered
// within keepaliveTimeout. Five minutes is the least interval gRPC servers
// accept by default (their enforcement policy's MinTime).
const (
	keepaliveTime    = 5 * time.Minute
	keepaliveTimeout = 20 * time.Second
)

// maxErrorDetail bounds the error text a NACK carries.
const maxErrorDetail = 16 << 10

// TLS configures the connection to the control plane. The zero value
// means plaintext.
type TLS struct {
	// Enabled turns TLS on; any file or ServerName below implies it.
	Enabled bool
	// CA is a PEM file of the CAs the server's certificate must chain to;
	// empty: the system's.
	CA string
	// Cert and Key are PEM files of a client certificate and its key, for
	// mutual TLS; both or neither.
	Cert, Key string
	// ServerName is the name the server's certificate must hold; empty:
	// the host of Options.Server.
	ServerName string
}

func (t TLS) on() bool {
	return t.Enabled || t.CA != "" || t.Cert != "" || t.Key != "" || t.ServerName != ""
}

// config reads the files of t into a client TLS configuration. The files
// are read again at every connection attempt, so certificates rotated on
// disk are used from the next reconnect on.
func (t TLS) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CA != "" {
		data, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("xDS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("xDS CA file %s: no valid PEM certificate in it", t.CA)
		}
		cfg.RootCAs = pool
	}
	switch {
	case t.Cert != "" && t.Key != "":
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("xDS client certificate %s and key %s: %w", t.Cert, t.Key, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case t.Cert != "" || t.Key != "":
		return nil, errors.New("xDS client certificate and key go together: give both or neither")
	}
	return cfg, nil
}

// Options configure a [Client].
type Options struct {
	// Server is the control plane's gRPC target, such as "host:18000".
	// Required.
	Server string
	// NodeID identifies this replica to the control plane, which picks
	// the snapshot to serve by it. Default DefaultNodeID.
	NodeID string
	// NodeMetadata is sent as the node's metadata, each value a string.
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata on the stream (authorization, say).
	// They are never logged.
	Headers map[string]string
	// TLS secures the connection; plaintext when off.
	TLS TLS
	// BackoffInitial and BackoffMax bound the wait before reconnecting
	// after the stream failed: it doubles from BackoffInitial up to
	// BackoffMax with each failure in a row, and each wait is drawn at
	// random between half that and all of it. A stream that delivered a
	// response starts the sequence again. The same waits space out NACKs
	// of a rejected version the server sends again. Defaults
	// DefaultBackoffInitial, DefaultBackoffMax.
	BackoffInitial, BackoffMax time.Duration
	// OnRules receives each valid rule set with its version_info, from the
	// goroutine of Run, before it is ACKed. Required.
	OnRules func(rules *config.Rules, version string)
	// OnReject, when set, receives the error of each response rejected
	// (NACKed), from the goroutine of Run; the last good rules stay.
	OnReject func(err error)
	// Logger receives the client's logs. Default: discard them.
	Logger *slog.Logger
	// Now is the clock of Status.LastUpdate. Default time.Now.
	Now func() time.Time
	// After waits, as time.After does; tests may make it instant. Default
	// time.After.
	After func(time.Duration) <-chan time.Time
	// Rand returns a number in [0, 1) for the jitter of the backoff.
	// Default math/rand/v2's Float64.
	Rand func() float64
	// DialOptions are added to those of every connection.
	DialOptions []grpc.DialOption
}

// Status is what the client knows about its control plane.
type Status struct {
	Server string
	// Version is the version_info of the rules in force; "" before any.
	Version string
	// Connected is true while a stream to the server is open.
	Connected bool
	// LastError is the reason the last response was rejected (NACKed),
	// "" when the last response was accepted.
	LastError string
	// StreamError is why the last stream ended; "" before any ended.
	StreamError string
	// Updates counts responses accepted and ACKed, Rejections those
	// NACKed, StreamErrors the streams that failed or could not open.
	Updates, Rejections, StreamErrors uint64
	// LastUpdate is when rules were last accepted; zero before any.
	LastUpdate time.Time
}

// Client is a State-of-the-World ADS client for RateLimitConfig resources.
// Build it with [New] and run it with [Client.Run]; Status and Ready may be
// called from any goroutine.
type Client struct {
	opts  Options
	node  *corev3.Node
	log   *slog.Logger
	ready chan struct{}

	mu     sync.Mutex
	status Status
}

// New checks opts and returns a client; nothing is dialed before Run.
// Files of TLS are read once now, so that a missing or bad file is an error
// at start.
func New(opts Options) (*Client, error) {
	if opts.Server == "" {
		return nil, errors.New("xds: no server address")
	}
	if opts.OnRules == nil {
		return nil, errors.New("xds: nil OnRules")
	}
	if opts.NodeID == "" {
		opts.NodeID = DefaultNodeID
	}
	if opts.BackoffInitial == 0 {
		opts.BackoffInitial = DefaultBackoffInitial
	}
	if opts.BackoffMax == 0 {
		opts.BackoffMax = max(DefaultBackoffMax, opts.BackoffInitial)
	}
	if opts.BackoffInitial < 0 || opts.BackoffMax < opts.BackoffInitial {
		return nil, fmt.Errorf("xds: backoff from %v to %v: the initial wait must be positive and at most the maximum", opts.BackoffInitial, opts.BackoffMax)
	}
	if opts.TLS.on() {
		if _, err := opts.TLS.config(); err != nil {
			return nil, err
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.After == nil {
		opts.After = time.After
	}
	if opts.Rand == nil {
		opts.Rand = rand.Float64
	}
	md := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(opts.NodeMetadata))}
	for k, v := range opts.NodeMetadata {
		md.Fields[k] = structpb.NewStringValue(v)
	}
	c := &Client{
		opts:  opts,
		node:  &corev3.Node{Id: opts.NodeID, Metadata: md, UserAgentName: "ratelimitd"},
		log:   opts.Logger.With("xds_server", opts.Server),
		ready: make(chan struct{}),
	}
	c.status.Server = opts.Server
	return c, nil
}

// Status returns a copy of the client's status.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// Ready is closed once the first valid rules were handed to OnRules.
func (c *Client) Ready() <-chan struct{} { return c.ready }

// backoff returns the wait before retry n (0 for the first): drawn
// between half and all of BackoffInitial × 2^n, capped at BackoffMax.
func (c *Client) backoff(n int) time.Duration {
	d := c.opts.BackoffInitial
	for i := 0; i < n && d < c.opts.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, c.opts.BackoffMax)
	return d/2 + time.Duration(c.opts.Rand()*float64(d/2))
}

// Run keeps a stream to the server open until ctx is done, reconnecting
// with backoff whenever it fails, and returns nil then.
func (c *Client) Run(ctx context.Context) error {
	failures := 0
	for {
		delivered, err := c.stream(ctx)
		if ctx.Err() != nil {
			c.setConnected(false)
			return nil
		}
		if delivered {
			failures = 0
		}
		wait := c.backoff(failures)
		failures++
		c.mu.Lock()
		c.status.Connected = false
		c.status.StreamError = err.Error()
		c.status.StreamErrors++
		c.mu.Unlock()
		c.log.Warn("xDS stream failed; reconnecting", "error", err, "retry_in", wait, "attempt", failures)
		select {
		case <-ctx.Done():
			return nil
		case <-c.opts.After(wait):
		}
	}
}

func (c *Client) setConnected(v bool) {
	c.mu.Lock()
	c.status.Connected = v
	c.mu.Unlock()
}

// stream runs one ADS stream until it fails; delivered reports whether a
// response arrived on it.
func (c *Client) stream(ctx context.Context) (delivered bool, err error) {
	creds := insecure.NewCredentials()
	if c.opts.TLS.on() {
		cfg, err := c.opts.TLS.config()
		if err != nil {
			return false, err
		}
		creds = credentials.NewTLS(cfg)
	}
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithKeepaliveParams(keepalive.ClientParameters{
		Time: keepaliveTime, Timeout: keepaliveTimeout,
	})}, c.opts.DialOptions...)
	conn, err := grpc.NewClient(c.opts.Server, dial...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.opts.Headers) > 0 {
		sctx = metadata.NewOutgoingContext(sctx, metadata.New(c.opts.Headers))
	}
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	// The first request carries the version in force, as Envoy's does, so
	// that a server that still has it may skip sending it again.
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL, VersionInfo: c.Status().Version}); err != nil {
		return false, fmt.Errorf("sending the subscription: %w", err)
	}
	c.setConnected(true)
	c.log.Info("xDS stream open", "node_id", c.opts.NodeID, "type_url", TypeURL)
	var rejected struct {
		version string
		times   int
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return delivered, err
		}
		delivered = true
		req, problem := c.handle(resp)
		if problem == nil {
			rejected.version, rejected.times = "", 0
		} else {
			// A server may send a rejected version again at once (the
			// snapshot cache of go-control-plane does); answering each at
			// once would spin both. Repeats are NACKed after a wait.
			if resp.GetVersionInfo() == rejected.version {
				wait := c.backoff(rejected.times)
				rejected.times++
				select {
				case <-ctx.Done():
					return delivered, ctx.Err()
				case <-c.opts.After(wait):
				}
			} else {
				rejected.version, rejected.times = resp.GetVersionInfo(), 0
			}
		}
		if err := st.Send(req); err != nil {
			return delivered, fmt.Errorf("sending an ACK or NACK: %w", err)
		}
	}
}

// handle applies resp and returns the ACK or NACK to send, with the reason
// of a NACK.
func (c *Client) handle(resp *discoveryv3.DiscoveryResponse) (*discoveryv3.DiscoveryRequest, error) {
	req := &discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
	var rules *config.Rules
	var err error
	if resp.GetTypeUrl() != TypeURL {
		err = fmt.Errorf("response of type %q; this client subscribes to %s only", resp.GetTypeUrl(), TypeURL)
	} else {
		rules, err = Parse(resp.GetResources())
	}
	version := resp.GetVersionInfo()
	if err != nil {
		msg := err.Error()
		if len(msg) > maxErrorDetail {
			msg = msg[:maxErrorDetail] + "…"
		}
		c.mu.Lock()
		req.VersionInfo = c.status.Version // NACK: the version still in force
		c.status.LastError = msg
		c.status.Rejections++
		c.mu.Unlock()
		req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: msg}
		c.log.Error("xDS rules rejected (NACK); the last good rules keep serving", "version", version, "nonce", resp.GetNonce(), "error", msg)
		if c.opts.OnReject != nil {
			c.opts.OnReject(err)
		}
		return req, err
	}
	c.opts.OnRules(rules, version)
	c.mu.Lock()
	c.status.Version = version
	c.status.LastError = ""
	c.status.Updates++
	c.status.LastUpdate = c.opts.Now()
	first := c.status.Updates == 1
	c.mu.Unlock()
	if first {
		close(c.ready)
	}
	req.VersionInfo = version
	c.log.Info("xDS rules applied (ACK)", "version", version, "resources", len(resp.GetResources()),
		"domains", len(rules.Domains()), "hash", rules.Hash())
	return req, nil
}

// ParsePairs parses "k1=v1,k2=v2" (node metadata, headers). Spaces around
// keys and values are trimmed; an empty string is no pairs.
func ParsePairs(s string) (map[string]string, error) {
	out := make(map[string]string)
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for item := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(item, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value; expected k1=v1,k2=v2", strings.TrimSpace(item))
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("key %q given twice", k)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}
