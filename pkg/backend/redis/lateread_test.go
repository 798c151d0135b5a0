//go:build unix

package redis

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestLateReadTakesWhatArrived: a read whose deadline has passed, as when
// this process resumes after the machine kept it from running, still
// returns an answer that reached the socket; with nothing there it times
// out as it would have. Shown failing against withLateRead returning the
// connection unwrapped: Go fails a read past its deadline without looking
// at the socket.
func TestLateReadTakesWhatArrived(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := withLateRead(raw)
	defer c.Close()
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	buf := make([]byte, 16)
	if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(buf); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read past its deadline with nothing sent: %d bytes, %v; want a timeout", n, err)
	}
	if _, err := srv.Write([]byte("+OK\r\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the answer reaches the socket
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "+OK\r\n" {
		t.Fatalf("a read past its deadline with an answer there: %q, %v; want the answer", buf[:n], err)
	}
	// The deadline stays passed: a read that needs more fails at once.
	start := time.Now()
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("a read after the late one: %v after %v, want a timeout at once", err, time.Since(start))
	}
	// A fresh deadline reads as always.
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Write([]byte("+PONG\r\n")); err != nil {
		t.Fatal(err)
	}
	if n, err := io.ReadFull(c, buf[:7]); err != nil || string(buf[:n]) != "+PONG\r\n" {
		t.Fatalf("a read within its deadline: %q, %v", buf[:n], err)
	}
}
