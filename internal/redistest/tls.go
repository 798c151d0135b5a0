package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/pki"
)

// CertFiles are the PEM files of a throwaway CA and of a server
// certificate it signed, and a client config that trusts the CA.
type CertFiles struct {
	CA, Cert, Key string
	Client        *tls.Config
	// Pair is the certificate and key of Cert and Key, valid for server
	// and client authentication; Pool holds the CA.
	Pair tls.Certificate
	Pool *x509.CertPool
}

// MutualServer returns the TLS config of a server that presents Pair and
// requires client certificates signed by the CA.
func (f CertFiles) MutualServer() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{f.Pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: f.Pool, MinVersion: tls.VersionTLS12}
}

// MutualClient returns the TLS config of a client that trusts the CA and
// presents Pair.
func (f CertFiles) MutualClient() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{f.Pair}, RootCAs: f.Pool, MinVersion: tls.VersionTLS12}
}

// WriteCerts makes a throwaway CA and a server certificate for 127.0.0.1,
// ::1 and localhost in a temporary directory of t, for tests of TLS
// servers other than Redis too.
func WriteCerts(t testing.TB) CertFiles {
	t.Helper()
	c, err := writeCerts(t.TempDir())
	if err != nil {
		t.Fatalf("redistest: writing certificates: %v", err)
	}
	return c
}

// writeCerts makes a CA and a certificate for 127.0.0.1, ::1 and
// localhost, valid for a day, and writes them in dir.
func writeCerts(dir string) (CertFiles, error) {
	ca, err := pki.New(dir, "redistest throwaway CA")
	if err != nil {
		return CertFiles{}, err
	}
	// Valid for client authentication too: redis-server may present it on
	// outgoing links.
	c, err := ca.Sign(pki.Leaf{CN: "localhost", Server: true})
	if err != nil {
		return CertFiles{}, err
	}
	f := CertFiles{CA: ca.File, Cert: c.File, Key: c.KeyFile, Pair: c.Pair, Pool: ca.Pool()}
	f.Client = &tls.Config{RootCAs: f.Pool, MinVersion: tls.VersionTLS12}
	return f, nil
}
