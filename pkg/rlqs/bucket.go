package rlqs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Bounds of a bucket id, the same as an RLS descriptor's (SPEC section 7).
const (
	maxEntries  = 16
	maxKeyLen   = 1024
	maxValueLen = 1024
)

// bucketDescriptor is a bucket id's entries sorted by key: the descriptor
// that decides the bucket. It implements config.Descriptor.
type bucketDescriptor []entry

type entry struct{ key, value string }

func (d bucketDescriptor) Len() int { return len(d) }

func (d bucketDescriptor) Entry(i int) (string, string) { return d[i].key, d[i].value }

// errNotUTF8 is the error of a bucket id holding a key or value that is
// not UTF-8 (see Server.handle).
var errNotUTF8 = errors.New("not UTF-8")

// newBucketDescriptor sorts the entries of bucket id m by key, or says what
// is wrong with it.
func newBucketDescriptor(m map[string]string) (bucketDescriptor, error) {
	switch {
	case len(m) == 0:
		return nil, fmt.Errorf("bucket_id is empty: it needs 1 to %d entries", maxEntries)
	case len(m) > maxEntries:
		return nil, fmt.Errorf("bucket_id has %d entries: at most %d are accepted", len(m), maxEntries)
	}
	d := make(bucketDescriptor, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		switch {
		case k == "":
			return nil, fmt.Errorf("bucket_id has an empty key: keys need 1 to %d bytes", maxKeyLen)
		case len(k) > maxKeyLen:
			return nil, fmt.Errorf("bucket_id key of %d bytes: at most %d are accepted", len(k), maxKeyLen)
		case len(v) > maxValueLen:
			return nil, fmt.Errorf("bucket_id value of key %q has %d bytes: at most %d are accepted", k, len(v), maxValueLen)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return nil, fmt.Errorf("bucket_id entry %q: %q: %w", k, v, errNotUTF8)
		}
		d = append(d, entry{k, v})
	}
	return d, nil
}

// key encodes the descriptor so that two different bucket ids never share
// a key: every key and value is length-prefixed.
func (d bucketDescriptor) key() string {
	var b []byte
	for _, e := range d {
		b = appendEntry(b, e.key, e.value)
	}
	return string(b)
}

func appendEntry(b []byte, k, v string) []byte {
	b = strconv.AppendInt(b, int64(len(k)), 10)
	b = append(b, ':')
	b = append(b, k...)
	b = strconv.AppendInt(b, int64(len(v)), 10)
	b = append(b, ':')
	return append(b, v...)
}

// appendBucketKey appends to b the key of bucket id m, the same as its
// descriptor's key, without building the descriptor: a stream's known
// buckets are found with it at every report. ok is false, and nothing is
// appended, when m has no entries or more than maxEntries (then
// newBucketDescriptor says what is wrong).
func appendBucketKey(b []byte, m map[string]string) (_ []byte, ok bool) {
	if len(m) == 0 || len(m) > maxEntries {
		return b, false
	}
	var arr [maxEntries]string
	keys := arr[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = appendEntry(b, k, m[k])
	}
	return b, true
}

// String renders the descriptor as the RLS documentation writes one:
// [(k1, v1), (k2, v2)].
func (d bucketDescriptor) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for i, e := range d {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%s, %s)", e.key, e.value)
	}
	b.WriteByte(']')
	return b.String()
}
