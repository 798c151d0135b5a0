package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// A reference fixture (testdata/reference/*.json) is a scenario and
// envoyproxy/ratelimit's answers to it: the reference was built from
// source outside this repository, run on loopback with its own
// redis-server, the environment of Env and the rule files of Rules, and
// sent each request of Steps in order; Reference names its commit and the
// date of the run. TestReferenceFixtures -record re-records them
// (refrecord_test.go). The differential tests send the same requests to
// ratelimitd in compatibility mode, with the same environment and rules,
// and want the same answers, but for the differences each step lists and
// docs/migrating.md documents. No reference is needed to run them.
type refFixture struct {
	Reference   map[string]string `json:"reference"`
	Description string            `json:"description"`
	Env         map[string]string `json:"env,omitempty"`
	Rules       map[string]string `json:"rules"`
	Steps       []refStep         `json:"steps"`
}

// refStep is a request and the reference's answer to it (Response, or
// Error for a gRPC error), or an action between requests: "kill-redis"
// kills the Redis both servers count in.
type refStep struct {
	Note     string          `json:"note"`
	Action   string          `json:"action,omitempty"`
	Request  json.RawMessage `json:"request,omitempty"`
	Response json.RawMessage `json:"response,omitempty"`
	Error    *refError       `json:"error,omitempty"`
}

// refError is a gRPC error the reference answered: its code's name and
// its message.
type refError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// loadFixture reads testdata/reference/name.
func loadFixture(t *testing.T, name string) refFixture {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "reference", name))
	if err != nil {
		t.Fatal(err)
	}
	var f refFixture
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if f.Reference["commit"] == "" || f.Reference["recorded"] == "" {
		t.Fatalf("%s names no commit or date of the reference run", name)
	}
	return f
}

// replayFixture starts ratelimitd as /bin/ratelimit with the fixture's
// environment and rules on a Redis of its own, sends every request of the
// fixture, and calls check with each step and ratelimitd's answer.
func replayFixture(t *testing.T, f refFixture, check func(i int, st refStep, resp *rlsv3.RateLimitResponse, err error)) {
	t.Helper()
	redis := redistest.StartNode(t)
	var extra []string
	for _, k := range sortedKeys(f.Env) {
		extra = append(extra, k+"="+f.Env[k])
	}
	cmd := exec.Command(asReference(t))
	cmd.Env = referenceEnv(runtimeRoot(t, f.Rules), redis.Addr, extra...)
	s := startProcess(t, cmd)
	rls := rlsv3.NewRateLimitServiceClient(s.dial(t))
	replaySteps(t, rls, redis, f.Steps, func(i int, resp *rlsv3.RateLimitResponse, err error) {
		check(i, f.Steps[i], resp, err)
	})
}

// sameAnswer fails t unless resp, ratelimitd's answer to step i, is the
// reference's: the same codes, limits, remaining counts, headers and
// dynamic metadata. Time-dependent figures are compared for what they
// mean, not for the instant each run read: duration_until_reset and the
// reset header (seconds until the window of the status's unit ends) must
// lie within the unit (ratelimitd answers 0 where nothing is counted). The limit override of a descriptor in dynamic
// metadata is protobuf's text form, whose spacing protobuf varies on
// purpose from build to build; it is compared with spaces collapsed.
func sameAnswer(t *testing.T, i int, st refStep, resp *rlsv3.RateLimitResponse, err error) {
	t.Helper()
	if st.Error != nil {
		t.Fatalf("step %d (%s): the reference answered an error; use a check that says what ratelimitd answers instead", i, st.Note)
	}
	if err != nil {
		t.Fatalf("step %d (%s): %v; the reference answered %s", i, st.Note, err, st.Response)
	}
	var want rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(st.Response, &want); err != nil {
		t.Fatalf("step %d: %v", i, err)
	}
	got, ref := normalized(t, resp), normalized(t, &want)
	if !reflect.DeepEqual(got, ref) {
		g, _ := json.Marshal(got)
		r, _ := json.Marshal(ref)
		t.Errorf("step %d (%s):\nratelimitd %s\n reference %s", i, st.Note, g, r)
	}
}

// normalized returns resp as JSON values with the time-dependent figures
// checked and taken out (see sameAnswer).
func normalized(t *testing.T, resp *rlsv3.RateLimitResponse) map[string]any {
	t.Helper()
	var longest time.Duration // the longest unit of a status, bounding the reset header
	for _, s := range resp.Statuses {
		if l := s.GetCurrentLimit(); l != nil {
			unit := unitLength(l.Unit)
			longest = max(longest, unit)
			// 0 is ratelimitd's answer for a limit with nothing counted
			// (everything remains, or a limit of 0, which counts
			// nothing), a documented difference.
			untouched := s.Code == rlsv3.RateLimitResponse_OK && s.LimitRemaining == l.RequestsPerUnit || l.RequestsPerUnit == 0
			if d := s.DurationUntilReset.AsDuration(); d < 0 || d > unit || d == 0 && !untouched {
				t.Errorf("duration_until_reset %v is not within the %v unit of %v", d, unit, l)
			}
			s.DurationUntilReset = nil
		}
	}
	for _, h := range resp.ResponseHeadersToAdd {
		if strings.HasSuffix(strings.ToLower(h.Key), "reset") {
			n, err := strconv.Atoi(h.Value)
			if err != nil || n < 0 || time.Duration(n)*time.Second > longest {
				t.Errorf("header %s: %q is not a number of seconds within %v", h.Key, h.Value, longest)
			}
			h.Value = "<seconds until the window ends>"
		}
	}
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if md, ok := m["dynamic_metadata"].(map[string]any); ok {
		if ds, ok := md["descriptors"].([]any); ok {
			for _, d := range ds {
				if d, ok := d.(map[string]any); ok {
					if l, ok := d["limit"].(string); ok {
						d["limit"] = strings.Join(strings.Fields(l), " ")
					}
				}
			}
		}
	}
	return m
}

// unitLength is how long a unit's window lasts, as rule files count it
// (a month is 30 days, a year 365, as in envoyproxy/ratelimit).
func unitLength(u rlsv3.RateLimitResponse_RateLimit_Unit) time.Duration {
	unit, err := config.ParseUnit(u.String())
	if err != nil {
		return 0
	}
	return unit.Duration()
}

// TestReferenceCosts replays issue 27's token costs against ratelimitd in
// compatibility mode: the calls of 800, 1, 900, 1 and 900 tokens under
// 1,000 per minute, two descriptors of which one is over, AI Gateway's
// request-time check of zero tokens before and after a stream-done cost
// larger than what remains, and the request's own hits_addend. Every
// answer is the reference's (testdata/reference/costs.json): the costs
// are counted, and the calls after them refused.
func TestReferenceCosts(t *testing.T) {
	t.Parallel()
	f := loadFixture(t, "costs.json")
	replayFixture(t, f, func(i int, st refStep, resp *rlsv3.RateLimitResponse, err error) {
		sameAnswer(t, i, st, resp, err)
	})
}

// TestReferenceRedisDown kills the Redis of ratelimitd in compatibility
// mode, as testdata/reference/redis-down.json killed the reference's: the
// reference answers each call it cannot decide with a gRPC error (Unknown,
// "response returned from Conn: EOF"), so that Envoy's failure_mode_deny
// decides, and so does ratelimitd, by default in compatibility mode
// (-failure-mode error; its code is Unavailable: Envoy treats every error
// alike, see Filter::complete in Envoy's
// source/extensions/filters/http/ratelimit/ratelimit.cc). A domain without
// rules is answered without Redis by both. With
// RATELIMITD_FAILURE_MODE=open, the operator's choice, the calls are
// admitted instead.
func TestReferenceRedisDown(t *testing.T) {
	t.Parallel()
	f := loadFixture(t, "redis-down.json")
	t.Run("as the reference", func(t *testing.T) {
		t.Parallel()
		replayFixture(t, f, func(i int, st refStep, resp *rlsv3.RateLimitResponse, err error) {
			if st.Error == nil {
				sameAnswer(t, i, st, resp, err)
				return
			}
			if status.Code(err) != codes.Unavailable {
				t.Errorf("step %d (%s): %v, %v; the reference answered the error %s %q, want Unavailable", i, st.Note, resp, err, st.Error.Code, st.Error.Message)
			}
		})
	})
	t.Run("RATELIMITD_FAILURE_MODE=open", func(t *testing.T) {
		t.Parallel()
		open := f
		open.Env = map[string]string{"RATELIMITD_FAILURE_MODE": "open"}
		replayFixture(t, open, func(i int, st refStep, resp *rlsv3.RateLimitResponse, err error) {
			if st.Error == nil {
				sameAnswer(t, i, st, resp, err)
				return
			}
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Errorf("step %d (%s): %v, %v; want OK, as failure mode open says", i, st.Note, resp, err)
			}
		})
	})
}

// TestReferenceQuotaMode replays testdata/reference/quota-mode.json:
// under QUOTA_MODE=true every descriptor but an unlimited one is a quota
// descriptor, one that matched no rule or a replaced rule, and a shadow
// one over its limit, passing; a request is refused only when a
// non-quota descriptor is over, or every quota descriptor is. Case by
// case, the answers are the reference's.
func TestReferenceQuotaMode(t *testing.T) {
	t.Parallel()
	replayFixture(t, loadFixture(t, "quota-mode.json"), func(i int, st refStep, resp *rlsv3.RateLimitResponse, err error) {
		sameAnswer(t, i, st, resp, err)
	})
}

// TestReferenceHeaders replays testdata/reference/headers.json: with
// LIMIT_RESPONSE_HEADERS_ENABLED=true and the header names of
// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER, the
// headers describe the descriptor the reference picks (the least
// remaining, a shadow one included; an over one first), under those
// names. ratelimitd adds Retry-After to OVER_LIMIT answers, a documented
// addition: it is checked and taken out before the comparison.
func TestReferenceHeaders(t *testing.T) {
	t.Parallel()
	replayFixture(t, loadFixture(t, "headers.json"), func(i int, st refStep, resp *rlsv3.RateLimitResponse, err error) {
		if resp != nil {
			kept := resp.ResponseHeadersToAdd[:0]
			retry := false
			for _, h := range resp.ResponseHeadersToAdd {
				if h.Key == "Retry-After" {
					retry = true
					continue
				}
				kept = append(kept, h)
			}
			if retry != (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) {
				t.Errorf("step %d (%s): Retry-After %v in a %v answer", i, st.Note, retry, resp.OverallCode)
			}
			if len(kept) == 0 {
				kept = nil
			}
			resp.ResponseHeadersToAdd = kept
		}
		sameAnswer(t, i, st, resp, err)
	})
}

// TestReferenceDynamicMetadata replays
// testdata/reference/dynamic-metadata.json: with
// RESPONSE_DYNAMIC_METADATA=true every answer carries the reference's
// dynamic_metadata, field by field: the domain; each descriptor's entries,
// limit override (protobuf's text form) and hits_addend; the request's
// hits_addend; and the metadata of the rules of the descriptors that
// passed, merged (the first's keys first, structs merged), read from
// YAML as the reference reads it (yes and on are booleans, a date a
// string). One documented difference: the reference drops the metadata
// of a rule with detailed_metric (it rebuilds such a rule's limit
// without it, src/config/config_impl.go, GetLimit); ratelimitd sends it.
func TestReferenceDynamicMetadata(t *testing.T) {
	t.Parallel()
	replayFixture(t, loadFixture(t, "dynamic-metadata.json"), func(i int, st refStep, resp *rlsv3.RateLimitResponse, err error) {
		if st.Note == "a rule with detailed_metric" {
			var want map[string]any
			if err := json.Unmarshal(st.Response, &want); err != nil {
				t.Fatal(err)
			}
			want["dynamic_metadata"].(map[string]any)["metadata"] = map[string]any{"detailed": true}
			st.Response, _ = json.Marshal(want)
		}
		sameAnswer(t, i, st, resp, err)
	})
}
