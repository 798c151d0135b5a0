// Package redistest gives tests a real Redis: the server named by
// REDIS_URL, or else a redis-server from PATH started on a free loopback
// port for the test and stopped after it, or else a redis:7 container
// through testcontainers-go when a Docker engine answers. With none of
// them, the test is skipped with a loud reason, except under CI=true,
// where it fails: CI must exercise every Redis test.
//
// Beyond one server, it starts every topology from real redis-server
// processes on free 127.0.0.1 ports: single nodes a test can kill and
// restart (StartNode), a Redis Cluster (StartCluster), a master with
// replicas watched by Sentinels (StartSentinel), and a server that
// requires TLS or an ACL user (StartWith). These always need
// redis-server (and, for a cluster, redis-cli) in PATH.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is a Redis server for a test.
type Server struct {
	// Addr is host:port on the loopback interface.
	Addr string
	// URL is a redis:// URL of the server; rediss:// when it speaks TLS,
	// with user:password@ when it requires them.
	URL string
	// CAFile is the path of a PEM file holding the CA certificate that
	// signed the server's certificate; set only when the server speaks
	// TLS. Clients put it in tls.Config.RootCAs.
	CAFile string
}

// Options asks StartWith for a server that needs more than a plain
// connection.
type Options struct {
	// TLS makes the server accept only TLS connections, with a
	// certificate for 127.0.0.1 and localhost signed by a throwaway CA
	// (see Server.CAFile). Client certificates are optional.
	TLS bool
	// User and Password, when set, make the server refuse every
	// command until AUTH User Password: User is an ACL user with all
	// permissions and the default user is switched off. Password alone
	// sets requirepass on the default user.
	User, Password string
}

// Start returns a Redis server for t: REDIS_URL when set, else a fresh
// redis-server process, killed when t ends, else a redis:7 container
// when a Docker engine answers, removed when t ends.
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
	if _, err := exec.LookPath("redis-server"); err != nil {
		s, why := startContainer(t)
		if s != nil {
			return s
		}
		unavailable(t, "no REDIS_URL, no redis-server in PATH (install it: apt-get install -y redis-server), "+
			"and no Docker engine for testcontainers ("+why+")")
	}
	n := StartNode(t)
	return &Server{Addr: n.Addr, URL: "redis://" + n.Addr}
}

// StartWith returns a fresh redis-server process configured as o asks,
// killed when t ends. The zero Options is Start. Otherwise REDIS_URL
// and containers are not used: the server must be configured, so it
// needs redis-server in PATH, built with TLS when o.TLS is set.
func StartWith(t testing.TB, o Options) *Server {
	t.Helper()
	if o == (Options{}) {
		return Start(t)
	}
	if o.User != "" && o.Password == "" {
		t.Fatalf("redistest: Options.User %q has no Password: set Password too (a user without one proves nothing)", o.User)
	}
	bin := redisServer(t)
	p := probe{user: o.User, password: o.Password}
	var certs CertFiles
	if o.TLS {
		var err error
		if certs, err = writeCerts(t.TempDir()); err != nil {
			t.Fatalf("redistest: making TLS certificates: %v", err)
		}
		p.tls = certs.Client
	}
	n, err := launch(t, bin, func(dir string) ([]string, int, error) {
		ports, err := freePorts(1)
		if err != nil {
			return nil, 0, err
		}
		args := baseArgs(dir, ports[0])
		if o.TLS {
			args = append(baseArgs(dir, 0),
				"--tls-port", strconv.Itoa(ports[0]),
				"--tls-cert-file", certs.Cert,
				"--tls-key-file", certs.Key,
				"--tls-ca-cert-file", certs.CA,
				"--tls-auth-clients", "optional")
		}
		switch {
		case o.User != "":
			args = append(args,
				"--user", o.User, "on", ">"+o.Password, "~*", "&*", "+@all",
				"--user", "default", "off")
		case o.Password != "":
			args = append(args, "--requirepass", o.Password)
		}
		return args, ports[0], nil
	}, p)
	if err != nil {
		if o.TLS && tlsUnsupported(err) {
			unavailable(t, bin+" was built without TLS support (it rejects --tls-port); "+
				"install a redis-server built with TLS (Debian's is)")
		}
		t.Fatalf("redistest: starting %s: %v", bin, err)
	}
	u := url.URL{Scheme: "redis", Host: n.Addr}
	if o.TLS {
		u.Scheme = "rediss"
	}
	switch {
	case o.User != "":
		u.User = url.UserPassword(o.User, o.Password)
	case o.Password != "":
		u.User = url.UserPassword("", o.Password)
	}
	return &Server{Addr: n.Addr, URL: u.String(), CAFile: certs.CA}
}

// tlsUnsupported tells whether a failed start came from a redis-server
// that does not know the TLS options.
func tlsUnsupported(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "tls-port") &&
		(strings.Contains(msg, "Bad directive") || strings.Contains(msg, "nknown"))
}

// unavailable skips the test, or fails it under CI=true.
func unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("redistest: Redis is required under CI=true: %s", why)
	}
	t.Skipf("SKIPPING: this test needs Redis: %s", why)
}

// redisServer returns the path of redis-server, or makes t unavailable.
func redisServer(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "no redis-server in PATH (install it: apt-get install -y redis-server)")
	}
	return bin
}

// probe says what "ready" means for a node: a connection, over TLS when
// tls is set, on which AUTH (when password is set) and PING succeed.
type probe struct {
	tls            *tls.Config
	user, password string
}

// check connects to addr once and returns nil when the node is ready.
// Without a password, a NOAUTH answer to PING also counts as ready: the
// node answers, and its password is the business of whoever set it.
func (p probe) check(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var c net.Conn
	var err error
	if p.tls != nil {
		d := tls.Dialer{Config: p.tls}
		c, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	r := bufio.NewReader(c)
	if p.password != "" {
		cmd := []string{"AUTH", p.password}
		if p.user != "" {
			cmd = []string{"AUTH", p.user, p.password}
		}
		line, err := roundTrip(c, r, cmd...)
		if err != nil {
			return err
		}
		if line != "+OK" {
			return fmt.Errorf("AUTH answered %q", line)
		}
	}
	line, err := roundTrip(c, r, "PING")
	if err != nil {
		return err
	}
	if line == "+PONG" || (p.password == "" && strings.HasPrefix(line, "-NOAUTH")) {
		return nil
	}
	return fmt.Errorf("PING answered %q", line)
}

// roundTrip sends one command in RESP and returns the first line of the
// reply without its CRLF.
func roundTrip(c net.Conn, r *bufio.Reader, args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// freePorts returns n distinct loopback ports that were free a moment
// ago. They can be taken before redis-server binds them: callers retry.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // held until all are chosen, so none repeats
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
