package aigwsim

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Workload draws the streams users send: costs from a log-normal
// distribution capped at CostMax, durations from the cost (time to first
// token, then a time per token), and each stream's fate by its share.
type Workload struct {
	CostMedian float64 // median tokens of a served stream
	CostSigma  float64 // standard deviation of the cost's logarithm
	CostMax    uint64  // costs are capped here
	ZeroShare  float64 // share of served streams that use no tokens

	FirstToken time.Duration // duration of a stream of no tokens
	PerToken   time.Duration // and of each token

	UpstreamFailureShare    float64 // share of streams whose upstream fails
	ResetShare              float64 // share reset by the client mid-stream
	ResetWhileCheckingShare float64 // share reset while the request-time call is in flight
}

// DefaultWorkload returns issue 31's workload: a median of 700 tokens, at most 4,000,
// 5% upstream failures, 1% resets mid-stream and 0.5% while checking, 1%
// of streams costing nothing, about 2 s a stream of 700 tokens and 10 s
// one of 4,000, long enough to cross windows of 10 s.
func DefaultWorkload() Workload {
	return Workload{
		CostMedian: 700, CostSigma: 0.6, CostMax: 4000, ZeroShare: 0.01,
		FirstToken: 300 * time.Millisecond, PerToken: 2500 * time.Microsecond,
		UpstreamFailureShare: 0.05, ResetShare: 0.01, ResetWhileCheckingShare: 0.005,
	}
}

// Draw draws one stream from r.
func (w Workload) Draw(r *rand.Rand) Stream {
	cost := uint64(0)
	if r.Float64() >= w.ZeroShare {
		c := math.Round(w.CostMedian * math.Exp(w.CostSigma*r.NormFloat64()))
		cost = min(uint64(max(c, 1)), w.CostMax)
	}
	full := w.FirstToken + time.Duration(cost)*w.PerToken
	switch p := r.Float64(); {
	case p < w.UpstreamFailureShare:
		// An upstream error comes with the first byte.
		return Stream{Fate: UpstreamFailure, Duration: w.FirstToken}
	case p < w.UpstreamFailureShare+w.ResetShare:
		return Stream{Fate: ClientReset, Duration: time.Duration(r.Float64() * float64(full))}
	case p < w.UpstreamFailureShare+w.ResetShare+w.ResetWhileCheckingShare:
		return Stream{Fate: ResetWhileChecking}
	default:
		return Stream{Fate: Complete, Cost: cost, Duration: full}
	}
}

// Load is Users concurrent users, each sending streams back to back through
// one Client with a think time between them, for For or until MaxRequests
// request-time calls, whichever comes first. A refused stream is sent again,
// the same, after the think time: the user retries the same prompt.
type Load struct {
	Users       int
	Workload    Workload
	Think       time.Duration // each pause is uniform in [0, 2·Think)
	For         time.Duration // no stream starts after For; streams still going then are reset
	MaxRequests int           // request-time calls of all users, at most
	Seed        uint64        // user u draws from PCG(Seed, u)
	Clock       Clock         // nil: RealClock
}

// Run is what a Load did.
type Run struct {
	Began, Ended time.Time // the load started, and stopped starting streams
	Results      []Result  // every request, in the order they ended
}

// Run runs the load through c, then waits for its stream-done calls. ctx
// is every user's connection: done, their streams are reset.
func (l Load) Run(ctx context.Context, c *Client) (Run, error) {
	if l.Users <= 0 || l.For <= 0 || l.MaxRequests <= 0 {
		return Run{}, errors.New("aigwsim: a load needs users, and bounds in time (For) and count (MaxRequests)")
	}
	clock := l.Clock
	if clock == nil {
		clock = RealClock{}
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	r := &runner{load: l, clock: clock, client: c, run: Run{Began: clock.Now()}}
	r.end = r.run.Began.Add(l.For)
	go func() {
		if clock.Sleep(ctx, l.For) == nil {
			stop() // streams still going are reset
		}
	}()
	var users sync.WaitGroup
	for u := range l.Users {
		users.Add(1)
		go func() {
			defer users.Done()
			r.user(ctx, rand.New(rand.NewPCG(l.Seed, uint64(u))))
		}()
	}
	users.Wait()
	r.run.Ended = r.stopped
	if r.run.Ended.IsZero() || r.run.Ended.After(r.end) {
		r.run.Ended = r.end
	}
	c.Wait()
	return r.run, nil
}

// runner is the state of one Load.Run its users share.
type runner struct {
	load   Load
	clock  Clock
	client *Client
	end    time.Time

	mu      sync.Mutex
	asked   int
	stopped time.Time // when the last user stopped, if before end
	run     Run
}

// user sends streams until the load ends.
func (r *runner) user(ctx context.Context, rng *rand.Rand) {
	defer r.userStopped()
	for {
		s := r.load.Workload.Draw(rng)
		for {
			if !r.ask() {
				return
			}
			res := r.client.Run(ctx, s)
			r.record(res)
			if r.clock.Sleep(ctx, time.Duration(rng.Float64()*2*float64(r.load.Think))) != nil {
				return
			}
			if res.Outcome != Refused {
				break
			}
		}
	}
}

// ask reports whether a user may send one more request-time call, and
// counts it.
func (r *runner) ask() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asked >= r.load.MaxRequests || !r.clock.Now().Before(r.end) {
		return false
	}
	r.asked++
	return true
}

func (r *runner) record(res Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.run.Results = append(r.run.Results, res)
}

func (r *runner) userStopped() {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.After(r.stopped) {
		r.stopped = now
	}
}
