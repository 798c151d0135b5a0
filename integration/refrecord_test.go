package integration

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/refproc"
)

// The recorder of the reference fixtures (testdata/reference/*.json, see
// refFixture): with a binary of envoyproxy/ratelimit built from source,
//
//	ANCHOR_BIN=/path/to/ratelimit go test ./integration -run TestReferenceFixtures -record
//
// runs the reference once per fixture, on loopback with a redis-server of
// its own (internal/redistest), the fixture's environment and rule files,
// sends the fixture's requests in order and rewrites the fixture with the
// reference's answers, its commit and commit date (read from the binary's
// build information: build it in a git checkout with -buildvcs=true, or
// set ANCHOR_COMMIT and ANCHOR_COMMITTED) and the date of the run. A
// fixture whose answers come out the same at the same commit, but for
// the figures that depend on the instant (see sameRecording), is kept as
// it was; each answer that changed is logged. The scenarios (description,
// env, rules, requests) are the fixture's own: to add one, write a
// fixture with its steps' requests and record it.

var record = flag.Bool("record", false, "re-record testdata/reference/*.json from the envoyproxy/ratelimit binary at $ANCHOR_BIN")

// referenceModule is the module path of the reference's binaries.
const referenceModule = "github.com/envoyproxy/ratelimit"

// recordedHow is the "how" of a fixture's reference header.
const recordedHow = "built from source outside the repository; recorded by go test ./integration -run TestReferenceFixtures -record with ANCHOR_BIN, run on loopback with its own redis-server and the env and rules below"

// TestReferenceFixtures: without -record, each fixture names the
// reference's commit and the date of its run, and is written as the
// recorder writes it, so that a re-recording changes only what the
// reference answers differently. With -record (and ANCHOR_BIN), it
// re-records them.
//
// Shown failing against broken builds: formatFixture indenting by a tab
// (every fixture "not as the recorder writes it"); a fixture's commit
// removed by hand.
func TestReferenceFixtures(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("testdata", "reference", "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixture in testdata/reference: %v", err)
	}
	if *record {
		bin := os.Getenv("ANCHOR_BIN")
		if bin == "" {
			t.Fatal("-record needs ANCHOR_BIN, the path of an envoyproxy/ratelimit binary built from source")
		}
		header := anchorHeader(t, bin)
		for _, path := range paths {
			t.Run(filepath.Base(path), func(t *testing.T) { recordFixture(t, bin, header, path) })
		}
		return
	}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f := loadFixture(t, filepath.Base(path))
		if f.Reference["repository"] != "envoyproxy/ratelimit" || len(f.Reference["commit"]) != 40 {
			t.Errorf("%s: reference %v names no envoyproxy/ratelimit commit", path, f.Reference)
		}
		if _, err := time.Parse(time.RFC3339, f.Reference["recorded"]); err != nil {
			t.Errorf("%s: recorded: %v", path, err)
		}
		if !bytes.Equal(formatFixture(t, f), data) {
			t.Errorf("%s is not as the recorder writes it (formatFixture): re-indent it so that a re-recording shows only what changed", path)
		}
	}
}

// formatFixture writes f as the recorder does: JSON indented by two
// spaces, keys of maps and of the requests and answers in sorted order,
// characters unescaped.
func formatFixture(t *testing.T, f refFixture) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// anchorHeader returns the reference header of fixtures recorded from
// the binary at bin: its commit and commit date from its build
// information, or from ANCHOR_COMMIT and ANCHOR_COMMITTED.
func anchorHeader(t *testing.T, bin string) map[string]string {
	t.Helper()
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatalf("ANCHOR_BIN %s: %v", bin, err)
	}
	if info.Main.Path != referenceModule {
		t.Fatalf("ANCHOR_BIN %s is a build of %q, not of %s", bin, info.Main.Path, referenceModule)
	}
	vcs := map[string]string{}
	for _, s := range info.Settings {
		vcs[s.Key] = s.Value
	}
	if vcs["vcs.modified"] == "true" {
		t.Fatalf("ANCHOR_BIN %s was built from a modified checkout of %s", bin, vcs["vcs.revision"])
	}
	commit := cmpOr(os.Getenv("ANCHOR_COMMIT"), vcs["vcs.revision"])
	committed := cmpOr(os.Getenv("ANCHOR_COMMITTED"), vcs["vcs.time"])
	if len(commit) != 40 || committed == "" {
		t.Fatalf("ANCHOR_BIN %s names no commit and commit date: build it in a git checkout with go build -buildvcs=true, or set ANCHOR_COMMIT and ANCHOR_COMMITTED", bin)
	}
	c, err := time.Parse(time.RFC3339, committed)
	if err != nil {
		t.Fatalf("commit date: %v", err)
	}
	return map[string]string{
		"repository": "envoyproxy/ratelimit",
		"commit":     commit,
		"committed":  c.UTC().Format(time.RFC3339),
		"how":        recordedHow,
	}
}

// cmpOr returns a, or b when a is empty.
func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// recordFixture runs the reference at bin through the fixture at path
// and rewrites it with the answers, unless they are the same.
func recordFixture(t *testing.T, bin string, header map[string]string, path string) {
	old := loadFixture(t, filepath.Base(path))
	f := old
	f.Steps = append([]refStep(nil), old.Steps...)
	f.Reference = map[string]string{"recorded": time.Now().UTC().Format(time.RFC3339)}
	for k, v := range header {
		f.Reference[k] = v
	}
	runReference(t, bin, f, func(i int, resp *rlsv3.RateLimitResponse, err error) {
		st := &f.Steps[i]
		st.Response, st.Error = nil, nil
		if err != nil {
			s := status.Convert(err)
			st.Error = &refError{Code: s.Code().String(), Message: s.Message()}
			return
		}
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		st.Response = sortedJSON(t, b)
	})
	changed := false
	for i := range f.Steps {
		if !sameRecording(t, old.Steps[i], f.Steps[i]) {
			changed = true
			t.Logf("step %d (%s): the reference's answer changed\n was %s\n now %s", i, f.Steps[i].Note, stepAnswer(old.Steps[i]), stepAnswer(f.Steps[i]))
		}
	}
	if !changed && old.Reference["commit"] == f.Reference["commit"] {
		t.Logf("%s: the same answers from the same commit %s: kept as it was", path, f.Reference["commit"])
		return
	}
	if err := os.WriteFile(path, formatFixture(t, f), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: rewritten from envoyproxy/ratelimit %s", path, f.Reference["commit"])
}

// stepAnswer prints a step's answer for the log.
func stepAnswer(st refStep) string {
	if st.Error != nil {
		return fmt.Sprintf("error %s %q", st.Error.Code, st.Error.Message)
	}
	var b bytes.Buffer
	if json.Compact(&b, st.Response) != nil {
		return string(st.Response)
	}
	return b.String()
}

// sortedJSON returns the JSON b with the keys of its objects sorted and
// its numbers as written.
func sortedJSON(t *testing.T, b []byte) json.RawMessage {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sameRecording reports whether two recordings of a step are the same
// answer: the same error, or the same response but for the figures that
// depend on the instant of the run (duration_until_reset, the value of a
// header whose name ends in "reset") and the spacing of protobuf's text
// form, which varies from build to build (a limit override in dynamic
// metadata).
func sameRecording(t *testing.T, a, b refStep) bool {
	t.Helper()
	if (a.Error == nil) != (b.Error == nil) || a.Error != nil && *a.Error != *b.Error {
		return false
	}
	if a.Error != nil || a.Response == nil && b.Response == nil { // an error, or an action
		return true
	}
	if a.Response == nil || b.Response == nil {
		return false
	}
	return reflect.DeepEqual(timeless(t, a.Response), timeless(t, b.Response))
}

// timeless returns a recorded response as JSON values without what
// sameRecording leaves out.
func timeless(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var walk func(key string, v any) any
	walk = func(key string, v any) any {
		switch v := v.(type) {
		case map[string]any:
			delete(v, "duration_until_reset")
			if k, ok := v["key"].(string); ok && key == "response_headers_to_add" && strings.HasSuffix(strings.ToLower(k), "reset") {
				v["value"] = "<seconds until the window ends>"
			}
			for k, e := range v {
				v[k] = walk(k, e)
			}
		case []any:
			for i, e := range v {
				v[i] = walk(key, e)
			}
		case string:
			if key == "limit" {
				return strings.Join(strings.Fields(v), " ")
			}
		}
		return v
	}
	return walk("", v)
}

// runReference starts the reference at bin on free loopback ports with
// f's environment and rules and a Redis of its own, sends f's requests in
// order (killing the Redis at a "kill-redis" step), and calls answer with
// each request's step and the reference's answer.
func runReference(t *testing.T, bin string, f refFixture, answer func(i int, resp *rlsv3.RateLimitResponse, err error)) {
	t.Helper()
	redis := redistest.StartNode(t)
	var extra []string
	for _, k := range sortedKeys(f.Env) {
		extra = append(extra, k+"="+f.Env[k])
	}
	rls := startReference(t, bin, runtimeRoot(t, f.Rules), redis.Addr, extra...)
	replaySteps(t, rls, redis, f.Steps, answer)
}

// runtimeRoot is a RUNTIME_ROOT holding rules, file name to contents, in
// RUNTIME_SUBDIRECTORY ratelimit, as both servers read them.
func runtimeRoot(t *testing.T, rules map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := refproc.ConfigDir(root)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range rules {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// startReference starts the envoyproxy/ratelimit binary bin on free
// loopback ports, serving the rules of root from the Redis at redisAddr
// with the extra settings, waits until it is healthy, and returns a
// client of its gRPC port. The process is stopped, and its log shown if
// the test failed, at the test's end.
func startReference(t *testing.T, bin, root, redisAddr string, extra ...string) rlsv3.RateLimitServiceClient {
	t.Helper()
	httpPort, grpcPort, debugPort := freePort(t), freePort(t), freePort(t)
	var logs bytes.Buffer
	cmd := exec.Command(bin)
	cmd.Env = refproc.Env(refproc.Settings{
		Root: root, Redis: redisAddr, HTTPPort: atoi(t, httpPort), GRPCPort: atoi(t, grpcPort), Debug: atoi(t, debugPort),
		LogLevel: "info", Extra: append([]string{"LOG_FORMAT=json"}, extra...),
	})
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("the reference's log:\n%s", logs.String())
		}
	})
	waitHealthy(t, "http://127.0.0.1:"+httpPort+"/healthcheck", exited, func() error { return waitErr })
	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// replaySteps sends the requests of steps in order to rls within one
// minute, as the reference's recordings were made, kills redis at a
// "kill-redis" step, and calls answer with each request's step and answer.
func replaySteps(t *testing.T, rls rlsv3.RateLimitServiceClient, redis *redistest.Node, steps []refStep, answer func(i int, resp *rlsv3.RateLimitResponse, err error)) {
	t.Helper()
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 10*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	for i, st := range steps {
		switch st.Action {
		case "kill-redis":
			redis.Kill(t)
			continue
		case "":
		default:
			t.Fatalf("step %d: unknown action %q", i, st.Action)
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(st.Request, &req); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		resp, err := rls.ShouldRateLimit(ctx, &req)
		cancel()
		answer(i, resp, err)
	}
}

// waitHealthy waits until url answers 200, as the reference's
// /healthcheck does once it has loaded its rules and listens.
func waitHealthy(t *testing.T, url string, exited <-chan struct{}, waitErr func() error) {
	t.Helper()
	for deadline := time.Now().Add(startupTimeout); ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("the reference exited: %v", waitErr())
		default:
		}
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 within %v", url, startupTimeout)
		}
	}
}

// freePort returns a loopback port free now.
// atoi reads a port freePort returned.
func atoi(t *testing.T, port string) int {
	t.Helper()
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestReferenceRecordingsCompare: the recorder keeps a fixture whose new
// answers differ only in what depends on the instant of the run, and
// rewrites one whose answers differ in anything else.
//
// Shown failing against broken builds: timeless keeping
// duration_until_reset (a fixture rewritten at every run); timeless
// returning nil (a changed answer kept).
func TestReferenceRecordingsCompare(t *testing.T) {
	step := func(resp string) refStep { return refStep{Response: json.RawMessage(resp)} }
	was := step(`{"overall_code":"OK","statuses":[{"code":"OK","current_limit":{"requests_per_unit":2,"unit":"MINUTE"},"duration_until_reset":"20s","limit_remaining":1}],` +
		`"response_headers_to_add":[{"key":"X-Custom-Reset","value":"20"},{"key":"X-Custom-Limit","value":"2"}],` +
		`"dynamic_metadata":{"descriptors":[{"limit":"requests_per_unit:5  unit:HOUR"}]}}`)
	for _, c := range []struct {
		now  refStep
		same bool
	}{
		{step(`{"overall_code":"OK","statuses":[{"code":"OK","current_limit":{"requests_per_unit":2,"unit":"MINUTE"},"duration_until_reset":"48s","limit_remaining":1}],` +
			`"response_headers_to_add":[{"key":"X-Custom-Reset","value":"48"},{"key":"X-Custom-Limit","value":"2"}],` +
			`"dynamic_metadata":{"descriptors":[{"limit":"requests_per_unit:5 unit:HOUR"}]}}`), true},
		{step(`{"overall_code":"OK","statuses":[{"code":"OK","current_limit":{"requests_per_unit":2,"unit":"MINUTE"},"duration_until_reset":"20s","limit_remaining":0}],` +
			`"response_headers_to_add":[{"key":"X-Custom-Reset","value":"20"},{"key":"X-Custom-Limit","value":"2"}],` +
			`"dynamic_metadata":{"descriptors":[{"limit":"requests_per_unit:5  unit:HOUR"}]}}`), false},
		{step(`{"overall_code":"OK","statuses":[{"code":"OK","current_limit":{"requests_per_unit":2,"unit":"MINUTE"},"duration_until_reset":"20s","limit_remaining":1}],` +
			`"response_headers_to_add":[{"key":"X-Custom-Reset","value":"20"},{"key":"X-Custom-Limit","value":"3"}],` +
			`"dynamic_metadata":{"descriptors":[{"limit":"requests_per_unit:5  unit:HOUR"}]}}`), false},
		{refStep{Error: &refError{Code: "Unknown", Message: "response returned from Conn: EOF"}}, false},
	} {
		if got := sameRecording(t, was, c.now); got != c.same {
			t.Errorf("the same answer: %v, want %v\n was %s\n now %s", got, c.same, stepAnswer(was), stepAnswer(c.now))
		}
	}
	e := refStep{Error: &refError{Code: "Unknown", Message: "EOF"}}
	if !sameRecording(t, e, e) || sameRecording(t, e, refStep{Error: &refError{Code: "Unavailable", Message: "EOF"}}) {
		t.Error("errors compared by more or less than their code and message")
	}
}
