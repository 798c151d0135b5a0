package rlqs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// Defaults of [Options].
const (
	DefaultReportingInterval = 5 * time.Second
	DefaultBurst             = time.Second
	DefaultAbandonAfter      = 3
	DefaultMaxBuckets        = 1000
	DefaultMaxStreamBuckets  = 10000
	DefaultFloorFraction     = 0.1
	DefaultSmoothing         = 1
	DefaultHeadroom          = 2
	DefaultBudgetTimeout     = time.Second
	maxDomainLen             = 255
	// ledgerGrace is how long after an assignment's TTL the server still
	// counts it against the limit: the TTL runs on the client from when it
	// receives the assignment, a little after the server sent it.
	ledgerGrace = time.Second
)

// Options configure a [Server]. Only Rules is required.
type Options struct {
	// Rules returns the rules in force; it is called once per report, and
	// by [Server.Reload], which pushes what a reload changed to the open
	// streams at once. Required.
	Rules func() *config.Rules
	// Default is the strategy assigned to a bucket that matches no rule, or
	// whose stream's domain no rule file defines. Nil means ALLOW_ALL: RLQS
	// limits only what the rules name, as RLS does.
	Default *typev3.RateLimitStrategy
	// ReportingInterval is the reporting interval assumed for a bucket until
	// its reports tell the real one. Default 5s: Envoy's rate_limit_quota
	// filter reports every 5 s whatever its reporting_interval says
	// (initTlsStore in Envoy's
	// source/extensions/filters/http/rate_limit_quota/filter_persistence.cc).
	ReportingInterval time.Duration
	// AssignmentTTL is the assignment_time_to_live of every assignment, a
	// whole number of seconds: Envoy reads only the seconds of it
	// (startActionExpirationTimer in global_client_impl.cc), and 0 expires
	// at once. 0 here means twice the bucket's reporting interval, rounded
	// up to whole seconds: one lost report does not expire an assignment,
	// and a silent client's does.
	AssignmentTTL time.Duration
	// Burst sets an assignment's max_tokens: its share's rate times Burst,
	// at least 1 token and at most a period's share. Envoy starts each new
	// token bucket full, so every change of a stream's assignment may
	// admit that much on top of the rates (docs/rlqs.md, the bound): a
	// shorter Burst bounds the overshoot tighter, a longer one lets
	// Envoy pass bursts of traffic. Default 1s.
	Burst time.Duration
	// AbandonAfter is how many reporting intervals a stream may leave a
	// bucket out of its reports before the server sends abandon_action and
	// forgets it. Default 3.
	AbandonAfter int
	// MaxBuckets bounds the buckets of one report (InvalidArgument above).
	// Default 1000.
	MaxBuckets int
	// MaxStreamBuckets bounds the buckets one stream may hold at once
	// (ResourceExhausted above), so a stream's memory is bounded.
	// Default 10000.
	MaxStreamBuckets int
	// FloorFraction is the part of a limit split evenly among the streams
	// sharing it, whatever their demand; the rest follows demand. Default
	// 0.1; 1 splits the limit evenly.
	FloorFraction float64
	// Headroom caps a stream's share at Headroom times its demand (but
	// never below its floor), so that budget a stream does not use stays
	// free for the others to take at once, and a stream whose traffic
	// grows gets more at its next report. Default 2: a bucket's traffic
	// may double between two reports before Envoy refuses any of it.
	// +Inf assigns every stream its whole share, whatever its demand.
	Headroom float64
	// Smoothing is the weight of the latest report in a stream's demand
	// (an exponential average). Default 1: Envoy reports every 5 s, a
	// report is its own average, and a shift of demand shows in the
	// shares at the next report (a share moved in steps would cost Envoy
	// a new token bucket at each).
	Smoothing float64
	// Budget, when set, is the store that holds every pooled limit's
	// budget across the replicas sharing it (the backend chain of
	// ratelimitd: the lease engine in front of Redis, or the memory
	// backend). Each assignment is then backed by a lease of as many hits
	// taken from it, so that the assignments in force on all replicas sum
	// to at most the limit; targets follow the demand of every replica's
	// streams. Nil shares a limit among this replica's streams only
	// (phase 1). See docs/rlqs.md.
	Budget algo.Backend
	// BudgetTimeout bounds each call to Budget. Default 1s.
	BudgetTimeout time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// AfterFunc runs f once d has passed on the clock of Now; default
	// time.AfterFunc. A pool short of its targets looks at the store again
	// on it (see Server.pollStarved). A clock of a test passes its own.
	AfterFunc func(d time.Duration, f func())
	// Logger receives stream and rejection logs; default slog.Default().
	Logger *slog.Logger
}

// Server implements RateLimitQuotaService. Register it on a gRPC server
// with [Server.Register]. It is safe for concurrent use.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	opts    Options
	pol     policy
	allow   *typev3.RateLimitStrategy
	deny    *typev3.RateLimitStrategy
	mu      sync.Mutex
	pools   map[poolKey]*pool
	streams uint64 // the last stream id given
	active  int    // streams open
	open    map[uint64]*stream
	counts  counts
	closing chan struct{}
	closed  sync.Once
	// busy bounds the reports deciding with a Budget at once (see
	// handle); behind, the budget calls made behind answers already given,
	// which wait on the store, not on this process, and must not hold up
	// the reports.
	busy, behind chan struct{}
	// scratch pools the space of budget calls (*settleScratch).
	scratch sync.Pool
	// work counts what may still send a response without a client doing
	// anything: reports a stream's goroutine took and has not finished
	// with (their budget calls behind the answer included), wakes of a
	// stream not yet reassessed, and streams leaving. A piece of work
	// counts what it causes before it ends, so once every report sent
	// was taken (stream.received), 0 means no response is on its way but
	// those sent (stream.responded): what tests wait for instead of a
	// quiet spell of wall-clock time (export_test.go).
	work atomic.Int64
}

// New returns a server deciding buckets with opts.
func New(opts Options) (*Server, error) {
	if opts.Rules == nil {
		return nil, errors.New("rlqs: Options.Rules is required")
	}
	if opts.ReportingInterval <= 0 {
		opts.ReportingInterval = DefaultReportingInterval
	}
	if opts.AssignmentTTL%time.Second != 0 || opts.AssignmentTTL < 0 {
		return nil, fmt.Errorf("rlqs: Options.AssignmentTTL %v is not a whole number of seconds: Envoy reads only the seconds of assignment_time_to_live", opts.AssignmentTTL)
	}
	if opts.Burst <= 0 {
		opts.Burst = DefaultBurst
	}
	if opts.Default.GetRequestsPerTimeUnit() != nil {
		return nil, errors.New("rlqs: Options.Default is a requests_per_time_unit strategy, which Envoy's rate_limit_quota filter does not enforce (onQuotaResponseImpl in global_client_impl.cc skips it); use a blanket rule or a token bucket")
	}
	if opts.AbandonAfter <= 0 {
		opts.AbandonAfter = DefaultAbandonAfter
	}
	if opts.MaxBuckets <= 0 {
		opts.MaxBuckets = DefaultMaxBuckets
	}
	if opts.MaxStreamBuckets <= 0 {
		opts.MaxStreamBuckets = DefaultMaxStreamBuckets
	}
	switch {
	case opts.FloorFraction == 0:
		opts.FloorFraction = DefaultFloorFraction
	case opts.FloorFraction < 0 || opts.FloorFraction > 1:
		return nil, fmt.Errorf("rlqs: Options.FloorFraction %v is outside [0, 1]", opts.FloorFraction)
	}
	switch {
	case opts.Smoothing == 0:
		opts.Smoothing = DefaultSmoothing
	case opts.Smoothing < 0 || opts.Smoothing > 1:
		return nil, fmt.Errorf("rlqs: Options.Smoothing %v is outside (0, 1]", opts.Smoothing)
	}
	switch {
	case opts.Headroom == 0:
		opts.Headroom = DefaultHeadroom
	case !(opts.Headroom >= 1):
		return nil, fmt.Errorf("rlqs: Options.Headroom %v is below 1: a stream would be assigned less than it uses", opts.Headroom)
	}
	if opts.BudgetTimeout <= 0 {
		opts.BudgetTimeout = DefaultBudgetTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.AfterFunc == nil {
		opts.AfterFunc = func(d time.Duration, f func()) { time.AfterFunc(d, f) }
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{
		opts:    opts,
		pol:     policy{floor: opts.FloorFraction, headroom: opts.Headroom},
		allow:   blanket(typev3.RateLimitStrategy_ALLOW_ALL),
		deny:    blanket(typev3.RateLimitStrategy_DENY_ALL),
		pools:   make(map[poolKey]*pool),
		open:    make(map[uint64]*stream),
		closing: make(chan struct{}),
		busy:    make(chan struct{}, maxBusy()),
		behind:  make(chan struct{}, maxBusy()),
	}
	s.counts.errors = make(map[codes.Code]uint64)
	s.counts.usage = make(map[ruleRef]*ruleUsage)
	if opts.Default == nil {
		s.opts.Default = s.allow
	}
	return s, nil
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// Register registers the service on gs.
func (s *Server) Register(gs grpc.ServiceRegistrar) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, s)
}

// stream is the state of one StreamRateLimitQuotas call. Only its own
// goroutine touches domain and sends on the stream; buckets is guarded by
// Server.mu, but only its own goroutine changes it, so that goroutine may
// read it without the lock.
type stream struct {
	id      uint64
	domain  string
	buckets map[string]*streamBucket
	// interval is the stream's reporting interval, as its reports last
	// showed it (zero: not known yet). Envoy reports every bucket of a
	// stream on one timer, so a new bucket starts from it.
	interval time.Duration
	// wake is signalled by Server.Reload (which sets reload), and when the
	// shares of the buckets in moved did (both guarded by Server.mu): the
	// stream's goroutine then pushes the assignments the new rules or
	// shares changed.
	wake   chan struct{}
	reload bool
	moved  map[string]bool
	// warnedUTF8 is set once a bucket id that is not UTF-8 was logged.
	warnedUTF8 bool
	// work is Server.work; received and responded count the reports the
	// stream's goroutine took and the responses it sent (answers and
	// pushes), for Server.work's readers.
	work                *atomic.Int64
	received, responded atomic.Uint64
}

// streamBucket is one bucket a stream reports.
type streamBucket struct {
	desc     bucketDescriptor
	key      string
	id       *rlqsv3.BucketId
	interval time.Duration // the stream's reporting interval for the bucket
	last     time.Time     // its last report
	reports  int           // reports of it received
	// partial is set when its first report came as soon as the client
	// created the bucket (time_elapsed 0, as Envoy's does), between two
	// of the client's periodic reports: the time to its second report is
	// then part of an interval only, and no interval is learnt from it.
	partial bool
	pool    *pool // nil when the bucket shares no limit
	poolKey poolKey
	decided decision // what the last assignment was decided by
	ref     ruleRef  // the rule that decided it, for usage
	allowed float64  // requests allowed per second, at its last report
}

// decision is what decides a bucket's assignment under the rules in force:
// a reload that leaves it alone leaves the assignment alone.
type decision struct {
	kind   decisionKind
	rule   string // the rule's ID, for decidedByRule
	period int64  // seconds
	limit  uint64 // per period
}

type decisionKind uint8

const (
	decidedByDefault decisionKind = iota // no rule, or no limit RLQS can express
	decidedAllow                         // unlimited or shadow mode
	decidedDeny                          // a limit of 0
	decidedByRule                        // a pooled limit
)

// decisionFor returns what decides a bucket matching rule r (nil: none).
func decisionFor(r *config.Rule) decision {
	switch {
	case r == nil || (!r.Unlimited && len(r.Limits) == 0):
		return decision{kind: decidedByDefault}
	case r.Unlimited || r.ShadowMode:
		return decision{kind: decidedAllow}
	}
	period, limit := periodFor(r)
	if limit == 0 {
		return decision{kind: decidedDeny}
	}
	return decision{kind: decidedByRule, rule: r.ID, period: period, limit: limit}
}

// StreamRateLimitQuotas answers each usage report with one response: an
// assignment for every bucket reported, and abandon_action for the buckets
// the stream stopped reporting.
func (s *Server) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	select {
	case <-s.closing:
		return s.failed(errClosing)
	default:
	}
	s.mu.Lock()
	s.streams++
	s.active++
	ss := &stream{id: s.streams, buckets: make(map[string]*streamBucket), wake: make(chan struct{}, 1), work: &s.work}
	s.open[ss.id] = ss
	s.mu.Unlock()
	defer s.leave(ss)

	// Reports are received on a goroutine of their own so that Close can
	// end the stream while it waits for one; it ends when the stream does.
	reports := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	failed := make(chan error, 1)
	go func() {
		for {
			rep, err := st.Recv()
			if err != nil {
				failed <- err
				return
			}
			select {
			case reports <- rep:
			case <-st.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case <-s.closing:
			return s.failed(errClosing)
		case <-st.Context().Done():
			// The client went away; the receiver may have left with a
			// report it could not hand over, without an error to send.
			return st.Context().Err()
		case err := <-failed:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case rep := <-reports:
			s.work.Add(1) // before received: see Server.work
			ss.received.Add(1)
			s.counts.reports.Add(1)
			var sendErr error
			err := s.handle(ss, rep, func(resp *rlqsv3.RateLimitQuotaResponse) {
				s.sent(resp) // before Send, so the counts include what a client has
				ss.responded.Add(1)
				sendErr = st.Send(resp)
			})
			s.work.Add(-1)
			if err != nil {
				s.opts.Logger.Warn("rlqs report rejected", "stream", ss.id, "domain", ss.domain, "error", err)
				return s.failed(err)
			}
			if sendErr != nil {
				return sendErr
			}
		case <-ss.wake:
			var sendErr error
			if resp, reloaded := s.reassess(ss); resp != nil {
				if reloaded {
					s.counts.pushes.Add(1)
				} else {
					s.counts.rebalances.Add(1)
				}
				s.sent(resp)
				ss.responded.Add(1)
				sendErr = st.Send(resp)
			}
			s.work.Add(-1) // the wake's, counted by signal
			if sendErr != nil {
				return sendErr
			}
		}
	}
}

// Reload pushes to every open stream, without waiting for its next
// report, the new assignments of the buckets whose rule or limit the rules
// [Options.Rules] now returns changed: call it once new rules are in force.
// A bucket whose rule and limit did not change is sent nothing. Each
// stream's goroutine computes and sends its own push, as it does its
// answers to reports, so Reload does not wait for them.
func (s *Server) Reload() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ss := range s.open {
		ss.reload = true
		ss.signal()
	}
}

// signal wakes the stream's goroutine to push what changed. Called with
// Server.mu held, on an open stream: leave forgets a wake left pending.
func (ss *stream) signal() {
	ss.work.Add(1)
	select {
	case ss.wake <- struct{}{}:
	default: // a push is pending already; it reads the latest rules and shares
		ss.work.Add(-1)
	}
}

// reassess returns the assignments of the buckets of ss that the rules in
// force decide otherwise than they were decided, or whose share moved
// (rebalance), computed as at a report of theirs (budget included) but
// keeping their demand; nil when there is none, or when no assignment
// differs from what the stream was last sent. reloaded is true when a
// bucket's decision changed. Run on the stream's goroutine.
func (s *Server) reassess(ss *stream) (_ *rlqsv3.RateLimitQuotaResponse, reloaded bool) {
	if ss.domain == "" {
		return nil, false // no report yet: nothing assigned
	}
	// The flags are taken before the rules are read: a Reload that set
	// them had its rules in force already, and one that comes after the
	// read sets them again, for another push. Read first, a reload
	// landing between the read and the flags would be taken here with
	// the rules it replaced, and never pushed.
	s.mu.Lock()
	moved, all := ss.moved, ss.reload
	ss.moved, ss.reload = nil, false
	s.mu.Unlock()
	var dom *config.Domain
	if rules := s.opts.Rules(); rules != nil {
		dom = rules.Domain(ss.domain)
	}
	now := s.opts.Now()
	var actions []*rlqsv3.RateLimitQuotaResponse_BucketAction
	var prev []*typev3.RateLimitStrategy // of a moved bucket: what it was last sent
	var batch []algo.Request
	var calls []call
	s.mu.Lock()
	// After a reload every bucket is matched again; otherwise only those
	// whose share moved.
	keys := make([]string, 0, len(moved))
	if all {
		for key := range ss.buckets {
			keys = append(keys, key)
		}
	} else {
		for key := range moved {
			keys = append(keys, key)
		}
	}
	for _, key := range keys {
		b := ss.buckets[key]
		if b == nil {
			continue // abandoned since
		}
		var r *config.Rule
		if dom != nil {
			r = dom.Match(b.desc)
		}
		var last *typev3.RateLimitStrategy
		switch {
		case decisionFor(r) != b.decided:
			reloaded = true
		case moved[key] && b.pool != nil && b.pool.members[ss.id] != nil:
			last = b.pool.members[ss.id].sent
		default:
			continue
		}
		s.track(b, refOf(ss, r), b.allowed)
		actions = append(actions, s.assignment(ss, b, r, -1, now, &batch, &calls))
		prev = append(prev, last)
	}
	s.mu.Unlock()
	if len(batch) > 0 {
		s.settle(batch, calls)
	}
	var resp *rlqsv3.RateLimitQuotaResponse
	for i, a := range actions {
		if st := a.GetQuotaAssignmentAction().GetRateLimitStrategy(); prev[i] != nil && st == prev[i] {
			continue // the share moved back, or not enough to change the assignment
		}
		if resp == nil {
			resp = &rlqsv3.RateLimitQuotaResponse{}
		}
		resp.BucketAction = append(resp.BucketAction, a)
	}
	return resp, reloaded
}

// refOf names rule r (nil: none) of the domain of ss for usage.
func refOf(ss *stream, r *config.Rule) ruleRef {
	if r == nil {
		return ruleRef{}
	}
	return ruleRef{domain: ss.domain, rule: r.ID}
}

// assignment returns the quota assignment action of bucket b under rule r
// (nil: none), given the rate its report showed, or -1 for a push without
// a report. Called with s.mu held; with a Budget, settle completes it.
func (s *Server) assignment(ss *stream, b *streamBucket, r *config.Rule, rate float64, now time.Time, batch *[]algo.Request, calls *[]call) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	ttl := s.ttl(b.interval)
	qa := &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{AssignmentTimeToLive: durationpb.New(ttl)}
	qa.RateLimitStrategy = s.decide(ss, b, r, rate, now, ttl, qa, batch, calls)
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: qa},
	}
}

// errClosing ends the streams of a server that is shutting down: Envoy
// keeps its assignments until their TTL and reconnects, to another replica
// behind a load balancer.
var errClosing = status.Error(codes.Unavailable, "the RLQS server is shutting down; reconnect")

// Close ends every open stream with Unavailable and refuses new ones, so
// that a graceful stop of the gRPC server need not wait for streams that
// never end on their own. The streams' shares are forgotten.
func (s *Server) Close() {
	s.closed.Do(func() { close(s.closing) })
}

// handle validates report rep of stream ss whole, decides each of its
// buckets and gives answer the response, once; it returns an error,
// having answered nothing, for a report it refuses. When the budget calls
// the report makes all run behind its assignments (renewals of leases
// that still back them, reads of the budget), the response is given
// before the store answers them; otherwise once it has.
func (s *Server) handle(ss *stream, rep *rlqsv3.RateLimitQuotaUsageReports, answer func(*rlqsv3.RateLimitQuotaResponse)) error {
	if err := ss.adoptDomain(rep.GetDomain()); err != nil {
		return err
	}
	usages := rep.GetBucketQuotaUsages()
	if len(usages) > s.opts.MaxBuckets {
		return status.Errorf(codes.InvalidArgument, "report of %d buckets: at most %d are accepted", len(usages), s.opts.MaxBuckets)
	}
	descs := make([]bucketDescriptor, len(usages))
	keys := make([]string, len(usages))
	unanswerable, err := ss.parseUsages(usages, descs, keys)
	if err != nil {
		return err
	}
	s.countNotUTF8(ss, usages, descs, unanswerable)
	var dom *config.Domain
	if rules := s.opts.Rules(); rules != nil {
		dom = rules.Domain(ss.domain)
	}
	if s.opts.Budget != nil {
		// With every stream reporting at once, reports that all wait for
		// Server.mu and the store's locks hand them from one goroutine to
		// the next, each with its batch in memory: a few at a time do the
		// same work with less scheduling and garbage.
		s.busy <- struct{}{}
	}
	// The response is given without holding a place: a client slow to
	// read it must not keep the other reports waiting.
	held := s.opts.Budget != nil
	release := func() {
		if held {
			<-s.busy
			held = false
		}
	}
	defer release()
	now := s.opts.Now()
	resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, 0, len(usages))}

	s.mu.Lock()
	if err := s.checkRoom(ss, descs, keys); err != nil {
		s.mu.Unlock()
		return err
	}
	var batch []algo.Request // with a Budget: gives, then takes and announcements
	var calls []call
	if s.opts.Budget != nil {
		// At most three gives and three takes per bucket, in space reused
		// from report to report.
		sc := getSettleScratch(&s.scratch, len(usages))
		defer sc.put()
		batch, calls = sc.batch, sc.calls
		defer func() { sc.batch, sc.calls = batch, calls }()
	}
	s.assignReported(ss, usages, descs, keys, dom, now, resp, &batch, &calls)
	s.abandonSilent(ss, now, resp, &batch, &calls)
	s.mu.Unlock()
	behind := len(batch) > 0 && !waits(calls)
	if len(batch) > 0 && !behind {
		s.settle(batch, calls)
	}
	release()
	answer(resp)
	if behind {
		s.behind <- struct{}{}
		defer func() { <-s.behind }()
		s.settle(batch, calls)
	}
	return nil
}

// adoptDomain checks the domain d a report of ss names, and makes it the
// stream's on its first report; a later report may name the same domain or
// none.
func (ss *stream) adoptDomain(d string) error {
	switch {
	case ss.domain == "" && d == "":
		return status.Error(codes.InvalidArgument, "the first report of a stream must name its domain")
	case ss.domain == "" && len(d) > maxDomainLen:
		return status.Errorf(codes.InvalidArgument, "domain of %d bytes: at most %d are accepted", len(d), maxDomainLen)
	case !utf8.ValidString(d):
		return status.Errorf(codes.InvalidArgument, "domain %q is not UTF-8", d)
	case ss.domain == "":
		ss.domain = d
	case d != "" && d != ss.domain:
		return status.Errorf(codes.InvalidArgument, "report for domain %q on a stream of domain %q: a stream keeps the domain of its first report; open another stream", d, ss.domain)
	}
	return nil
}

// parseUsages checks the bucket usages of a report of ss and sets the
// descriptor and key of each in descs and keys (as long as usages), or
// returns an InvalidArgument error for a report it refuses whole: a bucket
// id or time_elapsed it cannot read, a bucket reported twice.
//
// A bucket id that is not UTF-8 cannot be answered: Envoy's filter builds
// ids from request headers byte for byte and sends them, but its protobuf
// refuses a response holding such a string (proto3 strings are checked
// when parsed, only logged when serialized: protocolbuffers/protobuf issue
// 7364), so an answer naming the bucket would break the stream, and every
// bucket of that Envoy would lose its assignment. Such a bucket is left
// out of the answer (Envoy's no_assignment_behavior decides it): its
// descriptor is left nil, and unanswerable counts it. The others are
// answered.
func (ss *stream) parseUsages(usages []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, descs []bucketDescriptor, keys []string) (unanswerable int, _ error) {
	index := make(map[string]int, len(usages))
	var kb []byte
	for i, u := range usages {
		id := u.GetBucketId().GetBucket()
		// A bucket the stream holds was checked when it was first
		// reported: it is found by its key, without a new descriptor.
		var ok bool
		if kb, ok = appendBucketKey(kb[:0], id); ok {
			if b := ss.buckets[string(kb)]; b != nil {
				descs[i], keys[i] = b.desc, b.key
			}
		}
		if descs[i] == nil {
			d, err := newBucketDescriptor(id)
			if errors.Is(err, errNotUTF8) {
				unanswerable++
				continue
			}
			if err != nil {
				return 0, status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d]: %v", i, err)
			}
			descs[i], keys[i] = d, d.key()
		}
		if te := u.GetTimeElapsed(); te != nil && (te.CheckValid() != nil || te.AsDuration() < 0) {
			return 0, status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d]: time_elapsed %v is not a duration of 0 or more", i, te)
		}
		if j, dup := index[keys[i]]; dup {
			return 0, status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d]: bucket_id %v repeats bucket_quota_usages[%d]; report each bucket once", i, descs[i], j)
		}
		index[keys[i]] = i
	}
	return unanswerable, nil
}

// countNotUTF8 counts the unanswerable buckets of a report of ss, those
// whose ids are not UTF-8 (a nil descriptor in descs, as parseUsages sets
// them), and logs the first of the stream's.
func (s *Server) countNotUTF8(ss *stream, usages []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, descs []bucketDescriptor, unanswerable int) {
	if unanswerable == 0 {
		return
	}
	s.counts.notUTF8.Add(uint64(unanswerable))
	if !ss.warnedUTF8 {
		ss.warnedUTF8 = true
		first := slices.IndexFunc(descs, func(d bucketDescriptor) bool { return d == nil })
		s.opts.Logger.Warn("rlqs: bucket ids that are not UTF-8 are left unanswered (Envoy could not read an answer naming them); its no_assignment_behavior decides them. Logged once per stream; ratelimitd_rlqs_buckets_not_utf8_total counts them",
			"stream", ss.id, "domain", ss.domain, "bucket_id", fmt.Sprintf("%q", usages[first].GetBucketId().GetBucket()))
	}
}

// checkRoom returns a ResourceExhausted error when the buckets of a
// report (descs and keys, as parseUsages returns them) that ss does not
// hold yet would take it past MaxStreamBuckets. Called with s.mu held.
func (s *Server) checkRoom(ss *stream, descs []bucketDescriptor, keys []string) error {
	added := 0
	for i, k := range keys {
		if descs[i] != nil && ss.buckets[k] == nil {
			added++
		}
	}
	if len(ss.buckets)+added > s.opts.MaxStreamBuckets {
		return status.Errorf(codes.ResourceExhausted, "the stream would hold %d buckets: at most %d are accepted per stream", len(ss.buckets)+added, s.opts.MaxStreamBuckets)
	}
	return nil
}

// assignReported decides each bucket a report of ss received at now
// counts (descs and keys, as parseUsages returns them; a nil descriptor
// is left out), under the rules of domain dom (nil: none), and appends
// its assignment to resp. A bucket reported for the first time is added
// to the stream. Called with s.mu held; budget calls go to batch and
// calls.
func (s *Server) assignReported(ss *stream, usages []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, descs []bucketDescriptor, keys []string,
	dom *config.Domain, now time.Time, resp *rlqsv3.RateLimitQuotaResponse, batch *[]algo.Request, calls *[]call) {
	for i, u := range usages {
		if descs[i] == nil {
			continue // not UTF-8: see parseUsages
		}
		b := ss.buckets[keys[i]]
		first := b == nil
		if first {
			b = &streamBucket{desc: descs[i], key: keys[i], id: &rlqsv3.BucketId{Bucket: u.GetBucketId().GetBucket()}, interval: cmp.Or(ss.interval, s.opts.ReportingInterval)}
			ss.buckets[keys[i]] = b
			s.counts.buckets++
		}
		elapsed := s.elapsed(ss, b, u.GetTimeElapsed().AsDuration(), now)
		rate := float64(u.GetNumRequestsAllowed()+u.GetNumRequestsDenied()) / elapsed.Seconds()

		var r *config.Rule
		if dom != nil {
			r = dom.Match(b.desc)
		}
		s.track(b, refOf(ss, r), float64(u.GetNumRequestsAllowed())/elapsed.Seconds())
		resp.BucketAction = append(resp.BucketAction, s.assignment(ss, b, r, rate, now, batch, calls))
	}
}

// abandonSilent abandons the buckets ss stopped reporting, appending
// their abandon_action to resp: they leave their pools and the stream. A
// client reports its buckets on one timer, so the stream's interval
// counts. Called with s.mu held; budget calls go to batch and calls.
func (s *Server) abandonSilent(ss *stream, now time.Time, resp *rlqsv3.RateLimitQuotaResponse, batch *[]algo.Request, calls *[]call) {
	for k, b := range ss.buckets {
		if now.Sub(b.last) > time.Duration(s.opts.AbandonAfter)*cmp.Or(ss.interval, b.interval) {
			resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{
				BucketId:     b.id,
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
			})
			s.detach(ss, b, now, batch, calls)
			s.track(b, ruleRef{}, 0)
			delete(ss.buckets, k)
			s.counts.buckets--
		}
	}
}

// elapsed returns the time the counts of a report of bucket b, received
// at now with time_elapsed te, were gathered over, and learns the stream's
// reporting interval from it. Envoy's time_elapsed is whole seconds,
// truncated (getUsageFromBucket in Envoy's global_client_impl.cc), so the
// time between the bucket's reports as received, within [te, te+1s), is
// the finer measure. Envoy reports a new bucket at once, with
// time_elapsed 0: its counts are then spread over the interval assumed,
// and the time to its next report, the first periodic one, is part of an
// interval only and teaches nothing. A first report with time_elapsed
// (a client that reconnected) covers that much. Called with s.mu held.
func (s *Server) elapsed(ss *stream, b *streamBucket, te time.Duration, now time.Time) time.Duration {
	var elapsed time.Duration
	switch {
	case b.reports == 0 && te > 0:
		elapsed = te
	case b.reports == 0:
		elapsed, b.partial = b.interval, true
	default:
		elapsed = now.Sub(b.last)
		if te > 0 {
			elapsed = min(max(elapsed, te), te+time.Second)
		}
		if b.reports > 1 || !b.partial {
			b.interval, ss.interval = max(elapsed, time.Millisecond), max(elapsed, time.Millisecond)
		}
	}
	b.reports++
	b.last = now
	return max(elapsed, time.Millisecond)
}

// waits reports whether an assignment waits for calls: a renewal whose
// member is assigned out of the lease it takes.
func waits(calls []call) bool {
	for i := range calls {
		if !calls[i].read && calls[i].m != nil {
			return true
		}
	}
	return false
}

// maxBusy is how many reports decide with a Budget at once: enough to
// keep every core and a remote store's round trips busy.
func maxBusy() int { return max(8, 4*runtime.GOMAXPROCS(0)) }

// settle sends a budget batch to the store and records each pool's
// answer; a renewal's member is assigned out of the lease it took. When
// the store fails, that member is assigned as without a Budget (this
// replica's streams share the limit among themselves), and the failure is
// logged. What a call took for a pool that lost its last member meanwhile
// goes back at once.
func (s *Server) settle(batch []algo.Request, calls []call) {
	sc := getSettleScratch(&s.scratch, 0)
	defer sc.put()
	out := append(sc.out[:0], make([]algo.Decision, len(batch))...)
	defer func() { sc.out = out }()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.BudgetTimeout)
	sent := s.opts.Now()
	err := s.opts.Budget.Decide(ctx, batch, out)
	cancel()
	s.countOps(batch, err)
	if err != nil {
		s.opts.Logger.Warn("rlqs budget store failed: assigning this replica's share of the limits alone until it answers", "error", err)
	}
	var gives []algo.Request
	s.mu.Lock()
	for i := range calls {
		c := &calls[i]
		was := c.p.lease.contended(c.p.limit)
		gives = c.settle(out, err, sent, gives)
		if !c.read && c.m != nil {
			p, budget := c.p, c.p.limit
			if p.lease.backs(p.limit, sent) {
				budget = p.lease.held()
			}
			if err == nil && c.announce && c.m.counted {
				// The take's answer holds every replica's announcement,
				// this one's included: the freshest view of the demand
				// there is, when the reports of several replicas move it
				// at once.
				p.retarget(c.m, s.pol, p.lease.gCount, p.lease.gDemand)
			}
			c.qa.RateLimitStrategy = c.m.strategy(p.assign(c.m, budget, math.MaxUint64, c.until), p.period, s.opts.Burst)
		}
		if err == nil && (was || c.p.lease.contended(c.p.limit)) {
			// Where the budget is plentiful (and was), a stream takes
			// what it needs at its next report: nothing to push.
			s.rebalance(c, sent)
		}
		if err == nil {
			s.pollStarved(c.p, c.interval, sent)
		}
	}
	s.mu.Unlock()
	if len(gives) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.BudgetTimeout)
		defer cancel()
		err := s.opts.Budget.Decide(ctx, gives, make([]algo.Decision, len(gives)))
		s.countOps(gives, err)
		if err != nil {
			s.opts.Logger.Warn("rlqs budget not given back: it returns when its leases end", "error", err)
		}
	}
}

// rebalance wakes, after call c settled, the streams of the members of
// its pool whose share the store's answer moved: their target by over an
// eighth (and one), or an assignment short of its target by what the pool
// can still give. (Settle calls it where the budget was or is contended.) Their new assignments are then
// pushed at once, rather than at their next reports: a share freed on
// another replica, or by a stream that ended, is taken within about one
// interval, the member whose report made the call included (it was
// assigned by what the pool knew before). A push re-decides the bucket,
// which may call the store again
// (at most one renewal of a pool is on its way at once, and reads are
// spaced): shares settle in a few calls. Called with s.mu held.
func (s *Server) rebalance(c *call, now time.Time) {
	p, l := c.p, &c.p.lease
	if l.dropped {
		return
	}
	// What the pool could give at once: what its lease holds beyond the
	// assignments in force, and what no replica holds, where a push would
	// take it. Members short of their target are pushed while it lasts,
	// not all for one free unit. A push re-decides the bucket out of the
	// lease, which it renews (taking what is free) only when the lease no
	// longer backs an assignment or the pool renews anyway (renewal: not
	// while its streams use under 90% of what it holds). Free units it
	// would not take woke the member again after each read its push made:
	// a loop of store reads that sent nothing, until a report or the
	// clock changed the pool.
	var room uint64
	if held := l.held(); held > p.assigned {
		room = held - p.assigned
	}
	if !l.backs(p.limit, now) || p.renewal(l.contended(p.limit)) {
		room += l.free
	}
	// A member spends room only when it is short of its target; those
	// are pushed furthest short first (shortestFirst), the others when
	// their target drifted, in any order.
	visit := func(id uint64, m *member, t uint64) {
		// A small shortfall is pushed only when units nobody holds appeared
		// (a stream ended, a replica gave back): it is otherwise the
		// rounding of targets that sum a little over the limit. A member
		// is pushed for what there is room for, when that raises it by
		// more than the hysteresis keeps, even if not to its target (a
		// replica that gave back part of what another needs).
		var gain uint64
		if m.assigned < t {
			gain = min(t-m.assigned, room)
		}
		short := gain > 0 && (l.free > 0 || t-m.assigned > t/8) && !keeps(m.assigned+gain, m.assigned, true)
		if !drifted(t, m.target) && !short {
			return
		}
		if short {
			room -= gain
		}
		ss := s.open[id]
		if ss == nil || ss.buckets[p.bucket] == nil || ss.moved[p.bucket] {
			return
		}
		if ss.moved == nil {
			ss.moved = make(map[string]bool)
		}
		ss.moved[p.bucket] = true
		ss.signal()
	}
	var wanting []candidate
	for id, m := range p.members {
		t := p.targetOf(m, s.pol, l.gCount, l.gDemand)
		if m.assigned < t && room > 0 {
			wanting = append(wanting, candidate{id, m, t})
			continue
		}
		visit(id, m, t)
	}
	slices.SortFunc(wanting, shortestFirst)
	for _, cd := range wanting {
		visit(cd.id, cd.m, cd.target)
	}
}

// candidate is a member of a pool with its target, as rebalance and
// pollStarved weigh it.
type candidate struct {
	id     uint64
	m      *member
	target uint64
}

// shortfall is how far c's assignment is short of its target (negative:
// over it).
func (c candidate) shortfall() int64 { return int64(c.target) - int64(c.m.assigned) }

// shortestFirst orders the members of a pool that raises only some of
// them: the one furthest short of its target first, then the lower stream
// id, so that the same state always picks the same members, whatever the
// order of Go's maps.
func shortestFirst(a, b candidate) int {
	return cmp.Or(cmp.Compare(b.shortfall(), a.shortfall()), cmp.Compare(a.id, b.id))
}

// pollStarved has pool p look at the store again in a fifth of interval
// when it is starved: contended, its targets over what it holds by more
// than an eighth, and nothing free at its last look. Another replica
// gives back what it held over its own targets behind an answer of its
// own, which the reports of this pool, an interval apart, may all have
// just missed when the Envoys report in step. It looks at most once an
// interval, a read of three keys: a pool that stays starved (replicas
// that disagree on the demand for a while) costs the store no more than
// its reports do. Called with s.mu held.
func (s *Server) pollStarved(p *pool, interval time.Duration, now time.Time) {
	l := &p.lease
	if interval <= 0 || l.polling || l.dropped || now.Before(l.polled.Add(interval)) || !l.contended(p.limit) || l.free > 0 || p.target <= l.held()+l.held()/8 {
		return
	}
	l.polling, l.polled = true, now
	s.opts.AfterFunc(interval/5, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		l.polling = false
		select {
		case <-s.closing:
			return // the streams end: nothing to push
		default:
		}
		if l.dropped || len(p.members) == 0 {
			return
		}
		// The member that is pushed, the one furthest short of its
		// target, reads the store (a starved pool reads at every report,
		// see decide) and, if units were freed, is assigned more; an
		// assignment that did not change is not sent.
		var pick *stream
		var best candidate
		for id, m := range p.members {
			ss := s.open[id]
			if ss == nil || ss.buckets[p.bucket] == nil || ss.moved[p.bucket] {
				continue
			}
			if cd := (candidate{id, m, p.targetOf(m, s.pol, l.gCount, l.gDemand)}); pick == nil || shortestFirst(cd, best) < 0 {
				pick, best = ss, cd
			}
		}
		if pick == nil {
			return
		}
		if pick.moved == nil {
			pick.moved = make(map[string]bool)
		}
		pick.moved[p.bucket] = true
		pick.signal()
	})
}

// countOps counts the operations of a budget call, which failed with err.
func (s *Server) countOps(batch []algo.Request, err error) {
	if err != nil {
		s.counts.failed.Add(1)
	}
	var takes, gives, reads uint64
	for i := range batch {
		switch r := &batch[i]; {
		case r.Peek:
			reads++
		case r.Op == algo.OpGive:
			gives++
		default:
			takes++
		}
	}
	s.counts.takes.Add(takes)
	s.counts.gives.Add(gives)
	s.counts.reads.Add(reads)
}

// decide returns bucket b's strategy under rule r (nil: no rule), given the
// rate its latest report showed (-1: a push after a reload, with no report;
// the demand known is kept). With a Budget, a pooled bucket's strategy may
// be left nil, with a renewal of its pool's lease appended to batch, whose
// call settle completes. Called with s.mu held.
func (s *Server) decide(ss *stream, b *streamBucket, r *config.Rule, rate float64, now time.Time, ttl time.Duration,
	qa *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction, batch *[]algo.Request, calls *[]call) *typev3.RateLimitStrategy {
	d := decisionFor(r)
	b.decided = d
	switch d.kind {
	case decidedByDefault:
		// No rule, or a concurrency limit alone, which RLQS cannot express.
		s.detach(ss, b, now, batch, calls)
		return s.opts.Default
	case decidedAllow:
		s.detach(ss, b, now, batch, calls)
		return s.allow
	case decidedDeny:
		s.detach(ss, b, now, batch, calls)
		return s.deny
	}
	p := s.joinPool(ss, b, r, d, now, batch, calls)
	m := p.members[ss.id]
	m.stale = time.Duration(s.opts.AbandonAfter) * b.interval
	p.sweep(now, b.interval)
	if rate >= 0 {
		p.observe(m, rate, s.opts.Smoothing, now)
		if b.partial && b.reports == 1 {
			// The report a client sends as soon as it creates the bucket
			// tells that the bucket exists, not its rate: the next
			// report's rate replaces it rather than averaging with it.
			m.observed = false
		}
	} else {
		p.touch(m)
	}
	p.retarget(m, s.pol, p.lease.gCount, p.lease.gDemand)
	until := now.Add(ttl + ledgerGrace)
	if s.opts.Budget == nil {
		return m.strategy(p.assign(m, p.limit, math.MaxUint64, until), p.period, s.opts.Burst)
	}
	if p.lease.inflight {
		// A renewal of the pool's lease is on its way; it takes at least
		// the assignments in force, m's included: m may keep what it has,
		// or less, until it settles.
		return m.strategy(p.assign(m, p.assigned, m.assigned, until), p.period, s.opts.Burst)
	}
	renewal := call{keys: p.storeKeys(ss.domain, r.ID, b.desc), ttl: ttl, renew: ttl + ledgerGrace, interval: b.interval}
	return s.fromLease(p, m, renewal, now, until, qa, batch, calls)
}

// joinPool returns the pool bucket b of stream ss counts in under rule r,
// whose limit d decides: the pool b is in, or the one of r's limit, which
// b joins when it is in none, or in another (the rules were reloaded and
// the bucket moved; it carries its part of the pool it leaves). The
// pool's limit is d's, which a reload may have changed. Called with s.mu
// held.
func (s *Server) joinPool(ss *stream, b *streamBucket, r *config.Rule, d decision, now time.Time, batch *[]algo.Request, calls *[]call) *pool {
	pk := poolKey{domain: ss.domain, rule: r.ID, bucket: b.key}
	var carried *member // the bucket's part of the pool it leaves, if any
	if b.pool != nil && b.poolKey != pk {
		carried = b.pool.members[ss.id]
		s.detach(ss, b, now, batch, calls) // the rules were reloaded and the bucket moved
	}
	if b.pool == nil {
		p := s.pools[pk]
		if p == nil {
			p = newPool(d.period, d.limit)
			p.bucket = b.key
			s.pools[pk] = p
		}
		p.join(ss.id, carried)
		b.pool, b.poolKey = p, pk
	}
	p := b.pool
	p.rescale(d.period, d.limit) // a reload may have changed the limit
	return p
}

// fromLease returns the strategy of member m of pool p, whose lease no
// renewal is on its way for, assigned out of what the lease holds when it
// backs an assignment for longer than its TTL; renewal is the call that
// renews the lease. The lease may then need a call behind the answer,
// appended to batch: what it holds over the pool's need given back, a
// read of the budget, or a renewal before it ends. When the lease does
// not back m's assignment, the renewal is appended to take it, and the
// strategy is left nil: settle sets qa's once the call settles. Called
// with s.mu held.
func (s *Server) fromLease(p *pool, m *member, renewal call, now, until time.Time,
	qa *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction, batch *[]algo.Request, calls *[]call) *typev3.RateLimitStrategy {
	l := &p.lease
	contended := l.contended(p.limit)
	if l.backs(p.limit, now) && !p.renewal(contended) {
		// The lease backs an assignment out of what it holds for longer
		// than its TTL: no take. Where the budget is contended, the pool
		// reads it and the announcements once an interval, to see what
		// the other replicas freed or need. Where it is plentiful and the
		// lease will not back the next report's assignment, it is renewed
		// now, behind this answer, which it still backs: reports then
		// wait for the store only for a pool's first lease, or one lost.
		a := p.assign(m, l.held(), math.MaxUint64, until)
		switch {
		case contended && p.surplus():
			// This assignment left the lease holding more than the pool
			// needs, which another replica may be short of: it goes back
			// now, behind the answer, rather than at the next report.
			p.renew(renewal, true, now, batch, calls)
		case contended && (!now.Before(l.next) || p.target > l.held()):
			// Once an interval, or at every report while the pool is
			// short of its targets: another replica may have given back
			// what it needs since the last look.
			p.read(m, now, renewal.interval, batch, calls)
		case !contended && !l.backs(p.limit, now.Add(renewEarly*renewal.interval)):
			p.renew(renewal, false, now, batch, calls)
		}
		return m.strategy(a, p.period, s.opts.Burst)
	}
	renewal.m, renewal.qa, renewal.until = m, qa, until
	p.renew(renewal, contended, now, batch, calls)
	return nil
}

// detach takes bucket b of stream ss out of its pool: its assignment no
// longer counts against the limit. A pool left empty gives its lease back
// (appended to batch); one whose budget is contended renews it at once,
// so that the share the bucket held is free for the other replicas to
// take at their next reports. Called with s.mu held.
func (s *Server) detach(ss *stream, b *streamBucket, now time.Time, batch *[]algo.Request, calls *[]call) {
	p := b.pool
	if p == nil {
		return
	}
	p.remove(ss.id)
	b.pool = nil
	l := &p.lease
	switch {
	case len(p.members) == 0:
		delete(s.pools, b.poolKey)
		if l.inflight {
			l.dropped = true // the renewal gives back what it takes
		} else {
			l.gives(now, batch)
		}
	case s.opts.Budget != nil && !l.inflight && l.backs(p.limit, now) && l.contended(p.limit):
		ttl := s.ttl(b.interval)
		p.renew(call{keys: p.keys, ttl: ttl, renew: ttl + ledgerGrace, interval: b.interval}, true, now, batch, calls)
	}
}

// ttl is the assignment_time_to_live of a bucket reported every interval:
// twice the interval, in whole seconds (rounded up, at least 1 s), since
// Envoy reads only the seconds.
func (s *Server) ttl(interval time.Duration) time.Duration {
	if s.opts.AssignmentTTL > 0 {
		return s.opts.AssignmentTTL
	}
	return max(time.Second, (2*interval + time.Second - 1).Truncate(time.Second))
}

// leave forgets a stream that ended: its shares go to the streams that
// remain, at their next reports, and its pools' budget it held goes back
// to the store.
func (s *Server) leave(ss *stream) {
	s.work.Add(1)
	defer s.work.Add(-1)
	var batch []algo.Request
	var calls []call
	s.mu.Lock()
	now := s.opts.Now()
	for _, b := range ss.buckets {
		s.detach(ss, b, now, &batch, &calls)
		s.track(b, ruleRef{}, 0)
	}
	s.counts.buckets -= len(ss.buckets)
	ss.buckets = nil
	s.active--
	delete(s.open, ss.id)
	select {
	case <-ss.wake: // signalled, never reassessed; no more now it is not open
		s.work.Add(-1)
	default:
	}
	s.mu.Unlock()
	s.opts.Logger.Debug("rlqs stream ended", "stream", ss.id, "domain", ss.domain)
	if len(batch) > 0 {
		s.settle(batch, calls)
	}
}

// Streams returns how many streams are open.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active
}

// Pools returns how many bucket limits are shared by streams at the moment.
func (s *Server) Pools() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pools)
}
