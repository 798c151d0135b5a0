package region

import (
	"context"
	"crypto/x509"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// DefaultSAN is the name a region's certificate carries, as a URI (or
// DNS) subject alternative name, {region} standing for the region's name:
// region eu's certificate names urn:ratelimitd:region:eu.
const DefaultSAN = "urn:ratelimitd:region:{region}"

// CertAuth authenticates pushes by the client certificate of their
// connection: a push is accepted only over TLS, from a certificate that
// chains to Roots and carries, as a URI or DNS subject alternative name,
// SAN with {region} replaced by the name of the region the push comes
// from. A certificate of the same CA that names another region, or none
// (an Envoy's), is refused, and so is a push without a certificate.
type CertAuth struct {
	// Roots returns the CAs region certificates chain to; it is called
	// for each push, so the CAs may change (a rotated file).
	Roots func() *x509.CertPool
	// SAN is the name a region's certificate carries, {region} standing
	// for the region. Default DefaultSAN.
	SAN string
}

// Names returns the regions certificate c names under the SAN template
// san (DefaultSAN when empty).
func Names(c *x509.Certificate, san string) []string {
	if san == "" {
		san = DefaultSAN
	}
	prefix, suffix, _ := strings.Cut(san, "{region}")
	var out []string
	consider := func(name string) {
		if r, ok := strings.CutPrefix(name, prefix); ok {
			if r, ok = strings.CutSuffix(r, suffix); ok && CheckName(r) == nil && !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	for _, u := range c.URIs {
		consider(u.String())
	}
	for _, d := range c.DNSNames {
		consider(d)
	}
	return out
}

// Authenticate implements [Options.Authenticate]: it returns nil when the
// caller of ctx proves, by its certificate, to be region; else a gRPC
// status error, Unauthenticated (no certificate, or one that does not
// chain to Roots) or PermissionDenied (a certificate of another region,
// or of no region), saying what is wrong.
func (a CertAuth) Authenticate(ctx context.Context, region string) error {
	san := a.SAN
	if san == "" {
		san = DefaultSAN
	}
	want := strings.ReplaceAll(san, "{region}", region)
	p, ok := grpcpeer.FromContext(ctx)
	var info credentials.TLSInfo
	if ok {
		info, ok = p.AuthInfo.(credentials.TLSInfo)
	}
	if !ok || len(info.State.PeerCertificates) == 0 {
		return status.Errorf(codes.Unauthenticated, "a push claiming region %q came without a client certificate: pushes are accepted over mutual TLS only, from a certificate naming the region (%s)", region, want)
	}
	certs := info.State.PeerCertificates
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.Roots(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return status.Errorf(codes.Unauthenticated, "a push claiming region %q came with a client certificate (subject %q) not of the regions' CA: %v", region, leaf.Subject.String(), err)
	}
	names := Names(leaf, san)
	if !slices.Contains(names, region) {
		of := "names no region"
		if len(names) > 0 {
			of = "names region " + strings.Join(names, ", ")
		}
		return status.Errorf(codes.PermissionDenied, "a push claiming region %q came with a certificate (subject %q) that %s: want a SAN %s", region, leaf.Subject.String(), of, want)
	}
	return nil
}
