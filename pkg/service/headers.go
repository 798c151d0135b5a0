package service

import (
	"cmp"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// HeaderStyle selects the rate-limit headers an answer carries: in
// ShouldRateLimit's response_headers_to_add, for Envoy to add to the
// client's response, and as HTTP headers of POST /json.
//
// Whatever the style, the figures are those of one descriptor of the
// request, the most restrictive one:
//
//   - when the answer is OVER_LIMIT, the refused descriptor with the
//     longest retry-after ([algo.Never] being the longest of all);
//   - otherwise the descriptor with the least remaining;
//   - ties go to the descriptor that comes first in the request.
//
// Within a descriptor whose rule has several limits, the limit is the one
// its status reports in current_limit.
//
// Only descriptors that were counted take part: those that matched a rule
// with a limit, or carried a limit override. Descriptors that matched no
// rule, an unlimited rule or a rule another one replaced do not, and
// neither do descriptors of shadow_mode rules: a shadow rule is on trial,
// and telling clients about it would already slow down those that honour
// the headers. A request with no descriptor taking part gets no headers;
// neither does one decided by failure mode open or closed, whose figures
// are unknown (failure mode local has figures, and sends them).
//
// When the answer is OVER_LIMIT, every style adds Retry-After: the chosen
// descriptor's retry-after in seconds, rounded up and at least 1. It is
// left out when the retry-after is [algo.Never]: the request asks for
// more hits than the limit ever holds, and waiting never admits it. The
// reset figures of each style then fall back to the time until the limit
// is fully restored.
type HeaderStyle uint8

const (
	// HeadersNone adds no headers.
	HeadersNone HeaderStyle = iota
	// HeadersRateLimit adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset, the fields of draft-ietf-httpapi-ratelimit-headers
	// up to version 06 (the last to define them), still the most widely
	// understood:
	//
	//	RateLimit-Limit: 100
	//	RateLimit-Remaining: 99
	//	RateLimit-Reset: 60
	//
	// RateLimit-Limit is the limit's requests_per_unit; RateLimit-Remaining
	// the hits it admits now; RateLimit-Reset the seconds, rounded up,
	// until the limit is fully restored. With Retry-After (over the limit),
	// RateLimit-Reset is the Retry-After value, as draft 06 section 4 asks:
	// "If a response contains both the Retry-After and the RateLimit-Reset
	// fields, the RateLimit-Reset field value SHOULD reference the same
	// point in time as the Retry-After field value."
	HeadersRateLimit
	// HeadersXRateLimit adds the headers the seed documents describe:
	//
	//	X-RateLimit-Limit: 100
	//	X-RateLimit-Remaining: 0
	//	X-RateLimit-Retry-After: 42
	//
	// X-RateLimit-Limit and X-RateLimit-Remaining are as in
	// HeadersRateLimit; X-RateLimit-Retry-After, the seconds to wait before
	// a request is no longer throttled, is sent only over the limit, with
	// the value of Retry-After. (Header
	// names are case-insensitive; the seed documents spell them
	// X-Ratelimit-*, as Go's net/http writes them in POST /json answers.)
	HeadersXRateLimit
	// HeadersStructured adds RateLimit-Policy and RateLimit, the structured
	// fields (RFC 9651 lists) of draft-ietf-httpapi-ratelimit-headers-11,
	// the current version:
	//
	//	RateLimit-Policy: "per_minute";q=100;w=60, "per_day";q=1000;w=86400
	//	RateLimit: "per_minute";r=99;t=60
	//
	// RateLimit-Policy lists one quota policy per limit of every rule
	// matched by a descriptor taking part (one per rule with a single
	// limit; each override is one too), in request order, each once: its
	// name (a String), q the limit's requests_per_unit and w its window in
	// seconds, plus ratelimitd-burst, the bucket capacity, for a bucket
	// algorithm whose capacity is not requests_per_unit. A limit without a
	// name is named after its rule's ID (with "#" and the limit's place,
	// counted from 1, in a rule of several limits), an override
	// "override_<N>_per_<unit>" (or "_per_<M>_<unit>" with a
	// unit_multiplier). RateLimit is the chosen descriptor's service limit:
	// r the hits it admits now and t the seconds, rounded up, until the
	// limit is fully restored, or, with Retry-After, the Retry-After value
	// (draft 11 section 6: Retry-After "SHOULD NOT reference a point in
	// time earlier than the end of the effective window").
	HeadersStructured
	// HeadersReference adds the headers envoyproxy/ratelimit adds with
	// LIMIT_RESPONSE_HEADERS_ENABLED (src/service/ratelimit.go,
	// shouldRateLimitWorker), for the descriptor it picks, which is not
	// the one the styles above pick:
	//
	//	RateLimit-Limit: 100
	//	RateLimit-Remaining: 99
	//	RateLimit-Reset: 48
	//
	// The descriptor is, among those whose status has a current_limit
	// (shadow ones included; not unlimited, unmatched or replaced ones),
	// the first with the least limit_remaining; but when any descriptor
	// that is not a quota descriptor is over its limit, the last such one.
	// RateLimit-Limit is its requests_per_unit, RateLimit-Remaining its
	// limit_remaining, RateLimit-Reset the whole seconds until the
	// epoch-aligned window of its unit (× unit_multiplier) ends, whatever
	// its algorithm, as the reference computes it (utils.CalculateReset).
	// The names are [HeaderNames]'. Over the limit, Retry-After is added,
	// as in every style: the reference adds none, and a 429 may carry it
	// (RFC 6585, section 4).
	HeadersReference
)

// headerStyleNames are the styles' names, indexed by style.
var headerStyleNames = [...]string{"none", "ratelimit", "x-ratelimit", "structured", "reference"}

// String returns the style's name: none, ratelimit, x-ratelimit or
// structured.
func (h HeaderStyle) String() string {
	if int(h) < len(headerStyleNames) {
		return headerStyleNames[h]
	}
	return "HeaderStyle(" + strconv.Itoa(int(h)) + ")"
}

// ParseHeaderStyle returns the style named s: "none", "ratelimit",
// "x-ratelimit", "structured" or "reference".
func ParseHeaderStyle(s string) (HeaderStyle, error) {
	for i, name := range headerStyleNames {
		if s == name {
			return HeaderStyle(i), nil
		}
	}
	return HeadersNone, fmt.Errorf("unknown response header style %q: want none, ratelimit, x-ratelimit, structured or reference", s)
}

// HeaderNames are the names of the limit, remaining and reset headers of
// the styles HeadersRateLimit and HeadersReference (envoyproxy/ratelimit's
// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER). An
// empty name is the default: RateLimit-Limit, RateLimit-Remaining,
// RateLimit-Reset.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// withDefaults returns n with every empty name replaced by its default.
func (n HeaderNames) withDefaults() HeaderNames {
	n.Limit = cmp.Or(n.Limit, hdrLimit)
	n.Remaining = cmp.Or(n.Remaining, hdrRemaining)
	n.Reset = cmp.Or(n.Reset, hdrReset)
	return n
}

// Check reports a name that is no HTTP header name (RFC 9110 section
// 5.1: a token).
func (n HeaderNames) Check() error {
	for _, name := range []string{n.Limit, n.Remaining, n.Reset} {
		if name == "" {
			continue
		}
		for i := 0; i < len(name); i++ {
			if !isTokenChar(name[i]) {
				return fmt.Errorf("%q is not an HTTP header name: %q is not a token character", name, name[i])
			}
		}
	}
	return nil
}

// isTokenChar reports whether c is a tchar of RFC 9110 section 5.6.2.
func isTokenChar(c byte) bool {
	switch {
	case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// MarshalText returns the style's name, so that a HeaderStyle is a
// flag.TextVar.
func (h HeaderStyle) MarshalText() ([]byte, error) {
	if int(h) >= len(headerStyleNames) {
		return nil, fmt.Errorf("unknown response header style %d", h)
	}
	return []byte(headerStyleNames[h]), nil
}

// UnmarshalText sets the style named text; see [ParseHeaderStyle].
func (h *HeaderStyle) UnmarshalText(text []byte) error {
	v, err := ParseHeaderStyle(string(text))
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// The header names, as the drafts and the seed documents spell them.
const (
	hdrRetryAfter      = "Retry-After"
	hdrLimit           = "RateLimit-Limit"
	hdrRemaining       = "RateLimit-Remaining"
	hdrReset           = "RateLimit-Reset"
	hdrXLimit          = "X-RateLimit-Limit"
	hdrXRemaining      = "X-RateLimit-Remaining"
	hdrXRetryAfter     = "X-RateLimit-Retry-After"
	hdrPolicy          = "RateLimit-Policy"
	hdrRateLimit       = "RateLimit"
	maxResponseHeaders = 4 // the most any style adds
)

// headerPick is the most restrictive descriptor of a request so far; see
// [HeaderStyle].
type headerPick struct {
	d    *algo.Decision // nil until a descriptor takes part
	i, j int            // the descriptor, and the limit of its rule
}

// consider offers decision d, of limit j of descriptor i, to the pick.
// Descriptors are offered in request order, so ties keep the first.
func (p *headerPick) consider(i, j int, d *algo.Decision) {
	if b := p.d; b != nil {
		switch {
		case d.Allowed != b.Allowed:
			if d.Allowed {
				return
			}
		case !d.Allowed:
			if d.RetryAfter <= b.RetryAfter {
				return
			}
		default:
			if d.Remaining >= b.Remaining {
				return
			}
		}
	}
	p.d, p.i, p.j = d, i, j
}

// headerBuilder records where each header value ends in one buffer, so
// that all the values become one string.
type headerBuilder struct {
	keys [maxResponseHeaders]string
	ends [maxResponseHeaders]int // ends[k] is the end of value k
	n    int
}

// end ends, at buffer length n, the value of header key.
func (h *headerBuilder) end(key string, n int) {
	h.keys[h.n] = key
	h.ends[h.n] = n
	h.n++
}

// headerBlock holds the headers of one answer, allocated together.
type headerBlock struct {
	values [maxResponseHeaders]corev3.HeaderValue
	ptrs   [maxResponseHeaders]*corev3.HeaderValue
}

// headers returns the headers whose values buf holds.
func (h *headerBuilder) headers(buf []byte) []*corev3.HeaderValue {
	values := string(buf)
	blk := new(headerBlock)
	start := 0
	for k := range h.n {
		hv := &blk.values[k]
		hv.Key = h.keys[k]
		hv.Value = values[start:h.ends[k]]
		start = h.ends[k]
		blk.ptrs[k] = hv
	}
	return blk.ptrs[:h.n:h.n]
}

// responseHeaders returns the headers of style s for the descriptor p
// picked among sc's checks; over tells whether the answer is OVER_LIMIT,
// and so whether p's decision was refused.
func (s *Service) responseHeaders(sc *scratch, p *headerPick, over bool) []*corev3.HeaderValue {
	c, d := &sc.checks[p.i], p.d
	var retry uint64 // Retry-After in seconds; 0 for none
	if over && d.RetryAfter != algo.Never {
		retry = max(ceilSeconds(d.RetryAfter), 1)
	}
	reset := ceilSeconds(d.ResetAfter)
	if retry != 0 {
		reset = retry
	}
	q, _, _ := limitFigures(c, p.j)

	var arr [256]byte
	b := arr[:0]
	var h headerBuilder
	switch s.headers {
	case HeadersRateLimit:
		b = strconv.AppendUint(b, q, 10)
		h.end(s.headerNames.Limit, len(b))
		b = strconv.AppendUint(b, d.Remaining, 10)
		h.end(s.headerNames.Remaining, len(b))
		b = strconv.AppendUint(b, reset, 10)
		h.end(s.headerNames.Reset, len(b))
	case HeadersXRateLimit:
		b = strconv.AppendUint(b, q, 10)
		h.end(hdrXLimit, len(b))
		b = strconv.AppendUint(b, d.Remaining, 10)
		h.end(hdrXRemaining, len(b))
		if retry != 0 {
			b = strconv.AppendUint(b, retry, 10)
			h.end(hdrXRetryAfter, len(b))
		}
	case HeadersStructured:
		b = appendPolicies(b, sc.checks)
		h.end(hdrPolicy, len(b))
		b = appendPolicyName(b, c, p.j)
		b = append(b, ";r="...)
		b = strconv.AppendUint(b, d.Remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendUint(b, reset, 10)
		h.end(hdrRateLimit, len(b))
	}
	if retry != 0 {
		b = strconv.AppendUint(b, retry, 10)
		h.end(hdrRetryAfter, len(b))
	}
	return h.headers(b)
}

// referenceHeaders returns the headers of HeadersReference for the
// decided request sc whose answer is resp, or nil when no descriptor has
// a current_limit.
func (s *Service) referenceHeaders(sc *scratch, resp *rlsv3.RateLimitResponse) []*corev3.HeaderValue {
	pick, least := -1, uint32(math.MaxUint32)
	for i, st := range resp.Statuses {
		if st.CurrentLimit != nil && st.LimitRemaining < least {
			pick, least = i, st.LimitRemaining
		}
		if c := &sc.checks[i]; c.kind == counted && !c.quota && st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			pick, least = i, 0
		}
	}
	if pick < 0 {
		return nil
	}
	st, c := resp.Statuses[pick], &sc.checks[pick]
	j := mostRestrictive(sc.decisions[c.req : c.req+c.n]) // the limit of st.CurrentLimit
	d := &sc.decisions[c.req+j]
	l := st.CurrentLimit
	_, window, _ := limitFigures(c, j) // unit × multiplier, of a rule or an override
	w := max(int64(window/time.Second), 1)
	var arr [128]byte
	b := arr[:0]
	var h headerBuilder
	b = strconv.AppendUint(b, uint64(l.RequestsPerUnit), 10)
	h.end(s.headerNames.Limit, len(b))
	b = strconv.AppendUint(b, uint64(st.LimitRemaining), 10)
	h.end(s.headerNames.Remaining, len(b))
	b = strconv.AppendInt(b, w-s.now().Unix()%w, 10)
	h.end(s.headerNames.Reset, len(b))
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && !d.Allowed && d.RetryAfter != algo.Never {
		b = strconv.AppendUint(b, max(ceilSeconds(d.RetryAfter), 1), 10)
		h.end(hdrRetryAfter, len(b))
	}
	return h.headers(b)
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d-1)/time.Second) + 1
}

// takesPart reports whether check c takes part in the headers: counted,
// and not under a shadow_mode rule.
func (c *check) takesPart() bool {
	return c.kind == counted && (c.rule == nil || !c.rule.ShadowMode)
}

// limitFigures returns limit j of check c as a quota policy: its
// requests_per_unit, its window, and its bucket capacity when that is not
// requests_per_unit (0 otherwise).
func limitFigures(c *check, j int) (q uint64, w time.Duration, burst uint64) {
	if o := c.override; o != nil {
		l := overrideLimit(o)
		return l.Requests, l.Window, 0
	}
	l := &c.rule.Limits[j]
	q, w = uint64(l.RequestsPerUnit), l.Window
	if l.Algorithm.UsesBurst() && l.Capacity() != q {
		burst = l.Capacity()
	}
	return q, w, burst
}

// appendPolicies appends the RateLimit-Policy list of the checks taking
// part: one item per limit of each, each item once.
func appendPolicies(dst []byte, checks []check) []byte {
	first := true
	for i := range checks {
		c := &checks[i]
		if !c.takesPart() {
			continue
		}
		for j := range c.n {
			if listedBefore(checks[:i], c, j) {
				continue
			}
			if !first {
				dst = append(dst, ", "...)
			}
			first = false
			q, w, burst := limitFigures(c, j)
			dst = appendPolicyName(dst, c, j)
			dst = append(dst, ";q="...)
			dst = strconv.AppendUint(dst, q, 10)
			dst = append(dst, ";w="...)
			dst = strconv.AppendUint(dst, ceilSeconds(w), 10)
			if burst != 0 {
				dst = append(dst, ";ratelimitd-burst="...)
				dst = strconv.AppendUint(dst, burst, 10)
			}
		}
	}
	return dst
}

// listedBefore reports whether limit j of c is the same policy as one of
// the checks before it: the same limit of the same rule, or an override
// of the same limit.
func listedBefore(before []check, c *check, j int) bool {
	for i := range before {
		b := &before[i]
		if !b.takesPart() {
			continue
		}
		if c.rule != nil && b.rule == c.rule {
			return true
		}
		if c.override != nil && b.override != nil && sameOverride(b.override, c.override) {
			return true
		}
	}
	return false
}

// sameOverride reports whether overrides a and b name the same policy:
// the same requests_per_unit, unit and unit_multiplier.
func sameOverride(a, b *rlv3.RateLimitDescriptor_RateLimitOverride) bool {
	return a.RequestsPerUnit == b.RequestsPerUnit && a.Unit == b.Unit && multiplier(a) == multiplier(b)
}

// multiplier is o's unit_multiplier, 1 when unset or 0.
func multiplier(o *rlv3.RateLimitDescriptor_RateLimitOverride) uint32 {
	if m := o.GetUnitMultiplier(); m != nil && m.Value > 1 {
		return m.Value
	}
	return 1
}

// appendPolicyName appends the name of limit j of c as a structured field
// String: the limit's name, else its rule's ID (with "#" and j+1 in a rule
// of several limits), or for an override "override_<N>_per_[<M>_]<unit>".
func appendPolicyName(dst []byte, c *check, j int) []byte {
	if o := c.override; o != nil {
		dst = append(dst, `"override_`...)
		dst = strconv.AppendUint(dst, uint64(o.RequestsPerUnit), 10)
		dst = append(dst, "_per_"...)
		if m := multiplier(o); m > 1 {
			dst = strconv.AppendUint(dst, uint64(m), 10)
			dst = append(dst, '_')
		}
		dst = append(dst, overrideUnit(o.Unit).String()...)
		return append(dst, '"')
	}
	l := &c.rule.Limits[j]
	if l.Name != "" {
		return appendSFString(dst, l.Name)
	}
	dst = appendSFString(dst, c.rule.ID)
	if len(c.rule.Limits) > 1 {
		dst = dst[:len(dst)-1] // reopen the string
		dst = append(dst, '#')
		dst = strconv.AppendInt(dst, int64(j)+1, 10)
		dst = append(dst, '"')
	}
	return dst
}

// appendSFString appends s as a structured field String (RFC 9651 section
// 3.3.3): quoted, with '"' and '\' escaped. Characters a String cannot
// hold (controls, and all but printable ASCII) become '_'.
func appendSFString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r < 0x20 || r > 0x7e:
			dst = append(dst, '_')
		default:
			dst = append(dst, byte(r))
		}
	}
	return append(dst, '"')
}
