package redis

import (
	"context"
	"crypto/tls"
	"net"
	"time"
)

// A call gives up when its deadline is acted upon, and a reply that
// reached this machine before that moment must still be read: Redis
// counted the decision. The Go runtime acts on an expired deadline before
// it looks for sockets ready to read: when this process resumes after the
// machine kept it from running (a busy machine, a stop of the world), a
// read whose deadline passed meanwhile fails even though its reply has
// arrived, and the failure mode answers a caller whose decision was
// counted. So connections to Redis read once more, without waiting, when
// a read times out (lateread_unix.go), and take what the kernel holds.

// dialer returns the dialer of the connections to Redis: TCP (or a unix
// socket), with TLS when tlsConfig is set, as go-redis's own dialer, but
// with late reads below TLS. dialTimeout bounds the dial and the TLS
// handshake together.
func dialer(dialTimeout time.Duration, tlsConfig *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dialTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, dialTimeout)
			defer cancel()
		}
		d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c = withLateRead(c)
		if tlsConfig == nil {
			return c, nil
		}
		cfg := tlsConfig
		if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
			// As tls.Dial does: the certificate must name the host dialed.
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(c, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = c.Close()
			return nil, err
		}
		return tc, nil
	}
}
