package service

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// MaxJSONBody is the largest request body POST /json reads: 4 MiB, gRPC's
// default limit on a received message.
const MaxJSONBody = 4 << 20

// HTTPHandler returns the HTTP endpoints:
//
//   - POST /json takes a RateLimitRequest as JSON (protojson) and answers
//     the RateLimitResponse as JSON, 200 when OK and 429 when over the
//     limit, as envoyproxy/ratelimit does; errors are {"error": "..."} with
//     400 for bad input, 503 when the backend is unavailable. The
//     response's response_headers_to_add (see [HeaderStyle]) are also
//     sent as HTTP headers of the answer.
//   - GET /healthcheck answers 200 "OK" while serving, 503 once draining.
//   - GET /rlconfig lists the rules in force, one line per rule with every
//     limit of the rule.
//   - POST /explain takes the /json body and answers 200 with an
//     [ExplainResponse]: which rule each descriptor matched and why, and
//     the counter keys it would use. It decides and counts nothing.
func (s *Service) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /json", s.serveJSON)
	mux.HandleFunc("GET /healthcheck", s.serveHealthcheck)
	mux.HandleFunc("GET /rlconfig", s.serveRLConfig)
	mux.HandleFunc("POST /explain", s.serveExplain)
	return mux
}

func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request) {
	req, ok := ReadRLSRequest(w, r, MaxJSONBody)
	if !ok {
		return
	}
	resp, err := s.ShouldRateLimit(r.Context(), req)
	if err != nil {
		st := status.Convert(err)
		WriteJSONError(w, HTTPStatus(st.Code()), st.Message())
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		WriteJSONError(w, http.StatusInternalServerError, "encoding the response: "+err.Error())
		return
	}
	// protojson varies its spacing from build to build on purpose; compact
	// it so clients and scripts always see the same bytes.
	var compact bytes.Buffer
	if err := json.Compact(&compact, out); err == nil {
		out = append(compact.Bytes(), '\n')
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	for _, h := range resp.ResponseHeadersToAdd {
		hdr.Add(h.GetKey(), h.GetValue())
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// HTTPStatus maps a gRPC code of ShouldRateLimit or the own API to an
// HTTP status.
func HTTPStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable, codes.Canceled:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// WriteJSONError answers code with {"error": msg}, as every JSON endpoint
// of ratelimitd answers an error; see [wire.WriteJSONError].
func WriteJSONError(w http.ResponseWriter, code int, msg string) {
	wire.WriteJSONError(w, code, msg)
}

func (s *Service) serveHealthcheck(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if s.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "draining\n")
		return
	}
	if reasons := s.unhealthyReasons(); len(reasons) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, strings.Join(reasons, "\n")+"\n")
		return
	}
	io.WriteString(w, "OK\n")
}

// serveRLConfig lists the rules in force. Each line starts as
// envoyproxy/ratelimit's /rlconfig lines do ("ID: unit=U
// requests_per_unit=N, shadow_mode: B") and goes on with what ratelimitd
// adds; a rule with several limits lists the others after the first, each
// after "; ".
func (s *Service) serveRLConfig(w http.ResponseWriter, r *http.Request) {
	rules := s.rules.Load()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# rules %s from %s\n", rules.Hash(), strings.Join(rules.Files(), ", "))
	for _, d := range rules.Domains() {
		if d.FailureMode != "" {
			fmt.Fprintf(bw, "# domain %s: failure_mode %s\n", d.Name, d.FailureMode)
		}
		for _, rule := range d.Rules() {
			writeRule(bw, rule, s.overLimit, s.reserving.Load())
		}
	}
	bw.Flush()
}

// writeRule writes rule r's line; overLimit and rs are the server's
// over_limit_hits and reservations, for the limits that do not say.
func writeRule(w io.Writer, r *config.Rule, overLimit config.OverLimitHits, rs *reserving) {
	if r.Unlimited {
		fmt.Fprintf(w, "%s: unlimited, shadow_mode: %t", r.ID, r.ShadowMode)
		if r.Name != "" {
			fmt.Fprintf(w, ", name: %s", r.Name)
		}
	}
	for i, l := range r.Limits {
		if i == 0 {
			fmt.Fprintf(w, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t", r.ID, strings.ToUpper(l.Unit.String()), l.RequestsPerUnit, r.ShadowMode)
		} else {
			fmt.Fprintf(w, "; unit=%s requests_per_unit=%d", strings.ToUpper(l.Unit.String()), l.RequestsPerUnit)
		}
		fmt.Fprintf(w, ", algorithm: %s", l.Algorithm)
		if l.Burst != 0 {
			fmt.Fprintf(w, ", burst: %d", l.Burst)
		}
		if l.Consistency != config.Exact {
			fmt.Fprintf(w, ", consistency: %s", l.Consistency)
		}
		if res := rs.reserveOf(&r.Limits[i]); res.On() {
			fmt.Fprintf(w, ", reserve: %s", res)
		} else if o := l.OverLimitHits.Or(overLimit); o == config.OverLimitCount {
			fmt.Fprintf(w, ", over_limit_hits: %s", o)
		}
		if l.UnitMultiplier > 1 {
			fmt.Fprintf(w, ", unit_multiplier: %d", l.UnitMultiplier)
		}
		if l.Name != "" {
			fmt.Fprintf(w, ", name: %s", l.Name)
		}
	}
	if c := r.Concurrency; c != nil {
		if len(r.Limits) == 0 {
			fmt.Fprintf(w, "%s: shadow_mode: %t", r.ID, r.ShadowMode)
		}
		fmt.Fprintf(w, ", concurrency: max_in_flight=%d lease_ttl=%v", c.MaxInFlight, c.LeaseTTL)
	}
	if len(r.Replaces) > 0 {
		fmt.Fprintf(w, ", replaces: %s", strings.Join(r.Replaces, " "))
	}
	if r.QuotaMode {
		io.WriteString(w, ", quota_mode: true")
	}
	if r.Metadata != nil {
		md, err := json.Marshal(r.Metadata)
		if err != nil { // a mapping with non-string keys deeper down
			md = fmt.Appendf(nil, "%v", r.Metadata)
		}
		fmt.Fprintf(w, ", metadata: %s", md)
	}
	fmt.Fprintf(w, " (%s:%d)\n", r.File, r.Line)
}

// ReadRLSRequest reads a RateLimitRequest in JSON from r's body, at most
// limit bytes (POST /json: MaxJSONBody). When it cannot, it answers the
// error (400, or 413 over limit) and returns false.
func ReadRLSRequest(w http.ResponseWriter, r *http.Request, limit int64) (*rlsv3.RateLimitRequest, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
			WriteJSONError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", limit))
			return nil, false
		}
		WriteJSONError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return nil, false
	}
	req := &rlsv3.RateLimitRequest{}
	if err := protojson.Unmarshal(body, req); err != nil {
		WriteJSONError(w, http.StatusBadRequest, "the body is not a RateLimitRequest in JSON: "+err.Error())
		return nil, false
	}
	return req, true
}
