// Package pki makes throwaway certificate authorities for tests and the
// load generator, and the certificates they sign, written as PEM files:
// a region's certificate naming it, an Envoy client's of the same CA, a
// stranger's of another CA. Never for production: the keys lie in plain
// files of a temporary directory.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"
)

// T is what the helpers that fail a test need of it: *testing.T and
// *testing.B fit.
type T interface {
	Helper()
	Fatal(args ...any)
	TempDir() string
}

// CA is a certificate authority: ECDSA P-256, valid from an hour ago for a
// day.
type CA struct {
	t      T // whose failure Issue reports; nil from New
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	File   string // the CA certificate, PEM
	serial atomic.Int64
}

// New returns a new self-signed CA named cn, its files written in dir.
func New(dir, cn string) (*CA, error) {
	ca := &CA{dir: dir}
	ca.serial.Store(1)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	if ca.cert, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	ca.key = key
	if ca.File, err = ca.write("ca.pem", "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return ca, nil
}

// NewCA is New in a temporary directory of t; it fails t on error, as
// Issue and Region do.
func NewCA(t T, cn string) *CA {
	t.Helper()
	ca, err := New(t.TempDir(), cn)
	if err != nil {
		t.Fatal(err)
	}
	ca.t = t
	return ca
}

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Leaf says what a certificate names.
type Leaf struct {
	CN   string
	URIs []string // URI SANs, such as urn:ratelimitd:region:eu
	// Server makes it valid for 127.0.0.1, ::1 and localhost as a server
	// too; every leaf is valid for client authentication.
	Server bool
}

// RegionLeaf is region name's certificate: valid as a server for loopback
// and as a client, naming the region by the URI SAN ratelimitd expects by
// default (region.DefaultSAN: urn:ratelimitd:region:NAME).
func RegionLeaf(name string) Leaf {
	return Leaf{CN: name, URIs: []string{"urn:ratelimitd:region:" + name}, Server: true}
}

// Cert is a certificate the CA signed: its files and the pair.
type Cert struct {
	File, KeyFile string
	Pair          tls.Certificate
}

// Sign returns a certificate of leaf, signed by the CA, its files written
// beside the CA's.
func (ca *CA) Sign(leaf Leaf) (Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Cert{}, err
	}
	now := time.Now()
	n := ca.serial.Add(1)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(n),
		Subject:      pkix.Name{CommonName: leaf.CN},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if leaf.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	for _, u := range leaf.URIs {
		p, err := url.Parse(u)
		if err != nil {
			return Cert{}, fmt.Errorf("pki: URI SAN %q: %w", u, err)
		}
		tmpl.URIs = append(tmpl.URIs, p)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Cert{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Cert{}, err
	}
	var c Cert
	name := leaf.CN + "-" + strconv.FormatInt(n, 10)
	if c.File, err = ca.write(name+".pem", "CERTIFICATE", der); err != nil {
		return Cert{}, err
	}
	if c.KeyFile, err = ca.write(name+"-key.pem", "PRIVATE KEY", keyDER); err != nil {
		return Cert{}, err
	}
	c.Pair, err = tls.LoadX509KeyPair(c.File, c.KeyFile)
	return c, err
}

// Issue is Sign for a CA of NewCA: it fails the CA's test on error.
func (ca *CA) Issue(leaf Leaf) Cert {
	ca.t.Helper()
	c, err := ca.Sign(leaf)
	if err != nil {
		ca.t.Fatal(err)
	}
	return c
}

// Region is Issue of RegionLeaf(name).
func (ca *CA) Region(name string) Cert {
	ca.t.Helper()
	return ca.Issue(RegionLeaf(name))
}

// Client returns the TLS config of a client that trusts the CA and, when
// c is not nil, presents it whatever CAs the server asks for (as a client
// forging its way in would).
func (ca *CA) Client(c *Cert) *tls.Config {
	cfg := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if c != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c.Pair, nil }
	}
	return cfg
}

func (ca *CA) write(name, typ string, der []byte) (string, error) {
	path := filepath.Join(ca.dir, name)
	return path, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
