package tlsconfig

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

// testCA is a certificate authority for tests: ECDSA P-256, valid for a
// day.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte // the CA certificate
}

// newCA returns a new self-signed CA named cn.
func newCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key := newKey(t)
	tmpl := template(t, cn)
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// pool returns a pool holding the CA.
func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// issue returns the PEM certificate and key of a leaf named cn signed by
// the CA: a server certificate for 127.0.0.1, ::1 and localhost, or a client
// certificate.
func (ca *testCA) issue(t *testing.T, cn string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	tmpl := template(t, cn)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// clientFor returns a client certificate named cn, valid for the DNS
// names dns, signed by the CA.
func (ca *testCA) clientFor(t *testing.T, cn string, dns ...string) tls.Certificate {
	t.Helper()
	key := newKey(t)
	tmpl := template(t, cn)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	tmpl.DNSNames = dns
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// client returns a client certificate named cn signed by the CA.
func (ca *testCA) client(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(ca.issue(t, cn, false))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// meshFiles writes a certificate named cn signed by the CA for both
// server and client authentication (as a mesh of servers that dial each
// other uses), and its key, to cert.pem and key.pem in dir, and the CA to
// ca.pem, also named as the client CA.
func (ca *testCA) meshFiles(t *testing.T, dir, cn string) Files {
	t.Helper()
	f := ca.serverFiles(t, dir, cn)
	key := newKey(t)
	tmpl := template(t, cn)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.DNSNames = []string{"localhost"}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, f.Key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	f.ClientCA = filepath.Join(dir, "ca.pem")
	return f
}

// serverFiles writes a server certificate named cn signed by the CA, and
// its key, to cert.pem and key.pem in dir, and the CA to ca.pem.
func (ca *testCA) serverFiles(t *testing.T, dir, cn string) Files {
	t.Helper()
	f := Files{Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	certPEM, keyPEM := ca.issue(t, cn, true)
	writeFile(t, f.Cert, certPEM)
	writeFile(t, f.Key, keyPEM)
	writeFile(t, filepath.Join(dir, "ca.pem"), ca.pem)
	return f
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func template(t *testing.T, cn string) *x509.Certificate {
	t.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		t.Fatal(err)
	}
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

// writeFile replaces file name with data the way cert-manager and most
// tools do: it writes a temporary file next to it, then renames it over.
func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}
