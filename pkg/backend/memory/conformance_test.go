package memory

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
)

// clocked decides at the instants the conformance suite gives.
type clocked struct {
	b     *Backend
	clock *clocktest.Clock
}

func (c clocked) Decide(ctx context.Context, now time.Time, reqs []algo.Request, out []algo.Decision) error {
	c.clock.Set(now)
	return c.b.Decide(ctx, reqs, out)
}

// TestConformance runs the algorithm vectors and the batch contract
// against the in-memory backend.
func TestConformance(t *testing.T) {
	newSubject := func(t *testing.T) algotest.Subject {
		b, c := newTestBackend(t, Options{})
		return clocked{b, c}
	}
	algotest.Run(t, newSubject)
	algotest.RunBatches(t, newSubject)
}
