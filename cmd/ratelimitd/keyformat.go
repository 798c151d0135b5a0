package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// -redis-key-format: where a Redis-backed replica keeps its counters.
const (
	// keyFormatNative is ratelimitd's collision-free layout (package key).
	keyFormatNative = "native"
	// keyFormatReference keeps fixed windows where envoyproxy/ratelimit
	// keeps them, so that reference pods and ratelimitd replicas sharing
	// one Redis count together during a migration.
	keyFormatReference = "reference"
)

// validateKeyFormat checks -redis-key-format and -redis-expiration-jitter.
func (c *redisConfig) checkKeyFormat(flagName func(string) string) error {
	if c.keyFormat != keyFormatNative && c.keyFormat != keyFormatReference {
		return fmt.Errorf("invalid %s %q; accepted: native, reference", flagName("redis-key-format"), c.keyFormat)
	}
	if c.jitter < 0 || c.jitter%time.Second != 0 {
		return fmt.Errorf("invalid %s %v; it must be whole seconds, not negative (0 adds none)", flagName("redis-expiration-jitter"), c.jitter)
	}
	return nil
}

// referenceKeys reports whether counters are kept in the reference layout:
// only on Redis, the store reference pods can share.
func (b *backendStore) referenceKeys() bool {
	return b.backend == "redis" && b.redis.keyFormat == keyFormatReference
}

// logKeyFormat says at start-up, in the reference layout, what it costs,
// how to leave it, and which rules keep native keys all the same.
func (b *backendStore) logKeyFormat(rules *config.Rules, log *slog.Logger) {
	if !b.referenceKeys() {
		return
	}
	log.Warn("redis key format reference: fixed-window counters are kept in envoyproxy/ratelimit's layout, "+
		"prefix+domain_key_value_…_windowStart, so that reference pods on this Redis count together with this server "+
		"(they must run with CACHE_KEY_PREFIX equal to -redis-prefix). The layout is collision-prone: "+
		"descriptors whose keys or values contain \"_\" can share one counter, such as (a, b_c) and (a_b, c). "+
		"Once no reference pod is left, restart every replica with -redis-key-format native "+
		"(collision-free keys; fixed-window counts start afresh once)",
		"prefix", b.redis.prefix, "expiration_jitter", b.redis.jitter.String())
	var native []string
	for _, d := range rules.Domains() {
		for _, r := range d.Rules() {
			if len(r.Limits) > 0 && !service.ReferenceRule(r) {
				native = append(native, r.ID)
			}
		}
	}
	if len(native) > 0 {
		shown := native[:min(len(native), 10)]
		log.Warn("redis key format reference: these rules keep native keys, so reference pods do not share their counts "+
			"(only a rule's single fixed window of one unit, not leased, has a reference layout: other algorithms, "+
			"unit_multiplier, several rate_limits and consistency: leased are ratelimitd's own)",
			"rules", len(native), "first", shown)
	}
}
