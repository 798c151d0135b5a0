// Package xdstest runs an xDS control plane in the test's process:
// go-control-plane's own ADS server and snapshot cache, serving
// RateLimitConfig resources on a free loopback port, and recording every
// DiscoveryRequest it receives so tests can see ACKs and NACKs.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Server is a running control plane.
type Server struct {
	// Addr is where it listens, 127.0.0.1:port; it keeps it across
	// Stop and Restart.
	Addr string

	cache  cachev3.SnapshotCache
	tls    *tls.Config
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	gs       *grpc.Server
	requests []*discoveryv3.DiscoveryRequest
	opens    int
	md       metadata.MD // of the last stream opened
}

// Start starts a control plane on a free loopback port, with TLS when
// tlsConfig is not nil. It stops when t ends.
func Start(t testing.TB, tlsConfig *tls.Config) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), tls: tlsConfig, ctx: ctx, cancel: cancel}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = lis.Addr().String()
	s.serve(lis)
	t.Cleanup(func() {
		s.Stop()
		cancel()
	})
	return s
}

func (s *Server) serve(lis net.Listener) {
	var opts []grpc.ServerOption
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	gs := grpc.NewServer(opts...)
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			s.mu.Lock()
			s.opens++
			s.md = md
			s.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
			s.mu.Lock()
			s.requests = append(s.requests, proto.Clone(req).(*discoveryv3.DiscoveryRequest))
			s.mu.Unlock()
			return nil
		},
	}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(s.ctx, s.cache, cb))
	s.mu.Lock()
	s.gs = gs
	s.mu.Unlock()
	go gs.Serve(lis)
}

// Stop stops serving at once, breaking every stream.
func (s *Server) Stop() {
	s.mu.Lock()
	gs := s.gs
	s.gs = nil
	s.mu.Unlock()
	if gs != nil {
		gs.Stop()
	}
}

// Restart serves again on the same address, with the same snapshots.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	var lis net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if lis, err = net.Listen("tcp", s.Addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("xdstest: listening again on %s: %v", s.Addr, err)
	}
	s.serve(lis)
}

// Set serves configs as the snapshot of version for node nodeID.
func (s *Server) Set(t testing.TB, nodeID, version string, configs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]cachetypes.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]cachetypes.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		t.Fatal(err)
	}
}

// Requests returns every DiscoveryRequest received so far, in order.
func (s *Server) Requests() []*discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discoveryv3.DiscoveryRequest(nil), s.requests...)
}

// Opens returns how many streams were opened.
func (s *Server) Opens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opens
}

// Header returns the values of gRPC metadata key on the last stream
// opened.
func (s *Server) Header(key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.md.Get(key)
}

// Node returns the node of the first request, nil before any.
func (s *Server) Node() *corev3.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.requests) == 0 {
		return nil
	}
	return s.requests[0].GetNode()
}

// WaitRequest waits up to timeout for a request that match accepts and
// returns it; it fails t when none comes.
func (s *Server) WaitRequest(t testing.TB, timeout time.Duration, what string, match func(*discoveryv3.DiscoveryRequest) bool) *discoveryv3.DiscoveryRequest {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, r := range s.Requests() {
			if match(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("xdstest: no %s within %v; requests:\n%s", what, timeout, s.dump())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *Server) dump() string {
	var b strings.Builder
	for _, r := range s.Requests() {
		b.WriteString("  version=" + r.GetVersionInfo() + " nonce=" + r.GetResponseNonce())
		if r.GetErrorDetail() != nil {
			b.WriteString(" error=" + r.GetErrorDetail().GetMessage())
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// ACK matches the ACK of version.
func ACK(version string) func(*discoveryv3.DiscoveryRequest) bool {
	return func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetErrorDetail() == nil && r.GetResponseNonce() != "" && r.GetVersionInfo() == version
	}
}

// NACK matches a NACK whose error text holds text, sent while version
// was in force.
func NACK(version, text string) func(*discoveryv3.DiscoveryRequest) bool {
	return func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetErrorDetail() != nil && r.GetVersionInfo() == version && strings.Contains(r.GetErrorDetail().GetMessage(), text)
	}
}

// Limit is a RateLimitConfig for domain with one descriptor key=value
// limited to n per unit, named name.
func Limit(name, domain, key, value string, n uint32, unit rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: key, Value: value, RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n},
	}}}
}
