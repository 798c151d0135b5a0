package redistest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// startContainer runs the redis:7 image through testcontainers-go and
// removes it when t ends. When no Docker engine answers it returns nil
// and why, so that Start can skip (or fail under CI=true) with every
// reason. A machine with the Docker CLI but no engine is such a case.
//
// This path only runs where redis-server is not in PATH and an engine
// answers; the package's own tests exercise it only up to the engine
// check, since their machine has redis-server and no engine. Keep it
// small. testcontainers-go stays on v0.44: v0.45.0 requires a
// go-ansiterm pseudo-version that the module proxy refuses, which breaks
// go mod tidy.
func startContainer(t testing.TB) (*Server, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if why := dockerUnreachable(ctx); why != "" {
		return nil, why
	}
	c, err := testcontainers.Run(ctx, "redis:7",
		testcontainers.WithExposedPorts("6379/tcp"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("6379/tcp")))
	testcontainers.CleanupContainer(t, c)
	if err != nil {
		t.Fatalf("redistest: a Docker engine answers but the redis:7 container did not start: %v", err)
	}
	addr, err := c.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		t.Fatalf("redistest: the redis:7 container's port: %v", err)
	}
	if err := waitUntil(10*time.Second, "redis:7 container answering PING", func() error {
		return probe{}.check(addr)
	}); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return &Server{Addr: addr, URL: "redis://" + addr}, ""
}

// dockerUnreachable returns why no Docker engine can run containers, or
// "" when one answers. testcontainers can panic without an engine.
func dockerUnreachable(ctx context.Context) (why string) {
	defer func() {
		if r := recover(); r != nil {
			why = fmt.Sprint(r)
		}
	}()
	p, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return err.Error()
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return err.Error()
	}
	return ""
}
