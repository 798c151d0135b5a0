package tlsconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// timeout bounds every dial and call of these tests.
const timeout = 5 * time.Second

// reloadWait bounds how long a test waits for a reload to show.
const reloadWait = 10 * ReloadInterval

// serveGRPC serves the standard health service over gRPC with cfg on a
// loopback port until the test ends, and returns its address.
func serveGRPC(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// check calls the health service at addr over a new connection made with
// creds.
func check(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, want SERVING", resp.GetStatus())
	}
	return err
}

// trusting returns gRPC credentials trusting roots, presenting certs[0] if
// given. The certificate is presented even when the server asks for another
// CA's (a Go client would send none), so that the server verifies it.
func trusting(roots *x509.CertPool, certs ...tls.Certificate) credentials.TransportCredentials {
	cfg := &tls.Config{RootCAs: roots}
	if len(certs) > 0 {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
	}
	return credentials.NewTLS(cfg)
}

// servedCN handshakes with the server at addr on a new connection and
// returns the common name of the certificate it presented.
func servedCN(t *testing.T, addr string, roots *x509.CertPool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].Subject.CommonName
}

// waitCN handshakes with addr until the server presents the certificate
// named want, and fails the test if it does not within reloadWait.
func waitCN(t *testing.T, addr string, roots *x509.CertPool, want string) {
	t.Helper()
	for deadline := time.Now().Add(reloadWait); ; time.Sleep(50 * time.Millisecond) {
		got := servedCN(t, addr, roots)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server still presents %q %v after the files changed, want %q", got, reloadWait, want)
		}
	}
}

// errorsTo returns a reload error callback sending to a buffered channel,
// and the channel.
func errorsTo() (func(error), chan error) {
	ch := make(chan error, 16)
	return func(err error) {
		select {
		case ch <- err:
		default:
		}
	}, ch
}

func TestTLS(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "ca")
	cfg, err := Server(ca.serverFiles(t, t.TempDir(), "server"), nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGRPC(t, cfg)

	if err := check(t, addr, trusting(ca.pool())); err != nil {
		t.Fatalf("client trusting the CA: %v", err)
	}
	if err := check(t, addr, insecure.NewCredentials()); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext client: %v, want Unavailable", err)
	}
	err = check(t, addr, trusting(newCA(t, "other").pool()))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("client not trusting the CA: %v, want Unavailable for an unknown authority", err)
	}
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	ca, other := newCA(t, "ca"), newCA(t, "other")
	dir := t.TempDir()
	files := ca.serverFiles(t, dir, "server")
	files.ClientCA = filepath.Join(dir, "ca.pem")
	onError, errs := errorsTo()
	cfg, err := Server(files, onError)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGRPC(t, cfg)
	roots := ca.pool()
	fromCA, fromOther := ca.client(t, "client"), other.client(t, "intruder")

	if err := check(t, addr, trusting(roots)); status.Code(err) != codes.Unavailable {
		t.Errorf("client without a certificate: %v, want Unavailable", err)
	}
	if err := check(t, addr, trusting(roots, fromCA)); err != nil {
		t.Errorf("client with a certificate of the CA: %v", err)
	}
	if err := check(t, addr, trusting(roots, fromOther)); status.Code(err) != codes.Unavailable {
		t.Errorf("client with a certificate of another CA: %v, want Unavailable", err)
	}

	// The client CAs rotate too: trust the other CA instead.
	writeFile(t, files.ClientCA, other.pem)
	for deadline := time.Now().Add(reloadWait); check(t, addr, trusting(roots, fromOther)) != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("client of the new CA still refused %v after the CA file changed", reloadWait)
		}
	}
	if err := check(t, addr, trusting(roots, fromCA)); status.Code(err) != codes.Unavailable {
		t.Errorf("client of the CA no longer trusted: %v, want Unavailable", err)
	}
	select {
	case err := <-errs:
		t.Errorf("reload error: %v", err)
	default:
	}
}

// TestClientSAN: with ClientSAN, a client certificate of the CA is
// accepted only when valid for that name (a wildcard name covers it).
func TestClientSAN(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "ca")
	dir := t.TempDir()
	files := ca.serverFiles(t, dir, "server")
	files.ClientCA = filepath.Join(dir, "ca.pem")
	files.ClientSAN = "envoy.gateway.svc"
	cfg, err := Server(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGRPC(t, cfg)
	roots := ca.pool()
	for _, c := range []struct {
		dns  []string
		want codes.Code
	}{
		{[]string{"envoy.gateway.svc"}, codes.OK},
		{[]string{"other.svc", "envoy.gateway.svc"}, codes.OK},
		{[]string{"*.gateway.svc"}, codes.OK},
		{[]string{"intruder.svc"}, codes.Unavailable},
		{nil, codes.Unavailable},
	} {
		if err := check(t, addr, trusting(roots, ca.clientFor(t, "client", c.dns...))); status.Code(err) != c.want {
			t.Errorf("client certificate for %q: %v, want %v", c.dns, err, c.want)
		}
	}
	if _, err := Server(Files{Cert: files.Cert, Key: files.Key, ClientSAN: "x"}, nil); err == nil || !strings.Contains(err.Error(), "without a client CA") {
		t.Errorf("ClientSAN without ClientCA: %v", err)
	}
}

func TestRotation(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "ca")
	files := ca.serverFiles(t, t.TempDir(), "a")
	onError, errs := errorsTo()
	cfg, err := Server(files, onError)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGRPC(t, cfg)
	roots := ca.pool()
	if got := servedCN(t, addr, roots); got != "a" {
		t.Fatalf("server presents %q, want a", got)
	}

	// Each file replaced by a rename: a look between the two may see a
	// mismatched pair, and report it.
	certB, keyB := ca.issue(t, "b", true)
	writeFile(t, files.Cert, certB)
	writeFile(t, files.Key, keyB)
	waitCN(t, addr, roots, "b")
	for len(errs) > 0 {
		if err := <-errs; !strings.Contains(err.Error(), "does not match") {
			t.Errorf("reload error while the pair was written: %v", err)
		}
	}

	writeFile(t, files.Cert, []byte("garbage"))
	for deadline := time.Now().Add(reloadWait); len(errs) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no reload error %v after the certificate file turned to garbage", reloadWait)
		}
		if got := servedCN(t, addr, roots); got != "b" {
			t.Fatalf("server presents %q after the certificate file turned to garbage, want b", got)
		}
	}
	if err := <-errs; !strings.Contains(err.Error(), files.Cert) {
		t.Errorf("reload error %q does not name %s", err, files.Cert)
	}
	if got := servedCN(t, addr, roots); got != "b" {
		t.Errorf("server presents %q after a failed reload, want b", got)
	}
}

// TestRotationSecretVolume rotates the pair the way kubelet updates a
// secret volume: both files are symlinks through ..data, which one rename
// points to a new directory.
func TestRotationSecretVolume(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "ca")
	dir := t.TempDir()
	version := func(name, cn string) {
		ca.serverFiles(t, filepath.Join(dir, name), cn)
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []string{"..v1", "..v2"} {
		if err := os.Mkdir(filepath.Join(dir, v), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", "a")
	files := Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key")}
	for link, target := range map[string]string{files.Cert: "..data/cert.pem", files.Key: "..data/key.pem"} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	onError, errs := errorsTo()
	cfg, err := Server(files, onError)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGRPC(t, cfg)
	if got := servedCN(t, addr, ca.pool()); got != "a" {
		t.Fatalf("server presents %q, want a", got)
	}
	version("..v2", "b")
	waitCN(t, addr, ca.pool(), "b")
	if len(errs) > 0 {
		t.Errorf("reload error: %v", <-errs)
	}
}

func TestHTTP(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "ca")
	cfg, err := Server(ca.serverFiles(t, t.TempDir(), "server"), nil)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }),
		TLSConfig:         cfg,
		ReadHeaderTimeout: timeout,
	}
	go hs.ServeTLS(lis, "", "")
	t.Cleanup(func() { hs.Close() })

	client := &http.Client{Timeout: timeout, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: ca.pool()},
		ForceAttemptHTTP2: true,
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("https://" + lis.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != "ok" || resp.ProtoMajor != 2 {
		t.Errorf("GET: %s %q, %v; want HTTP/2.0 \"ok\"", resp.Proto, body, err)
	}
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	ca := newCA(t, "ca")
	dir := t.TempDir()
	good := ca.serverFiles(t, dir, "server")
	otherKey := filepath.Join(dir, "other-key.pem")
	_, keyPEM := ca.issue(t, "other", true)
	writeFile(t, otherKey, keyPEM)
	notPEM := filepath.Join(dir, "not-pem.pem")
	writeFile(t, notPEM, []byte("not a certificate\n"))
	missing := filepath.Join(dir, "missing.pem")

	for _, tc := range []struct {
		name  string
		files Files
		want  []string // in the error
	}{
		{"missing key file", Files{Cert: good.Cert, Key: missing}, []string{missing, "no such file"}},
		{"cert without key", Files{Cert: good.Cert}, []string{good.Cert, "without its key"}},
		{"key without cert", Files{Key: good.Key}, []string{good.Key, "without its certificate"}},
		{"key not matching", Files{Cert: good.Cert, Key: otherKey}, []string{good.Cert, otherKey, "does not match"}},
		{"cert not PEM", Files{Cert: notPEM, Key: good.Key}, []string{notPEM, "certificate input"}},
		{"CA without PEM", Files{Cert: good.Cert, Key: good.Key, ClientCA: notPEM}, []string{notPEM, "no valid PEM certificate"}},
		{"CA without cert", Files{ClientCA: good.Cert}, []string{good.Cert, "without a server certificate"}},
		{"nothing", Files{}, []string{"no TLS certificate"}},
	} {
		cfg, err := Server(tc.files, nil)
		if err == nil {
			t.Errorf("%s: got a config, want an error", tc.name)
			continue
		}
		if cfg != nil {
			t.Errorf("%s: got a config with error %v", tc.name, err)
		}
		t.Logf("%s: %v", tc.name, err)
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, w)
			}
		}
	}
}

func TestEnabled(t *testing.T) {
	for f, want := range map[Files]bool{{}: false, {Cert: "c", Key: "k"}: true, {Cert: "c"}: true, {ClientCA: "ca"}: true} {
		if got := f.Enabled(); got != want {
			t.Errorf("%+v.Enabled() = %v, want %v", f, got, want)
		}
	}
}

// TestPeer: two servers of one mesh (certificates of one CA for server and
// client authentication, each its listener's files) dial each other with
// Peer's configuration: it presents the dialer's certificate and verifies
// the server's against the CA, so a server of another CA is refused.
func TestPeer(t *testing.T) {
	t.Parallel()
	ca, other := newCA(t, "ca"), newCA(t, "other")
	a, b, stranger := ca.meshFiles(t, t.TempDir(), "a"), ca.meshFiles(t, t.TempDir(), "b"), other.meshFiles(t, t.TempDir(), "stranger")
	serve := func(f Files) string {
		cfg, err := Server(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		return serveGRPC(t, cfg)
	}
	addrB, addrStranger := serve(b), serve(stranger)
	dialer, err := Peer(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(t, addrB, credentials.NewTLS(dialer)); err != nil {
		t.Fatalf("a peer of the mesh: %v", err)
	}
	if err := check(t, addrStranger, credentials.NewTLS(dialer)); status.Code(err) != codes.Unavailable {
		t.Errorf("a server of another CA: %v, want Unavailable", err)
	}
	if _, err := Peer(Files{Cert: a.Cert, Key: a.Key}, nil); err == nil {
		t.Error("Peer without a CA file: no error")
	}
}
