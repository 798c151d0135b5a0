package service

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// Concurrency limits (a descriptor's concurrency block) are held through
// the own API: Acquire takes a slot of each descriptor whose rule has one,
// in the same atomic batch as the request's rate limits, and answers with
// a lease id; Release gives the slots back and Renew keeps them for
// another lease TTL. Envoy's API and Check have no release: they decide
// only rate limits, and a rule with a concurrency limit alone answers them
// as a descriptor without a limit (docs/concurrency.md).
//
// A lease id names everything its slots need, so that any replica can
// release or renew them without a record of its own: the holder (128
// random bits) and, for each slot, its domain, rule, counter key, limit
// and TTL. Only the holder's bits let a lease id give back or keep a slot;
// a lease id altered elsewhere names slots its holder does not hold, and
// changes nothing.

// leasePrefix starts every lease id: the version of its layout.
const leasePrefix = "rl1."

// maxLeaseID bounds a lease id's length.
const maxLeaseID = 16 << 10

// slotLease is a concurrency lease: a holder and the slots it holds.
type slotLease struct {
	holder algo.Holder
	slots  []leaseSlot
}

// leaseSlot is one slot of a lease.
type leaseSlot struct {
	domain, rule string
	key          []byte
	limit        algo.Limit
}

// slotLimit is a concurrency block as a limit of package algo.
func slotLimit(c *config.Concurrency) algo.Limit {
	return algo.Limit{Algorithm: algo.Concurrency, Requests: uint64(c.MaxInFlight), Window: c.LeaseTTL}
}

// newHolder returns a holder of 128 random bits.
func newHolder() (algo.Holder, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return algo.Holder{}, err
	}
	return algo.Holder{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}, nil
}

// String encodes l as a lease id: the prefix, then base64url of the
// holder and, per slot, its domain, rule, key (each length-prefixed), max
// in flight and TTL in milliseconds.
func (l *slotLease) String() string {
	b := binary.BigEndian.AppendUint64(nil, l.holder[0])
	b = binary.BigEndian.AppendUint64(b, l.holder[1])
	for _, s := range l.slots {
		for _, f := range [][]byte{[]byte(s.domain), []byte(s.rule), s.key} {
			b = binary.AppendUvarint(b, uint64(len(f)))
			b = append(b, f...)
		}
		b = binary.AppendUvarint(b, s.limit.Requests)
		b = binary.AppendUvarint(b, uint64(s.limit.Window.Milliseconds()))
	}
	return leasePrefix + base64.RawURLEncoding.EncodeToString(b)
}

// errBadLease is what a lease id that this server did not write gets.
var errBadLease = errors.New("lease_id: not a lease id of ratelimitd's Acquire")

// parseLease reads a lease id written by String.
func parseLease(id string) (*slotLease, error) {
	rest, ok := strings.CutPrefix(id, leasePrefix)
	if !ok || len(id) > maxLeaseID {
		return nil, errBadLease
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(b) < 16 {
		return nil, errBadLease
	}
	l := &slotLease{holder: algo.Holder{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])}}
	b = b[16:]
	field := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		f := b[k : k+int(n)]
		b = b[k+int(n):]
		return f, true
	}
	number := func() (uint64, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 {
			return 0, false
		}
		b = b[k:]
		return n, true
	}
	for len(b) > 0 {
		domain, ok1 := field()
		rule, ok2 := field()
		key, ok3 := field()
		most, ok4 := number()
		ttl, ok5 := number()
		lim := algo.Limit{Algorithm: algo.Concurrency, Requests: most, Window: time.Duration(ttl) * time.Millisecond}
		if !(ok1 && ok2 && ok3 && ok4 && ok5) || len(key) == 0 || lim.Check() != nil {
			return nil, errBadLease
		}
		l.slots = append(l.slots, leaseSlot{domain: string(domain), rule: string(rule), key: key, limit: lim})
	}
	// Only the canonical encoding is a lease id: no stray bits, no long
	// varints. One lease has one id.
	if len(l.slots) == 0 || l.String() != id {
		return nil, errBadLease
	}
	return l, nil
}

// SlotReport is what one Acquire, Release or Renew did to the slots of
// one concurrency limit's key, as metrics count them.
type SlotReport struct {
	// Domain and Rule name the concurrency limit: its domain and rule ID,
	// as the lease names it (the rule may have left the rules since).
	Domain, Rule string
	// Key is the counter key of the slots; it is valid only during the
	// call.
	Key []byte
	// Acquired, Refused and Released are 1 when the call took a slot,
	// was refused one because every slot was held, or gave one back.
	Acquired, Refused, Released uint64
	// Expired is how many holders the store found whose TTL had ended
	// without a release: each is reported once, by the first call that
	// finds it.
	Expired uint64
	// InFlight is how many slots are held after the call, and Until the
	// time until the last of them ends unless renewed.
	InFlight uint64
	Until    time.Duration
}

// SlotObserver is told of concurrency slots, for metrics, when the
// service's Observer is one too. Calls to a failing backend, and
// decisions by failure mode open or closed, are not reported.
type SlotObserver interface {
	Slots(r *SlotReport)
}

// observeSlots reports what op did to slot q, decided as d.
func (s *Service) observeSlots(domain, rule string, q *algo.Request, d *algo.Decision, allowed bool) {
	o, ok := s.observer.(SlotObserver)
	if !ok {
		return
	}
	r := &SlotReport{
		Domain: domain, Rule: rule, Key: q.Key,
		Expired:  uint64(d.Mark),
		InFlight: q.Limit.Requests - min(d.Remaining, q.Limit.Requests),
		Until:    d.ResetAfter,
	}
	switch {
	case !d.Allowed:
		r.Refused = 1
	case !allowed && q.Op == algo.OpAcquire && d.Taken > 0:
		r.InFlight-- // the slot was free, but the batch was refused: not taken
	case d.Taken == 0:
	case q.Op == algo.OpAcquire:
		r.Acquired = 1
	case q.Op == algo.OpRelease:
		r.Released = 1
	}
	o.Slots(r)
}

// acquire serves Acquire: the request's rate limits and its rules'
// concurrency slots, decided in one batch.
func (s *Service) acquire(ctx context.Context, req *ratelimitdv1.AcquireRequest) (*ratelimitdv1.AcquireResponse, error) {
	rls := toRLS(req.GetDomain(), req.GetDescriptors(), req.GetHits())
	if err := s.bounds.check(rls); err != nil {
		return nil, err.Status()
	}
	dom := s.rules.Load().Domain(rls.Domain)
	if dom == nil {
		return &ratelimitdv1.AcquireResponse{Allowed: true, Results: noLimits(len(rls.Descriptors))}, nil
	}
	holder, err := newHolder()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "drawing a lease holder: %v", err)
	}
	sc := s.getScratch(len(rls.Descriptors))
	defer s.putScratch(sc)
	planSlots(sc, dom, rls, true, holder)
	known, err := s.decideAll(ctx, rls.Domain, dom, sc)
	if err != nil {
		return nil, err
	}
	allowed, results := s.ownResults(rls, sc, s.observer != nil && known)
	resp := &ratelimitdv1.AcquireResponse{Allowed: allowed, Results: results}
	lease := &slotLease{holder: holder}
	var ttl time.Duration
	for i := range sc.checks {
		c := &sc.checks[i]
		if c.slot < 0 {
			continue
		}
		q, d := &sc.reqs[c.slot], &sc.decisions[c.slot]
		if known { // decisions by failure mode open or closed tell nothing
			s.observeSlots(rls.Domain, c.rule.ID, q, d, allowed)
		}
		if allowed && d.Taken > 0 {
			lease.slots = append(lease.slots, leaseSlot{domain: rls.Domain, rule: c.rule.ID, key: append([]byte(nil), q.Key...), limit: q.Limit})
			if ttl == 0 || q.Limit.Window < ttl {
				ttl = q.Limit.Window
			}
		}
	}
	if allowed && len(lease.slots) > 0 {
		resp.LeaseId = lease.String()
		resp.Ttl = durationpb.New(ttl)
	}
	return resp, nil
}

// slotOp serves Release and Renew: op for every slot of the lease. It
// returns how many slots the holder still held, the shortest TTL of those,
// and how many slots the lease names.
func (s *Service) slotOp(ctx context.Context, id string, op algo.Op) (kept int, ttl time.Duration, all int, err error) {
	if id == "" {
		return 0, 0, 0, nil // Acquire took no slot: nothing to give back
	}
	l, perr := parseLease(id)
	if perr != nil {
		return 0, 0, 0, status.Error(codes.InvalidArgument, perr.Error())
	}
	reqs := make([]algo.Request, len(l.slots))
	for i, sl := range l.slots {
		reqs[i] = algo.Request{Key: sl.key, Limit: sl.limit, Op: op, Holder: l.holder}
	}
	out := make([]algo.Decision, len(reqs))
	start := s.now()
	err = s.backend.Decide(ctx, reqs, out)
	if s.observer != nil {
		s.observer.BackendCall(s.now().Sub(start), err)
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return 0, 0, 0, status.FromContextError(ctxErr).Err()
		}
		s.log.WarnContext(ctx, "concurrency slots not released or renewed: the backend failed", "error", err)
		return 0, 0, 0, status.Error(codes.Unavailable, errBackendUnavailable+"; a slot not given back returns when its lease TTL ends")
	}
	for i, sl := range l.slots {
		s.observeSlots(sl.domain, sl.rule, &reqs[i], &out[i], true)
		if out[i].Taken == 0 {
			continue
		}
		kept++
		if ttl == 0 || sl.limit.Window < ttl {
			ttl = sl.limit.Window
		}
	}
	return kept, ttl, len(l.slots), nil
}

// Acquire implements ratelimitd.v1.RateLimiter.
func (a ownAPI) Acquire(ctx context.Context, req *ratelimitdv1.AcquireRequest) (*ratelimitdv1.AcquireResponse, error) {
	return a.s.acquire(ctx, req)
}

// Release implements ratelimitd.v1.RateLimiter.
func (a ownAPI) Release(ctx context.Context, req *ratelimitdv1.ReleaseRequest) (*ratelimitdv1.ReleaseResponse, error) {
	released, _, _, err := a.s.slotOp(ctx, req.GetLeaseId(), algo.OpRelease)
	if err != nil {
		return nil, err
	}
	return &ratelimitdv1.ReleaseResponse{Released: released > 0}, nil
}

// Renew implements ratelimitd.v1.RateLimiter.
func (a ownAPI) Renew(ctx context.Context, req *ratelimitdv1.RenewRequest) (*ratelimitdv1.RenewResponse, error) {
	if req.GetLeaseId() == "" {
		return nil, status.Error(codes.InvalidArgument, "lease_id: empty; an Acquire that took no slot has nothing to renew")
	}
	kept, ttl, all, err := a.s.slotOp(ctx, req.GetLeaseId(), algo.OpRenew)
	if err != nil {
		return nil, err
	}
	resp := &ratelimitdv1.RenewResponse{Renewed: kept == all}
	if resp.Renewed {
		resp.Ttl = durationpb.New(ttl)
	}
	return resp, nil
}
