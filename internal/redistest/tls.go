package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
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
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return CertFiles{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest throwaway CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return CertFiles{}, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return CertFiles{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return CertFiles{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Client auth too: redis-server may present it on outgoing links.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return CertFiles{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return CertFiles{}, err
	}
	f := CertFiles{
		CA:   filepath.Join(dir, "ca.pem"),
		Cert: filepath.Join(dir, "server.pem"),
		Key:  filepath.Join(dir, "server-key.pem"),
	}
	for _, w := range []struct {
		path, typ string
		der       []byte
	}{{f.CA, "CERTIFICATE", caDER}, {f.Cert, "CERTIFICATE", der}, {f.Key, "PRIVATE KEY", keyDER}} {
		b := pem.EncodeToMemory(&pem.Block{Type: w.typ, Bytes: w.der})
		if err := os.WriteFile(w.path, b, 0o600); err != nil {
			return CertFiles{}, err
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	f.Client = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	f.Pool = pool
	if f.Pair, err = tls.LoadX509KeyPair(f.Cert, f.Key); err != nil {
		return CertFiles{}, err
	}
	return f, nil
}
