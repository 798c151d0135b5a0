package key

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// descriptor is everything a key encodes.
type descriptor struct {
	Domain  string
	Entries []entry
	Limit   string // "<algorithm>/<window>"
}

type entry struct {
	Shared bool
	K, V   string
}

func encode(d descriptor, l algo.Limit) string {
	b := AppendDomain(nil, d.Domain)
	for _, e := range d.Entries {
		if e.Shared {
			b = AppendShared(b, e.K, e.V)
		} else {
			b = AppendEntry(b, e.K, e.V)
		}
	}
	return string(AppendLimit(b, l))
}

// decode inverts encode. That a decoder exists proves the encoding
// injective: equal keys decode to equal descriptors.
func decode(s string) (descriptor, error) {
	var d descriptor
	var err error
	if d.Domain, s, err = decodeString(s); err != nil {
		return d, err
	}
	for len(s) > 0 && s[0] != '|' {
		var e entry
		switch s[0] {
		case '=':
		case '*':
			e.Shared = true
		default:
			return d, errors.New("bad entry tag")
		}
		if e.K, s, err = decodeString(s[1:]); err != nil {
			return d, err
		}
		if e.V, s, err = decodeString(s); err != nil {
			return d, err
		}
		d.Entries = append(d.Entries, e)
	}
	if len(s) == 0 {
		return d, errors.New("missing limit")
	}
	d.Limit = s[1:]
	return d, nil
}

func decodeString(s string) (string, string, error) {
	n, rest, ok := strings.Cut(s, ":")
	if !ok {
		return "", "", errors.New("missing length")
	}
	l, err := strconv.Atoi(n)
	if err != nil || l < 0 || l > len(rest) {
		return "", "", errors.New("bad length")
	}
	return rest[:l], rest[l:], nil
}

var perDay = algo.Limit{Requests: 5, Window: 24 * time.Hour}

func TestEncodingIsReadable(t *testing.T) {
	got := encode(descriptor{Domain: "messaging", Entries: []entry{{K: "to_number", V: "2061111111"}}}, perDay)
	want := "9:messaging=9:to_number10:2061111111|fixed_window/86400s"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	got = encode(descriptor{Domain: "d", Entries: []entry{{Shared: true, K: "path", V: "/files/*"}}},
		algo.Limit{Window: 1500 * time.Millisecond})
	if want := "1:d*4:path8:/files/*|fixed_window/1500000us"; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	// A concurrency limit's TTL is no part of its key.
	got = encode(descriptor{Domain: "d", Entries: []entry{{K: "export"}}}, algo.Limit{Algorithm: algo.Concurrency, Requests: 20, Window: 30 * time.Second})
	if want := "1:d=6:export0:|concurrency"; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestDistinctDescriptorsNeverCollide(t *testing.T) {
	cases := []struct {
		name string
		a, b descriptor
	}{
		{"underscore joins", descriptor{"d", []entry{{K: "a", V: "b_c"}}, ""}, descriptor{"d", []entry{{K: "a_b", V: "c"}}, ""}},
		{"domain vs key", descriptor{"d_a", []entry{{K: "b", V: "c"}}, ""}, descriptor{"d", []entry{{K: "a_b", V: "c"}}, ""}},
		{"separator inside value", descriptor{"d", []entry{{K: "a", V: "1:b"}}, ""}, descriptor{"d", []entry{{K: "a", V: "1"}, {K: "b", V: ""}}, ""}},
		{"shared pattern vs literal value", descriptor{"d", []entry{{Shared: true, K: "p", V: "x*"}}, ""}, descriptor{"d", []entry{{K: "p", V: "x*"}}, ""}},
		{"entry split", descriptor{"d", []entry{{K: "ab", V: ""}}, ""}, descriptor{"d", []entry{{K: "a", V: "b"}}, ""}},
		{"empty vs missing entry", descriptor{"d", nil, ""}, descriptor{"d", []entry{{}}, ""}},
	}
	for _, c := range cases {
		if ka, kb := encode(c.a, perDay), encode(c.b, perDay); ka == kb {
			t.Errorf("%s: both encode to %q", c.name, ka)
		}
	}
	d := descriptor{Domain: "d", Entries: []entry{{K: "k", V: "v"}}}
	if encode(d, perDay) == encode(d, algo.Limit{Requests: 5, Window: time.Hour}) {
		t.Error("limits of different windows share a key")
	}
	if encode(d, perDay) != encode(d, algo.Limit{Requests: 500, Window: 24 * time.Hour}) {
		t.Error("changing only N changed the key; counts would restart on every limit change")
	}
}

func FuzzRoundTrip(f *testing.F) {
	f.Add("messaging", "message_type", "marketing", "to_number", "2061111111", uint8(2), false, int64(86400))
	f.Add("d", "a", "b_c", "a_b", "c", uint8(2), true, int64(1))
	f.Add("", "", "", "", "", uint8(0), false, int64(0))
	f.Add("1:x", "=3:", "|a", "*", ":", uint8(1), true, int64(-5))
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, n uint8, shared bool, window int64) {
		d := descriptor{Domain: domain}
		if n%3 >= 1 {
			d.Entries = append(d.Entries, entry{Shared: shared, K: k1, V: v1})
		}
		if n%3 == 2 {
			d.Entries = append(d.Entries, entry{K: k2, V: v2})
		}
		l := algo.Limit{Window: time.Duration(window) * time.Microsecond}
		s := encode(d, l)
		got, err := decode(s)
		if err != nil {
			t.Fatalf("decode(%q): %v", s, err)
		}
		d.Limit = got.Limit // the limit is checked against its own encoding below
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("round trip of %q:\n got %+v\nwant %+v", s, got, d)
		}
		if want := string(AppendLimit(nil, l))[1:]; got.Limit != want {
			t.Fatalf("limit %q, want %q", got.Limit, want)
		}
	})
}

func BenchmarkAppend(b *testing.B) {
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendDomain(buf[:0], "messaging")
		buf = AppendEntry(buf, "message_type", "marketing")
		buf = AppendEntry(buf, "to_number", "2061111111")
		buf = AppendLimit(buf, perDay)
	}
}
