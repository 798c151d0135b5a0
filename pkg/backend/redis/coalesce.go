package redis

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// maxCoalesced bounds the requests one coalesced call carries.
const maxCoalesced = 256

// job is one Decide call waiting for a coalescing worker. Its keys and
// arguments are built by the caller, so that a worker never reads the
// caller's requests, which the caller may reuse once it gave up.
type job struct {
	ctx   context.Context
	start time.Time // when the caller asked
	n     int       // requests
	keys  []string
	args  []any // the requests' arguments, without the call's header
	res   []algo.Decision
	err   error
	done  chan struct{}
}

// coalescer runs Decide calls through a few workers, each of which takes
// every call waiting when it is free and decides them in one call of the
// decision, each call's batch still all or nothing on its own. Under light
// load a worker is free and a call goes out at once; under heavy load the
// waiting calls share one write, one read and one FCALL.
type coalescer struct {
	b    *Backend
	jobs chan *job
	quit chan struct{}
}

func newCoalescer(b *Backend, workers int) *coalescer {
	c := &coalescer{b: b, jobs: make(chan *job, 4*maxCoalesced), quit: make(chan struct{})}
	for range workers {
		go c.work()
	}
	return c
}

func (c *coalescer) close() { close(c.quit) }

// decide queues reqs for a worker and waits for its decisions, or for ctx.
func (c *coalescer) decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	j := &job{ctx: ctx, start: time.Now(), n: len(reqs), res: make([]algo.Decision, len(reqs)), done: make(chan struct{})}
	j.keys, reqs = c.b.prepare(reqs, false)
	j.args = algo.AppendRequestArgs(make([]any, 0, algo.ScriptArgsPerRequest*len(reqs)), reqs)
	select {
	case c.jobs <- j:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-j.done:
		if j.err != nil {
			return j.err
		}
		copy(out, j.res)
		return nil
	case <-ctx.Done():
		return ctx.Err() // the decision may still be made, as on a timeout
	}
}

func (c *coalescer) work() {
	var group []*job
	for {
		select {
		case <-c.quit:
			return
		case j := <-c.jobs:
			group = append(group[:0], j)
		}
		n := group[0].n
	more:
		for n < maxCoalesced {
			select {
			case j := <-c.jobs:
				group = append(group, j)
				n += j.n
			default:
				break more
			}
		}
		c.run(group)
	}
}

// run decides group in one call and hands each job its decisions.
func (c *coalescer) run(group []*job) {
	// Jobs whose caller gave up are dropped before the call.
	live := group[:0]
	for _, j := range group {
		if j.ctx.Err() != nil {
			j.err = j.ctx.Err()
			close(j.done)
			continue
		}
		live = append(live, j)
	}
	if len(live) == 0 {
		return
	}
	var now time.Time
	if c.b.opts.Now != nil {
		now = c.b.opts.Now()
	}
	// The call is bounded by the longest deadline of its callers.
	ctx, cancel := context.WithTimeout(context.Background(), c.deadline(live))
	defer cancel()
	keys := make([]string, 0, len(live)*live[0].n)
	args := algo.AppendBatchesHeader(make([]any, 0, 4+len(live)+len(live)*algo.ScriptArgsPerRequest*live[0].n), now, c.b.minTTL, time.Time{}, len(live))
	// Each job's batch carries the instant after which it decides nothing:
	// before its caller gives up, or the call does (the client's read
	// timeout), by the margin (clock.go).
	giveUp := c.b.giveUp(ctx, time.Now())
	bounds := make([]lateBound, len(live))
	for i, j := range live {
		g := giveUp
		if d, ok := j.ctx.Deadline(); ok && (g.IsZero() || d.Before(g)) {
			g = d
		}
		bounds[i] = c.b.lateBound(j.start, g)
		args = algo.AppendBatchLen(args, j.n, bounds[i].notAfter)
	}
	for _, j := range live {
		keys = append(keys, j.keys...)
		args = append(args, j.args...)
	}
	reply, err := c.b.run(ctx, c.b.client, keys, args)
	late := make([]bool, len(live))
	if err == nil {
		outs := make([][]algo.Decision, len(live))
		for i, j := range live {
			outs[i] = j.res
		}
		if perr := algo.ParseBatchesReply(reply, outs, late); perr != nil {
			err = fmt.Errorf("redis: %w", perr)
		}
	}
	for i, j := range live {
		j.err = err
		if late[i] && err == nil {
			j.err = fmt.Errorf("redis: %w", algo.ErrLate)
		}
		c.b.checkLate(bounds[i], j.err)
		close(j.done)
	}
}

// deadline is the time left to the latest deadline among jobs, or a
// minute when one has none.
func (c *coalescer) deadline(jobs []*job) time.Duration {
	var latest time.Time
	for _, j := range jobs {
		d, ok := j.ctx.Deadline()
		if !ok {
			return time.Minute
		}
		if d.After(latest) {
			latest = d
		}
	}
	return time.Until(latest)
}
