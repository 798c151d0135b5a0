package console

import (
	"encoding/binary"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// A refused descriptor is kept in the sketch as one byte string: a flags
// byte (keyCut when the encoding was cut at maxKeyBytes), then the domain,
// the rule ID ("" for a limit override) and each entry's key and value,
// each as a uvarint length and its bytes. Distinct descriptors have
// distinct encodings unless both were cut at the same place.
const keyCut = 1

// appendKey appends the encoding of a refused descriptor to buf, at most
// maxKeyBytes in all: it never grows buf beyond that, so a buffer of that
// capacity on the caller's stack takes it without allocating.
func appendKey(buf []byte, domain, rule string, entries []*rlv3.RateLimitDescriptor_Entry) []byte {
	start := len(buf)
	buf = append(buf, 0)
	var ok bool
	if buf, ok = appendField(buf, start, domain); !ok {
		return cut(buf, start)
	}
	if buf, ok = appendField(buf, start, rule); !ok {
		return cut(buf, start)
	}
	for _, e := range entries {
		if buf, ok = appendField(buf, start, e.GetKey()); !ok {
			return cut(buf, start)
		}
		if buf, ok = appendField(buf, start, e.GetValue()); !ok {
			return cut(buf, start)
		}
	}
	return buf
}

func cut(buf []byte, start int) []byte {
	buf[start] |= keyCut
	return buf
}

// appendField appends s with its length, cut to what fits in maxKeyBytes
// from start; false when it was cut (or did not fit at all).
func appendField(buf []byte, start int, s string) ([]byte, bool) {
	const lenRoom = 2 // a uvarint of a length below maxKeyBytes
	room := maxKeyBytes - (len(buf) - start) - lenRoom
	if room < 0 {
		return buf, false
	}
	whole := len(s) <= room
	if !whole {
		s = s[:room]
	}
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...), whole
}

// decodedKey is a refused descriptor, decoded.
type decodedKey struct {
	domain, rule string
	entries      []Entry
	cut          bool
}

// decodeKey decodes what appendKey encoded. A cut encoding may end with a
// key without its value.
func decodeKey(b string) decodedKey {
	var k decodedKey
	if len(b) == 0 {
		return k
	}
	k.cut = b[0]&keyCut != 0
	b = b[1:]
	var fields []string
	for len(b) > 0 {
		n, w := binary.Uvarint([]byte(b[:min(len(b), binary.MaxVarintLen64)]))
		if w <= 0 || n > uint64(len(b)-w) {
			k.cut = true // not an encoding of appendKey's
			break
		}
		fields = append(fields, b[w:w+int(n)])
		b = b[w+int(n):]
	}
	if len(fields) > 0 {
		k.domain = fields[0]
	}
	if len(fields) > 1 {
		k.rule = fields[1]
	}
	for i := 2; i < len(fields); i += 2 {
		e := Entry{Key: fields[i]}
		if i+1 < len(fields) {
			e.Value = fields[i+1]
		}
		k.entries = append(k.entries, e)
	}
	return k
}
