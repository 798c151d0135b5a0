// Package rlqssim is a simulated Envoy rate_limit_quota filter: an RLQS
// client that decides requests locally from the assignments of an RLQS
// server, as Envoy does, for tests and as a load generator.
//
// A [Client] opens one StreamRateLimitQuotas stream for its domain, counts
// allowed and denied requests per bucket, and reports them every reporting
// interval (and at once when a bucket is first seen, as Envoy does). It
// applies each assignment with a local limiter: a blanket rule as is,
// requests_per_time_unit as a token bucket of that many tokens refilled
// over the unit, a token_bucket as given. A new bucket's limiter starts
// full; a changed assignment keeps the tokens left (at most its new size).
// An assignment that outlives its TTL falls back to the no-assignment
// behaviour; abandon_action forgets the bucket.
package rlqssim

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Option configures a [Client].
type Option func(*Client)

// WithClock makes the client read time from now (token refills, TTLs and
// time_elapsed). With a clock of its own a test usually also wants
// [WithManualReports].
func WithClock(now func() time.Time) Option { return func(c *Client) { c.now = now } }

// WithManualReports stops the reporting loop: reports are sent only by
// [Client.Report], which a test drives on its own clock.
func WithManualReports() Option { return func(c *Client) { c.manual = true } }

// WithNoAssignment sets whether a bucket without an assignment (new, or its
// assignment expired) admits requests: Envoy's no_assignment_behavior, a
// blanket rule. Default allow.
func WithNoAssignment(allow bool) Option { return func(c *Client) { c.noAssignment = allow } }

// Client is one simulated Envoy. Its methods are safe for concurrent use.
type Client struct {
	domain       string
	interval     time.Duration
	now          func() time.Time
	manual       bool
	noAssignment bool

	stream grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel context.CancelFunc
	sendMu sync.Mutex // one Send at a time; the first report carries the domain
	sent   bool

	mu       sync.Mutex
	buckets  map[string]*bucket
	received uint64        // responses applied
	changed  chan struct{} // closed and replaced when a response is applied
	err      error         // why the stream ended
	wake     chan struct{} // a new bucket asks the loop for a report
	done     chan struct{} // closed when both loops ended
}

type bucket struct {
	id         map[string]string
	allowed    uint64
	denied     uint64
	lastReport time.Time
	strategy   *typev3.RateLimitStrategy // nil: no assignment
	expires    time.Time                 // zero: never
	tokens     float64
	max        float64 // bucket size; 0 when the strategy is a blanket rule
	perSecond  float64 // refill rate
	refilled   time.Time
}

// New opens a stream to the RLQS server on conn for domain, reporting every
// interval.
func New(conn grpc.ClientConnInterface, domain string, interval time.Duration, opts ...Option) (*Client, error) {
	if domain == "" || interval <= 0 {
		return nil, errors.New("rlqssim: a domain and a positive interval are required")
	}
	c := &Client{
		domain: domain, interval: interval, now: time.Now, noAssignment: true,
		buckets: make(map[string]*bucket), changed: make(chan struct{}),
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	for _, o := range opts {
		o(c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	c.stream, c.cancel = st, cancel
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.receive() }()
	if !c.manual {
		wg.Add(1)
		go func() { defer wg.Done(); c.loop(ctx) }()
	}
	go func() { wg.Wait(); close(c.done) }()
	return c, nil
}

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
// next report.
func (c *Client) Allow(id map[string]string) bool {
	k := bucketKey(id)
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.buckets[k]
	if b == nil {
		b = &bucket{id: maps.Clone(id), lastReport: now}
		c.buckets[k] = b
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	ok := b.decide(now, c.noAssignment)
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
	return ok
}

func (b *bucket) decide(now time.Time, noAssignment bool) bool {
	if b.strategy == nil || (!b.expires.IsZero() && !now.Before(b.expires)) {
		return noAssignment
	}
	if r, ok := b.strategy.Strategy.(*typev3.RateLimitStrategy_BlanketRule_); ok {
		return r.BlanketRule == typev3.RateLimitStrategy_ALLOW_ALL
	}
	b.decideRefill(now)
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// decideRefill adds the tokens earned since the last refill.
func (b *bucket) decideRefill(now time.Time) {
	if el := now.Sub(b.refilled); el > 0 {
		b.tokens = min(b.max, b.tokens+el.Seconds()*b.perSecond)
		b.refilled = now
	}
}

// apply installs an assignment.
func (b *bucket) apply(a *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction, now time.Time) {
	s := a.GetRateLimitStrategy()
	if s == nil {
		s = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{}}
	}
	var size, perSecond float64
	switch v := s.Strategy.(type) {
	case *typev3.RateLimitStrategy_RequestsPerTimeUnit_:
		size = float64(v.RequestsPerTimeUnit.GetRequestsPerTimeUnit())
		perSecond = size / unitSeconds(v.RequestsPerTimeUnit.GetTimeUnit())
	case *typev3.RateLimitStrategy_TokenBucket:
		tb := v.TokenBucket
		size = float64(tb.GetMaxTokens())
		fill := uint32(1)
		if tb.GetTokensPerFill() != nil {
			fill = tb.GetTokensPerFill().GetValue()
		}
		if iv := tb.GetFillInterval().AsDuration(); iv > 0 {
			perSecond = float64(fill) / iv.Seconds()
		}
	}
	if b.max > 0 {
		b.decideRefill(now)
	}
	if b.strategy == nil || b.max == 0 {
		b.tokens = size // a new limiter starts full
	} else {
		b.tokens = min(b.tokens, size)
	}
	b.strategy, b.max, b.perSecond, b.refilled = s, size, perSecond, now
	b.expires = time.Time{}
	if ttl := a.GetAssignmentTimeToLive(); ttl != nil {
		b.expires = now.Add(ttl.AsDuration())
	}
}

func unitSeconds(u typev3.RateLimitUnit) float64 {
	switch u {
	case typev3.RateLimitUnit_MINUTE:
		return 60
	case typev3.RateLimitUnit_HOUR:
		return 3600
	case typev3.RateLimitUnit_DAY:
		return 86400
	case typev3.RateLimitUnit_MONTH:
		return 30 * 86400
	case typev3.RateLimitUnit_YEAR:
		return 365 * 86400
	}
	return 1
}

// loop reports every interval, and at once for new buckets.
func (c *Client) loop(ctx context.Context) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.wake:
		}
		if _, err := c.send(); err != nil {
			return
		}
	}
}

// send reports every bucket's counts since its last report. With no bucket
// it sends nothing (as Envoy) and says so.
func (c *Client) send() (sent bool, err error) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	now := c.now()
	rep := &rlqsv3.RateLimitQuotaUsageReports{}
	if !c.sent {
		rep.Domain = c.domain
	}
	c.mu.Lock()
	for _, b := range c.buckets {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: b.id},
			TimeElapsed:        durationpb.New(now.Sub(b.lastReport)),
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	c.mu.Unlock()
	if len(rep.BucketQuotaUsages) == 0 {
		return false, nil
	}
	c.sent = true
	return true, c.stream.Send(rep)
}

// receive applies the server's responses until the stream ends.
func (c *Client) receive() {
	for {
		resp, err := c.stream.Recv()
		c.mu.Lock()
		if err != nil {
			c.err = err
			close(c.changed)
			c.mu.Unlock()
			return
		}
		now := c.now()
		for _, a := range resp.GetBucketAction() {
			k := bucketKey(a.GetBucketId().GetBucket())
			b := c.buckets[k]
			if b == nil {
				continue
			}
			if qa := a.GetQuotaAssignmentAction(); qa != nil {
				b.apply(qa, now)
			} else if a.GetAbandonAction() != nil {
				delete(c.buckets, k)
			}
		}
		c.received++
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
	}
}

// Report sends a report of every bucket now and waits for the server's
// response to be applied (the server answers each report), or for ctx. A
// client without buckets sends nothing.
func (c *Client) Report(ctx context.Context) error {
	c.mu.Lock()
	want := c.received + 1
	c.mu.Unlock()
	if sent, err := c.send(); err != nil || !sent {
		return err
	}
	for {
		c.mu.Lock()
		got, ch, err := c.received, c.changed, c.err
		c.mu.Unlock()
		switch {
		case got >= want:
			return nil
		case err != nil:
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Assignment returns bucket id's strategy in force, nil when it has none
// (never assigned, expired or abandoned).
func (c *Client) Assignment(id map[string]string) *typev3.RateLimitStrategy {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.buckets[bucketKey(id)]
	if b == nil || b.strategy == nil || (!b.expires.IsZero() && !c.now().Before(b.expires)) {
		return nil
	}
	return b.strategy
}

// Err returns why the stream ended, or nil while it is open.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the stream and waits for the client's goroutines.
func (c *Client) Close() error {
	c.sendMu.Lock()
	err := c.stream.CloseSend()
	c.sendMu.Unlock()
	c.cancel()
	<-c.done
	return err
}
