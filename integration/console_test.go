package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// xssValue is a descriptor value an attacker could send: were the page
// to parse it as HTML, it would set window.__xss.
const xssValue = `<script>window.__xss=1</script><img src=x onerror="window.__xss=2">`

// browserTimeout bounds the whole browser test, each wait included.
const browserTimeout = 90 * time.Second

// chromiumPath returns the headless browser to drive: $CHROMIUM, else
// chromium (Debian's package) or Chrome from PATH. Without one the test
// is skipped loudly, except under CI=true, where it fails: CI installs
// Debian's chromium (.ci/run).
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	why := "no chromium in PATH (Debian: apt-get install -y chromium; or set CHROMIUM to a Chrome binary)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("the ops console's browser test needs a headless Chromium under CI=true: %s", why)
	}
	t.Skipf("SKIPPING: the ops console's browser test needs a headless Chromium: %s", why)
	return ""
}

// newBrowser starts a headless Chromium with a fresh profile and returns a
// tab's context, bounded by browserTimeout. Exceptions thrown by the
// page's scripts are collected in the returned func's answer.
func newBrowser(t *testing.T) (context.Context, func() []string) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	t.Cleanup(cancel)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		bcancel()
		chromedp.Cancel(bctx) // closes the browser and waits for it
	})
	var mu sync.Mutex
	var thrown []string
	if err := chromedp.Listen(bctx, func(ev any) {
		if ex, ok := ev.(*runtime.EventExceptionThrown); ok {
			mu.Lock()
			d := ex.ExceptionDetails
			msg := fmt.Sprintf("%s (%s:%d:%d)", d.Text, d.URL, d.LineNumber+1, d.ColumnNumber+1)
			if d.Exception != nil && d.Exception.Description != "" {
				msg += ": " + d.Exception.Description
			}
			thrown = append(thrown, msg)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return bctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), thrown...)
	}
}

// waitFor evaluates the JavaScript expression in the page every 100 ms
// until it is true, or fails after timeout. (chromedp's Poll builds its
// predicate with new Function, which the console's Content-Security-Policy
// forbids, as it should.)
func waitFor(t *testing.T, ctx context.Context, what, expr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return
		}
		last = err
		if time.Now().After(deadline) || ctx.Err() != nil {
			dump, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('main') ? document.querySelector('main').innerText.slice(0, 3000) : ''`))
			t.Fatalf("%s: not within %v (last error: %v); the page shows:\n%s", what, timeout, last, dump)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// eval evaluates expr in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// descriptorReq is a request of one descriptor of entries (key, value, …).
func descriptorReq(domain string, kv ...string) *rlsv3.RateLimitRequest {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{d}}
}

// TestConsoleInBrowser drives the ops console in a real headless Chromium
// against the real binary serving the example rules, with traffic sent
// over gRPC meanwhile: the rule list renders (and filters), live counters
// move after traffic, a refused key appears among the top limited keys,
// the explain form names the rule that decides a descriptor, a descriptor
// value holding <script> is shown as text and runs nothing, and a reset
// asked from the page clears the counter after its confirmation. With
// UPDATE_SCREENSHOT=1 it writes the page, as the test leaves it, to
// docs/console.png.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	ctx, thrown := newBrowser(t)
	srv := startServer(t, "-ui", "-enable-reset")
	base := "http://" + srv.httpAddr + "/ui/"

	// The rules as the console's API lists them, to compare the page with.
	var list struct {
		Rules []struct {
			ID, File string
			Line     int
		}
	}
	resp, err := http.Get(base + "api/rules")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var userRule string // file:line of api.user_id
	for _, r := range list.Rules {
		if r.ID == "api.user_id" {
			userRule = fmt.Sprintf("%s:%d", r.File, r.Line)
			checkRuleLine(t, r.File, r.Line, "key: user_id")
		}
	}
	if userRule == "" || len(list.Rules) < 10 {
		t.Fatalf("GET /ui/api/rules lists %d rules, without api.user_id: %+v", len(list.Rules), list.Rules)
	}

	start := time.Now()
	if err := chromedp.Do(ctx, chromedp.Navigate(base)); err != nil {
		t.Fatal(err)
	}

	// The rule list renders: one row per rule, each with its file:line.
	waitFor(t, ctx, "the rule list renders", `document.querySelectorAll('#rules tbody tr').length === `+fmt.Sprint(len(list.Rules)), 20*time.Second)
	if got := eval[string](t, ctx, `document.querySelector('#rules tr[data-rule="api.user_id"]').innerText`); !strings.Contains(got, userRule) || !strings.Contains(got, "10 per second") {
		t.Errorf("the row of api.user_id reads %q; want its source %s and its limit", got, userRule)
	}
	// The filter box narrows the list.
	if err := chromedp.Do(ctx, chromedp.SendKeys(`#rules-filter`, "token_bucket")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the filter keeps the token_bucket rule only",
		`[...document.querySelectorAll('#rules tbody tr')].filter(r => !r.hidden).map(r => r.dataset.rule).join() === 'algorithms.upload_user'`, 5*time.Second)
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`const f = document.querySelector('#rules-filter'); f.value = ''; f.dispatchEvent(new Event('input'))`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "clearing the filter shows every rule",
		`[...document.querySelectorAll('#rules tbody tr')].every(r => !r.hidden)`, 5*time.Second)

	// No traffic yet: no counters.
	if n := eval[int](t, ctx, `document.querySelectorAll('#traffic tbody tr').length`); n != 0 {
		t.Fatalf("%d traffic rows before any traffic", n)
	}

	// Traffic: alice at 20 per second against 10 per second (half
	// refused), bob well within, the attacker's value over its limit too,
	// logins past 5 per minute, and a few other domains.
	rls := rlsv3.NewRateLimitServiceClient(srv.dial(t))
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	var trafficErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			reqs := []*rlsv3.RateLimitRequest{
				descriptorReq("api", "user_id", "alice"), descriptorReq("api", "user_id", "alice"),
				descriptorReq("api", "user_id", xssValue), descriptorReq("api", "user_id", xssValue),
				descriptorReq("algorithms", "search_user", "carol"),
			}
			if i%3 == 0 {
				reqs = append(reqs, descriptorReq("api", "user_id", "bob"), basicAuth(),
					descriptorReq("accounts", "remote_address", "203.0.113.7"),
					descriptorReq("messaging", "message_type", "marketing", "to_number", "2061111111"))
			}
			for _, req := range reqs {
				if _, err := rls.ShouldRateLimit(trafficCtx, req); err != nil {
					if trafficCtx.Err() == nil {
						trafficErr = err
					}
					return
				}
			}
			select {
			case <-trafficCtx.Done():
				return
			case <-tick.C:
			}
		}
	})

	// Live counters move: api.user_id's decisions grow from one update to
	// a later one, with refusals per second.
	waitFor(t, ctx, "api.user_id's counters appear", `!!document.querySelector('#traffic tr[data-rule="api.user_id"] td.total')`, 10*time.Second)
	total := func() int {
		return eval[int](t, ctx, `Number(document.querySelector('#traffic tr[data-rule="api.user_id"] td.total').textContent.replace(/,/g, ''))`)
	}
	first := total()
	waitFor(t, ctx, "api.user_id's decisions grow", fmt.Sprintf(`Number(document.querySelector('#traffic tr[data-rule="api.user_id"] td.total').textContent.replace(/,/g, '')) > %d`, first), 10*time.Second)
	waitFor(t, ctx, "api.user_id refuses per second", `Number(document.querySelector('#traffic tr[data-rule="api.user_id"] td.over').textContent) > 0`, 10*time.Second)

	// The refused keys appear in the top list: alice, and the attacker's
	// value as text.
	topHas := func(v string) string {
		return `[...document.querySelectorAll('#top tbody .entry .value')].some(e => e.textContent === ` + jsString(v) + `)`
	}
	waitFor(t, ctx, "alice is among the top limited keys", topHas("alice"), 10*time.Second)
	waitFor(t, ctx, "the <script> value is among the top limited keys, as text", topHas(xssValue), 10*time.Second)

	// The explain form names the rule: typed in by hand.
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(`#explain-domain`, "api"),
		chromedp.SendKeys(`#descriptors input.key`, "user_id"),
		chromedp.SendKeys(`#descriptors input.value`, "bob"),
		chromedp.Click(`#explain-submit`),
	); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "explain answers", `!!document.querySelector('#explain-out .result .rule-id')`, 10*time.Second)
	if id := eval[string](t, ctx, `document.querySelector('#explain-out .rule-id').textContent`); id != "api.user_id" {
		t.Errorf("explain of (user_id, bob) names rule %q, want api.user_id", id)
	}
	if at := eval[string](t, ctx, `document.querySelector('#explain-out .rule-file').textContent`); at != userRule {
		t.Errorf("explain places the rule at %q, want %s", at, userRule)
	}
	waitFor(t, ctx, "explain shows what remains and when it resets",
		`!!document.querySelector('#explain-out .remaining') && /^\d+(\.\d+)?s$/.test(document.querySelector('#explain-out .reset-after').title)`, 5*time.Second)
	// bob sends about 3 a second against 10 a second.
	if left := eval[int](t, ctx, `Number(document.querySelector('#explain-out .remaining').textContent)`); left < 1 || left > 10 {
		t.Errorf("explain says bob has %d remaining of 10 per second, sending about 3", left)
	}
	if why := eval[string](t, ctx, `document.querySelector('#explain-out .why').innerText`); !strings.Contains(why, "api.user_id") {
		t.Errorf("explain's why does not name the rule: %q", why)
	}

	// The attacker's value, explained from the top list: text everywhere,
	// no script ran, no element came from it.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll('#top tbody tr')].find(tr =>
		[...tr.querySelectorAll('.entry .value')].some(e => e.textContent === `+jsString(xssValue)+`)).querySelector('button.explain').click()`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the <script> value is explained, as text",
		`[...document.querySelectorAll('#explain-out .entry .value')].some(e => e.textContent === `+jsString(xssValue)+`)`, 10*time.Second)
	if v := eval[string](t, ctx, `document.querySelector('#explain-out .rule-id').textContent`); v != "api.user_id" {
		t.Errorf("explain of the <script> value names rule %q, want api.user_id", v)
	}
	if ran := eval[string](t, ctx, `String(window.__xss)`); ran != "undefined" {
		t.Fatalf("a descriptor value ran as script: window.__xss = %s", ran)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('script').length`); n != 1 {
		t.Errorf("%d script elements in the page, want only console.js", n)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('img').length`); n != 0 {
		t.Errorf("%d img elements in the page: markup of a descriptor value was parsed", n)
	}

	// Explain alice, over her limit: the next request is refused.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll('#top tbody tr')].find(tr =>
		[...tr.querySelectorAll('.entry .value')].some(e => e.textContent === 'alice')).querySelector('button.explain').click()`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "alice is explained", `[...document.querySelectorAll('#explain-out .entry .value')].some(e => e.textContent === 'alice') && !!document.querySelector('#explain-out .remaining')`, 10*time.Second)

	// Let the counters show a few seconds of rates, then picture the page.
	waitFor(t, ctx, "the rates span a few seconds", `/over the last ([3-9]|\d\d) s/.test(document.querySelector('#traffic-window').textContent)`, 15*time.Second)
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(shot))
	if err != nil || cfg.Width < 1000 || cfg.Height < 600 {
		t.Fatalf("the screenshot is not a page-sized PNG: %v, %dx%d", err, cfg.Width, cfg.Height)
	}
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		out := filepath.Join("..", "docs", "console.png")
		if err := os.WriteFile(out, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%dx%d, %d bytes)", out, cfg.Width, cfg.Height, len(shot))
	}

	// Reset alice from the page: a confirmation first, then her counters
	// are cleared. Her traffic stops first, so that nothing counts again.
	stopTraffic()
	wg.Wait()
	if trafficErr != nil {
		t.Fatalf("traffic: %v", trafficErr)
	}
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`document.querySelector('#explain-out button.reset').click()`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the reset asks for confirmation", `document.querySelector('#confirm').open && document.querySelector('#confirm-text').textContent.includes('api.user_id')`, 5*time.Second)
	if err := chromedp.Do(ctx, chromedp.Click(`#confirm-yes`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the reset is reported", `!document.querySelector('#notice').hidden && document.querySelector('#notice').textContent.includes('Reset 2 counter(s) of rule api.user_id')`, 10*time.Second)
	got, err := rls.ShouldRateLimit(context.Background(), descriptorReq("api", "user_id", "alice"))
	if err != nil {
		t.Fatal(err)
	}
	if st := got.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 9 {
		t.Errorf("after the reset, alice's next request: %v with %d remaining; want OK with 9", st.Code, st.LimitRemaining)
	}

	if ex := thrown(); len(ex) > 0 {
		t.Errorf("the page threw: %s", strings.Join(ex, "\n"))
	}
	t.Logf("browser checks took %v", time.Since(start).Round(time.Millisecond))
}

// checkRuleLine checks that line of file (relative to the repository's
// root, as the server was given ../examples) holds want.
func checkRuleLine(t *testing.T, file string, line int, want string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		if n == line {
			if !strings.Contains(sc.Text(), want) {
				t.Errorf("%s:%d reads %q, not %q", file, line, sc.Text(), want)
			}
			return
		}
	}
	t.Errorf("%s has no line %d", file, line)
}

// TestConsoleOff: without -ui there is no /ui, and the other endpoints are
// served as before.
func TestConsoleOff(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	for path, want := range map[string]int{"/ui": 404, "/ui/": 404, "/ui/api/state": 404, "/healthcheck": 200} {
		resp, err := http.Get("http://" + srv.httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s without -ui: %d, want %d", path, resp.StatusCode, want)
		}
	}
}
