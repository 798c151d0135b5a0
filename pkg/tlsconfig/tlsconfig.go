// Package tlsconfig builds the TLS configuration of ratelimitd's listeners:
// TLS with a server certificate, and mutual TLS when a client CA file is
// given.
//
// # Rotation
//
// Certificates rotate without a restart. During TLS handshakes, at most
// once per [ReloadInterval] (one second), the configuration looks at its
// files: the certificate, the key and the client CAs. A file whose size,
// modification time or identity changed is read again, so a file replaced
// by a rename (as cert-manager, kubelet's secret volumes and most tools
// write them) is picked up as well as one rewritten in place. New
// connections then get the new certificate, or are verified against the new
// CAs; connections already established keep what they were handshaken with.
//
// When the changed files cannot be read, hold no certificate, or the key
// does not match the certificate, the previous certificate (or CAs) stay in
// use and the error goes to the callback given to [Server], once per change:
// the files are read again when they change again. Write the key and the
// certificate together (as one rename of a directory or symlink, the way
// kubelet does): a check between two separate writes reports a mismatch,
// and the next check after both are written picks up the new pair.
//
// Files are looked at only when clients connect: a listener nobody
// connects to reads nothing and reports nothing.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"
)

// ReloadInterval is how often, at most, a configuration looks at its files
// for changes.
const ReloadInterval = time.Second

// Files name the PEM files of a listener's TLS.
type Files struct {
	Cert, Key string // the server's certificate chain and key; both or neither
	ClientCA  string // when set, clients must present a certificate signed by one of these CAs (mutual TLS)
	// ClientSAN, with ClientCA, also requires the client certificate to
	// be valid for this name, as a server certificate is for its host
	// name (x509.Certificate.VerifyHostname: a DNS name, wildcards
	// included, or an IP address); envoyproxy/ratelimit's
	// GRPC_CLIENT_TLS_SAN.
	ClientSAN string
}

// Enabled reports whether any file is named, that is whether the listener
// is meant to serve TLS. [Server] says what is wrong with a partial set.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.ClientCA != "" }

// Server returns the *tls.Config of a listener: TLS 1.2 at least, h2 and
// http/1.1 offered by ALPN (for gRPC and HTTP), the certificate and key of
// f re-read when their files change, and with f.ClientCA, client
// certificates required and verified against the CAs of that file, also
// re-read when it changes. See the package documentation for rotation.
//
// Server fails when a file is missing or invalid, naming it and what is
// wrong. onReloadError, which may be nil, receives the errors of later
// reloads; it is called during handshakes, from any goroutine.
func Server(f Files, onReloadError func(error)) (*tls.Config, error) {
	switch {
	case f.Cert == "" && f.Key == "" && f.ClientCA != "":
		return nil, fmt.Errorf("client CA file %s given without a server certificate and key: mutual TLS needs all three", f.ClientCA)
	case f.Cert == "" && f.Key == "":
		return nil, errors.New("no TLS certificate and key files given")
	case f.Key == "":
		return nil, fmt.Errorf("TLS certificate file %s given without its key file", f.Cert)
	case f.Cert == "":
		return nil, fmt.Errorf("TLS key file %s given without its certificate file", f.Key)
	case f.ClientSAN != "" && f.ClientCA == "":
		return nil, fmt.Errorf("client SAN %q given without a client CA file: only mutual TLS verifies client certificates", f.ClientSAN)
	}
	if onReloadError == nil {
		onReloadError = func(error) {}
	}
	r := &reloader{files: f, onError: onReloadError, checked: time.Now()}
	r.pairStat = stat(f.Cert, f.Key)
	var err error
	if r.cert, err = loadPair(f.Cert, f.Key); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.current().cert, nil },
	}
	if f.ClientCA == "" {
		return cfg, nil
	}
	r.caStat = stat(f.ClientCA)
	pool, err := loadCA(f.ClientCA)
	if err != nil {
		return nil, err
	}
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	cfg.ClientCAs = pool
	if san := f.ClientSAN; san != "" {
		// Called after the chain is verified against the client CAs.
		cfg.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error {
			if len(chains) == 0 || len(chains[0]) == 0 {
				return errors.New("no verified client certificate")
			}
			if err := chains[0][0].VerifyHostname(san); err != nil {
				return fmt.Errorf("client certificate not valid for the required SAN: %w", err)
			}
			return nil
		}
	}
	r.template = cfg.Clone()
	r.mtls = r.withCAs(pool)
	// The configuration of each handshake is the one of the current CAs; cfg
	// itself, with the CAs read at start, is never used for one.
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.current().mtls, nil }
	return cfg, nil
}

// reloader holds the current certificate and client CAs of a listener, and
// reads them again when their files change.
type reloader struct {
	files    Files
	onError  func(error)
	template *tls.Config // with ClientCA: the configuration the CAs are set in

	mu       sync.Mutex
	checked  time.Time     // when the files were last looked at
	pairStat []fs.FileInfo // of the certificate and key, as of their last read
	caStat   []fs.FileInfo // of the client CAs, as of their last read
	state
}

// state is what handshakes use.
type state struct {
	cert *tls.Certificate
	mtls *tls.Config // with ClientCA: the configuration of a handshake
}

// current returns the state to handshake with, after reading the files
// again if ReloadInterval has passed since the last look and they changed.
func (r *reloader) current() state {
	var errs []error
	r.mu.Lock()
	if now := time.Now(); now.Sub(r.checked) >= ReloadInterval {
		r.checked = now
		if st := stat(r.files.Cert, r.files.Key); changed(r.pairStat, st) {
			r.pairStat = st
			if cert, err := loadPair(r.files.Cert, r.files.Key); err != nil {
				errs = append(errs, fmt.Errorf("keeping the previous TLS certificate: %w", err))
			} else {
				r.cert = cert
			}
		}
		if r.mtls != nil {
			if st := stat(r.files.ClientCA); changed(r.caStat, st) {
				r.caStat = st
				if pool, err := loadCA(r.files.ClientCA); err != nil {
					errs = append(errs, fmt.Errorf("keeping the previous client CAs: %w", err))
				} else {
					r.mtls = r.withCAs(pool)
				}
			}
		}
	}
	s := r.state
	r.mu.Unlock()
	for _, err := range errs {
		r.onError(err)
	}
	return s
}

// withCAs returns the configuration of a mutual TLS handshake verifying
// client certificates against pool.
func (r *reloader) withCAs(pool *x509.CertPool) *tls.Config {
	c := r.template.Clone()
	c.ClientCAs = pool
	return c
}

// stat returns the file information of each name, nil for those it cannot
// get.
func stat(names ...string) []fs.FileInfo {
	infos := make([]fs.FileInfo, len(names))
	for i, name := range names {
		infos[i], _ = os.Stat(name) // an unreadable file fails its read
	}
	return infos
}

// changed reports whether a file of old differs from the one of now: it
// appeared, went, was replaced, or changed size or modification time.
func changed(old, now []fs.FileInfo) bool {
	for i := range old {
		a, b := old[i], now[i]
		if a == nil || b == nil {
			if a != b {
				return true
			}
			continue
		}
		if !os.SameFile(a, b) || a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime()) {
			return true
		}
	}
	return false
}

// loadPair reads a certificate chain and its key.
func loadPair(certFile, keyFile string) (*tls.Certificate, error) {
	certPEM, err := readFile("TLS certificate", certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readFile("TLS key", keyFile)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate file %s and key file %s: %s", certFile, keyFile, strings.TrimPrefix(err.Error(), "tls: "))
	}
	return &cert, nil
}

// loadCA reads a file of PEM CA certificates.
func loadCA(name string) (*x509.CertPool, error) {
	data, err := readFile("client CA", name)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("client CA file %s: no valid PEM certificate in it", name)
	}
	return pool, nil
}

// readFile reads file name; what says which of the listener's TLS files it
// is, for errors.
func readFile(what, name string) ([]byte, error) {
	data, err := os.ReadFile(name)
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		err = pe.Err // the message names the file already
	}
	if err != nil {
		return nil, fmt.Errorf("%s file %s: %w", what, name, err)
	}
	return data, nil
}

// ClientCAs returns the client CAs in force of cfg, a configuration
// [Server] made: those of its client CA file as last read (they change
// when the file does); nil without one.
func ClientCAs(cfg *tls.Config) *x509.CertPool {
	if cfg.GetConfigForClient == nil {
		return cfg.ClientCAs
	}
	c, err := cfg.GetConfigForClient(nil)
	if err != nil || c == nil {
		return cfg.ClientCAs
	}
	return c.ClientCAs
}

// Peer returns the *tls.Config with which a server dials servers of its
// own mesh, as ratelimitd's regions dial each other: f.Cert and f.Key are
// its client certificate, and the servers' certificates are verified
// against the CAs of f.ClientCA (those its listener verifies clients with)
// for the name dialed. Both are re-read when their files change, as for
// [Server]. All three files are required.
func Peer(f Files, onReloadError func(error)) (*tls.Config, error) {
	if f.ClientCA == "" || f.Cert == "" || f.Key == "" {
		return nil, errors.New("dialing peers over mutual TLS needs a certificate, its key and the CA file their certificates are signed by")
	}
	server, err := Server(f, onReloadError)
	if err != nil {
		return nil, err
	}
	// Server's reloader serves the certificate and the CAs, reloaded.
	current := func() (*tls.Certificate, *x509.CertPool, error) {
		cert, err := server.GetCertificate(nil)
		return cert, ClientCAs(server), err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _, err := current()
			return cert, err
		},
		// The CAs may change: the chain is verified here, against the
		// current ones, rather than against RootCAs fixed now.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, pool, err := current()
			if err != nil {
				return err
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the peer presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: cs.ServerName, Roots: pool, Intermediates: inter})
			return err
		},
	}, nil
}
