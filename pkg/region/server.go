package region

import (
	"context"
	"math"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// maxKeyBytes bounds a pushed key: a domain, 64 descriptors' entries of
// the request bounds and a limit fit well under it.
const maxKeyBytes = 64 << 10

// Register serves the region sync service (ratelimitd.v1.RegionSync) of e
// on gs, to receive the peers' pushes.
func (e *Engine) Register(gs grpc.ServiceRegistrar) {
	ratelimitdv1.RegisterRegionSyncServer(gs, syncServer{e: e})
}

type syncServer struct {
	ratelimitdv1.UnimplementedRegionSyncServer
	e *Engine
}

// authenticate asks Options.Authenticate whether ctx's caller is region;
// an engine without peers accepts nobody.
func (e *Engine) authenticate(ctx context.Context, region string) error {
	if e.opts.Authenticate == nil {
		return status.Errorf(codes.PermissionDenied, "region %q has no peers: it accepts no push (a push from %q)", e.opts.Region, region)
	}
	return e.opts.Authenticate(ctx, region)
}

// Push merges a peer's counts into the region's store, then into what
// this replica knows, once Options.Authenticate has accepted its caller
// as the region it names. It answers once the store holds them, so that a
// push acknowledged is one every replica of the region reads.
func (s syncServer) Push(ctx context.Context, req *ratelimitdv1.PushRequest) (*ratelimitdv1.PushResponse, error) {
	e := s.e
	// Who pushes first: a caller that does not prove to be the region it
	// names learns nothing, not even the peers' names.
	if err := e.authenticate(ctx, req.GetRegion()); err != nil {
		e.refused.Add(1)
		return nil, err
	}
	if _, ok := e.index[req.GetRegion()]; !ok {
		e.refused.Add(1)
		names := make([]string, 0, len(e.peers))
		for _, p := range e.peers {
			names = append(names, p.Name)
		}
		slices.Sort(names)
		return nil, status.Errorf(codes.PermissionDenied, "region %q is not a peer of region %q (its -region-peers: %s)",
			req.GetRegion(), e.opts.Region, strings.Join(names, ", "))
	}
	if n := len(req.GetCounts()); n > maxPushCounts {
		return nil, status.Errorf(codes.InvalidArgument, "push of %d counts: at most %d are accepted; send several", n, maxPushCounts)
	}
	counts := make([]Count, len(req.GetCounts()))
	for i, c := range req.GetCounts() {
		switch l, st := c.GetWindowMs(), c.GetWindowStartMs(); {
		case len(c.GetKey()) == 0 || len(c.GetKey()) > maxKeyBytes:
			return nil, status.Errorf(codes.InvalidArgument, "counts[%d]: key of %d bytes: want 1 to %d", i, len(c.GetKey()), maxKeyBytes)
		case l <= 0:
			return nil, status.Errorf(codes.InvalidArgument, "counts[%d]: window_ms %d: want a window of 1 ms or more", i, l)
		case st%l != 0:
			return nil, status.Errorf(codes.InvalidArgument, "counts[%d]: window_start_ms %d is not a multiple of window_ms %d: windows are aligned to the Unix epoch", i, st, l)
		}
		counts[i] = Count{Region: req.GetRegion(), Key: c.GetKey(), Window: Window{Length: c.GetWindowMs(), Start: c.GetWindowStartMs()}, Count: c.GetCount()}
	}
	weight := req.GetWeight()
	if !(weight > 0) || math.IsInf(weight, 0) {
		weight = 1
	}
	now := e.opts.Now()
	if err := e.opts.Store.Append(ctx, Push{Region: req.GetRegion(), Weight: weight, At: now, Counts: counts}); err != nil {
		return nil, status.Errorf(codes.Unavailable, "region %q could not store the counts: %v", e.opts.Region, err)
	}
	e.received.Add(1)
	e.receivedCounts.Add(uint64(len(counts)))
	e.hear(req.GetRegion(), now, weight)
	for i := range counts {
		e.merge(&counts[i], now)
	}
	return &ratelimitdv1.PushResponse{}, nil
}
