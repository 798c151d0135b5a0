package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// floorStreamWorkers is the floor server's pool of call goroutines: the
// size ratelimitd serves with (cmd/ratelimitd, streamWorkers), so that the
// two differ only in deciding.
const floorStreamWorkers = 64

// floorMain runs `ratelimit-bench floor-server`: Envoy's RLS served by
// grpc-go as ratelimitd serves it, answering every call OK at once. What
// it costs per call is what serving a call costs ratelimitd before it
// decides anything: the floor under ratelimitd's own figures.
func floorMain(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("ratelimit-bench floor-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "loopback `address` to serve on; port 0 picks a free one")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: ratelimit-bench floor-server [flags]

Serves Envoy's RateLimitService on loopback and answers every call OK, one
status per descriptor, with no decision: the floor of what serving a call
with grpc-go costs, for comparison with ratelimitd. Logs "serving gRPC" with
its address as JSON on stderr; stops on SIGTERM or SIGINT.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ratelimit-bench floor-server: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if err := checkLoopbackListen(*addr); err != nil {
		fmt.Fprintf(stderr, "ratelimit-bench floor-server: %v\n", err)
		return exitUsage
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Error("listen", "error", err)
		return exitError
	}
	gs := grpc.NewServer(grpc.NumStreamWorkers(floorStreamWorkers))
	rlsv3.RegisterRateLimitServiceServer(gs, floorServer{})
	go func() {
		<-ctx.Done()
		gs.Stop()
	}()
	log.Info("serving gRPC", "addr", lis.Addr().String())
	if err := gs.Serve(lis); err != nil {
		log.Error("serve", "error", err)
		return exitError
	}
	return exitOK
}

// checkLoopbackListen refuses a listen address off loopback; unlike
// checkLoopback it takes port 0.
func checkLoopbackListen(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-addr %q: want host:port on loopback, such as 127.0.0.1:0 (%v)", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr %q: %q is not a loopback IP address", addr, host)
	}
	return nil
}

// floorServer answers as ratelimitd answers an admitted request: overall
// OK and, per descriptor, a status with its limit, what remains and when
// it resets. It builds the answer anew per call, as any handler must.
type floorServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (floorServer) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	statuses := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))
	for i := range statuses {
		statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
				RequestsPerUnit: 1000,
				Unit:            rlsv3.RateLimitResponse_RateLimit_SECOND,
			},
			LimitRemaining:     999,
			DurationUntilReset: durationpb.New(time.Second),
		}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses}, nil
}
