package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// rlsFrontEnd is the component of the rate limit service: Envoy's RLS v3
// and ratelimitd's own API on the gRPC port, POST /json, /healthcheck and
// POST /explain on the HTTP port. It decides through the top of the
// backend stack, tells the observers built before it of every decision,
// and owns the health checks.
type rlsFrontEnd struct {
	responseHeaders     service.HeaderStyle
	responseHeaderNames string
	headerNames         service.HeaderNames
	dynamicMetadata     bool
	nearLimitRatio      float64
	shadowMode          bool
	quotaMode           bool
	overLimitHits       string
	enableReset         bool
	bounds              service.Bounds
	maxHits             uint64
	reserve             string
}

func (r *rlsFrontEnd) addFlags(fs *flag.FlagSet) {
	fs.TextVar(&r.responseHeaders, "response-headers", service.HeadersNone, "rate-limit headers Envoy adds to answers: none, ratelimit (RateLimit-*), x-ratelimit (X-RateLimit-*), structured (RateLimit-Policy and RateLimit) or reference (RateLimit-*, for the descriptor envoyproxy/ratelimit picks); Retry-After when over the limit")
	fs.StringVar(&r.responseHeaderNames, "response-header-names", "RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset", "`names` of the limit, remaining and reset headers of -response-headers ratelimit and reference, comma-separated (envoyproxy/ratelimit's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER)")
	fs.BoolVar(&r.dynamicMetadata, "response-dynamic-metadata", false, "answers of Envoy's API carry dynamic_metadata: the domain, the descriptors and the merged metadata of the rules of those that passed (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA), for Envoy's later filters")
	fs.Float64Var(&r.nearLimitRatio, "near-limit-ratio", service.DefaultNearLimitRatio, "share of a limit past which an admitted descriptor counts as near_limit in the metrics")
	fs.BoolVar(&r.shadowMode, "shadow-mode", false, "answer every request of Envoy's API OK overall, while each descriptor is still decided, counted and reported (envoyproxy/ratelimit's SHADOW_MODE): to try rules in production")
	fs.BoolVar(&r.quotaMode, "quota-mode", false, "decide every descriptor but unlimited ones as one of a rule with quota_mode: true, unmatched ones and limit overrides included (envoyproxy/ratelimit's QUOTA_MODE): a request is refused only when a non-quota descriptor is over, or every quota descriptor is")
	fs.StringVar(&r.overLimitHits, "over-limit-hits", "drop", "hits beyond what remains, for limits whose rule does not say (rate_limit.over_limit_hits) and limit overrides: drop (refuse and count nothing) or count (count them anyway, as envoyproxy/ratelimit does: for costs reported after the response; the default in compatibility mode)")
	fs.BoolVar(&r.enableReset, "enable-reset", false, "let ratelimitd.v1.RateLimiter/Reset clear a descriptor's counters, and with -ui the ops console's reset button (an operator's tool; anyone who can reach the gRPC port, or the console, can call it)")
	fs.IntVar(&r.bounds.MaxDomainLen, "max-domain-bytes", service.DefaultMaxDomainLen, "longest domain a request may name, in bytes")
	fs.IntVar(&r.bounds.MaxDescriptors, "max-descriptors", service.DefaultMaxDescriptors, "most descriptors one request may carry")
	fs.IntVar(&r.bounds.MaxEntries, "max-entries", service.DefaultMaxEntries, "most entries one descriptor may carry")
	fs.IntVar(&r.bounds.MaxKeyLen, "max-key-bytes", service.DefaultMaxKeyLen, "longest descriptor entry key, in bytes")
	fs.IntVar(&r.bounds.MaxValueLen, "max-value-bytes", service.DefaultMaxValueLen, "longest descriptor entry value, in bytes")
	fs.Uint64Var(&r.maxHits, "max-hits", service.DefaultMaxHits, "largest hits_addend a request or descriptor may carry")
	fs.StringVar(&r.reserve, "reserve", "off", "for fixed windows whose rule does not set rate_limit.reserve (rules over xDS, as Envoy AI Gateway's are): off, auto or a number of hits a request-time call (no hits_addend of its own) holds until its stream-done call (one) charges the cost; auto learns the reservation from the costs settled (docs/ai-gateway.md)")
}

func (r *rlsFrontEnd) check(flagName func(string) string) error {
	names := strings.Split(r.responseHeaderNames, ",")
	for i := range names {
		names[i] = strings.TrimSpace(names[i])
	}
	if len(names) == 3 {
		r.headerNames = service.HeaderNames{Limit: names[0], Remaining: names[1], Reset: names[2]}
	}
	if err := r.headerNames.Check(); len(names) != 3 || slices.Contains(names, "") || err != nil {
		return fmt.Errorf("invalid %s %q: want three HTTP header names, limit,remaining,reset (%v)", flagName("response-header-names"), r.responseHeaderNames, cmp.Or(err, errors.New("not three names")))
	}
	if _, err := config.ParseOverLimitHits(r.overLimitHits); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: drop, count", flagName("over-limit-hits"), r.overLimitHits)
	}
	if !(r.nearLimitRatio > 0 && r.nearLimitRatio <= 1) {
		return fmt.Errorf("invalid %s %v; it must be above 0 and at most 1", flagName("near-limit-ratio"), r.nearLimitRatio)
	}
	for _, b := range []struct {
		name string
		v    int
	}{
		{"max-domain-bytes", r.bounds.MaxDomainLen},
		{"max-descriptors", r.bounds.MaxDescriptors},
		{"max-entries", r.bounds.MaxEntries},
		{"max-key-bytes", r.bounds.MaxKeyLen},
		{"max-value-bytes", r.bounds.MaxValueLen},
	} {
		if b.v < 1 {
			return fmt.Errorf("invalid %s %d; it must be at least 1", flagName(b.name), b.v)
		}
	}
	if r.maxHits < 1 {
		return fmt.Errorf("invalid %s %d; it must be at least 1", flagName("max-hits"), r.maxHits)
	}
	r.bounds.MaxHits = r.maxHits
	if _, err := config.ParseReserve(r.reserve); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: off, auto, or the hits a request-time call holds, 1 to 4294967295", flagName("reserve"), r.reserve)
	}
	return nil
}

func (r *rlsFrontEnd) build(_ context.Context, s *server) (hooks, error) {
	overLimitHits, _ := config.ParseOverLimitHits(r.overLimitHits) // checked
	reserve, _ := config.ParseReserve(r.reserve)                   // checked
	st := s.stack
	svc, err := service.New(st.main, s.source.initial, service.Options{
		Logger: s.log, Recovery: s.recovery, Bounds: r.bounds,
		FailureMode: st.failureMode, Fallback: st.fallback, LocalShare: st.localShare, Now: s.now,
		ResponseHeaders: r.responseHeaders, HeaderNames: r.headerNames, DynamicMetadata: r.dynamicMetadata, NearLimitRatio: r.nearLimitRatio,
		Observer: service.Tee(s.observers...), EnableReset: r.enableReset, Leases: st.leases, Global: st.global,
		ShadowMode: r.shadowMode, QuotaMode: r.quotaMode, OverLimitHits: overLimitHits,
		ReferenceKeys: st.referenceKeys, Reserve: reserve,
	})
	if err != nil {
		return hooks{}, err
	}
	s.svc = svc
	registerService(s.reg, svc, s.source.loaded)
	s.reg.MustRegister(reserveMetrics{svc})
	return hooks{
		grpc:  svc.RegisterGRPC,
		http:  func(mux *http.ServeMux) { mux.Handle("/", svc.HTTPHandler()) },
		rules: svc.SetRules,
	}, nil
}
