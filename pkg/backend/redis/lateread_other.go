//go:build !unix

package redis

import "net"

// withLateRead returns c: reads past their deadline are not retried on
// systems without unix sockets' non-blocking reads.
func withLateRead(c net.Conn) net.Conn { return c }
