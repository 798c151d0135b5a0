package service

import (
	"fmt"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// Default request bounds.
const (
	DefaultMaxDomainLen   = config.MaxDomainLen
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 16
	DefaultMaxKeyLen      = 1024
	DefaultMaxValueLen    = 1024
	DefaultMaxHits        = 1_000_000_000
)

// Bounds limit what one request may carry; a request past any bound is
// refused with InvalidArgument naming it. Zero fields take the defaults.
type Bounds struct {
	MaxDomainLen   int    // bytes in the domain
	MaxDescriptors int    // descriptors per request
	MaxEntries     int    // entries per descriptor
	MaxKeyLen      int    // bytes in an entry's key
	MaxValueLen    int    // bytes in an entry's value
	MaxHits        uint64 // hits_addend of the request or of a descriptor
}

func (b Bounds) withDefaults() Bounds {
	orDefault := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	orDefault(&b.MaxDomainLen, DefaultMaxDomainLen)
	orDefault(&b.MaxDescriptors, DefaultMaxDescriptors)
	orDefault(&b.MaxEntries, DefaultMaxEntries)
	orDefault(&b.MaxKeyLen, DefaultMaxKeyLen)
	orDefault(&b.MaxValueLen, DefaultMaxValueLen)
	if b.MaxHits == 0 {
		b.MaxHits = DefaultMaxHits
	}
	return b
}

// check returns the first way req breaks the bounds or the API, or nil.
func (b *Bounds) check(req *rlsv3.RateLimitRequest) *wire.BadRequest {
	switch n := len(req.Domain); {
	case n == 0:
		return wire.Bad("domain", "must not be empty")
	case n > b.MaxDomainLen:
		return wire.Bad("domain", "is %d bytes long; at most %d are accepted", n, b.MaxDomainLen)
	}
	switch n := len(req.Descriptors); {
	case n == 0:
		return wire.Bad("descriptors", "none given; a request carries 1 to %d", b.MaxDescriptors)
	case n > b.MaxDescriptors:
		return wire.Bad("descriptors", "%d given; at most %d are accepted", n, b.MaxDescriptors)
	}
	if h := uint64(req.HitsAddend); h > b.MaxHits {
		return wire.Bad("hits_addend", "is %d; at most %d are accepted", h, b.MaxHits)
	}
	for i, d := range req.Descriptors {
		switch n := len(d.GetEntries()); {
		case n == 0:
			return wire.Bad(fmt.Sprintf("descriptors[%d].entries", i), "none given; a descriptor carries 1 to %d", b.MaxEntries)
		case n > b.MaxEntries:
			return wire.Bad(fmt.Sprintf("descriptors[%d].entries", i), "%d given; at most %d are accepted", n, b.MaxEntries)
		}
		for j, e := range d.GetEntries() {
			switch n := len(e.GetKey()); {
			case n == 0:
				return wire.Bad(fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), "must not be empty")
			case n > b.MaxKeyLen:
				return wire.Bad(fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), "is %d bytes long; at most %d are accepted", n, b.MaxKeyLen)
			}
			if n := len(e.GetValue()); n > b.MaxValueLen {
				return wire.Bad(fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), "is %d bytes long; at most %d are accepted", n, b.MaxValueLen)
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.Value > b.MaxHits {
			return wire.Bad(fmt.Sprintf("descriptors[%d].hits_addend", i), "is %d; at most %d are accepted", h.Value, b.MaxHits)
		}
		if d.GetIsNegativeHits() {
			return wire.Bad(fmt.Sprintf("descriptors[%d].is_negative_hits", i), "refunds are not supported; send positive hits only")
		}
		if o := d.GetLimit(); o != nil {
			if err := checkOverride(o, fmt.Sprintf("descriptors[%d].limit", i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkOverride validates a descriptor's limit override.
func checkOverride(o *rlv3.RateLimitDescriptor_RateLimitOverride, field string) *wire.BadRequest {
	unit := overrideUnit(o.Unit)
	if unit == 0 {
		return wire.Bad(field+".unit", "is %s; accepted: SECOND, MINUTE, HOUR, DAY, MONTH, YEAR", o.Unit)
	}
	if m := o.GetUnitMultiplier(); m != nil {
		if m.Value == 0 {
			return wire.Bad(field+".unit_multiplier", "is 0; it must be at least 1 (or unset)")
		}
		if time.Duration(m.Value) > config.MaxWindow/unit.Duration() {
			return wire.Bad(field+".unit_multiplier", "%d %ss is longer than the longest window, 100 years", m.Value, unit)
		}
	}
	return nil
}

// overrideUnit maps an override's unit to the rule-file unit, or 0 for
// UNKNOWN and values this build does not know.
func overrideUnit(u typev3.RateLimitUnit) config.Unit {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return config.Second
	case typev3.RateLimitUnit_MINUTE:
		return config.Minute
	case typev3.RateLimitUnit_HOUR:
		return config.Hour
	case typev3.RateLimitUnit_DAY:
		return config.Day
	case typev3.RateLimitUnit_MONTH:
		return config.Month
	case typev3.RateLimitUnit_YEAR:
		return config.Year
	}
	return 0
}
