package service

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/key"
	"github.com/ratelimitd/ratelimitd/pkg/region"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

const globalRules = `
domain: api
descriptors:
  - key: tenant
    rate_limits:
      - {name: per_hour, unit: hour, requests_per_unit: 100, scope: global}
      - {name: per_second, unit: second, requests_per_unit: 50}
`

// TestGlobalLimitThroughTheService decides a rule with a global limit
// through a region engine that heard a peer count 70 of its 100: Envoy's
// API admits the 30 left, reports what remains of the global limit, and
// POST /explain shows every region's count.
func TestGlobalLimitThroughTheService(t *testing.T) {
	clk := clocktest.New(start)
	store := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	eng, err := region.New(store, region.Options{
		Region: "eu", Peers: []region.Peer{{Name: "us", Addr: "passthrough:///us.invalid"}},
		Store: region.NewMemoryStore(clk.Now), Now: clk.Now,
		// The push below is us's, in plaintext: who may push is
		// pkg/region's tests' concern (TestPushIdentity), not this one's.
		Authenticate: func(context.Context, string) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureOpts(t, globalRules, eng, clk, Options{Global: eng})

	// us pushes its count of tenant acme's per_hour key: 70.
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	eng.Register(gs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///eu", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	acme := desc("tenant", "acme")
	rule := f.svc.rules.Load().Domain("api").Match((*rlsDescriptor)(acme))
	k := key.AppendLimit(appendDescriptor(nil, "api", acme, rule), ruleLimit(&rule.Limits[0]))
	hour := start.Truncate(time.Hour)
	if _, err := ratelimitdv1.NewRegionSyncClient(conn).Push(context.Background(), &ratelimitdv1.PushRequest{Region: "us", Weight: 1,
		Counts: []*ratelimitdv1.RegionCount{{Key: k, WindowStartMs: hour.UnixMilli(), WindowMs: time.Hour.Milliseconds(), Count: 70}}}); err != nil {
		t.Fatal(err)
	}

	admitted, remaining := 0, uint32(0)
	for range 40 {
		resp := f.call(t, request("api", acme))
		if resp.OverallCode == ok {
			admitted++
		}
		remaining = resp.Statuses[0].LimitRemaining
		clk.Advance(10 * time.Millisecond) // the per-second limit (50) never binds; us stays heard (1 s)
	}
	if admitted != 30 || remaining != 0 {
		t.Fatalf("admitted %d with us at 70 of 100 (remaining %d), want 30 and 0", admitted, remaining)
	}

	code, _, body := postExplain(t, f.svc, `{"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}]}`)
	if code != 200 {
		t.Fatalf("explain: %d %s", code, body)
	}
	var x ExplainResponse
	if err := json.Unmarshal([]byte(body), &x); err != nil {
		t.Fatal(err)
	}
	d := x.Descriptors[0]
	if len(d.Global) != 2 || d.Global[0] == nil || d.Global[1] != nil {
		t.Fatalf("explain global %+v, want per_hour's and none for per_second", d.Global)
	}
	g := d.Global[0]
	if g.Count != 100 || g.Offset != 70 || len(g.Regions) != 2 || g.Regions[0].Region != "eu" || g.Regions[0].Count != 30 ||
		g.Regions[1].Region != "us" || g.Regions[1].Count != 70 || g.Regions[1].CutOff {
		t.Fatalf("explain global %+v, want eu 30 + us 70 = 100, offset 70", g)
	}
	if why := strings.Join(d.Why, "\n"); !strings.Contains(why, "limit 0 is global (on_partition: share)") || !strings.Contains(why, "eu 30 (this region), us 70 (heard") {
		t.Errorf("why does not say how the regions count:\n%s", why)
	}
}
