package algo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
)

// stepper applies algo.Apply to states it keeps per key: the Go step
// functions on their own, one request at a time.
type stepper struct{ states map[string]algo.State }

func (s *stepper) Decide(_ context.Context, now time.Time, reqs []algo.Request, out []algo.Decision) error {
	if len(reqs) != 1 {
		return errors.New("stepper decides one request at a time")
	}
	r := reqs[0]
	st := s.states[string(r.Key)]
	d := algo.Apply(&st, now, &r)
	s.states[string(r.Key)] = st
	out[0] = d
	return nil
}

func TestConformance(t *testing.T) {
	algotest.Run(t, func(*testing.T) algotest.Subject { return &stepper{states: map[string]algo.State{}} })
}
