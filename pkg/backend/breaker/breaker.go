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
// A backend made of nodes that fail apart, such as the primaries of a
// Redis Cluster, implements [Nodes]: the breaker then keeps one circuit per
// node, so that a dead node fails only the calls that reach it, and the
// keys of the other nodes are decided as if nothing had happened.
//
// A call the caller itself cancelled, or whose own deadline passed, does
// not count as a failure of the backend.
package breaker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// ErrOpen is returned, without calling the backend, while the circuit is
// open. For a backend made of nodes the error is an [*OpenError], which
// names the node and matches ErrOpen with errors.Is.
var ErrOpen = errors.New("backend circuit open: recent calls failed; probing again after the cooldown")

// OpenError is [ErrOpen] for one node of a backend made of nodes.
type OpenError struct {
	// Node is the node whose circuit is open.
	Node string
}

func (e *OpenError) Error() string {
	return "backend circuit open for node " + nodeName(e.Node) + ": recent calls to it failed; probing it again after the cooldown"
}

// Is reports whether target is ErrOpen.
func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// nodeName is how logs and errors name node: "" is a node whose address
// the backend could not tell (a Cluster whose slot map could not be read).
func nodeName(node string) string {
	if node == "" {
		return "(unknown: no slot map)"
	}
	return node
}

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
	// Failures is how many consecutive failed calls open the circuit (of
	// a node, for a backend made of nodes).
	Failures int
	// Cooldown is how long the circuit stays open before a probe.
	Cooldown time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// OnStateChange, when set, is called each time a circuit changes
	// state, with the node it guards ("" for a backend not made of
	// nodes) and the error that caused the change (nil when it closes).
	// It runs under the breaker's lock, so changes arrive in order; it
	// must be quick and must not call the breaker.
	OnStateChange func(node string, from, to State, err error)
}

// Nodes is a backend made of nodes that fail apart, such as the primaries
// of a Redis Cluster. A [Breaker] in front of one keeps a circuit per node.
type Nodes interface {
	algo.Backend
	// DecideVia decides as Decide does, through gate: it passes the
	// distinct nodes the call reaches to gate.Admit once, before it sends
	// anything, and sends nothing when Admit fails (returning its error);
	// after the call it reports each of those nodes' outcome with
	// gate.Done, nil for a node that answered.
	DecideVia(ctx context.Context, gate Gate, reqs []algo.Request, out []algo.Decision) error
}

// Gate is the breaker's side of a call through [Nodes.DecideVia].
type Gate interface {
	// Admit lets a call reach nodes, or returns an [*OpenError] for the
	// first of them whose circuit is open.
	Admit(nodes []string) error
	// Done reports how the call went on node: err is nil when the node
	// answered, and otherwise why it did not.
	Done(node string, err error)
}

// circuit is the state of one circuit, guarded by the breaker's lock.
type circuit struct {
	state    State
	failures int       // consecutive, while closed
	openedAt time.Time // when the circuit last opened
	seen     time.Time // when a call last asked for the node (nodes only)

	opens, errs, rejected uint64 // per node (nodes only)
}

// Breaker is an [algo.Backend] guarding another.
type Breaker struct {
	inner algo.Backend
	nodes Nodes // inner, when it is made of nodes
	opts  Options

	mu     sync.Mutex
	one    circuit             // the circuit, when inner is not made of nodes
	byNode map[string]*circuit // the circuits of the nodes
	pruned time.Time           // when byNode was last swept of stale nodes

	calls, errs, timeouts, rejected, opens atomic.Uint64
}

// New returns a breaker in front of inner. When inner implements [Nodes],
// the breaker keeps a circuit per node.
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
	b := &Breaker{inner: inner, opts: opts}
	if n, ok := inner.(Nodes); ok {
		b.nodes, b.byNode = n, map[string]*circuit{}
	}
	return b
}

// Decide implements [algo.Backend].
func (b *Breaker) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	if b.nodes != nil {
		return b.decideNodes(ctx, reqs, out)
	}
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
		b.mu.Lock()
		b.succeededLocked(&b.one, "", probe)
		b.mu.Unlock()
		return nil
	case ctx.Err() != nil:
		// The caller gave up: no verdict on the backend. A probe must not
		// leave the circuit half-open forever.
		if probe {
			b.mu.Lock()
			b.failedLocked(&b.one, "", true, ctx.Err())
			b.mu.Unlock()
		}
		return err
	}
	err = b.failure(err)
	b.mu.Lock()
	b.failedLocked(&b.one, "", probe, err)
	b.mu.Unlock()
	return err
}

// failure counts err, a failed call's error, and says so when the call
// ran out of time: only then, so that an answer of the backend (an error
// reply, say, even one that arrived as the deadline passed) is reported as
// it was given.
func (b *Breaker) failure(err error) error {
	b.errs.Add(1)
	if timedOut(err) {
		b.timeouts.Add(1)
		return fmt.Errorf("backend did not answer within %v: %w", b.opts.Timeout, err)
	}
	return err
}

// timedOut reports whether err says a deadline passed: the context's, or a
// socket's (net.Error, os.ErrDeadlineExceeded), which is how a client that
// sets its sockets' deadlines from the context reports it.
func timedOut(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &t) && t.Timeout())
}

// decideNodes decides through a backend made of nodes.
func (b *Breaker) decideNodes(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	c := &call{b: b, ctx: ctx}
	cctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	err := b.nodes.DecideVia(cctx, c, reqs, out)
	cancel()
	switch {
	case c.refused:
		b.rejected.Add(1)
		return err
	case c.nodes == nil:
		return err // refused before any node was asked (a bad batch)
	}
	b.calls.Add(1)
	if err != nil && ctx.Err() == nil {
		err = b.failure(err)
	}
	c.finish(err)
	return err
}

// call is a Gate for one call through [Nodes.DecideVia].
type call struct {
	b       *Breaker
	ctx     context.Context // the caller's
	nodes   []string        // admitted
	probe   []bool          // whether the call is the probe of nodes[i]
	done    []bool          // whether nodes[i] was reported
	refused bool
}

// Admit implements [Gate].
func (c *call) Admit(nodes []string) error {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.nodes != nil || c.refused {
		return errors.New("breaker: Admit called twice for one call")
	}
	now := b.opts.Now()
	b.pruneLocked(now)
	for _, n := range nodes {
		ci := b.byNode[n]
		if ci == nil {
			ci = &circuit{}
			b.byNode[n] = ci
		}
		ci.seen = now
		if ci.state == HalfOpen || (ci.state == Open && now.Sub(ci.openedAt) < b.opts.Cooldown) {
			ci.rejected++
			c.refused = true
			return &OpenError{Node: n}
		}
	}
	c.nodes = make([]string, 0, len(nodes))
	c.probe = make([]bool, 0, len(nodes))
	for _, n := range nodes {
		if slices.Contains(c.nodes, n) {
			continue
		}
		ci := b.byNode[n]
		probe := ci.state == Open // past its cooldown: this call probes it
		if probe {
			b.setLocked(ci, n, HalfOpen, nil)
		}
		c.nodes = append(c.nodes, n)
		c.probe = append(c.probe, probe)
	}
	c.done = make([]bool, len(c.nodes))
	return nil
}

// Done implements [Gate].
func (c *call) Done(node string, err error) {
	i := slices.Index(c.nodes, node)
	if i < 0 || c.done[i] {
		return
	}
	c.done[i] = true
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	c.verdictLocked(i, err)
}

// finish gives the nodes not reported the call's outcome.
func (c *call) finish(err error) {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	for i := range c.nodes {
		if !c.done[i] {
			c.done[i] = true
			c.verdictLocked(i, err)
		}
	}
}

// verdictLocked records the outcome err of the call on its node i.
func (c *call) verdictLocked(i int, err error) {
	b, n := c.b, c.nodes[i]
	ci := b.byNode[n]
	if ci == nil {
		return // swept meanwhile
	}
	switch {
	case err == nil:
		b.succeededLocked(ci, n, c.probe[i])
	case c.ctx.Err() != nil:
		// The caller gave up: no verdict, but a probe must not leave the
		// circuit half-open forever.
		if c.probe[i] {
			b.failedLocked(ci, n, true, c.ctx.Err())
		}
	default:
		ci.errs++
		b.failedLocked(ci, n, c.probe[i], err)
	}
}

// staleAfter is how long a node's circuit is kept after the last call
// that asked for the node: a node that no key maps to any more (a primary
// replaced by its replica) is forgotten, and one that comes back starts
// closed.
func (b *Breaker) staleAfter() time.Duration {
	return max(10*b.opts.Cooldown, 10*time.Second)
}

// pruneLocked forgets the circuits of nodes no call asked for lately,
// at most once per staleAfter.
func (b *Breaker) pruneLocked(now time.Time) {
	stale := b.staleAfter()
	if now.Sub(b.pruned) < stale {
		return
	}
	b.pruned = now
	for n, ci := range b.byNode {
		if now.Sub(ci.seen) >= stale {
			delete(b.byNode, n)
		}
	}
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

// admit lets a call through the single circuit, or says why not. probe
// reports that the call is the half-open circuit's probe.
func (b *Breaker) admit() (probe bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.one.state {
	case Closed:
		return false, nil
	case Open:
		if b.opts.Now().Sub(b.one.openedAt) < b.opts.Cooldown {
			return false, ErrOpen
		}
		b.setLocked(&b.one, "", HalfOpen, nil)
		return true, nil
	}
	return false, ErrOpen // half-open: the probe is out
}

func (b *Breaker) succeededLocked(c *circuit, node string, probe bool) {
	c.failures = 0
	if probe && c.state == HalfOpen {
		b.setLocked(c, node, Closed, nil)
	}
}

func (b *Breaker) failedLocked(c *circuit, node string, probe bool, err error) {
	switch {
	case probe && c.state == HalfOpen:
		b.openLocked(c, node, err)
	case c.state == Closed:
		c.failures++
		if c.failures >= b.opts.Failures {
			b.openLocked(c, node, err)
		}
	}
}

func (b *Breaker) openLocked(c *circuit, node string, err error) {
	c.failures = 0
	c.openedAt = b.opts.Now()
	c.opens++
	b.opens.Add(1)
	b.setLocked(c, node, Open, err)
}

// setLocked changes a circuit's state and reports the change.
func (b *Breaker) setLocked(c *circuit, node string, to State, err error) {
	from := c.state
	c.state = to
	if from != to && b.opts.OnStateChange != nil {
		b.opts.OnStateChange(node, from, to, err)
	}
}

// State returns the circuit's state. For a backend made of nodes it is
// the most open of the nodes' circuits: open when one is open, else
// half-open when one is probing, else closed.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.nodes == nil {
		return b.one.state
	}
	b.pruneLocked(b.opts.Now())
	s := Closed
	for _, c := range b.byNode {
		switch {
		case c.state == Open:
			return Open
		case c.state == HalfOpen:
			s = HalfOpen
		}
	}
	return s
}

// Stats are a breaker's counters since it was made.
type Stats struct {
	Calls    uint64 // calls that reached the backend
	Errors   uint64 // of those, failed ones (timeouts included)
	Timeouts uint64 // of those, ones past Options.Timeout
	Rejected uint64 // calls refused with ErrOpen
	Opens    uint64 // times a circuit opened
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

// NodeStats are the circuit and counters of one node of a backend made of
// nodes, since the breaker first saw the node (or saw it again after
// forgetting it).
type NodeStats struct {
	Node     string
	State    State
	Errors   uint64 // calls that failed on the node
	Rejected uint64 // calls refused because its circuit was open
	Opens    uint64 // times its circuit opened
}

// Nodes returns the circuits of the nodes calls asked for lately, by node;
// none for a backend not made of nodes.
func (b *Breaker) Nodes() []NodeStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.nodes == nil {
		return nil
	}
	b.pruneLocked(b.opts.Now())
	st := make([]NodeStats, 0, len(b.byNode))
	for n, c := range b.byNode {
		st = append(st, NodeStats{Node: n, State: c.state, Errors: c.errs, Rejected: c.rejected, Opens: c.opens})
	}
	slices.SortFunc(st, func(a, b NodeStats) int { return strings.Compare(a.Node, b.Node) })
	return st
}

// NodeName is how logs name node: itself, or for "" a note that the
// backend could not tell which node a call was for.
func NodeName(node string) string { return nodeName(node) }
