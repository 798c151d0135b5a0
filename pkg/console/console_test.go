package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// newClock returns the tests' clock, at noon UTC.
func newClock() *clocktest.Clock { return clocktest.New(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) }

const testRules = `domain: api
descriptors:
  - key: user_id
    rate_limit:
      requests_per_unit: 3
      unit: minute
  - key: plan
    value: trial
    shadow_mode: true
    rate_limit:
      requests_per_unit: 1
      unit: hour
`

// fixture is a service on the memory backend, observed by a console, on
// one fake clock.
type fixture struct {
	clock *clocktest.Clock
	cons  *Console
	svc   *service.Service
	h     http.Handler
}

func newFixture(t testing.TB, enableReset bool) *fixture {
	t.Helper()
	clk := newClock()
	rules, err := config.Parse(config.File{Name: "api.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := New(Options{Now: clk.Now, Replica: "test-replica", Version: "test",
		Source:  func() Source { return Source{Kind: "file", Path: "api.yaml"} },
		Backend: func() Backend { return Backend{Kind: "memory", Memory: &Memory{Keys: 1, MaxKeys: 10}} },
	})
	if err != nil {
		t.Fatal(err)
	}
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	svc, err := service.New(be, rules, service.Options{Now: clk.Now, Observer: cons, EnableReset: enableReset})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{clock: clk, cons: cons, svc: svc, h: cons.Handler(svc)}
}

func request(domain string, kv ...string) *rlsv3.RateLimitRequest {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{d}}
}

func (f *fixture) send(t testing.TB, n int, domain string, kv ...string) {
	t.Helper()
	for range n {
		if _, err := f.svc.ShouldRateLimit(context.Background(), request(domain, kv...)); err != nil {
			t.Fatal(err)
		}
	}
}

// get answers GET path with the fixture's handler.
func (f *fixture) get(t testing.TB, path string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	return w
}

// post answers POST path with body as JSON, from the page's origin.
func (f *fixture) post(t testing.TB, path, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func (f *fixture) state(t testing.TB) State {
	t.Helper()
	w := f.get(t, "/ui/api/state")
	if w.Code != http.StatusOK {
		t.Fatalf("GET /ui/api/state: %d %s", w.Code, w.Body)
	}
	var st State
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func trafficOf(st State, rule string) *RuleTraffic {
	for i := range st.Traffic.Rules {
		if st.Traffic.Rules[i].Rule == rule {
			return &st.Traffic.Rules[i]
		}
	}
	return nil
}

// TestStateCountsOutcomesAndRates sends decisions through a real service
// and checks the state's totals by outcome, and the rates from one read
// to a later one.
func TestStateCountsOutcomesAndRates(t *testing.T) {
	if st := newFixture(t, false).state(t); len(st.Traffic.Rules) != 0 || len(st.TopKeys.Keys) != 0 {
		t.Fatalf("before any traffic: %+v", st)
	}
	f := newFixture(t, false)

	// 3 per minute: ok, ok, near (3 of 3 used is past 0.8 × 3), then
	// refused twice.
	f.send(t, 5, "api", "user_id", "alice")
	// The shadow rule, 1 per hour: near, then over twice but admitted.
	f.send(t, 3, "api", "plan", "trial")
	f.send(t, 1, "other", "user_id", "x") // unknown domain: no rule decided

	st := f.state(t)
	if st.Replica != "test-replica" || st.Rules.Count != 2 || st.Rules.Domains != 1 || st.Rules.Source.Path != "api.yaml" || st.Backend.Kind != "memory" {
		t.Fatalf("state header: %+v", st)
	}
	alice := trafficOf(st, "api.user_id")
	if alice == nil || !alice.Loaded || alice.Domain != "api" {
		t.Fatalf("no traffic of api.user_id: %+v", st.Traffic)
	}
	if want := (Counts{OK: 2, Near: 1, Over: 2}); alice.Total != want {
		t.Errorf("api.user_id totals %+v, want %+v", alice.Total, want)
	}
	shadow := trafficOf(st, "api.plan_trial")
	if shadow == nil || shadow.Total != (Counts{Near: 1, Shadow: 2}) {
		t.Errorf("api.plan_trial: %+v, want 1 near and 2 shadow", shadow)
	}
	if st.Traffic.Rules[0].Rule != "api.user_id" {
		t.Errorf("the rule refusing most is not first: %+v", st.Traffic.Rules)
	}
	// The first read since traffic began has nothing to compare with.
	if alice.Rate != nil || st.Traffic.RateSeconds != 0 {
		t.Errorf("a rate from one read: %+v over %vs", alice.Rate, st.Traffic.RateSeconds)
	}
	if c := st.Backend.Calls; c.Total != 8 || c.Errors != 0 || c.P50Ms <= 0 || c.P99Ms < c.P50Ms || c.MaxMs < c.P99Ms {
		t.Errorf("backend calls %+v, want 8 with their latency", c)
	}

	// Two seconds and four refusals later: 2 refusals a second.
	f.clock.Advance(2 * time.Second)
	f.send(t, 4, "api", "user_id", "alice")
	st = f.state(t)
	alice = trafficOf(st, "api.user_id")
	if st.Traffic.RateSeconds != 2 || alice.Rate == nil || *alice.Rate != (Counts{Over: 2}) {
		t.Fatalf("after 2 s and 4 refusals: window %vs, rate %+v; want 2s and 2 over per second", st.Traffic.RateSeconds, alice.Rate)
	}
	if st.Backend.Calls.PerSecond != 2 {
		t.Errorf("backend calls per second %v, want 2", st.Backend.Calls.PerSecond)
	}

	// Past the rate window the old snapshots go: the rate covers at most
	// RateWindow.
	for range 15 {
		f.clock.Advance(time.Second)
		st = f.state(t)
	}
	if st.Traffic.RateSeconds > RateWindow.Seconds() {
		t.Errorf("rates over %vs, more than the %v window", st.Traffic.RateSeconds, RateWindow)
	}
	if r := trafficOf(st, "api.user_id").Rate; r == nil || *r != (Counts{}) {
		t.Errorf("rate after 15 idle seconds: %+v, want zero", r)
	}
}

// TestTopKeysLastMinute: refused descriptors appear with their count, the
// most refused first, and leave once the minute has passed.
func TestTopKeysLastMinute(t *testing.T) {
	f := newFixture(t, false)
	f.send(t, 3+7, "api", "user_id", "alice") // 7 refused
	f.send(t, 3+2, "api", "user_id", "bob")   // 2 refused
	f.send(t, 3, "api", "user_id", "carol")   // none refused
	f.send(t, 5, "api", "plan", "trial")      // shadow: over but admitted, not a refusal
	st := f.state(t)
	tk := st.TopKeys
	if tk.Refused != 9 || tk.WindowSeconds != 60 || tk.Counters != DefaultTopKeys || tk.MaxError != 0 {
		t.Fatalf("top keys: %+v", tk)
	}
	want := []TopKey{
		{Domain: "api", Rule: "api.user_id", Entries: []Entry{{"user_id", "alice"}}, Count: 7},
		{Domain: "api", Rule: "api.user_id", Entries: []Entry{{"user_id", "bob"}}, Count: 2},
	}
	if len(tk.Keys) != 2 || !equalKeys(tk.Keys, want) {
		t.Fatalf("top keys %+v, want %+v", tk.Keys, want)
	}
	f.clock.Advance(61 * time.Second)
	if tk := f.state(t).TopKeys; len(tk.Keys) != 0 || tk.Refused != 0 {
		t.Fatalf("a minute later: %+v, want none", tk)
	}
}

func equalKeys(a, b []TopKey) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// TestTopKeysBoundedAndWithinError floods the console with refusals of
// many distinct descriptors, a few of them heavy: the sketch keeps at
// most k counters per slot, the heavy ones come out on top, and each
// count is within the stated error of the truth.
func TestTopKeysBoundedAndWithinError(t *testing.T) {
	clk := newClock()
	cons, err := New(Options{Now: clk.Now, TopKeys: 32})
	if err != nil {
		t.Fatal(err)
	}
	rule := &config.Rule{Domain: "api", ID: "api.user_id"}
	desc := func(v string) *rlv3.RateLimitDescriptor {
		return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: v}}}
	}
	heavy := map[string]uint64{"heavy-a": 900, "heavy-b": 600, "heavy-c": 300}
	exact := map[string]uint64{}
	for i := range 6000 { // 10 s per 1000: every slot of the minute
		v := "user-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+(i/26)%26)) + string(rune('a'+(i/676)%26))
		if i%3 == 0 {
			for h, n := range heavy {
				if exact[h] < n {
					v = h
					break
				}
			}
		}
		exact[v]++
		cons.Decided("api", rule, desc(v), service.OutcomeOverLimit, 1)
		clk.Advance(10 * time.Millisecond)
	}
	tk := cons.topKeys(clk.Now().Add(-10 * time.Millisecond)) // at the last refusal: the whole minute
	var n uint64
	for _, c := range exact {
		n += c
	}
	if tk.Refused != n {
		t.Fatalf("refused %d, want %d", tk.Refused, n)
	}
	if tk.MaxError > n/uint64(tk.Counters) {
		t.Errorf("max error %d above N/k = %d", tk.MaxError, n/uint64(tk.Counters))
	}
	for i, h := range []string{"heavy-a", "heavy-b", "heavy-c"} {
		k := tk.Keys[i]
		if k.Entries[0].Value != h {
			t.Errorf("top %d is %q, want %s", i+1, k.Entries[0].Value, h)
		}
		if tc := exact[k.Entries[0].Value]; tc > k.Count || tc < k.Count-k.Err || k.Err > tk.MaxError {
			t.Errorf("%s: true %d outside [%d, %d] or error above %d", h, tc, k.Count-k.Err, k.Count, tk.MaxError)
		}
	}
	if items := cons.top.Top(clk.Now().Add(-10*time.Millisecond), 0).Items; len(items) > TopKeysSlots*32 {
		t.Errorf("%d items held, more than %d slots × 32 counters", len(items), TopKeysSlots)
	}
}

// TestKeyEncoding: a refused descriptor decodes to what was refused;
// entries whose bytes run together still decode apart; an oversized one
// is cut at maxKeyBytes and says so.
func TestKeyEncoding(t *testing.T) {
	entries := func(kv ...string) []*rlv3.RateLimitDescriptor_Entry {
		var out []*rlv3.RateLimitDescriptor_Entry
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	a := appendKey(nil, "d", "d.a", entries("a", "b_c"))
	b := appendKey(nil, "d", "d.a", entries("a_b", "c"))
	if string(a) == string(b) {
		t.Fatal("(a, b_c) and (a_b, c) encode alike")
	}
	k := decodeKey(string(a))
	if k.domain != "d" || k.rule != "d.a" || k.cut || len(k.entries) != 1 || k.entries[0] != (Entry{"a", "b_c"}) {
		t.Fatalf("decoded %+v", k)
	}

	long := strings.Repeat("v", 1000)
	buf := make([]byte, 0, maxKeyBytes)
	enc := appendKey(buf, "d", "d.a", entries("a", "1", "b", long, "c", "3"))
	if len(enc) > maxKeyBytes || cap(enc) != maxKeyBytes {
		t.Fatalf("encoding of %d bytes (capacity %d), over %d or grown", len(enc), cap(enc), maxKeyBytes)
	}
	k = decodeKey(string(enc))
	if !k.cut || len(k.entries) != 2 || k.entries[0] != (Entry{"a", "1"}) || k.entries[1].Key != "b" || !strings.HasPrefix(long, k.entries[1].Value) {
		t.Fatalf("cut encoding decoded to %+v", k)
	}
	if k := decodeKey("\x00\x05ab"); !k.cut {
		t.Fatalf("a malformed encoding decoded whole: %+v", k)
	}
}

// TestSecurityHeaders: every answer under /ui forbids scripts but the
// page's own, framing, sniffing and caching the API.
func TestSecurityHeaders(t *testing.T) {
	f := newFixture(t, false)
	for _, path := range []string{"/ui/", "/ui/console.js", "/ui/console.css", "/ui/api/state", "/ui/api/rules", "/ui/nope"} {
		w := f.get(t, path)
		h := w.Result().Header
		if h.Get("Content-Security-Policy") != ContentSecurityPolicy || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s: headers %v", path, h)
		}
		if strings.Contains(path, "/api/") && h.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s: Cache-Control %q, want no-store", path, h.Get("Cache-Control"))
		}
	}
	for path, want := range map[string]string{"/ui/": "text/html", "/ui/console.js": "text/javascript", "/ui/console.css": "text/css", "/ui/api/state": "application/json"} {
		w := f.get(t, path)
		if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("Content-Type"), want) {
			t.Errorf("GET %s: %d %s, want 200 %s", path, w.Code, w.Header().Get("Content-Type"), want)
		}
	}
	if w := f.get(t, "/ui/nope"); w.Code != http.StatusNotFound {
		t.Errorf("GET /ui/nope: %d", w.Code)
	}
	if w := f.get(t, "/ui"); w.Code != http.StatusMovedPermanently || w.Header().Get("Location") != "ui/" {
		t.Errorf("GET /ui: %d to %q, want a relative redirect to ui/", w.Code, w.Header().Get("Location"))
	}
	// The page revalidates by ETag.
	etag := f.get(t, "/ui/console.js").Header().Get("ETag")
	r := httptest.NewRequest(http.MethodGet, "/ui/console.js", nil)
	r.Header.Set("If-None-Match", etag)
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	if etag == "" || w.Code != http.StatusNotModified {
		t.Errorf("If-None-Match %s: %d, want 304", etag, w.Code)
	}
}

// TestStateEscapesMarkup: a descriptor value holding markup travels in the
// JSON escaped, so that no reading of the answer can take it for HTML.
func TestStateEscapesMarkup(t *testing.T) {
	f := newFixture(t, false)
	evil := `</script><script>alert(1)</script><img src=x onerror=alert(2)>`
	f.send(t, 4, "api", "user_id", evil)
	body := f.get(t, "/ui/api/state").Body.String()
	if strings.ContainsAny(body, "<>") {
		t.Fatalf("the state holds raw markup: %s", body)
	}
	st := f.state(t)
	if len(st.TopKeys.Keys) != 1 || st.TopKeys.Keys[0].Entries[0].Value != evil {
		t.Fatalf("the value does not come back intact: %+v", st.TopKeys.Keys)
	}
}

// TestPageSetsTextOnly checks the page's sources: the script never hands
// strings to the HTML parser or to eval, and the HTML carries no inline
// script, style or event handler (the CSP would refuse them).
func TestPageSetsTextOnly(t *testing.T) {
	js, err := uiFiles.ReadFile("ui/console.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "setAttribute('on", "srcdoc", "createContextualFragment", "DOMParser"} {
		if strings.Contains(string(js), sink) {
			t.Errorf("console.js uses %s: set text with textContent or text nodes", sink)
		}
	}
	html, err := uiFiles.ReadFile("ui/index.html")
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{`<script(?:\s[^>]*)?>\s*[^<\s]`, `\son[a-z]+\s*=`, `\sstyle\s*=`, `<style`} {
		if m := regexp.MustCompile(re).Find(html); m != nil {
			t.Errorf("index.html has inline code or style: %q", m)
		}
	}
}

// TestResetGated: POST /ui/api/reset clears a descriptor's counters only
// with -enable-reset, from the page's origin, with a JSON body.
func TestResetGated(t *testing.T) {
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user_id","value":"alice"}]}]}`

	off := newFixture(t, false)
	off.send(t, 4, "api", "user_id", "alice")
	if w := off.post(t, "/ui/api/reset", body); w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "-enable-reset") {
		t.Errorf("reset without -enable-reset: %d %s, want 403 naming the flag", w.Code, w.Body)
	}
	if st := off.state(t); st.ResetEnabled {
		t.Error("the state says reset is enabled")
	}

	on := newFixture(t, true)
	on.send(t, 4, "api", "user_id", "alice")
	if st := on.state(t); !st.ResetEnabled {
		t.Error("the state says reset is off")
	}
	for _, c := range []struct {
		name, body string
		hdr        []string
		code       int
	}{
		{"another site", body, []string{"Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}, http.StatusForbidden},
		{"a form", body, []string{"Content-Type", "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType},
		{"two descriptors", `{"domain":"api","descriptors":[{"entries":[{"key":"user_id","value":"a"}]},{"entries":[{"key":"user_id","value":"b"}]}]}`, nil, http.StatusBadRequest},
		{"no rule", `{"domain":"api","descriptors":[{"entries":[{"key":"nothing","value":"a"}]}]}`, nil, http.StatusNotFound},
		{"not JSON", `{`, nil, http.StatusBadRequest},
	} {
		if w := on.post(t, "/ui/api/reset", c.body, c.hdr...); w.Code != c.code {
			t.Errorf("reset from %s: %d %s, want %d", c.name, w.Code, w.Body, c.code)
		}
	}
	resp, err := on.svc.ShouldRateLimit(context.Background(), request("api", "user_id", "alice"))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("before the reset alice should be over: %v %v", resp, err)
	}
	w := on.post(t, "/ui/api/reset", body)
	if w.Code != http.StatusOK {
		t.Fatalf("reset: %d %s", w.Code, w.Body)
	}
	var out struct {
		Rule     string
		Counters uint32
	}
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Rule != "api.user_id" || out.Counters != 1 {
		t.Fatalf("reset answered %s (%v)", w.Body, err)
	}
	resp, err = on.svc.ShouldRateLimit(context.Background(), request("api", "user_id", "alice"))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("after the reset: %v %v, want OK with 2 remaining", resp, err)
	}
}

// TestPeek: POST /ui/api/peek answers what remains without counting.
func TestPeek(t *testing.T) {
	f := newFixture(t, false)
	f.send(t, 1, "api", "user_id", "alice")
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user_id","value":"alice"}]}]}`
	for range 3 { // peeks count nothing: the same answer each time
		w := f.post(t, "/ui/api/peek", body)
		var out struct {
			Allowed bool
			Results []struct {
				Outcome, Rule, Remaining, ResetAfter string
			}
		}
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || w.Code != http.StatusOK {
			t.Fatalf("peek: %d %s (%v)", w.Code, w.Body, err)
		}
		if r := out.Results[0]; !out.Allowed || r.Outcome != "OUTCOME_OK" || r.Rule != "api.user_id" || r.Remaining != "1" || r.ResetAfter == "" {
			t.Fatalf("peek answered %s; want OK with 1 remaining after the next", w.Body)
		}
	}
	if w := f.post(t, "/ui/api/peek", `{"domain":"","descriptors":[]}`); w.Code != http.StatusBadRequest {
		t.Errorf("peek of nothing: %d %s, want 400", w.Code, w.Body)
	}
	if got := trafficOf(f.state(t), "api.user_id").Total; got != (Counts{OK: 1}) {
		t.Errorf("peeks were counted as decisions: %+v", got)
	}
}

// TestRulesList: GET /ui/api/rules lists every rule with its place.
func TestRulesList(t *testing.T) {
	f := newFixture(t, false)
	var list RulesList
	if err := json.Unmarshal(f.get(t, "/ui/api/rules").Body.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Rules) != 2 || list.Hash != f.svc.Rules().Hash() || list.Source.Kind != "file" {
		t.Fatalf("rules list %+v", list)
	}
	r := list.Rules[0]
	if r.ID != "api.user_id" || r.File != "api.yaml" || r.Line != 3 || r.Limits[0].Text != "3 per minute" || r.Limits[0].Algorithm != "fixed_window" || r.Shadow {
		t.Errorf("first rule %+v", r)
	}
	if s := list.Rules[1]; !s.Shadow || s.Path[0] != (PathElem{Key: "plan", Value: "trial"}) {
		t.Errorf("second rule %+v", s)
	}
}

// TestDecidedDoesNotAllocate: the observer's hot path allocates nothing,
// for an admitted decision nor for a refusal of a descriptor the sketch
// already holds.
func TestDecidedDoesNotAllocate(t *testing.T) {
	cons, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	rule := &config.Rule{Domain: "api", ID: "api.user_id"}
	d := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "alice"}}}
	cons.Decided("api", rule, d, service.OutcomeOverLimit, 1)
	for _, o := range []service.Outcome{service.OutcomeOK, service.OutcomeOverLimit} {
		if n := testing.AllocsPerRun(1000, func() { cons.Decided("api", rule, d, o, 1) }); n != 0 {
			t.Errorf("Decided(%v) allocates %v times", o, n)
		}
	}
	if n := testing.AllocsPerRun(1000, func() { cons.BackendCall(time.Millisecond, nil) }); n != 0 {
		t.Errorf("BackendCall allocates %v times", n)
	}
}

// TestRulesReloadKeepStats: a reload brings new rule pointers; their
// decisions count under the same rule ID.
func TestRulesReloadKeepStats(t *testing.T) {
	f := newFixture(t, false)
	f.send(t, 2, "api", "user_id", "alice")
	for range 3 {
		rules, err := config.Parse(config.File{Name: "api.yaml", Data: []byte(testRules)})
		if err != nil {
			t.Fatal(err)
		}
		f.svc.SetRules(rules)
		f.send(t, 1, "api", "user_id", "bob")
	}
	if got := sum(trafficOf(f.state(t), "api.user_id").Total); got != 5 {
		t.Errorf("api.user_id counted %v decisions across reloads, want 5", got)
	}
}

// BenchmarkDecided measures the observer on the request path: an
// admitted decision (an atomic add), a refusal of one of a few hammering
// descriptors (held by the sketch), and a refusal of a descriptor new to
// the sketch each time (a flood of distinct keys: it takes the place of
// the smallest counter, copying its key).
func BenchmarkDecided(b *testing.B) {
	rule := &config.Rule{Domain: "api", ID: "api.user_id"}
	users := func(n int) []*rlv3.RateLimitDescriptor {
		out := make([]*rlv3.RateLimitDescriptor, n)
		for i := range out {
			out[i] = &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "user-" + strconv.Itoa(i)}}}
		}
		return out
	}
	few, many := users(16), users(1<<16)
	for _, bc := range []struct {
		name  string
		o     service.Outcome
		users []*rlv3.RateLimitDescriptor
	}{
		{"ok", service.OutcomeOK, few},
		{"refused-hammering", service.OutcomeOverLimit, few},
		{"refused-distinct", service.OutcomeOverLimit, many},
	} {
		cons, err := New(Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				cons.Decided("api", rule, bc.users[i%len(bc.users)], bc.o, 1)
			}
		})
		b.Run(bc.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1) << 20)
				for ; pb.Next(); i++ {
					cons.Decided("api", rule, bc.users[i%len(bc.users)], bc.o, 1)
				}
			})
		})
	}
}

// nopObserver observes nothing: the baseline of an observed service.
type nopObserver struct{}

func (nopObserver) Decided(string, *config.Rule, *rlv3.RateLimitDescriptor, service.Outcome, uint64) {
}
func (nopObserver) BackendCall(time.Duration, error)       {}
func (nopObserver) FailureMode(string, config.FailureMode) {}

// BenchmarkShouldRateLimit puts the console's cost beside a whole
// decision's: ShouldRateLimit on the memory backend, observed by an
// observer that does nothing, and by that one and the console (as
// serve tees the metrics and the console), admitted and refused.
func BenchmarkShouldRateLimit(b *testing.B) {
	rules, err := config.Parse(config.File{Name: "api.yaml", Data: []byte(`domain: api
descriptors:
  - key: user_id
    rate_limit:
      requests_per_unit: 1000000000
      unit: day
  - key: ip
    rate_limit:
      requests_per_unit: 0
      unit: day
`)})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{{"admitted", request("api", "user_id", "alice")}, {"refused", request("api", "ip", "192.0.2.1")}} {
		for _, withConsole := range []bool{false, true} {
			name := bc.name + "/without-console"
			var obs service.Observer = nopObserver{}
			if withConsole {
				name = bc.name + "/with-console"
				cons, err := New(Options{})
				if err != nil {
					b.Fatal(err)
				}
				obs = service.Tee(obs, cons)
			}
			be := memory.New(memory.Options{SweepInterval: -1})
			svc, err := service.New(be, rules, service.Options{Observer: obs})
			if err != nil {
				b.Fatal(err)
			}
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					if _, err := svc.ShouldRateLimit(ctx, bc.req); err != nil {
						b.Fatal(err)
					}
				}
			})
			be.Close()
		}
	}
}

// TestRulesTable: with Rules told of each rule set, decisions count under
// the rule's ID across reloads, are found in the table without caching
// the rules anywhere else, and the rules replaced can be freed.
func TestRulesTable(t *testing.T) {
	f := newFixture(t, false)
	parse := func() *config.Rules {
		rules, err := config.Parse(config.File{Name: "api.yaml", Data: []byte(testRules)})
		if err != nil {
			t.Fatal(err)
		}
		return rules
	}
	first := parse()
	f.svc.SetRules(first)
	f.cons.Rules(first)
	f.send(t, 2, "api", "user_id", "alice")
	var gone weak.Pointer[config.Rule]
	for _, r := range first.Domain("api").Rules() {
		if r.ID == "api.user_id" {
			gone = weak.Make(r)
		}
	}
	first = nil
	for range 3 {
		rules := parse()
		f.svc.SetRules(rules)
		f.cons.Rules(rules)
		f.send(t, 1, "api", "user_id", "bob")
	}
	if got := sum(trafficOf(f.state(t), "api.user_id").Total); got != 5 {
		t.Errorf("api.user_id counted %v decisions across reloads, want 5", got)
	}
	cached := 0
	f.cons.byRule.Range(func(any, any) bool { cached++; return true })
	if cached != 0 {
		t.Errorf("%d rule pointers cached besides the table", cached)
	}
	runtime.GC()
	if gone.Value() != nil {
		t.Error("a rule of a replaced set is still reachable")
	}
}
