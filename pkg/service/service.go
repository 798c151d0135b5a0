// Package service serves rate-limit decisions: Envoy's RateLimitService v3
// over gRPC (with grpc.health.v1 and server reflection), and the HTTP
// endpoints /json, /healthcheck and /rlconfig.
//
// A [Service] is handed its [algo.Backend] and its [config.Rules]; it builds
// neither. It matches each descriptor of a request to a rule, asks the
// backend to decide all of them as one atomic batch, and answers in the
// caller's protocol.
package service

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// Options configure a [Service]. The zero value selects every default.
type Options struct {
	// Logger receives the service's logs. Default: discard them.
	Logger *slog.Logger
	// Recovery recovers the panics of the service's handlers, and counts
	// them for [Service.Panics]. Give every server of the process the same
	// one, so that Panics counts theirs too. Default: a Recovery of the
	// service's own, logging to Logger.
	Recovery *wire.Recovery
	// Bounds limit what one request may carry.
	Bounds Bounds
	// FailureMode is what a decision is when the backend fails, for
	// domains whose rule file does not say (failure_mode). Default open.
	FailureMode config.FailureMode
	// Fallback decides while the backend fails, for domains in failure
	// mode local; without it they answer as in mode open.
	Fallback algo.Backend
	// LocalShare scales every limit decided by Fallback: each replica
	// admits ceil(N × LocalShare) (and as much of the burst), so that k
	// replicas with a share of 1/k admit about N together. Default 1.
	LocalShare float64
	// Now is the clock the service's own bookkeeping reads (how often a
	// failure is logged, how long a backend call took). Default time.Now.
	Now func() time.Time
	// Observer, when set, is told of every decision and backend call.
	Observer Observer
	// EnableReset lets ratelimitd.v1.RateLimiter/Reset clear counters; it
	// answers PermissionDenied otherwise.
	EnableReset bool
	// NearLimitRatio is the share of a limit past which an admitted
	// descriptor counts as near its limit. Default DefaultNearLimitRatio.
	NearLimitRatio float64
	// ResponseHeaders is the style of the rate-limit headers answers ask
	// Envoy to add (response_headers_to_add), and POST /json sends. Default
	// HeadersNone: none. See [HeaderStyle].
	ResponseHeaders HeaderStyle
	// DynamicMetadata has every answer of Envoy's API carry
	// dynamic_metadata as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA
	// does: the domain, the descriptors, and the merged metadata of the
	// rules of the descriptors that passed (see dynamicMetadata), which
	// Envoy keeps for later filters, such as quota-aware routing.
	DynamicMetadata bool
	// HeaderNames names the headers of the styles HeadersRateLimit and
	// HeadersReference. The zero value names them RateLimit-Limit,
	// RateLimit-Remaining and RateLimit-Reset.
	HeaderNames HeaderNames
	// Leases, when set, tells what this replica holds of the counters of
	// leased limits (the lease engine in front of the backend): Peek,
	// Check and POST /explain show it. Nil when nothing is leased.
	Leases algo.LeaseReader
	// Global, when set, tells what this region knows of the counters of
	// limits of scope: global (the region engine in front of the
	// backend): POST /explain shows it. Nil without a region.
	Global algo.GlobalReader
	// ShadowMode answers every request of Envoy's API OK, as
	// envoyproxy/ratelimit's SHADOW_MODE does: each descriptor is decided,
	// counted and reported (OVER_LIMIT included) as usual; only the
	// overall code never refuses.
	ShadowMode bool
	// QuotaMode decides every descriptor but unlimited ones as a quota
	// descriptor (envoyproxy/ratelimit's QUOTA_MODE): those of rules, as if
	// each had quota_mode: true, limit overrides, and those that matched
	// no rule or a replaced rule, which are within their limit.
	QuotaMode bool
	// OverLimitHits is what becomes of hits beyond what remains for the
	// limits whose rule does not say (rate_limit.over_limit_hits) and for
	// limit overrides: drop (the default) refuses them and counts nothing;
	// count counts them anyway and still answers OVER_LIMIT, and counts a
	// request refused by another descriptor, as envoyproxy/ratelimit does.
	OverLimitHits config.OverLimitHits
	// ReferenceKeys gives every limit envoyproxy/ratelimit could hold
	// too (a rule's single fixed window of one unit, exact, or a limit
	// override of one unit) its key in that implementation's layout as
	// well ([algo.Request.RefKey]), so that a backend shared with
	// reference pods (Redis, -redis-key-format reference) counts there.
	ReferenceKeys bool
	// Reserve is how the limits whose rule does not set rate_limit.reserve
	// reserve, when they can (a fixed window, exact, of its region): off
	// (the zero value), auto or a fixed number of hits. See
	// [Service.ShouldRateLimit] and docs/ai-gateway.md.
	Reserve config.Reserve
}

// Service decides rate limits. Create it with [New]; it is safe for
// concurrent use.
type Service struct {
	backend algo.Backend
	rules   atomic.Pointer[config.Rules]
	// reserving holds what the limits that reserve learnt, under the rules
	// in force (or those just replaced: see reserving.of);
	// reserveDefault is Options.Reserve.
	reserving      atomic.Pointer[reserving]
	reserveDefault config.Reserve
	log            *slog.Logger
	bounds         Bounds
	health         *health.Server
	// draining is set by Drain: health checks then report not serving.
	draining atomic.Bool
	// unhealthy holds the components that make health checks report not
	// serving ([Service.SetUnhealthy]), each with its reason; nil when none.
	unhealthy atomic.Pointer[map[string]string]
	healthMu  sync.Mutex // serializes SetUnhealthy
	scratch   sync.Pool  // of *scratch

	failureMode config.FailureMode
	fallback    algo.Backend
	localShare  float64
	now         func() time.Time
	degraded    [numFailureModes]atomic.Uint64
	failureLog  logLimiter
	recovery    *wire.Recovery // counts handler panics; see Panics

	observer        Observer
	reporter        ReportObserver // observer, when it is one
	nearLimitRatio  float64
	enableReset     bool
	headers         HeaderStyle
	headerNames     HeaderNames
	dynamicMetadata bool
	leases          algo.LeaseReader
	global          algo.GlobalReader
	shadowMode      bool
	quotaMode       bool
	overLimit       config.OverLimitHits
	referenceKeys   bool
}

// New returns a service deciding with backend under rules.
func New(backend algo.Backend, rules *config.Rules, opts Options) (*Service, error) {
	if backend == nil {
		return nil, errors.New("service: nil backend")
	}
	if rules == nil {
		return nil, errors.New("service: nil rules")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Recovery == nil {
		opts.Recovery = wire.NewRecovery(opts.Logger)
	}
	if opts.FailureMode == "" {
		opts.FailureMode = config.FailOpen
	}
	if failureIndex(opts.FailureMode) < 0 {
		return nil, fmt.Errorf("service: unknown failure mode %q", opts.FailureMode)
	}
	if opts.LocalShare == 0 {
		opts.LocalShare = 1
	}
	if !(opts.LocalShare > 0 && opts.LocalShare <= 1) {
		return nil, fmt.Errorf("service: local share %v is not in (0, 1]", opts.LocalShare)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.NearLimitRatio == 0 {
		opts.NearLimitRatio = DefaultNearLimitRatio
	}
	if !(opts.NearLimitRatio > 0 && opts.NearLimitRatio <= 1) {
		return nil, fmt.Errorf("service: near-limit ratio %v is not in (0, 1]", opts.NearLimitRatio)
	}
	if opts.OverLimitHits > config.OverLimitCount {
		return nil, fmt.Errorf("service: unknown over_limit_hits %d", opts.OverLimitHits)
	}
	if opts.ResponseHeaders > HeadersReference {
		return nil, fmt.Errorf("service: unknown response header style %d", opts.ResponseHeaders)
	}
	if err := opts.HeaderNames.Check(); err != nil {
		return nil, fmt.Errorf("service: response header names: %w", err)
	}
	s := &Service{
		backend:     backend,
		log:         opts.Logger,
		bounds:      opts.Bounds.withDefaults(),
		health:      health.NewServer(),
		failureMode: opts.FailureMode,
		fallback:    opts.Fallback,
		localShare:  opts.LocalShare,
		now:         opts.Now,
		failureLog:  logLimiter{every: failureLogInterval},
		recovery:    opts.Recovery,

		observer:        opts.Observer,
		nearLimitRatio:  opts.NearLimitRatio,
		enableReset:     opts.EnableReset,
		headers:         opts.ResponseHeaders,
		headerNames:     opts.HeaderNames.withDefaults(),
		dynamicMetadata: opts.DynamicMetadata,
		leases:          opts.Leases,
		global:          opts.Global,
		shadowMode:      opts.ShadowMode,
		quotaMode:       opts.QuotaMode,
		overLimit:       opts.OverLimitHits.Or(config.OverLimitDrop),
		referenceKeys:   opts.ReferenceKeys,
	}
	s.reporter, _ = opts.Observer.(ReportObserver)
	s.reserveDefault = opts.Reserve
	s.reserving.Store(newReserving(rules, opts.Reserve, nil))
	s.rules.Store(rules)
	s.health.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ratelimitdv1.RateLimiter_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// Rules returns the rules in force.
func (s *Service) Rules() *config.Rules {
	return s.rules.Load()
}

// SetRules replaces the rules in force. Requests already being decided
// finish under the rules they started with.
func (s *Service) SetRules(r *config.Rules) {
	if r != nil {
		s.reserving.Store(newReserving(r, s.reserveDefault, s.reserving.Load()))
		s.rules.Store(r)
	}
}

// RegisterGRPC registers the Envoy RateLimitService v3, ratelimitd's own
// ratelimitd.v1.RateLimiter, grpc.health.v1 and server reflection (so
// grpcurl needs no proto files) on gs.
func (s *Service) RegisterGRPC(gs *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	ratelimitdv1.RegisterRateLimiterServer(gs, ownAPI{s: s})
	healthpb.RegisterHealthServer(gs, s.health)
	reflection.Register(gs)
}

// API returns ratelimitd.v1.RateLimiter as RegisterGRPC serves it, for
// callers in the same process (the ops console peeks and resets through
// it): the same checks, answers and errors as over gRPC.
func (s *Service) API() ratelimitdv1.RateLimiterServer { return ownAPI{s: s} }

// ResetEnabled reports whether Reset may clear counters
// (Options.EnableReset).
func (s *Service) ResetEnabled() bool { return s.enableReset }

// UnaryInterceptor recovers panics in unary handlers with
// Options.Recovery; see [wire.RecoverUnary].
func (s *Service) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return s.recovery.UnaryInterceptor()
}

// StreamInterceptor recovers panics in streaming handlers with
// Options.Recovery; see [wire.RecoverStream].
func (s *Service) StreamInterceptor() grpc.StreamServerInterceptor {
	return s.recovery.StreamInterceptor()
}

// WrapHTTP recovers panics in h with Options.Recovery; see
// [wire.RecoverHTTP].
func (s *Service) WrapHTTP(h http.Handler) http.Handler {
	return s.recovery.WrapHTTP(h)
}

// Panics returns how many handler panics Options.Recovery recovered: the
// service's, and those of every other server it recovers for.
func (s *Service) Panics() uint64 { return s.recovery.Panics() }

// SetAwaitingRules, while set, has the health checks report not serving
// (gRPC NOT_SERVING, GET /healthcheck 503 "waiting for rules"), although
// calls are decided: for a server started before its first rules, which
// load balancers should not send to yet. Drain ends it for good.
func (s *Service) SetAwaitingRules(awaiting bool) {
	s.SetUnhealthy("rules", "waiting for rules", awaiting)
}

// SetUnhealthy marks component (such as "rules" or "redis") unhealthy for
// reason, or healthy again when bad is false. While any component is
// unhealthy, health checks report not serving (gRPC NOT_SERVING, GET
// /healthcheck 503 with the reasons, one a line), although calls are
// still decided, as envoyproxy/ratelimit's health components do
// (src/server/health.go). Drain ends serving for good.
func (s *Service) SetUnhealthy(component, reason string, bad bool) {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	next := map[string]string{}
	if cur := s.unhealthy.Load(); cur != nil {
		for k, v := range *cur {
			next[k] = v
		}
	}
	if bad {
		next[component] = reason
	} else {
		delete(next, component)
	}
	if len(next) == 0 {
		s.unhealthy.Store(nil)
	} else {
		s.unhealthy.Store(&next)
	}
	status := healthpb.HealthCheckResponse_SERVING
	if len(next) > 0 {
		status = healthpb.HealthCheckResponse_NOT_SERVING
	}
	for _, name := range []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName, ratelimitdv1.RateLimiter_ServiceDesc.ServiceName} {
		s.health.SetServingStatus(name, status) // ignored once drained
	}
}

// unhealthyReasons returns the reasons health checks report not serving,
// sorted; none while healthy.
func (s *Service) unhealthyReasons() []string {
	cur := s.unhealthy.Load()
	if cur == nil {
		return nil
	}
	return slices.Sorted(maps.Values(*cur))
}

// Drain marks the service as going away: gRPC health checks answer
// NOT_SERVING and GET /healthcheck 503, so load balancers stop sending new
// work, while calls keep being decided until the servers stop.
func (s *Service) Drain() {
	s.draining.Store(true)
	s.health.Shutdown()
}
