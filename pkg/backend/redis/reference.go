package redis

import (
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// A request that carries a reference key ([algo.Request.RefKey]) is kept
// where envoyproxy/ratelimit keeps the same counter, so that reference
// pods and ratelimitd count together in one Redis during a migration
// (-redis-key-format reference):
//
//   - the key is Options.Prefix (the reference's CACHE_KEY_PREFIX), the
//     reference key, and the start of the window in Unix seconds, now /
//     unit * unit, read from this replica's clock as the reference reads
//     its pod's; no hash tag, as the reference has none;
//   - the value is the window's count, a plain integer, raised with INCRBY
//     by the hits admitted;
//   - a key the decision creates expires after the unit plus a random
//     jitter in [0, Options.ExpirationJitter), in whole seconds (EXPIRE),
//     as the reference's EXPIRATION_JITTER_MAX_SECONDS does.
//
// Only a fixed window of whole seconds decided plainly (not leased, no
// lease op) is kept so; every other request keeps its native key.

// plainable reports whether r is kept in the reference layout.
func plainable(r *algo.Request) bool {
	return r.RefKey != nil && r.Limit.Algorithm == algo.FixedWindow && r.Op == algo.OpDecide && !r.Leased &&
		r.Limit.Window >= time.Second && r.Limit.Window%time.Second == 0
}

// replicaNow is this replica's clock: Options.Now, else the system's. It
// names the window of a reference key.
func (b *Backend) replicaNow() time.Time {
	if b.opts.Now != nil {
		return b.opts.Now()
	}
	return time.Now()
}

// prepare sets keys[i], keys as long as reqs, to the Redis key of
// reqs[i] and returns the requests to send: reqs itself, or when some
// request is kept in the reference layout a copy in which those are marked
// [algo.Plain]. tagged asks for the native keys of a Cluster, with their
// hash tags.
func (b *Backend) prepare(keys []string, reqs []algo.Request, tagged bool) []algo.Request {
	var now time.Time
	sent := reqs
	for i := range reqs {
		r := &reqs[i]
		if !plainable(r) {
			if tagged {
				keys[i] = b.clusterKey(r.Key)
			} else {
				keys[i] = b.opts.Prefix + string(r.Key)
			}
			continue
		}
		if now.IsZero() {
			now = b.replicaNow()
			sent = append([]algo.Request(nil), reqs...)
		}
		unit := int64(r.Limit.Window / time.Second)
		k := make([]byte, 0, len(b.opts.Prefix)+len(r.RefKey)+12)
		k = append(k, b.opts.Prefix...)
		k = append(k, r.RefKey...)
		k = strconv.AppendInt(k, now.Unix()/unit*unit, 10)
		keys[i] = string(k)
		ttl := unit
		if j := int64(b.opts.ExpirationJitter / time.Second); j > 0 {
			ttl += rand.Int64N(j)
		}
		sent[i].Plain = algo.Plain{At: now, TTL: time.Duration(ttl) * time.Second}
	}
	return sent
}
