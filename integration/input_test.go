package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ratelimitd/ratelimitd/internal/pki"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/wiretest"
)

// opaqueRules limits each value of descriptor (user, *) to 3 a day with a
// token bucket (one back every 8 hours: none within a test), and names
// the value in the metrics (detailed_metric), so that a value that is not
// UTF-8 reaches the metrics' labels too.
const opaqueRules = `domain: opaque
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: token_bucket}
`

// opaqueValues are descriptor values Envoy may send for a header: bytes
// that are not UTF-8 beside the UTF-8 a lossy decoding would make of them
// (U+FFFD), and others.
var opaqueValues = []string{"\xff", "\ufffd", "\xfe", "\xff\xff", "a\xffb", "ab", "\xc0\xaf", "/", ""}

// TestOpaqueDescriptorBytes sends, over gRPC to a real ratelimitd on the
// memory backend and on Redis, descriptor values that are not UTF-8, as
// Envoy copies them from request headers: each is counted under a key of
// its own, distinct from every other value (U+FFFD, which a lossy decoding
// would make of it, included), and refused at the limit like any other.
func TestOpaqueDescriptorBytes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "opaque.yaml"), []byte(opaqueRules), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		s := startServer(t, "-config", dir, "-reference-metrics-addr", "127.0.0.1:0", "-statsd-flush-interval", "100ms")
		opaqueCounts(t, s)
		// envoyproxy/ratelimit's statistics name the values too (mapped as
		// its USE_PROMETHEUS does): they are served, the others beside.
		url := "http://" + s.addr(t, "serving reference metrics") + "/metrics"
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			body := httpGet(t, url)
			if strings.Contains(body, "user_ab") {
				t.Logf("reference metrics:\n%s", body)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("reference metrics name no value ab within 10s:\n%s", body)
			}
		}
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		r := redistest.Start(t)
		args := redisArgs(t, r.URL, "standalone", "-config", dir)
		s := startServer(t, args...)
		opaqueCounts(t, s)
		// One counter per value in Redis, under the raw bytes.
		admin := goredis.NewClient(&goredis.Options{Addr: r.Addr})
		defer admin.Close()
		keys, err := admin.Keys(context.Background(), prefixOf(t, args)+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != len(opaqueValues) {
			t.Errorf("%d keys in Redis for %d values: %q", len(keys), len(opaqueValues), keys)
		}
		for _, v := range []string{"\xff", "\ufffd", "a\xffb"} {
			n := 0
			for _, k := range keys {
				if strings.Contains(k, "user") && strings.Contains(k, v) {
					n++
				}
			}
			if n == 0 {
				t.Errorf("no key in Redis holds the bytes %q: %q", v, keys)
			}
		}
	})
}

// opaqueCounts calls s with each of opaqueValues four times: 3 admitted,
// the fourth refused. Had two values shared a counter, the later would be
// refused early. The metrics are served after.
func opaqueCounts(t *testing.T, s *server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := s.dial(t)
	for _, v := range opaqueValues {
		for i := range 4 {
			var out wiretest.Raw
			err := conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, wiretest.Request("opaque", []string{"user", v}), &out, wiretest.CallOption())
			if err != nil {
				t.Fatalf("value %q, call %d: %v", v, i+1, err)
			}
			var resp rlsv3.RateLimitResponse
			if err := proto.Unmarshal(out, &resp); err != nil {
				t.Fatal(err)
			}
			want, remaining := rlsv3.RateLimitResponse_OK, uint32(2-i)
			if i == 3 {
				want, remaining = rlsv3.RateLimitResponse_OVER_LIMIT, 0
			}
			if st := resp.Statuses[0]; resp.OverallCode != want || st.LimitRemaining != remaining || st.CurrentLimit.GetRequestsPerUnit() != 3 {
				t.Fatalf("value %q, call %d: %v; want %v with %d of 3 remaining", v, i+1, &resp, want, remaining)
			}
		}
	}
	resp, err := http.Get("http://" + s.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`rule="opaque.user_ab"`)) {
		t.Errorf("/metrics: %d, want 200 with the detailed label of value ab:\n%s", resp.StatusCode, b)
	}
}

// TestNoInputIsInternalOnAnyMethod sends wiretest.Inputs of its request
// type to every method a real ratelimitd serves (RLS, ratelimitd.v1, RLQS,
// region sync, health, reflection: every service reflection lists): none
// is answered Internal. ShouldRateLimit decides strings that are not
// UTF-8; every other method refuses them as InvalidArgument naming the
// field; broken messages are InvalidArgument everywhere. Every method
// reflection lists must have been sent inputs (checkEveryMethodSent).
func TestNoInputIsInternalOnAnyMethod(t *testing.T) {
	t.Parallel()
	// A peer region at an address nobody listens on: the region sync
	// service is served all the same.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peer := l.Addr().String()
	l.Close()
	// Region sync on the gRPC port needs mutual TLS there: the calls come
	// with an Envoy's client certificate of the regions' CA.
	ca := pki.NewCA(t, "regions")
	cert, envoy := ca.Region("a"), ca.Issue(pki.Leaf{CN: "envoy"})
	s := startServer(t, "-enable-reset", "-region", "a", "-region-peers", "b="+peer,
		"-grpc-tls-cert", cert.File, "-grpc-tls-key", cert.KeyFile, "-grpc-tls-client-ca", ca.File)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(ca.Client(&envoy))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	methods := serverMethods(t, ctx, conn)
	var names []string
	for _, m := range methods {
		names = append(names, string(m.FullName()))
	}
	for _, want := range []string{
		"envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit",
		"ratelimitd.v1.RateLimiter.Check", "ratelimitd.v1.RateLimiter.Acquire",
		"envoy.service.rate_limit_quota.v3.RateLimitQuotaService.StreamRateLimitQuotas",
		"ratelimitd.v1.RegionSync.Push",
	} {
		if !slices.Contains(names, want) {
			t.Fatalf("reflection lists no %s: %v", want, names)
		}
	}
	sent := map[protoreflect.FullName]int{}
	for _, md := range methods {
		for _, in := range wiretest.Inputs(md.Input()) {
			sent[md.FullName()]++
			out, err := wiretest.Call(ctx, conn, md, in.Bytes)
			wiretest.Check(t, md, in, out, err)
		}
	}
	checkEveryMethodSent(t, methods, sent)
	if logs := strings.Join(s.logLines(), "\n"); strings.Contains(logs, "panic") {
		t.Errorf("a handler panicked:\n%s", logs)
	}
}

// checkEveryMethodSent fails t unless every method of methods, all that
// the server registers, was sent at least the inputs wiretest makes for
// any request type (floor: those it makes for an empty message, the
// broken messages), and so the whole at least that many per method: a
// method the server serves but the inputs miss fails here.
//
// Shown failing against broken builds: wiretest.Inputs making no input
// for ratelimitd.v1.PushRequest ("ratelimitd.v1.RegionSync.Push was sent
// 0 inputs"); TestNoInputIsInternalOnAnyMethod's loop skipping streaming
// methods (RLQS's StreamRateLimitQuotas, health's Watch, both reflection
// services' ServerReflectionInfo).
func checkEveryMethodSent(t *testing.T, methods []protoreflect.MethodDescriptor, sent map[protoreflect.FullName]int) {
	t.Helper()
	floor := len(wiretest.Inputs((&emptypb.Empty{}).ProtoReflect().Descriptor()))
	if floor == 0 {
		t.Fatal("wiretest makes no input for an empty message: the floor is 0")
	}
	total := 0
	var counts []string
	for _, md := range methods {
		n := sent[md.FullName()]
		total += n
		counts = append(counts, fmt.Sprintf("%s %d", md.FullName(), n))
		if n < floor {
			t.Errorf("%s was sent %d inputs, want at least %d (those of an empty message)", md.FullName(), n, floor)
		}
	}
	if total < floor*len(methods) {
		t.Errorf("%d calls to %d methods, want at least %d", total, len(methods), floor*len(methods))
	}
	t.Logf("%d calls to %d methods (at least %d each):\n%s", total, len(methods), floor, strings.Join(counts, "\n"))
}

// serverMethods returns every method of every service the server's
// reflection lists, described as the server describes them.
func serverMethods(t *testing.T, ctx context.Context, conn *grpc.ClientConn) []protoreflect.MethodDescriptor {
	t.Helper()
	st, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseSend()
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	list := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var services []string
	for _, svc := range list.GetListServicesResponse().GetService() {
		services = append(services, svc.Name)
		resp := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: svc.Name}})
		for _, b := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(b, fd); err != nil {
				t.Fatal(err)
			}
			if !seen[fd.GetName()] {
				seen[fd.GetName()] = true
				set.File = append(set.File, fd)
			}
		}
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatal(err)
	}
	var methods []protoreflect.MethodDescriptor
	for _, name := range services {
		d, err := files.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			t.Fatalf("service %s: %v", name, err)
		}
		ms := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range ms.Len() {
			methods = append(methods, ms.Get(i))
		}
	}
	return methods
}
