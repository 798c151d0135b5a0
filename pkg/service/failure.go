package service

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// errBackendUnavailable is what a caller is told when the backend failed.
// The cause (a Redis address, Redis's reply) is logged, never sent: the
// caller may be anyone who reaches the port.
const errBackendUnavailable = "backend unavailable: the limit could not be decided; the server's log has the cause"

// failureLogInterval is the least time between two log lines about backend
// failures; the lines in between are counted, not written.
const failureLogInterval = 10 * time.Second

// numFailureModes is the number of failure modes, each counted apart.
const numFailureModes = 4

// failureIndex is m's place among the counters, or -1 for no such mode.
func failureIndex(m config.FailureMode) int {
	switch m {
	case config.FailOpen:
		return 0
	case config.FailClosed:
		return 1
	case config.FailError:
		return 2
	case config.FailLocal:
		return 3
	}
	return -1
}

// DegradedDecisions returns how many requests were decided by failure mode
// m because the backend failed.
func (s *Service) DegradedDecisions(m config.FailureMode) uint64 {
	if i := failureIndex(m); i >= 0 {
		return s.degraded[i].Load()
	}
	return 0
}

// backendFailed decides a request whose backend call failed with err, by
// the failure mode of its domain (or the service's): open admits every
// descriptor, closed refuses every one, error answers Unavailable, and
// local decides with the fallback backend. It fills sc.decisions and
// returns the mode it decided by, or returns the error to answer with.
//
// The figures of an open or closed decision are unknown and reported as
// zero: no remaining, no time until reset or retry.
func (s *Service) backendFailed(ctx context.Context, domain string, dom *config.Domain, sc *scratch, err error) (config.FailureMode, error) {
	if ctxErr := ctx.Err(); ctxErr != nil {
		// The caller gave up or ran out of time: it sees that, not a policy.
		return "", status.FromContextError(ctxErr).Err()
	}
	mode, _ := s.failureModeOf(dom)
	s.degraded[failureIndex(mode)].Add(1)
	if s.observer != nil {
		s.observer.FailureMode(domain, mode)
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "decided by the failure mode", "domain", domain, "failure_mode", string(mode), "error", err)
	}
	if ok, suppressed := s.failureLog.allow(s.now()); ok {
		s.log.WarnContext(ctx, "backend failed; deciding by the failure mode",
			"domain", domain, "failure_mode", string(mode), "error", err,
			"suppressed", suppressed, "interval", failureLogInterval)
	}
	switch mode {
	case config.FailError:
		return mode, status.Error(codes.Unavailable, errBackendUnavailable)
	case config.FailLocal:
		for i := range sc.reqs {
			sc.reqs[i].Limit = share(sc.reqs[i].Limit, s.localShare)
		}
		if lerr := s.fallback.Decide(ctx, sc.reqs, sc.decisions); lerr != nil {
			s.log.WarnContext(ctx, "local fallback failed too", "domain", domain, "error", lerr, "backend_error", err)
			return mode, status.Error(codes.Unavailable, errBackendUnavailable)
		}
		return mode, nil
	}
	allowed := mode != config.FailClosed
	for i := range sc.decisions {
		sc.decisions[i] = algo.Decision{Allowed: allowed}
	}
	return mode, nil
}

// decideAll fills sc.decisions: by the backend, or when it fails by the
// failure mode of dom. known is false for decisions by failure mode open
// or closed, which carry no figures to count or to tell the client.
func (s *Service) decideAll(ctx context.Context, domain string, dom *config.Domain, sc *scratch) (known bool, err error) {
	if len(sc.reqs) == 0 {
		return true, nil
	}
	berr := s.decide(ctx, sc)
	if berr == nil {
		sc.reserving.settled(sc)
		return true, nil
	}
	mode, err := s.backendFailed(ctx, domain, dom, sc, berr)
	return mode == config.FailLocal, err
}

// failureModeOf returns the failure mode dom's requests are decided by
// when the backend fails, and where it is set: "domain" (its rule file) or
// "server". Without a fallback, local is open.
func (s *Service) failureModeOf(dom *config.Domain) (config.FailureMode, string) {
	m, from := dom.FailureMode, "domain"
	if m == "" {
		m, from = s.failureMode, "server"
	}
	if m == config.FailLocal && s.fallback == nil {
		m = config.FailOpen
	}
	return m, from
}

// share scales l to a replica's share f of it, rounding up so that no
// limit above zero becomes zero.
func share(l algo.Limit, f float64) algo.Limit {
	if f >= 1 {
		return l
	}
	scale := func(n uint64) uint64 { return uint64(math.Ceil(float64(n) * f)) }
	l.Requests = scale(l.Requests)
	l.Burst = scale(l.Burst)
	return l
}

// logLimiter lets a line through at most once per interval and counts
// the ones it held back.
type logLimiter struct {
	every time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// allow reports whether to log now, and how many lines were held back
// since the last one.
func (l *logLimiter) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return true, n
}
