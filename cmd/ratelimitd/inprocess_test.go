package main

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// inProcess is serve running in this process.
type inProcess struct {
	grpcAddr, httpAddr string
	addrs              map[string]string // every "serving …" message logged so far, and its address
	warnings           []string          // every warning's message read so far
	exit               chan int
	cancel             context.CancelFunc
	logs               lineWriter
	stopOnce           sync.Once
	code               int // serve's exit code, once stopped
}

// startServe runs Main with args and, when wantServing, waits until it
// logs its addresses.
func startServe(t *testing.T, wantServing bool, args ...string) *inProcess {
	t.Helper()
	return startServeEnv(t, env{}, wantServing, args...)
}

// startServeEnv is startServe with the environment e.
func startServeEnv(t *testing.T, e env, wantServing bool, args ...string) *inProcess {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &inProcess{exit: make(chan int, 1), cancel: cancel, logs: lineWriter{lines: make(chan string, 1000)}, addrs: map[string]string{}}
	go func() {
		p.exit <- Main(ctx, append([]string{"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-log-format", "json", "-shutdown-delay", "0s"}, args...),
			e.lookup, io.Discard, p.logs)
	}()
	t.Cleanup(func() { p.stop(t) })
	if wantServing {
		p.waitServing(t, 30*time.Second)
	}
	return p
}

// stop ends serve's context and returns its exit code, -1 when it does
// not stop within 30s; later calls return the same code.
func (p *inProcess) stop(t *testing.T) int {
	t.Helper()
	p.stopOnce.Do(func() {
		p.cancel()
		select {
		case p.code = <-p.exit:
		case <-time.After(30 * time.Second):
			p.code = -1
			t.Error("serve did not stop within 30s of its context ending")
		}
	})
	return p.code
}

// waitServing waits for the addresses; it fails t when they do not come
// within timeout.
func (p *inProcess) waitServing(t *testing.T, timeout time.Duration) {
	t.Helper()
	if !p.serving(t, timeout) {
		t.Fatalf("serve did not log its addresses within %v", timeout)
	}
}

// addr returns the address logged with msg, such as "serving reference
// metrics", reading the logs for up to 30s.
func (p *inProcess) addr(t *testing.T, msg string) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for p.addrs[msg] == "" {
		if !p.read(t, deadline) {
			t.Fatalf("serve did not log %q within 30s: %v", msg, p.addrs)
		}
	}
	return p.addrs[msg]
}

// read takes one log line, noting the address it gives; false when
// deadline comes first.
func (p *inProcess) read(t *testing.T, deadline <-chan time.Time) bool {
	t.Helper()
	select {
	case line := <-p.logs.lines:
		var rec struct{ Level, Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec.Msg, "serving ") {
			p.addrs[rec.Msg] = rec.Addr
		}
		if rec.Level == "WARN" {
			p.warnings = append(p.warnings, line)
		}
		return true
	case code := <-p.exit:
		t.Fatalf("serve exited early with %d", code)
	case <-deadline:
	}
	return false
}

// serving reports whether serve logs its addresses within timeout.
func (p *inProcess) serving(t *testing.T, timeout time.Duration) bool {
	t.Helper()
	deadline := time.After(timeout)
	for p.addrs["serving gRPC"] == "" || p.addrs["serving HTTP"] == "" {
		if !p.read(t, deadline) {
			return false
		}
	}
	p.grpcAddr, p.httpAddr = p.addrs["serving gRPC"], p.addrs["serving HTTP"]
	return true
}
