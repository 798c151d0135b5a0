// Package rlqssim is a simulated Envoy rate_limit_quota filter: an RLQS
// client that decides requests locally from the assignments of an RLQS
// server exactly as Envoy's filter does, for tests and as a load
// generator.
//
// Every behaviour is modelled on Envoy's source, read at commit
// 0b559611553841f503171457578e8fcea6a82b17 (and c33e7f824b99 where it
// differs), files under source/extensions/filters/http/rate_limit_quota/
// and source/common/common/token_bucket_impl.cc; each is cited where it
// is implemented. In short:
//
//   - Enforced strategies: a blanket rule (ALLOW_ALL, DENY_ALL) and a
//     token_bucket. A requests_per_time_unit assignment is ignored: the
//     bucket keeps what it had, usually its no_assignment_behavior.
//   - Token buckets: the rate is tokens_per_fill over fill_interval's
//     whole seconds (a sub-second interval divides by zero: an infinite
//     rate), max_tokens is the burst, and a new bucket starts full.
//   - An assignment replaces the token bucket in force only when
//     max_tokens, tokens_per_fill or fill_interval's nanos differ; then
//     the new bucket starts full ([ReplaceFull], Envoy 0b559611) or as
//     full as the old one was ([ReplaceFraction], Envoy c33e7f82).
//   - assignment_time_to_live counts in whole seconds (0 expires at once);
//     on expiry expired_assignment_behavior applies for its timeout, then
//     no_assignment_behavior.
//   - Reports go out every 5 s whatever reporting_interval says, with
//     time_elapsed in whole seconds and the domain on every report; a new
//     bucket is reported at once, alone, with time_elapsed 0. Reports are
//     dropped while the stream is down; the next report reopens it.
//   - Replies are matched to buckets by their whole bucket id; unknown ids
//     are ignored; abandon_action erases the bucket.
package rlqssim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// EnvoyReportingInterval is how often Envoy's filter reports, whatever a
// bucket's reporting_interval: initTlsStore in filter_persistence.cc
// hard-codes 5000 ms (a TODO there; Envoy issue 46033).
const EnvoyReportingInterval = 5 * time.Second

// Replacement is what a token bucket replacing another starts with.
type Replacement int

const (
	// ReplaceFull starts a replacing bucket full, as every new bucket:
	// createTokenBucketFromAction in Envoy 0b559611.
	ReplaceFull Replacement = iota
	// ReplaceFraction starts it with the old bucket's fraction of tokens:
	// max_tokens × remaining/old max_tokens, truncated, as
	// createTokenBucketFromAction in Envoy c33e7f82 does.
	ReplaceFraction
)

// Option configures a [Client].
type Option func(*Client)

// WithClock makes the client read time from now: token refills, TTLs and
// time_elapsed (Envoy's monotonic clock). With a clock of its own a test
// usually also wants [WithManualReports].
func WithClock(now func() time.Time) Option { return func(c *Client) { c.now = now } }

// WithManualReports stops the reporting timer: periodic reports are sent
// only by [Client.Report], which a test drives on its own clock. A new
// bucket is still reported at once, as Envoy does.
func WithManualReports() Option { return func(c *Client) { c.manual = true } }

// WithReportingInterval reports every d instead of Envoy's 5 s
// ([EnvoyReportingInterval]): no Envoy does, so only tests of a server
// against a client that honours another interval want it.
func WithReportingInterval(d time.Duration) Option { return func(c *Client) { c.interval = d } }

// WithNoAssignment sets no_assignment_behavior: whether a bucket without
// an assignment (new, or its assignment and fallback expired) admits
// requests, its fallback_rate_limit being a blanket ALLOW_ALL or DENY_ALL.
// Default allow, as Envoy without the setting (recordBucketUsage in
// filter.cc). A token bucket there makes Envoy dereference a null limiter,
// so it is not offered.
func WithNoAssignment(allow bool) Option {
	return func(c *Client) {
		c.noAssignment = blanket(typev3.RateLimitStrategy_DENY_ALL)
		if allow {
			c.noAssignment = blanket(typev3.RateLimitStrategy_ALLOW_ALL)
		}
	}
}

// WithExpiredAssignment sets expired_assignment_behavior: fallback_rate_limit
// st for expired_assignment_behavior_timeout d (whole seconds, as Envoy
// reads it) once an assignment's TTL ends; then no_assignment_behavior.
// Without it an expired assignment falls back at once.
// (reuse_last_assignment is not read by Envoy's filter: recordBucketUsage
// in filter.cc looks only at fallback_rate_limit.)
func WithExpiredAssignment(st *typev3.RateLimitStrategy, d time.Duration) Option {
	return func(c *Client) { c.fallback, c.fallbackTTL = st, d.Truncate(time.Second) }
}

// WithReplacement sets what a replacing token bucket starts with. Default
// [ReplaceFull].
func WithReplacement(r Replacement) Option { return func(c *Client) { c.replacement = r } }

// Client is one simulated Envoy: the filter's global client for one RLQS
// server and domain, with its buckets. Its methods are safe for
// concurrent use.
type Client struct {
	conn         grpc.ClientConnInterface
	domain       string
	interval     time.Duration
	now          func() time.Time
	manual       bool
	noAssignment *typev3.RateLimitStrategy
	fallback     *typev3.RateLimitStrategy
	fallbackTTL  time.Duration
	replacement  Replacement

	ctx    context.Context
	cancel context.CancelFunc
	// started is set by the first bucket's creation, which starts the
	// stream and the reporting timer (stream_tried_by_bucket_creation_).
	started bool

	sendMu sync.Mutex // one Send at a time
	mu     sync.Mutex
	stream grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	// gen counts the streams opened; a receiver of an older one exits.
	gen     int
	buckets map[string]*bucket
	stats   Stats
	// asked counts the reports with buckets sent on the stream, answered
	// the responses received on it: [Client.Report] waits for them to meet
	// (a server answers each report, and may push more).
	asked, answered uint64
	changed         chan struct{} // closed and replaced when a response is applied or a stream ends
	err             error         // why the last stream ended
	closed          bool
	wg              sync.WaitGroup
}

// Stats counts what a client did, for tests to bound what it admitted.
type Stats struct {
	Allowed, Denied uint64 // requests decided
	// Unassigned counts the requests allowed while no assignment from the
	// server was in force: by no_assignment_behavior, or by
	// expired_assignment_behavior.
	Unassigned uint64
	// TokenBuckets counts the token buckets made from assignments (new
	// ones and replacements; not those carried over), and StartTokens
	// sums the tokens they started with: what they could admit at once on
	// top of their rates.
	TokenBuckets uint64
	StartTokens  float64
	Carried      uint64 // assignments that kept the token bucket in force
	// Ignored counts the assignments Envoy skips: requests_per_time_unit
	// and no strategy; Unknown, actions for buckets the client does not
	// hold.
	Ignored, Unknown uint64
	Expired          uint64 // assignments whose TTL ended
	Abandoned        uint64 // buckets erased by abandon_action
	// Reports counts the reports sent, Dropped those lost because the
	// stream was down, Streams the streams opened, Responses the
	// responses received (answers and pushes).
	Reports, Dropped, Streams, Responses uint64
}

// bucket is one cached bucket (CachedBucket in quota_bucket_cache.h).
type bucket struct {
	id         map[string]string
	allowed    uint64
	denied     uint64
	lastReport time.Time
	// action is the cached action (nil: default_action, the
	// no_assignment_behavior, decides); fromServer tells an assignment
	// from an expired_assignment_behavior fallback.
	action     *typev3.RateLimitStrategy
	fromServer bool
	limiter    *tokenBucket // the action's token bucket, if it is one
	expires    time.Time    // when the action's TTL ends (fromServer)
	fallsBack  time.Time    // when the fallback ends (!fromServer)
}

// New returns a client of the RLQS server on conn for domain, reporting
// every 5 s as Envoy does (see the options). As Envoy, it opens its stream
// and starts its reporting timer when its first bucket is created.
func New(conn grpc.ClientConnInterface, domain string, opts ...Option) (*Client, error) {
	if domain == "" {
		return nil, errors.New("rlqssim: a domain is required (the filter's domain)")
	}
	c := &Client{
		conn: conn, domain: domain, interval: EnvoyReportingInterval, now: time.Now,
		noAssignment: blanket(typev3.RateLimitStrategy_ALLOW_ALL),
		buckets:      make(map[string]*bucket), changed: make(chan struct{}),
	}
	for _, o := range opts {
		o(c)
	}
	if c.interval <= 0 {
		return nil, errors.New("rlqssim: the reporting interval must be positive")
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// startLocked starts the stream and the reporting timer at the first
// bucket's creation (createBucketImpl): a stream that fails to start is
// tried again at the next periodic report. Called with c.mu held.
func (c *Client) startLocked() {
	if c.started || c.closed {
		return
	}
	c.started = true
	if !c.manual {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.loop() }()
	}
	if err := c.openLocked(); err != nil {
		c.err = err
	}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// openLocked starts a stream (startStreamImpl) and its receiver. Called
// with c.mu held.
func (c *Client) openLocked() error {
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(c.conn).StreamRateLimitQuotas(c.ctx)
	if err != nil {
		return err
	}
	c.stream, c.err = st, nil
	c.asked, c.answered = 0, 0
	c.gen++
	c.stats.Streams++
	gen := c.gen
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.receive(st, gen) }()
	return nil
}

// bucketKey stands for Envoy's MessageUtil::hash of the whole BucketId:
// two ids are one bucket exactly when their maps are equal.
func bucketKey(id map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(id)) {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(id[k])
		b.WriteByte(0)
	}
	return b.String()
}

// Allow decides one request of bucket id locally and counts it for the
// next report: RateLimitQuotaFilter::recordBucketUsage in filter.cc. A
// new bucket is decided by no_assignment_behavior (only a blanket
// DENY_ALL refuses it: noAssignmentBehaviorShouldAllow), created, and
// reported at once, alone (createBucketImpl and buildReports(bucket) in
// global_client_impl.cc).
func (c *Client) Allow(id map[string]string) bool {
	k := bucketKey(id)
	c.mu.Lock()
	now := c.now()
	b := c.buckets[k]
	if b == nil {
		ok := c.noAssignment.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL
		c.startLocked()
		b = &bucket{id: maps.Clone(id), lastReport: now}
		c.count(b, ok, true)
		c.buckets[k] = b
		rep := c.reportLocked([]*bucket{b}, now)
		c.mu.Unlock()
		c.sendInitial(rep)
		return ok
	}
	c.expire(b, now)
	ok := c.decide(b, now)
	c.count(b, ok, b.action == nil || !b.fromServer)
	c.mu.Unlock()
	return ok
}

func (c *Client) count(b *bucket, ok, unassigned bool) {
	if ok {
		b.allowed++
		c.stats.Allowed++
		if unassigned {
			c.stats.Unassigned++
		}
	} else {
		b.denied++
		c.stats.Denied++
	}
}

// decide is RateLimitQuotaFilter::shouldAllowRequest: the cached action,
// or the default one (no_assignment_behavior) without it.
func (c *Client) decide(b *bucket, now time.Time) bool {
	st := b.action
	if st == nil {
		st = c.noAssignment
	}
	switch v := st.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return v.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		return b.limiter.consume(now)
	}
	// RequestsPerTimeUnit ("not yet supported", allowed) and no strategy
	// (a bug, fail open).
	return true
}

// expire applies the timers due by now: onActionExpirationTimer (the
// fallback, or the default when none is set) and onFallbackExpirationTimer
// (the default). Envoy runs them on timers; deciding them when the bucket
// is next used gives the same decisions.
func (c *Client) expire(b *bucket, now time.Time) {
	if b.action != nil && b.fromServer && !now.Before(b.expires) {
		c.stats.Expired++
		at := b.expires
		if c.fallback == nil {
			b.action, b.limiter = nil, nil
		} else {
			var limiter *tokenBucket
			if tb := c.fallback.GetTokenBucket(); tb != nil {
				if old := b.action.GetTokenBucket(); old == nil || !sameTokenBucket(tb, old) {
					limiter = c.newTokenBucket(tb, b.limiter, at)
				} else {
					limiter = b.limiter
				}
			}
			b.action, b.fromServer, b.limiter, b.fallsBack = c.fallback, false, limiter, at.Add(c.fallbackTTL)
		}
	}
	if b.action != nil && !b.fromServer && !now.Before(b.fallsBack) {
		b.action, b.limiter = nil, nil
	}
}

// sameTokenBucket is protoTokenBucketsEq in global_client_impl.cc: only
// max_tokens, tokens_per_fill and fill_interval's nanos are compared.
func sameTokenBucket(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

// newTokenBucket is createTokenBucketFromAction: the rate is
// tokens_per_fill over fill_interval truncated to whole seconds
// (absl::ToInt64Seconds; 0 makes it infinite), the bucket holds max_tokens
// and starts full, or as full as old was ([ReplaceFraction]).
func (c *Client) newTokenBucket(tb *typev3.TokenBucket, old *tokenBucket, now time.Time) *tokenBucket {
	secs := tb.GetFillInterval().AsDuration().Truncate(time.Second).Seconds()
	rate := float64(tb.GetTokensPerFill().GetValue()) / secs // +Inf for 0 s
	if tb.GetTokensPerFill() == nil {
		rate = 1 / secs // Envoy reads an unset wrapper as 0; the proto requires it
	}
	start := float64(tb.GetMaxTokens())
	if c.replacement == ReplaceFraction && old != nil && old.max > 0 {
		start = math.Trunc(start * (old.remaining(now) / old.max))
	}
	c.stats.TokenBuckets++
	c.stats.StartTokens += start
	return newBucket(float64(tb.GetMaxTokens()), rate, start, now)
}

// tokenBucket is Envoy's AtomicTokenBucketImpl (token_bucket_impl.cc): the
// tokens are (now − t)·rate, at most max, and taking one moves t forward.
type tokenBucket struct {
	max, rate float64
	t         time.Time
}

// kMinFillRate in token_bucket_impl.cc: one token a year.
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

func newBucket(max, rate, start float64, now time.Time) *tokenBucket {
	rate = math.Max(math.Abs(rate), minFillRate)
	return &tokenBucket{max: max, rate: rate, t: now.Add(-seconds(start / rate))}
}

func seconds(s float64) time.Duration {
	if math.IsNaN(s) || s <= 0 {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}

// consume takes one token, or reports false (consume(1, false)).
func (tb *tokenBucket) consume(now time.Time) bool {
	total := tb.remaining(now)
	if total < 1 {
		return false
	}
	tb.t = now.Add(-seconds((total - 1) / tb.rate))
	return true
}

// remaining is remainingTokens().
func (tb *tokenBucket) remaining(now time.Time) float64 {
	if !now.After(tb.t) {
		return 0
	}
	return math.Min(tb.max, now.Sub(tb.t).Seconds()*tb.rate)
}

// reportLocked builds a report of buckets, resetting their counts
// (getUsageFromBucket: time_elapsed is the whole seconds since each
// bucket's last report, truncated; buildReports sets the domain on every
// report). Called with c.mu held.
func (c *Client) reportLocked(bs []*bucket, now time.Time) *rlqsv3.RateLimitQuotaUsageReports {
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: c.domain}
	for _, b := range bs {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: maps.Clone(b.id)},
			TimeElapsed:        &durationpb.Duration{Seconds: int64(now.Sub(b.lastReport) / time.Second)},
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	return rep
}

// sendInitial sends a new bucket's report on the stream if it is open
// (sendUsageReportImpl: dropped, not reopened, when it is down).
func (c *Client) sendInitial(rep *rlqsv3.RateLimitQuotaUsageReports) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.mu.Lock()
	st := c.stream
	if st == nil {
		c.stats.Dropped++
	} else {
		c.stats.Reports++
		c.asked++
	}
	c.mu.Unlock()
	if st != nil {
		st.Send(rep) // a failed send ends the stream; the receiver sees it
	}
}

// sendPeriodic is onSendReportsTimer: a report of every bucket, built
// first (the counts are reset even if it is dropped), then sent on the
// stream, which is reopened if it is down; if it cannot be, the report is
// dropped. sent is false when there was no bucket to report or the
// report was dropped.
func (c *Client) sendPeriodic() (sent bool) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.mu.Lock()
	if c.closed || !c.started {
		// Envoy's reporting timer starts with its first bucket: before
		// that there is no report, and no stream (one opened here would
		// be left open, unused, when the first bucket opens its own).
		c.mu.Unlock()
		return false
	}
	now := c.now()
	bs := make([]*bucket, 0, len(c.buckets))
	for _, k := range slices.Sorted(maps.Keys(c.buckets)) {
		bs = append(bs, c.buckets[k])
	}
	rep := c.reportLocked(bs, now)
	if c.stream == nil {
		if err := c.openLocked(); err != nil {
			c.err = err
			c.stats.Dropped++
			c.mu.Unlock()
			return false
		}
	}
	st := c.stream
	c.stats.Reports++
	if len(bs) > 0 {
		c.asked++
	}
	c.mu.Unlock()
	// Envoy sends a report with no bucket too; a server answers it with
	// nothing, so it is not waited for.
	return st.Send(rep) == nil && len(bs) > 0
}

// loop is the reporting timer (startSendReportsTimerImpl).
func (c *Client) loop() {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			c.sendPeriodic()
		}
	}
}

// receive applies the server's responses (onQuotaResponseImpl) until
// stream gen ends (onRemoteClose: the stream is forgotten; the next
// periodic report reopens it).
func (c *Client) receive(st grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse], gen int) {
	for {
		resp, err := st.Recv()
		c.mu.Lock()
		if err != nil {
			if c.gen == gen {
				c.stream, c.err = nil, err
			}
			close(c.changed)
			c.changed = make(chan struct{})
			c.mu.Unlock()
			return
		}
		now := c.now()
		for _, a := range resp.GetBucketAction() {
			c.apply(a, now)
		}
		if c.gen == gen {
			c.answered++
		}
		c.stats.Responses++
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
	}
}

// apply is the body of onQuotaResponseImpl for one bucket action. Called
// with c.mu held.
func (c *Client) apply(a *rlqsv3.RateLimitQuotaResponse_BucketAction, now time.Time) {
	if len(a.GetBucketId().GetBucket()) == 0 {
		c.stats.Unknown++ // "a bucket is missing its id"
		return
	}
	k := bucketKey(a.GetBucketId().GetBucket())
	b := c.buckets[k]
	if b == nil {
		c.stats.Unknown++ // "an unexpected bucket that isn't present in the bucket cache"
		return
	}
	c.expire(b, now)
	qa := a.GetQuotaAssignmentAction()
	if qa == nil {
		if a.GetAbandonAction() != nil {
			delete(c.buckets, k)
			c.stats.Abandoned++
			return
		}
		// Neither: the bucket caches an action without an assignment,
		// which allows, and expires at once.
		b.action, b.fromServer, b.limiter, b.expires = &typev3.RateLimitStrategy{}, true, nil, now
		return
	}
	st := qa.GetRateLimitStrategy()
	var limiter *tokenBucket
	switch st.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
	case *typev3.RateLimitStrategy_TokenBucket:
		// shouldReplaceTokenBucket: a new bucket unless the one in force
		// came from an equal token bucket assignment.
		if old := b.action.GetTokenBucket(); old != nil && sameTokenBucket(st.GetTokenBucket(), old) {
			limiter = b.limiter
			c.stats.Carried++
		} else {
			limiter = c.newTokenBucket(st.GetTokenBucket(), b.limiter, now)
		}
	default:
		// RequestsPerTimeUnit: "not yet supported in RLQS", and no
		// strategy: skipped; the bucket keeps what it had, TTL included.
		c.stats.Ignored++
		return
	}
	// startActionExpirationTimer: only the seconds of the TTL count.
	b.action, b.fromServer, b.limiter = proto.Clone(st).(*typev3.RateLimitStrategy), true, limiter
	b.expires = now.Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
}

// Report sends a periodic report of every bucket now and waits for its
// answer ([Client.Sync]). A client without buckets sends nothing to wait
// for; a report dropped because the stream could not be reopened returns
// its error.
func (c *Client) Report(ctx context.Context) error {
	if !c.sendPeriodic() {
		return c.Err()
	}
	return c.Sync(ctx)
}

// Sync waits until the server has answered every report sent on the
// stream (a server answers each), or for ctx, or for the stream to end.
// Envoy waits for nothing: this is for tests, to know what the client
// applied.
func (c *Client) Sync(ctx context.Context) error {
	c.mu.Lock()
	gen, want := c.gen, c.asked
	c.mu.Unlock()
	for {
		c.mu.Lock()
		got, ch, err, now := c.answered, c.changed, c.err, c.gen
		c.mu.Unlock()
		switch {
		case now != gen:
			return errors.New("rlqssim: the stream was reopened while waiting for an answer")
		case got >= want:
			return nil
		case err != nil:
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("rlqssim: %d responses on the stream for %d reports with buckets: %w", got, want, ctx.Err())
		}
	}
}

// Assignment returns the strategy an assignment of the server put in force
// for bucket id, nil when none is (never assigned, ignored, expired,
// or abandoned).
func (c *Client) Assignment(id map[string]string) *typev3.RateLimitStrategy {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.buckets[bucketKey(id)]
	if b == nil {
		return nil
	}
	c.expire(b, c.now())
	if b.action == nil || !b.fromServer {
		return nil
	}
	return b.action
}

// Stats returns what the client counted so far.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Err returns why the last stream ended, or nil while one is open.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stream != nil {
		return nil
	}
	return c.err
}

// Close ends the stream and waits for the client's goroutines.
func (c *Client) Close() error {
	c.sendMu.Lock()
	c.mu.Lock()
	c.closed = true
	st := c.stream
	c.mu.Unlock()
	var err error
	if st != nil {
		err = st.CloseSend()
	}
	c.sendMu.Unlock()
	c.cancel()
	c.wg.Wait()
	return err
}
