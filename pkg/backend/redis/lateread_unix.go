//go:build unix

package redis

import (
	"errors"
	"net"
	"os"
	"syscall"
	"time"
)

// lateReadConn is a connection whose reads, once their deadline has
// passed, still take what the kernel holds (lateread.go).
type lateReadConn struct {
	net.Conn
	raw syscall.RawConn
}

// withLateRead returns c with late reads, or c when it has no file
// descriptor to read from.
func withLateRead(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &lateReadConn{Conn: c, raw: raw}
}

// SyscallConn returns the connection's raw descriptor, as the wrapped
// connection's: go-redis checks a pooled connection's health with it.
func (c *lateReadConn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

// Read reads as net.Conn does, but when the read deadline has passed it
// returns what the kernel already holds, if anything, rather than the
// timeout.
func (c *lateReadConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 || len(p) == 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		return n, err
	}
	if held := c.readHeld(p); held > 0 {
		return held, nil
	}
	return n, err
}

// readHeld reads into p, without waiting, what the kernel holds, and
// leaves the read deadline passed: a read that needs more fails at once,
// as it would have.
func (c *lateReadConn) readHeld(p []byte) int {
	if c.Conn.SetReadDeadline(time.Time{}) != nil {
		return 0
	}
	defer c.Conn.SetReadDeadline(time.Unix(1, 0)) // long past
	n := 0
	err := c.raw.Read(func(fd uintptr) bool {
		m, rerr := syscall.Read(int(fd), p)
		if rerr == nil && m > 0 {
			n = m
		}
		return true // one try: EAGAIN means nothing is held
	})
	if err != nil {
		return 0
	}
	return n
}
