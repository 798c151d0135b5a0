package service

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

func (f *fixture) http(t *testing.T, method, path, body string) (int, http.Header, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	f.svc.HTTPHandler().ServeHTTP(rec, req)
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}

func TestJSONEndpoint(t *testing.T) {
	f := newFixture(t, testRules)
	body := `{"domain": "messaging", "descriptors": [{"entries": [{"key": "sender", "value": "x"}]}, {"entries": [{"key": "to_number", "value": "1"}]}], "hitsAddend": 2}`

	code, hdr, got := f.http(t, "POST", "/json", body)
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("first call: %d %s %s", code, hdr.Get("Content-Type"), got)
	}
	var resp struct {
		OverallCode string `json:"overallCode"`
		Statuses    []struct {
			Code           string `json:"code"`
			LimitRemaining uint32 `json:"limitRemaining"`
			CurrentLimit   struct {
				RequestsPerUnit uint32 `json:"requestsPerUnit"`
				Unit            string `json:"unit"`
			} `json:"currentLimit"`
			DurationUntilReset string `json:"durationUntilReset"`
		} `json:"statuses"`
	}
	if err := json.Unmarshal([]byte(got), &resp); err != nil {
		t.Fatalf("response is not JSON: %v\n%s", err, got)
	}
	if resp.OverallCode != "OK" || len(resp.Statuses) != 2 || resp.Statuses[1].LimitRemaining != 98 ||
		resp.Statuses[1].CurrentLimit.Unit != "DAY" || resp.Statuses[1].CurrentLimit.RequestsPerUnit != 100 ||
		resp.Statuses[1].DurationUntilReset != "6360s" {
		t.Fatalf("first call: %s", got)
	}

	// The shadow descriptor (2 per minute) is now full; the requests are
	// still OK. A limit of 100 per day admits 50 calls of 2 hits.
	for range 49 {
		f.http(t, "POST", "/json", body)
	}
	code, _, got = f.http(t, "POST", "/json", body)
	if code != http.StatusTooManyRequests || json.Unmarshal([]byte(got), &resp) != nil || resp.OverallCode != "OVER_LIMIT" {
		t.Fatalf("51st call: %d %s", code, got)
	}
	if !strings.HasPrefix(got, `{"overallCode":"OVER_LIMIT","statuses":[{"code":"OK","currentLimit":`) {
		t.Errorf("the JSON is not compact: %s", got)
	}
}

func TestJSONEndpointErrors(t *testing.T) {
	f := newFixture(t, testRules)
	for _, c := range []struct {
		name, method, body string
		code               int
		msg                string
	}{
		{"malformed JSON", "POST", `{"domain": `, http.StatusBadRequest, "the body is not a RateLimitRequest in JSON"},
		{"unknown field", "POST", `{"domian": "x"}`, http.StatusBadRequest, `unknown field "domian"`},
		// JSON is UTF-8 text: a value of other bytes cannot be sent here,
		// only over gRPC, where it is decided.
		{"value not UTF-8", "POST", "{\"domain\": \"messaging\", \"descriptors\": [{\"entries\": [{\"key\": \"burst\", \"value\": \"\xff\"}]}]}", http.StatusBadRequest, "invalid UTF-8"},
		{"invalid argument", "POST", `{"domain": "messaging"}`, http.StatusBadRequest, "descriptors: none given"},
		{"too large", "POST", `{"domain": "` + strings.Repeat("x", MaxJSONBody) + `"}`, http.StatusRequestEntityTooLarge, "larger than 4194304 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, hdr, got := f.http(t, c.method, "/json", c.body)
			var e struct{ Error string }
			if code != c.code || hdr.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(got), &e) != nil || !strings.Contains(e.Error, c.msg) {
				t.Fatalf("got %d %s %q; want %d with a JSON error containing %q", code, hdr.Get("Content-Type"), got, c.code, c.msg)
			}
		})
	}
	if code, hdr, _ := f.http(t, "GET", "/json", ""); code != http.StatusMethodNotAllowed || !strings.Contains(hdr.Get("Allow"), "POST") {
		t.Fatalf("GET /json: %d, Allow %q", code, hdr.Get("Allow"))
	}

	f = newFixtureOpts(t, testRules, failingBackend{}, new(clocktest.Clock), Options{FailureMode: config.FailError})
	code, _, got := f.http(t, "POST", "/json", `{"domain": "messaging", "descriptors": [{"entries": [{"key": "to_number", "value": "1"}]}]}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(got, errBackendUnavailable) || strings.Contains(got, "connection refused") {
		t.Fatalf("failing backend: %d %s", code, got)
	}
}

func TestHealthcheckEndpoint(t *testing.T) {
	f := newFixture(t, testRules)
	if code, _, body := f.http(t, "GET", "/healthcheck", ""); code != http.StatusOK || body != "OK\n" {
		t.Fatalf("serving: %d %q", code, body)
	}
	f.svc.Drain()
	if code, _, body := f.http(t, "GET", "/healthcheck", ""); code != http.StatusServiceUnavailable || body != "draining\n" {
		t.Fatalf("draining: %d %q", code, body)
	}
}

func TestRLConfigEndpoint(t *testing.T) {
	f := newFixture(t, testRules)
	code, _, body := f.http(t, "GET", "/rlconfig", "")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	for _, want := range []string{
		"# rules " + f.svc.Rules().Hash() + " from rules.yaml\n",
		"messaging.message_type_marketing.to_number: unit=DAY requests_per_unit=5, shadow_mode: false, algorithm: fixed_window, name: marketing (rules.yaml:7)\n",
		"messaging.sender: unit=MINUTE requests_per_unit=2, shadow_mode: true, algorithm: fixed_window (rules.yaml:11)\n",
		"messaging.internal: unlimited, shadow_mode: false (rules.yaml:14)\n",
		"messaging.burst: unit=SECOND requests_per_unit=3, shadow_mode: false, algorithm: fixed_window, unit_multiplier: 10 (rules.yaml:16)\n",
		"messaging.key_2_value_2.user: unit=SECOND requests_per_unit=10, shadow_mode: false, algorithm: fixed_window, replaces: specific_limit (rules.yaml:33)\n",
		`messaging.model: unit=MINUTE requests_per_unit=7, shadow_mode: false, algorithm: fixed_window, quota_mode: true, metadata: {"backend":"small"} (rules.yaml:38)` + "\n",
		"messaging.user: unit=SECOND requests_per_unit=10, shadow_mode: false, algorithm: fixed_window, name: user_per_second; " +
			"unit=HOUR requests_per_unit=1000, algorithm: sliding_window_counter, consistency: leased, name: user_per_hour; " +
			"unit=MINUTE requests_per_unit=50, algorithm: gcra, burst: 5, unit_multiplier: 2 (rules.yaml:42)\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/rlconfig lacks %q\n%s", want, body)
		}
	}
}
