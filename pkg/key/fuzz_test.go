package key

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// counter is everything that names one counter: a descriptor of a domain,
// and the algorithm and window of the limit it is counted under.
type counter struct {
	Domain    string
	Entries   []entry
	Algorithm algo.Algorithm
	Window    time.Duration
}

// key encodes c as the service does.
func (c counter) key() string {
	b := AppendDomain(nil, c.Domain)
	for _, e := range c.Entries {
		if e.Shared {
			b = AppendShared(b, e.K, e.V)
		} else {
			b = AppendEntry(b, e.K, e.V)
		}
	}
	return string(AppendLimit(b, algo.Limit{Algorithm: c.Algorithm, Window: c.Window}))
}

// window is a window as the key tells windows apart: whole seconds, or
// else whole microseconds (the unit the algorithms count in). Two limits
// whose windows differ by less than a microsecond are the same limit.
type window struct {
	wholeSeconds bool
	n            int64
}

func windowOf(w time.Duration) window {
	if w%time.Second == 0 {
		return window{true, int64(w / time.Second)}
	}
	return window{false, w.Microseconds()}
}

// same reports whether a and b name the same counter. A concurrency
// limit's window is its lease TTL, which does not name its counter.
func (c counter) same(o counter) bool {
	return c.Domain == o.Domain && slices.Equal(c.Entries, o.Entries) && c.Algorithm == o.Algorithm &&
		(c.Algorithm == algo.Concurrency || windowOf(c.Window) == windowOf(o.Window))
}

// fuzzCounter builds a counter from fuzz inputs. Its strings (the domain,
// then each entry's key and value) are consecutive pieces of flat: byte i
// of lens (least significant first) is the length of piece i, capped by
// what is left, and the last piece takes the rest. Two counters cut from
// the same flat at different places are what joining keys with a
// separator cannot tell apart. It has 1 + n%3 entries; bit i of shared
// makes entry i a shared wildcard pattern.
func fuzzCounter(flat string, lens uint64, n, shared, alg uint8, window int64) counter {
	entries := 1 + int(n%3)
	pieces := make([]string, 1+2*entries)
	for i := range pieces {
		l := len(flat)
		if i < len(pieces)-1 {
			l = min(int(lens>>(8*i)&0xff), len(flat))
		}
		pieces[i], flat = flat[:l], flat[l:]
	}
	c := counter{Domain: pieces[0], Algorithm: algo.Algorithm(alg), Window: time.Duration(window)}
	for i := range entries {
		c.Entries = append(c.Entries, entry{Shared: shared>>i&1 == 1, K: pieces[1+2*i], V: pieces[2+2*i]})
	}
	return c
}

// FuzzDistinctDescriptorsDistinctKeys builds two counters from the fuzz
// inputs and checks that their keys are equal exactly when the counters
// are: the domain, the number of entries, each entry's key, value and
// shared flag, the algorithm and the window (to the microsecond, as
// [AppendLimit] writes it). A collision would make two descriptors share
// one counter; keys differing for one counter would split it.
func FuzzDistinctDescriptorsDistinctKeys(f *testing.F) {
	// More seeds, each named for the trap it sets, are in
	// testdata/fuzz/FuzzDistinctDescriptorsDistinctKeys.
	// flatA, flatB, lensA, lensB, nA, nB, sharedA, sharedB, algA, algB, windowA, windowB
	day := int64(24 * time.Hour)
	f.Add("messagingto_number2061111111", "messagingto_number2061111111", uint64(0x0909), uint64(0x0909), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), day, day)
	f.Fuzz(func(t *testing.T, flatA, flatB string, lensA, lensB uint64, nA, nB, sharedA, sharedB, algA, algB uint8, windowA, windowB int64) {
		a := fuzzCounter(flatA, lensA, nA, sharedA, algA, windowA)
		b := fuzzCounter(flatB, lensB, nB, sharedB, algB, windowB)
		ka, kb := a.key(), b.key()
		switch same := a.same(b); {
		case same && ka != kb:
			t.Fatalf("one counter, two keys:\n%s\n%s\n%s", show(a), ka, kb)
		case !same && ka == kb:
			t.Fatalf("two counters share key %q:\n%s\n%s", ka, show(a), show(b))
		}
	})
}

func show(c counter) string {
	return fmt.Sprintf("domain %q entries %+v algorithm %v window %v", c.Domain, c.Entries, c.Algorithm, c.Window)
}
