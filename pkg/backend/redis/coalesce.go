package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// maxCoalesced bounds the requests one coalesced call carries.
const maxCoalesced = 256

// lateGrace bounds how much later than its caller's deadline a call
// gives up: a call carries the jobs whose deadlines fall within lateGrace
// of the earliest of them, and gives up at the latest.
const lateGrace = 5 * time.Millisecond

// job is one Decide call waiting for a coalescing worker. Its keys and
// arguments are built by the caller, so that a worker never reads the
// caller's requests, which the caller may reuse once it gave up.
//
// Its outcome is handed over once. A job not yet in a call is given up
// by its caller when its ctx ends. A job in a call (sent) is the call's:
// its caller waits for the worker, which gives up on the call at most
// lateGrace after the caller's deadline and then delivers what the call
// got, a reply read as late as the Go runtime acted on the deadline
// included (lateread.go). Had the caller given up on its own timer, a
// reply already in the worker's socket would be lost whenever the runtime
// runs expired timers before it looks for sockets ready to read (after
// the machine kept this process from running), and Redis would have
// counted a decision whose caller the failure mode answered.
type job struct {
	ctx      context.Context
	start    time.Time // when the caller asked
	deadline time.Time // ctx's deadline; zero for none
	n        int       // requests
	keys     []string
	args     []any // the requests' arguments, without the call's header
	res      []algo.Decision
	err      error
	state    atomic.Int32  // jobWaiting, jobSent, then jobDelivered or jobAbandoned
	done     chan struct{} // closed once delivered
	// The keys, arguments and decisions of a job of one request, nearly
	// every job: no slices of their own to allocate.
	oneKey  [1]string
	oneArgs [algo.ScriptArgsPerRequest]any
	oneRes  [1]algo.Decision
}

// A job's states.
const (
	jobWaiting   = iota
	jobSent      // by the worker: in a call
	jobDelivered // by the worker: res and err are its outcome
	jobAbandoned // by the caller, who gave up
)

// deliver hands the job its outcome, unless its caller gave up.
func (j *job) deliver(err error) {
	if j.state.CompareAndSwap(jobWaiting, jobDelivered) || j.state.CompareAndSwap(jobSent, jobDelivered) {
		j.err = err
		close(j.done)
	}
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
	j := &job{ctx: ctx, start: time.Now(), n: len(reqs), done: make(chan struct{})}
	j.deadline, _ = ctx.Deadline()
	if len(reqs) == 1 {
		j.keys, j.args, j.res = j.oneKey[:], j.oneArgs[:0], j.oneRes[:]
	} else {
		j.keys, j.args, j.res = make([]string, len(reqs)), make([]any, 0, algo.ScriptArgsPerRequest*len(reqs)), make([]algo.Decision, len(reqs))
	}
	reqs = c.b.prepare(j.keys, reqs, false)
	j.args = algo.AppendRequestArgs(j.args, reqs)
	select {
	case c.jobs <- j:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-j.done:
	case <-ctx.Done():
		if j.state.CompareAndSwap(jobWaiting, jobAbandoned) ||
			(errors.Is(ctx.Err(), context.Canceled) && j.state.CompareAndSwap(jobSent, jobAbandoned)) {
			// Not sent, or cancelled (nobody is answered): a call made
			// later decides nothing once its not-after instant, before
			// this moment by the margin, has passed.
			return ctx.Err()
		}
		<-j.done // in a call, which gives up by lateGrace after ctx's deadline
	}
	if j.err != nil {
		return j.err
	}
	copy(out, j.res)
	return nil
}

func (c *coalescer) work() {
	var waiting []*job // taken from the queue, not yet in a call
	for {
		if len(waiting) == 0 {
			select {
			case <-c.quit:
				return
			case j := <-c.jobs:
				waiting = append(waiting, j)
			}
		}
		n := 0
		for _, j := range waiting {
			n += j.n
		}
	more:
		for n < maxCoalesced {
			select {
			case j := <-c.jobs:
				waiting = append(waiting, j)
				n += j.n
			default:
				break more
			}
		}
		k := window(waiting)
		c.run(waiting[:k])
		waiting = append(waiting[:0], waiting[k:]...)
	}
}

// window orders jobs by deadline (none last) and returns how many of the
// first make the next call: those whose deadlines fall within lateGrace of
// the first's (every one when the first has none), up to maxCoalesced
// requests. The others wait for the next call.
func window(jobs []*job) int {
	slices.SortStableFunc(jobs, func(a, b *job) int {
		if a.deadline.IsZero() != b.deadline.IsZero() {
			if a.deadline.IsZero() {
				return 1
			}
			return -1
		}
		return a.deadline.Compare(b.deadline)
	})
	first := jobs[0].deadline
	n := 0
	for k, j := range jobs {
		if k > 0 && (n+j.n > maxCoalesced || (!first.IsZero() && (j.deadline.IsZero() || j.deadline.Sub(first) > lateGrace))) {
			return k
		}
		n += j.n
	}
	return len(jobs)
}

// run decides group in one call and hands each job its decisions.
func (c *coalescer) run(group []*job) {
	// Jobs whose caller gave up, or whose deadline passed (its timer may
	// not have run yet on a busy machine), are dropped before the call.
	live := make([]*job, 0, len(group))
	sending := time.Now()
	for _, j := range group {
		err := j.ctx.Err()
		if err == nil && !j.deadline.IsZero() && !sending.Before(j.deadline) {
			err = context.DeadlineExceeded
		}
		if err != nil {
			j.deliver(err)
			continue
		}
		if j.state.CompareAndSwap(jobWaiting, jobSent) { // else abandoned meanwhile
			live = append(live, j)
		}
	}
	if len(live) == 0 {
		return
	}
	var now time.Time
	if c.b.opts.Now != nil {
		now = c.b.opts.Now()
	}
	// The call gives up at the latest deadline of its callers (within
	// lateGrace of each), or after a minute when one has none.
	latest := live[len(live)-1].deadline
	if latest.IsZero() {
		latest = time.Now().Add(time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), latest)
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
		if !j.deadline.IsZero() && (g.IsZero() || j.deadline.Before(g)) {
			g = j.deadline
		}
		bounds[i] = c.b.lateBound(j.start, g)
		args = algo.AppendBatchLen(args, j.n, bounds[i].notAfter)
	}
	for _, j := range live {
		keys = append(keys, j.keys...)
		args = append(args, j.args...)
	}
	for _, bound := range bounds {
		if bound.notAfter.IsZero() { // the offset unknown, or forgotten meanwhile
			var cancelRepeat context.CancelFunc
			ctx, cancelRepeat = endAtGiveUp(ctx, bound, giveUp)
			defer cancelRepeat()
			break
		}
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
		jerr := err
		if late[i] && err == nil {
			jerr = fmt.Errorf("redis: %w", algo.ErrLate)
		}
		c.b.checkLate(bounds[i], jerr)
		j.deliver(jerr)
	}
}
