// Package refstats keeps the statistics envoyproxy/ratelimit (the
// reference) emits, under the reference's names, so that dashboards and
// alerts built on the reference keep working when ratelimitd replaces it.
//
// A [Stats] is a [service.ReportObserver]: hand it to the service (beside
// ratelimitd's own metrics, through [service.Tee]) and it counts every
// decision the way the reference does, in counters named
//
//	ratelimit.service.rate_limit.<key>.total_hits      hits asked for
//	ratelimit.service.rate_limit.<key>.within_limit    hits admitted
//	ratelimit.service.rate_limit.<key>.near_limit      hits past the near-limit threshold
//	ratelimit.service.rate_limit.<key>.over_limit      hits past the limit
//	ratelimit.service.rate_limit.<key>.shadow_mode     hits past the limit of a shadow_mode rule
//	ratelimit.service.rate_limit.<domain>.domain_not_found   descriptors of an unknown domain
//	ratelimit.service.call.should_rate_limit.redis_error     requests whose backend call failed
//	ratelimit.service.call.should_rate_limit.service_error   requests answered with an error
//	ratelimit.service.config_load_success                    rule sets loaded
//	ratelimit.service.config_load_error                      rule sets rejected
//	ratelimit_server.<Method>.total_requests                 gRPC calls (counter)
//	ratelimit_server.<Method>.response_time                  their duration in ms (timer)
//
// where <key> is the rule's ID (domain.key_value.key…), with descriptor
// values where the rule opts in with detailed_metric or value_to_metric,
// or, for a descriptor's own limit override, the domain and every entry as
// key_value. Names are sanitized as the reference does: ':' and '|' (and
// here line breaks too) become '_', and so do the dots of IPv4 addresses.
//
// Counts are hits, not decisions, and split as the reference splits them:
// a request of h hits that takes a limit of N from u used to u+h counts h
// in total_hits; when admitted, h in within_limit and the part of them
// above floor(N × near-limit ratio) in near_limit; when refused, the part
// above N in over_limit (all h when u ≥ N) and the part between the
// threshold and N in near_limit; a shadow_mode rule's refused hits count
// in over_limit and shadow_mode alike.
//
// The counters live in process and are flushed every interval by [Run]
// (or [Stats.Flush]) to [Sink]s: a statsd UDP sink ([NewStatsd]) sends
// each counter's increase since the last flush as name:n|c, and each
// timer's values as name:v|ms; a Prometheus sink ([NewPrometheus]) maps
// the same names through a statsd_exporter mapping into Prometheus
// series. Only counters that grew are flushed, as the reference does.
//
// The per-key statistics grow with the descriptors seen where rules name
// values, and with domains of requests: at most Options.MaxKeys keys are
// kept; decisions of further keys are not counted in the reference's
// names, only in [Stats.Dropped] (ratelimitd's own metrics still count
// them).
package refstats

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/metrics"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// The reference's fixed stat names.
const (
	RateLimitPrefix   = "ratelimit.service.rate_limit."
	RedisError        = "ratelimit.service.call.should_rate_limit.redis_error"
	ServiceError      = "ratelimit.service.call.should_rate_limit.service_error"
	ConfigLoadSuccess = "ratelimit.service.config_load_success"
	ConfigLoadError   = "ratelimit.service.config_load_error"
	ServerPrefix      = "ratelimit_server."
	DomainNotFound    = "domain_not_found"
)

// Suffixes of the per-key counters, in the order of their index.
var keySuffixes = [numKeyStats]string{"total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode"}

const (
	totalHits = iota
	withinLimit
	nearLimit
	overLimit
	shadowMode
	numKeyStats
)

// Defaults of Options.
const (
	DefaultMaxKeys       = 10000
	DefaultFlushInterval = 10 * time.Second
	// DefaultTimerSamples is how many values of each timer are kept per
	// flush; past it, a uniform sample of them is, sent with its rate.
	DefaultTimerSamples = 1024
)

// shouldRateLimit is the full name of Envoy's RLS method.
const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// Options configure [New]. The zero value selects every default.
type Options struct {
	// NearLimitRatio is the share of a limit past which admitted hits
	// count as near_limit. Default service.DefaultNearLimitRatio (0.8).
	NearLimitRatio float64
	// MaxKeys caps the keys of per-key statistics (a rule, a detailed
	// label, an override's descriptor, an unknown domain). Default
	// DefaultMaxKeys.
	MaxKeys int
	// TimerSamples caps the values of each timer kept between flushes.
	// Default DefaultTimerSamples.
	TimerSamples int
	// Sinks receive every flush, in order.
	Sinks []Sink
	// Now is the clock that times gRPC calls. Default time.Now.
	Now func() time.Time
	// Logger receives the one warning logged when MaxKeys is first
	// reached. Default: discard.
	Logger *slog.Logger
}

// Kind is the statsd type of a sample.
type Kind uint8

const (
	// Counter: Value is the increase since the last flush.
	Counter Kind = iota
	// Timer: Value is one duration in milliseconds.
	Timer
)

// Sample is one value of a flush.
type Sample struct {
	Name  string
	Kind  Kind
	Value float64
	// Rate is, for a timer, the share of its values the flush carries
	// (1 when all); each sent value stands for 1/Rate of them.
	Rate float64
}

// Sink receives flushes. Flush is called from one goroutine at a time; it
// must not keep samples after it returns.
type Sink interface {
	Flush(samples []Sample)
}

// Stats keeps the reference's statistics; see the package documentation.
// Create it with [New]. It is safe for concurrent use.
type Stats struct {
	ratio   float64
	maxKeys int
	samples int
	sinks   []Sink
	now     func() time.Time
	log     *slog.Logger

	mu       sync.RWMutex
	keys     map[string]*keyStats // by raw key
	counters map[string]*counter  // fixed names and domain_not_found, by full name
	methods  map[string]*method   // by gRPC full method name
	made     int                  // per-key statistics made: keys and unknown domains' counters
	dropped  atomic.Uint64
	warned   atomic.Bool

	redisError, serviceError, configOK, configErr *counter

	flushMu sync.Mutex // one flush at a time; guards counter.last
	buf     []Sample
}

var _ service.ReportObserver = (*Stats)(nil)

// counter is a monotonic count; last is its value at the last flush.
type counter struct {
	name string
	v    atomic.Uint64
	last uint64
}

func (c *counter) add(n uint64) { c.v.Add(n) }

// keyStats is the counters of one key.
type keyStats struct {
	c [numKeyStats]counter
}

// method is the statistics of one gRPC method.
type method struct {
	total *counter
	time  *timer
}

// timer keeps a uniform sample of its values since the last flush.
type timer struct {
	name   string
	mu     sync.Mutex
	seen   uint64
	values []float64
	cap    int
}

func (t *timer) add(v float64) {
	t.mu.Lock()
	t.seen++
	if len(t.values) < t.cap {
		t.values = append(t.values, v)
	} else if i := rand.Uint64N(t.seen); i < uint64(t.cap) {
		t.values[i] = v // reservoir sampling: every value kept with equal chance
	}
	t.mu.Unlock()
}

// New returns empty statistics flushed to opts.Sinks.
func New(opts Options) *Stats {
	if opts.NearLimitRatio <= 0 || opts.NearLimitRatio > 1 {
		opts.NearLimitRatio = service.DefaultNearLimitRatio
	}
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.TimerSamples <= 0 {
		opts.TimerSamples = DefaultTimerSamples
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Stats{
		ratio: opts.NearLimitRatio, maxKeys: opts.MaxKeys, samples: opts.TimerSamples,
		sinks: opts.Sinks, now: opts.Now, log: opts.Logger,
		keys:     make(map[string]*keyStats),
		counters: make(map[string]*counter),
		methods:  make(map[string]*method),
	}
	s.redisError = s.fixed(RedisError)
	s.serviceError = s.fixed(ServiceError)
	s.configOK = s.fixed(ConfigLoadSuccess)
	s.configErr = s.fixed(ConfigLoadError)
	return s
}

// fixed makes the counter of a fixed name.
func (s *Stats) fixed(name string) *counter {
	c := &counter{name: name}
	s.counters[name] = c
	return c
}

// Dropped returns how many decisions and events were not counted because
// MaxKeys keys were already kept.
func (s *Stats) Dropped() uint64 { return s.dropped.Load() }

// Keys returns how many per-key statistics are kept.
func (s *Stats) Keys() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.made
}

// Decided implements [service.Observer]; the figures come with Report.
func (s *Stats) Decided(string, *config.Rule, *rlv3.RateLimitDescriptor, service.Outcome, uint64) {}

// BackendCall implements [service.Observer]; the reference has no
// statistics of its own for it.
func (s *Stats) BackendCall(time.Duration, error) {}

// FailureMode counts a request whose backend call failed, whatever the
// failure mode then decided, as the reference counts a Redis error.
func (s *Stats) FailureMode(string, config.FailureMode) { s.redisError.add(1) }

// ConfigLoaded counts a rule set loaded (ok) or rejected.
func (s *Stats) ConfigLoaded(ok bool) {
	if ok {
		s.configOK.add(1)
	} else {
		s.configErr.add(1)
	}
}

// UnknownDomain counts the descriptors of a request of an unknown domain,
// in <domain>.domain_not_found.
func (s *Stats) UnknownDomain(domain string, descriptors int) {
	var buf [128]byte
	b := append(append(append(buf[:0], RateLimitPrefix...), domain...), "."+DomainNotFound...)
	s.mu.RLock()
	c := s.counters[string(b)]
	s.mu.RUnlock()
	if c == nil {
		if c = s.newCounter(b, domain); c == nil {
			return
		}
	}
	c.add(uint64(descriptors))
}

// newCounter makes the counter of unknown domain's raw name b, unless the
// cap is reached.
func (s *Stats) newCounter(b []byte, domain string) *counter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.counters[string(b)]; c != nil {
		return c
	}
	if !s.roomLocked(domain) {
		return nil
	}
	c := &counter{name: RateLimitPrefix + Sanitize(domain) + "." + DomainNotFound}
	s.counters[string(b)] = c
	return c
}

// roomLocked reports whether another key may be made, counting a drop
// and warning once when not.
func (s *Stats) roomLocked(key string) bool {
	if s.made < s.maxKeys {
		s.made++
		return true
	}
	s.dropped.Add(1)
	if !s.warned.Swap(true) {
		s.log.Warn("reference statistics: key cap reached; decisions of new keys are not counted under the reference's names "+
			"(ratelimitd_reference_stats_dropped_total counts them), and only this first one is logged",
			"max_keys", s.maxKeys, "key", key)
	}
	return false
}

// Report counts one decision as the reference does; it implements
// [service.ReportObserver].
func (s *Stats) Report(r service.Report) {
	var buf [256]byte
	b := metrics.AppendStatKey(buf[:0], r.Domain, r.Rule, r.Descriptor)
	s.mu.RLock()
	k := s.keys[string(b)]
	s.mu.RUnlock()
	if k == nil {
		if k = s.newKey(b); k == nil {
			return
		}
	}
	n, h, before := r.Limit, r.Hits, r.Used
	after := before + h
	// As the reference computes it, in float32.
	near := uint64(math.Floor(float64(float32(n) * float32(s.ratio))))
	k.c[totalHits].add(h)
	switch r.Outcome {
	case service.OutcomeOverLimit, service.OutcomeShadowOverride:
		// Refused hits that would have fitted (the request was refused
		// for another of its hits on the same key) count as over whole.
		over := h
		if before < n && after > n {
			over = after - n
			k.c[nearLimit].add(n - max(near, before))
		}
		k.c[overLimit].add(over)
		if r.Outcome == service.OutcomeShadowOverride {
			k.c[shadowMode].add(over)
		}
	case service.OutcomeUnlimited:
	default:
		if after > near {
			if before >= near {
				k.c[nearLimit].add(h)
			} else {
				k.c[nearLimit].add(after - near)
			}
		}
		k.c[withinLimit].add(h)
	}
}

// newKey makes the statistics of raw key b, unless the cap is reached.
func (s *Stats) newKey(b []byte) *keyStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.keys[string(b)]; k != nil {
		return k
	}
	key := string(b)
	if !s.roomLocked(key) {
		return nil
	}
	k := &keyStats{}
	prefix := RateLimitPrefix + Sanitize(key) + "."
	for i := range k.c {
		k.c[i].name = prefix + keySuffixes[i]
	}
	s.keys[key] = k
	return k
}

// UnaryServerInterceptor counts and times every unary gRPC call as
// ratelimit_server.<Method>.total_requests and .response_time (in whole
// milliseconds), and counts the ShouldRateLimit calls answered with an
// error other than the backend's (InvalidArgument, Internal, Unknown) as
// should_rate_limit.service_error.
func (s *Stats) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		m := s.method(info.FullMethod)
		m.total.add(1)
		start := s.now()
		resp, err := handler(ctx, req)
		m.time.add(float64(s.now().Sub(start).Milliseconds()))
		if err != nil && info.FullMethod == shouldRateLimit {
			switch status.Code(err) {
			case codes.InvalidArgument, codes.Internal, codes.Unknown:
				s.serviceError.add(1)
			}
		}
		return resp, err
	}
}

// method returns the statistics of gRPC method full. Methods are those
// the server registered, a bounded set: gRPC refuses others before any
// interceptor runs.
func (s *Stats) method(full string) *method {
	s.mu.RLock()
	m := s.methods[full]
	s.mu.RUnlock()
	if m != nil {
		return m
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m = s.methods[full]; m != nil {
		return m
	}
	name := full[strings.LastIndexByte(full, '/')+1:]
	prefix := ServerPrefix + Sanitize(name) + "."
	m = &method{
		total: &counter{name: prefix + "total_requests"},
		time:  &timer{name: prefix + "response_time", cap: s.samples},
	}
	s.methods[full] = m
	return m
}

// Run flushes every interval until ctx is done, then once more.
func (s *Stats) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.Flush()
			return
		case <-t.C:
			s.Flush()
		}
	}
}

// Flush sends every counter's increase since the last flush, when not
// zero, and the timers' values, to every sink; names in sorted order.
func (s *Stats) Flush() {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	out := s.buf[:0]
	emit := func(c *counter) {
		v := c.v.Load()
		if v != c.last {
			out = append(out, Sample{Name: c.name, Kind: Counter, Value: float64(v - c.last), Rate: 1})
			c.last = v
		}
	}
	s.mu.RLock()
	for _, c := range s.counters {
		emit(c)
	}
	for _, k := range s.keys {
		for i := range k.c {
			emit(&k.c[i])
		}
	}
	timers := make([]*timer, 0, len(s.methods))
	for _, m := range s.methods {
		emit(m.total)
		timers = append(timers, m.time)
	}
	s.mu.RUnlock()
	for _, t := range timers {
		t.mu.Lock()
		rate := 1.0
		if t.seen > uint64(len(t.values)) {
			rate = float64(len(t.values)) / float64(t.seen)
		}
		for _, v := range t.values {
			out = append(out, Sample{Name: t.name, Kind: Timer, Value: v, Rate: rate})
		}
		t.values, t.seen = t.values[:0], 0
		t.mu.Unlock()
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if len(out) > 0 {
		for _, sk := range s.sinks {
			sk.Flush(out)
		}
	}
	clear(out)
	s.buf = out[:0]
}

// ipv4 finds IPv4 addresses, whose dots Sanitize replaces.
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// Sanitize returns stat name part s as the reference cleans it: ':' and
// '|', which end a name in the statsd protocol, become '_', and so do the
// dots of IPv4 addresses; line breaks, which would start a new statsd
// line, become '_' too, and bytes that are not UTF-8 (a descriptor value
// Envoy copied from a header) U+FFFD, since Prometheus refuses label
// values that are not UTF-8.
func Sanitize(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.NewReplacer(":", "_", "|", "_", "\n", "_", "\r", "_").Replace(s)
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}
