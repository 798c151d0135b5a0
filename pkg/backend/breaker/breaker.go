// Package breaker guards a backend that can fail, such as Redis: every
// call gets a deadline, and a circuit breaker stops calling a backend that
// keeps failing, so that decisions fall to the failure policy in
// microseconds instead of waiting for timeouts.
//
// The circuit is closed while calls succeed. After Options.Failures
// consecutive failures (errors or timeouts) it opens: calls fail at once
// with [ErrOpen], without reaching the backend. After Options.Cooldown one
// call is let through as a probe (half-open); its success closes the
// circuit, its failure opens it for another cooldown. Calls made while the
// probe is out fail with ErrOpen.
//
// A call the caller itself cancelled, or whose own deadline passed, does
// not count as a failure of the backend.
package breaker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// ErrOpen is returned, without calling the backend, while the circuit is
// open.
var ErrOpen = errors.New("backend circuit open: recent calls failed; probing again after the cooldown")

// Defaults of Options.
const (
	DefaultTimeout  = 50 * time.Millisecond
	DefaultFailures = 5
	DefaultCooldown = time.Second
)

// State is the circuit's state.
type State int32

const (
	Closed   State = iota // calls go to the backend
	Open                  // calls fail at once
	HalfOpen              // one probe is out; other calls fail at once
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Options configure a Breaker. Zero fields take the defaults.
type Options struct {
	// Timeout bounds each call to the backend.
	Timeout time.Duration
	// Failures is how many consecutive failed calls open the circuit.
	Failures int
	// Cooldown is how long the circuit stays open before a probe.
	Cooldown time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// OnStateChange, when set, is called each time the circuit changes
	// state, with the error that caused it (nil when it closes). It runs
	// under the breaker's lock, so changes arrive in order; it must be
	// quick and must not call the breaker.
	OnStateChange func(from, to State, err error)
}

// Breaker is an [algo.Backend] guarding another.
type Breaker struct {
	inner algo.Backend
	opts  Options

	mu       sync.Mutex
	state    State
	failures int       // consecutive, while closed
	openedAt time.Time // when the circuit last opened

	calls, errs, timeouts, rejected, opens atomic.Uint64
}

// New returns a breaker in front of inner.
func New(inner algo.Backend, opts Options) *Breaker {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Failures <= 0 {
		opts.Failures = DefaultFailures
	}
	if opts.Cooldown <= 0 {
		opts.Cooldown = DefaultCooldown
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Breaker{inner: inner, opts: opts}
}

// Decide implements [algo.Backend].
func (b *Breaker) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	probe, err := b.admit()
	if err != nil {
		b.rejected.Add(1)
		return err
	}
	b.calls.Add(1)
	cctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	err = b.inner.Decide(cctx, reqs, out)
	cancel()
	switch {
	case err == nil:
		b.succeeded(probe)
		return nil
	case ctx.Err() != nil:
		// The caller gave up: no verdict on the backend. A probe must not
		// leave the circuit half-open forever.
		if probe {
			b.failed(true, ctx.Err())
		}
		return err
	}
	b.errs.Add(1)
	if errors.Is(err, context.DeadlineExceeded) || cctx.Err() != nil {
		b.timeouts.Add(1)
		err = fmt.Errorf("backend did not answer within %v: %w", b.opts.Timeout, err)
	}
	b.failed(probe, err)
	return err
}

// Reset implements [algo.Resetter] when the guarded backend does. It is an
// operator's call: it bypasses the circuit, with the same deadline.
func (b *Breaker) Reset(ctx context.Context, reqs []algo.Request) error {
	r, ok := b.inner.(algo.Resetter)
	if !ok {
		return errors.New("breaker: the backend cannot reset keys")
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	defer cancel()
	return r.Reset(ctx, reqs)
}

// admit lets a call through, or says why not. probe reports that the call
// is the half-open circuit's probe.
func (b *Breaker) admit() (probe bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Closed:
		return false, nil
	case Open:
		if b.opts.Now().Sub(b.openedAt) < b.opts.Cooldown {
			return false, ErrOpen
		}
		b.setLocked(HalfOpen, nil)
		return true, nil
	}
	return false, ErrOpen // half-open: the probe is out
}

func (b *Breaker) succeeded(probe bool) {
	b.mu.Lock()
	b.failures = 0
	if probe && b.state == HalfOpen {
		b.setLocked(Closed, nil)
	}
	b.mu.Unlock()
}

func (b *Breaker) failed(probe bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case probe && b.state == HalfOpen:
		b.openLocked(err)
	case b.state == Closed:
		b.failures++
		if b.failures >= b.opts.Failures {
			b.openLocked(err)
		}
	}
}

func (b *Breaker) openLocked(err error) {
	b.failures = 0
	b.openedAt = b.opts.Now()
	b.opens.Add(1)
	b.setLocked(Open, err)
}

// setLocked changes the state and reports the change.
func (b *Breaker) setLocked(to State, err error) {
	from := b.state
	b.state = to
	if from != to && b.opts.OnStateChange != nil {
		b.opts.OnStateChange(from, to, err)
	}
}

// State returns the circuit's state.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Stats are a breaker's counters since it was made.
type Stats struct {
	Calls    uint64 // calls that reached the backend
	Errors   uint64 // of those, failed ones (timeouts included)
	Timeouts uint64 // of those, ones past Options.Timeout
	Rejected uint64 // calls refused with ErrOpen
	Opens    uint64 // times the circuit opened
}

// Stats returns the counters.
func (b *Breaker) Stats() Stats {
	return Stats{
		Calls:    b.calls.Load(),
		Errors:   b.errs.Load(),
		Timeouts: b.timeouts.Load(),
		Rejected: b.rejected.Load(),
		Opens:    b.opens.Load(),
	}
}
