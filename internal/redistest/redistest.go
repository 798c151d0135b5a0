// Package redistest gives tests a real Redis: the server named by
// REDIS_URL, or else a redis-server from PATH started on a free loopback
// port for the test and stopped after it. With neither, the test is
// skipped with a loud reason, except under CI=true, where it fails: CI
// must exercise every Redis test.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is a Redis server for a test.
type Server struct {
	// Addr is host:port on the loopback interface.
	Addr string
	// URL is a redis:// URL of the server.
	URL string
}

// Start returns a Redis server for t: REDIS_URL when set, else a fresh
// redis-server process, killed when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	if u := os.Getenv("REDIS_URL"); u != "" {
		host := strings.TrimPrefix(strings.TrimPrefix(u, "redis://"), "rediss://")
		if i := strings.LastIndex(host, "@"); i >= 0 {
			host = host[i+1:]
		}
		host, _, _ = strings.Cut(host, "/")
		return &Server{Addr: host, URL: u}
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "no REDIS_URL and no redis-server in PATH (install it: apt-get install -y redis-server)")
	}
	var lastErr error
	for range 3 { // a free port can be taken between choosing and binding
		s, err := start(t, bin)
		if err == nil {
			return s
		}
		lastErr = err
	}
	t.Fatalf("redistest: starting %s: %v", bin, lastErr)
	return nil
}

// unavailable skips the test, or fails it under CI=true.
func unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("redistest: Redis is required under CI=true: %s", why)
	}
	t.Skipf("SKIPPING: this test needs Redis: %s", why)
}

func start(t testing.TB, bin string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			return nil, fmt.Errorf("redis-server exited (%v): %s%s", err, out.Bytes(), log)
		default:
		}
		if ping(addr) == nil {
			return &Server{Addr: addr, URL: "redis://" + addr}, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, fmt.Errorf("redis-server on %s did not answer PING within 10s", addr)
}

// ping sends PING in RESP and expects +PONG.
func ping(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
