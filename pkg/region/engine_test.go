package region

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/pki"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// link is the network between two regions, which a test can cut.
type link struct{ down atomic.Bool }

func (l *link) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if l.down.Load() {
		return status.Error(codes.Unavailable, "test: the link is cut")
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// world is a few regions of one replica each, on memory backends and
// memory stores, every pair of them linked over gRPC (bufconn).
type world struct {
	clk       *clocktest.Clock
	engines   map[string]*Engine
	links     map[[2]string]*link // from, to
	ctx       context.Context
	ca        *pki.CA                      // of the regions' certificates
	certs     map[string]pki.Cert          // by region, naming it
	listeners map[string]*bufconn.Listener // by region
}

// dial connects to region addr's listener over TLS with cfg (nil:
// plaintext), as "localhost".
func (w *world) dial(addr string, cfg *tls.Config, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	l := w.listeners[addr]
	creds := insecure.NewCredentials()
	if cfg != nil {
		cfg.ServerName = "localhost"
		creds = credentials.NewTLS(cfg)
	}
	return grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(creds)}, opts...)...)
}

// newWorld starts regions, named and weighted as weights says (nil: 1),
// syncing every 100 ms.
func newWorld(t *testing.T, names []string, weights map[string]float64) *world {
	t.Helper()
	return newWorldEvery(t, names, weights, 100*time.Millisecond)
}

// newWorldEvery is newWorld with a sync interval of its own: a push that
// fails is retried a quarter interval later, in real time.
func newWorldEvery(t *testing.T, names []string, weights map[string]float64, interval time.Duration) *world {
	t.Helper()
	w := &world{clk: clocktest.New(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)), engines: map[string]*Engine{}, links: map[[2]string]*link{}, ctx: context.Background(),
		ca: pki.NewCA(t, "regions"), certs: map[string]pki.Cert{}, listeners: map[string]*bufconn.Listener{}}
	listeners := w.listeners
	for _, n := range names {
		listeners[n] = bufconn.Listen(1 << 20)
	}
	for _, n := range names {
		mem := memory.New(memory.Options{Now: w.clk.Now})
		t.Cleanup(func() { mem.Close() })
		var peers []Peer
		for _, m := range names {
			if m != n {
				peers = append(peers, Peer{Name: m, Addr: m})
				w.links[[2]string{n, m}] = &link{}
			}
		}
		// Each region dials its peers over mutual TLS with a certificate
		// naming it, as ratelimitd does, and accepts only pushes from the
		// region a certificate names.
		cert := w.ca.Region(n)
		w.certs[n] = cert
		e, err := New(mem, Options{
			Region: n, Weight: weights[n], Peers: peers, Interval: interval,
			Store: NewMemoryStore(w.clk.Now), Now: w.clk.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Dial: func(addr string) (grpc.ClientConnInterface, error) {
				return w.dial(addr, w.ca.Client(&cert), grpc.WithUnaryInterceptor(w.links[[2]string{n, addr}].intercept))
			},
			Authenticate: CertAuth{Roots: w.ca.Pool}.Authenticate,
		})
		if err != nil {
			t.Fatal(err)
		}
		// The listener asks for a certificate and checks none: CertAuth
		// alone decides, as behind a listener whose client CAs are not the
		// regions'.
		gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{cert.Pair}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12,
		})))
		e.Register(gs)
		go gs.Serve(listeners[n])
		t.Cleanup(gs.Stop)
		w.engines[n] = e
	}
	return w
}

// sync runs one sync round in every region, the pushes done before it
// returns, then a second read round so that every region has read what
// the others pushed.
func (w *world) sync() {
	for range 2 {
		var wg sync.WaitGroup
		for _, e := range w.engines {
			e.tick(w.ctx, &wg)
		}
		wg.Wait()
	}
}

// cut cuts (or, with down false, heals) every link to and from region.
func (w *world) cut(region string, down bool) {
	for k, l := range w.links {
		if k[0] == region || k[1] == region {
			l.down.Store(down)
		}
	}
}

var hourly = algo.Limit{Algorithm: algo.FixedWindow, Requests: 100, Window: time.Hour}

// admit offers n single hits of key to region, and returns how many it
// admitted.
func (w *world) admit(t *testing.T, region string, key string, l algo.Limit, g algo.Global, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		reqs := []algo.Request{{Key: []byte(key), Limit: l, Hits: 1, Global: g}}
		out := make([]algo.Decision, 1)
		if err := w.engines[region].Decide(w.ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		if reqs[0].Limit != l {
			t.Fatalf("Decide changed the caller's request: limit %+v", reqs[0].Limit)
		}
		if out[0].Allowed {
			admitted++
		}
	}
	return admitted
}

// counts returns the counts region knows of key now, by region.
func (w *world) counts(region, key string, l algo.Limit, g algo.Global) map[string]uint64 {
	st, ok := w.engines[region].GlobalState([]byte(key), l, g)
	if !ok {
		return nil
	}
	out := map[string]uint64{}
	for _, c := range st.Counts {
		out[c.Region] = c.Count
	}
	return out
}

// TestGlobalLimitAcrossRegions: with the counts synced between decisions,
// three regions admit the limit together, no more: each admits what the
// others left.
func TestGlobalLimitAcrossRegions(t *testing.T) {
	w := newWorld(t, []string{"eu", "us", "ap"}, nil)
	w.sync() // every region heard from every other
	got := map[string]int{}
	for _, r := range []string{"eu", "us", "ap"} {
		got[r] = w.admit(t, r, "tenant-a", hourly, algo.GlobalShare, 50)
		w.sync()
	}
	if got["eu"] != 50 || got["us"] != 50 || got["ap"] != 0 {
		t.Fatalf("admitted %v, want eu 50, us 50 (the limit's rest), ap 0", got)
	}
	for _, r := range []string{"eu", "us", "ap"} {
		if c := w.counts(r, "tenant-a", hourly, algo.GlobalShare); c["eu"] != 50 || c["us"] != 50 || c["ap"] != 0 {
			t.Errorf("%s knows %v, want eu 50, us 50, ap 0", r, c)
		}
	}
	// A limit of scope: region is not touched: each region has its own.
	for _, r := range []string{"eu", "us"} {
		if n := w.admit(t, r, "tenant-b", hourly, algo.NotGlobal, 100); n != 100 {
			t.Errorf("%s admitted %d of a regional limit of 100, want 100", r, n)
		}
	}
}

// TestOvershootWithinOneSyncDelay: regions that admit before they hear
// each other overshoot by what they admitted meanwhile, no more; once
// synced, none admits until the window ends.
func TestOvershootWithinOneSyncDelay(t *testing.T) {
	w := newWorld(t, []string{"eu", "us", "ap"}, nil)
	w.sync()
	total := 0
	for _, r := range []string{"eu", "us", "ap"} {
		total += w.admit(t, r, "k", hourly, algo.GlobalShare, 40) // no sync between: one sync delay
	}
	if total != 120 {
		t.Fatalf("admitted %d within one sync delay, want 120: each region sees only its own 40", total)
	}
	w.sync()
	for _, r := range []string{"eu", "us", "ap"} {
		if n := w.admit(t, r, "k", hourly, algo.GlobalShare, 10); n != 0 {
			t.Errorf("%s admitted %d after the sync, with 120 counted of 100", r, n)
		}
		st, _ := w.engines[r].GlobalState([]byte("k"), hourly, algo.GlobalShare)
		if st.Offset != 80 {
			t.Errorf("%s: offset %d, want 80 (the two others' 40 each)", r, st.Offset)
		}
	}
	// The next window starts from nothing.
	w.clk.Advance(time.Hour)
	w.sync()
	if n := w.admit(t, "eu", "k", hourly, algo.GlobalShare, 100); n != 100 {
		t.Errorf("the next window admitted %d, want 100", n)
	}
}

// TestPartitionShare: a region cut off from the others admits its share
// (the limit less the others' shares or last counts, whichever is more),
// the others together the rest; after the link heals, every region knows
// every count at the next sync, and none was lost.
func TestPartitionShare(t *testing.T) {
	w := newWorld(t, []string{"eu", "us", "ap"}, nil)
	limit := algo.Limit{Algorithm: algo.FixedWindow, Requests: 300, Window: time.Hour}
	w.sync()
	for _, r := range []string{"eu", "us", "ap"} {
		w.admit(t, r, "k", limit, algo.GlobalShare, 20)
	}
	w.sync()
	w.cut("ap", true)
	w.clk.Advance(2 * time.Second) // past PartitionAfter (1 s): every side counts the other as cut off
	w.sync()
	// ap reserves eu's and us's shares (100 each, over their 20): it may
	// count up to 100, so 80 more. eu and us reserve ap's 100 and share
	// the rest, 200, of which they counted 40.
	ap := w.admit(t, "ap", "k", limit, algo.GlobalShare, 150)
	eu := w.admit(t, "eu", "k", limit, algo.GlobalShare, 150)
	w.sync()
	us := w.admit(t, "us", "k", limit, algo.GlobalShare, 150)
	if ap != 80 || eu+us != 160 {
		t.Fatalf("during the partition ap admitted %d (want 80), eu and us %d (want 160 together)", ap, eu+us)
	}
	st, _ := w.engines["ap"].GlobalState([]byte("k"), limit, algo.GlobalShare)
	if st.Counts[1].Reserved != 100 || !st.Counts[1].CutOff {
		t.Errorf("ap's view of eu: %+v, want cut off, 100 reserved", st.Counts[1])
	}
	w.cut("ap", false)
	w.sync()
	want := map[string]uint64{"ap": 100, "eu": 20 + uint64(eu), "us": 20 + uint64(us)}
	for _, r := range []string{"eu", "us", "ap"} {
		if c := w.counts(r, "k", limit, algo.GlobalShare); c["ap"] != want["ap"] || c["eu"] != want["eu"] || c["us"] != want["us"] {
			t.Errorf("after the heal %s knows %v, want %v", r, c, want)
		}
	}
}

// TestPartitionExactLocal: with on_partition: exact-local, a region cut
// off decides the limit on its own count.
func TestPartitionExactLocal(t *testing.T) {
	w := newWorld(t, []string{"eu", "us"}, nil)
	w.sync()
	w.admit(t, "us", "k", hourly, algo.GlobalExactLocal, 70)
	w.sync()
	if n := w.admit(t, "eu", "k", hourly, algo.GlobalExactLocal, 100); n != 30 {
		t.Fatalf("connected: eu admitted %d, want the 30 us left", n)
	}
	w.cut("eu", true)
	w.clk.Advance(2 * time.Second)
	w.sync()
	if n := w.admit(t, "eu", "k", hourly, algo.GlobalExactLocal, 100); n != 70 {
		t.Fatalf("cut off: eu admitted %d, want 70 (its own count of 30 against the whole limit)", n)
	}
}

// TestWeights: a region's share while cut off follows the weights the
// regions announce.
func TestWeights(t *testing.T) {
	w := newWorld(t, []string{"eu", "us"}, map[string]float64{"eu": 3, "us": 1})
	w.sync()
	w.cut("us", true)
	w.clk.Advance(2 * time.Second)
	w.sync()
	eu := w.admit(t, "eu", "k", hourly, algo.GlobalShare, 100)
	us := w.admit(t, "us", "k", hourly, algo.GlobalShare, 100)
	if eu != 75 || us != 25 {
		t.Fatalf("cut apart with weights 3:1, eu admitted %d and us %d, want 75 and 25", eu, us)
	}
}

// TestPushFromStranger: a region not among the peers is refused.
func TestPushFromStranger(t *testing.T) {
	w := newWorld(t, []string{"eu", "us"}, nil)
	mars := w.ca.Region("mars")
	if err := w.pushAs(t, "eu", &mars, pushOf("mars", "k", 0, 1000, 5)); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not a peer") {
		t.Fatalf("push from mars, with its certificate: %v, want PermissionDenied: not a peer", err)
	}
	us := w.certs["us"]
	if err := w.pushAs(t, "eu", &us, pushOf("us", "k", 10, 1000, 5)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("push of a window not aligned: %v, want InvalidArgument", err)
	}
}

// TestPushIdentity: a push is accepted only from the region its caller's
// certificate names. Pushes claiming us with a count of 1,000,000, which
// would hold the key over its limit for the rest of the window, are
// refused from ap's certificate, without a certificate, from an Envoy's
// certificate of the same CA, and from a certificate naming us of another
// CA; us's own certificate is accepted, and eu knows only what it pushed.
func TestPushIdentity(t *testing.T) {
	w := newWorld(t, []string{"eu", "us", "ap"}, nil)
	start := windowOf(w.clk.Now(), time.Hour).Start
	forged := pushOf("us", "k", start, time.Hour.Milliseconds(), 1_000_000)
	envoy := w.ca.Issue(pki.Leaf{CN: "envoy", URIs: []string{"spiffe://cluster.local/ns/gw/sa/envoy"}})
	other := pki.NewCA(t, "another").Region("us")
	ap := w.certs["ap"]
	for _, c := range []struct {
		name string
		cert *pki.Cert
		want codes.Code
		msg  string
	}{
		{"ap's certificate", &ap, codes.PermissionDenied, `names region ap: want a SAN urn:ratelimitd:region:us`},
		{"no certificate", nil, codes.Unauthenticated, "without a client certificate"},
		{"an Envoy's certificate of the same CA", &envoy, codes.PermissionDenied, "names no region"},
		{"us's name, by another CA", &other, codes.Unauthenticated, "not of the regions' CA"},
	} {
		if err := w.pushAs(t, "eu", c.cert, forged); status.Code(err) != c.want || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.want, c.msg)
		}
	}
	if got := w.counts("eu", "k", hourly, algo.GlobalShare)["us"]; got != 0 {
		t.Fatalf("eu knows a count of %d for us after forged pushes", got)
	}
	if st := w.engines["eu"].Stats(); st.Refused != 4 || st.Received != 0 {
		t.Errorf("eu's stats: %d refused, %d received; want 4 and 0", st.Refused, st.Received)
	}
	us := w.certs["us"]
	if err := w.pushAs(t, "eu", &us, pushOf("us", "k", start, time.Hour.Milliseconds(), 7)); err != nil {
		t.Fatalf("us's own push: %v", err)
	}
	if got := w.counts("eu", "k", hourly, algo.GlobalShare)["us"]; got != 7 {
		t.Fatalf("eu knows a count of %d for us, want the 7 us pushed", got)
	}
}

// pushAs sends req to region to's listener over TLS, presenting cert (nil:
// none), and returns the answer's error.
func (w *world) pushAs(t *testing.T, to string, cert *pki.Cert, req *ratelimitdv1.PushRequest) error {
	t.Helper()
	conn, err := w.dial(to, w.ca.Client(cert))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	_, err = ratelimitdv1.NewRegionSyncClient(conn).Push(ctx, req)
	return err
}

// from returns the context gRPC hands a push's handler when region pushes
// over mutual TLS with its certificate.
func (w *world) from(region string) context.Context {
	state := tls.ConnectionState{PeerCertificates: []*x509.Certificate{w.certs[region].Pair.Leaf}}
	return grpcpeer.NewContext(w.ctx, &grpcpeer.Peer{AuthInfo: credentials.TLSInfo{State: state}})
}

// TestSiblingsCountTogether runs a region of two replicas on one backend
// and one store: a replica learns its region's count from its own
// decisions, and its sibling's hits from the backend within
// 2·refreshRounds rounds, even when the sibling is gone; explain reads the count from the
// backend at once.
func TestSiblingsCountTogether(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	mem := memory.New(memory.Options{Now: clk.Now})
	t.Cleanup(func() { mem.Close() })
	store := NewMemoryStore(clk.Now)
	replica := func() *Engine {
		e, err := New(mem, Options{Region: "eu", Store: store, Now: clk.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	a, b := replica(), replica()
	ctx := context.Background()
	decide := func(e *Engine, n int) {
		for range n {
			out := make([]algo.Decision, 1)
			if err := e.Decide(ctx, []algo.Request{{Key: []byte("k"), Limit: hourly, Hits: 1, Global: algo.GlobalShare}}, out); err != nil {
				t.Fatal(err)
			}
		}
	}
	known := func(e *Engine) uint64 { // what the engine holds, without explain's read
		own, _ := stateOf(e, "k", windowOf(clk.Now(), time.Hour))
		return own
	}
	round := func(e *Engine) {
		var wg sync.WaitGroup
		e.tick(ctx, &wg)
		wg.Wait()
	}
	decide(b, 1)
	decide(a, 10)
	if known(a) != 11 || known(b) != 1 {
		t.Fatalf("a knows %d, b %d; want 11 and 1", known(a), known(b))
	}
	if st, _ := b.GlobalState([]byte("k"), hourly, algo.GlobalShare); st.Counts[0].Count != 11 {
		t.Fatalf("b explains a count of %d, want the backend's 11", st.Counts[0].Count)
	}
	// a is gone; b, which decided the key once, finds its hits from the
	// backend once the key has been idle for refreshRounds rounds, within
	// refreshRounds more (each round refreshes that part of the keys).
	rounds := 0
	for known(b) != 11 {
		if rounds == 2*refreshRounds {
			t.Fatalf("after %d rounds b knows %d, want 11", rounds, known(b))
		}
		round(b)
		clk.Advance(DefaultInterval)
		rounds++
	}
	t.Logf("b knew a's hits after %d rounds", rounds)
}

// stateOf returns what e holds of key in window w: its region's count and
// each peer's.
func stateOf(e *Engine, key string, w Window) (own uint64, remote []uint64) {
	sh := e.shardOf([]byte(key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ks := sh.keys[key]; ks != nil {
		if ws := e.window(ks, w, false); ws != nil {
			for _, pc := range ws.peers {
				remote = append(remote, pc.remote)
			}
			return ws.own, remote
		}
	}
	return 0, nil
}
