package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// HashTag chooses the part of a key a Redis Cluster hashes to place it:
// keys with one hash tag share a slot, and only keys of one slot can be
// decided by one atomic script call.
type HashTag int

const (
	// TagDescriptor, the default, hashes the domain and the descriptor's
	// entries: every limit of one descriptor shares a slot, so a rule's
	// several limits are decided together, while different descriptors
	// spread over the masters.
	TagDescriptor HashTag = iota
	// TagDomain hashes only the domain: every key of a domain shares a
	// slot, so a request's descriptors are decided together, all or
	// nothing, as on one Redis server, at the price of putting the whole
	// domain's traffic on one master.
	TagDomain
)

// ParseHashTag reads "descriptor" or "domain".
func ParseHashTag(s string) (HashTag, error) {
	switch s {
	case "descriptor":
		return TagDescriptor, nil
	case "domain":
		return TagDomain, nil
	}
	return 0, fmt.Errorf("unknown hash tag %q; accepted: descriptor, domain", s)
}

// String returns the name ParseHashTag reads.
func (h HashTag) String() string {
	if h == TagDomain {
		return "domain"
	}
	return "descriptor"
}

// clusterKey returns the Redis key of k with its hash tag: the prefix, then
// the tagged part of k in braces, then the rest. The tagged part is the
// domain, or the domain and entries (everything before the limit). The
// prefix's own hash tag, if it has one, comes first and so wins.
func (b *Backend) clusterKey(k []byte) string {
	end := len(k)
	switch b.opts.HashTag {
	case TagDomain:
		end = domainEnd(k)
	default:
		// The limit suffix "|algorithm/window" holds no "|": the last one
		// starts it (package key).
		if i := strings.LastIndexByte(string(k), '|'); i > 0 {
			end = i
		}
	}
	var s strings.Builder
	s.Grow(len(b.opts.Prefix) + len(k) + 2)
	s.WriteString(b.opts.Prefix)
	s.WriteByte('{')
	s.Write(k[:end])
	s.WriteByte('}')
	s.Write(k[end:])
	return s.String()
}

// domainEnd returns where the length-prefixed domain ("9:messaging") that
// starts a key ends, or len(k) when k does not start with one.
func domainEnd(k []byte) int {
	colon := strings.IndexByte(string(k), ':')
	if colon < 1 {
		return len(k)
	}
	n, err := strconv.Atoi(string(k[:colon]))
	if err != nil || n < 0 || colon+1+n > len(k) {
		return len(k)
	}
	return colon + 1 + n
}

// slotCount is the number of hash slots of a Redis Cluster.
const slotCount = 16384

// slot returns the Cluster hash slot of key: CRC16 of its hash tag (the
// bytes between the first "{" and the next "}", when not empty) or of the
// whole key, modulo 16384.
func slot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	return int(crc16(key) % slotCount)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum Redis Cluster places keys by.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// slotGroup is the requests of a batch that share a hash slot, in batch
// order, with their script call.
type slotGroup struct {
	slot  int
	index []int // positions in the batch
	keys  []string
	reqs  []algo.Request
	args  []any
	cmd   *goredis.Cmd
}

// decideCluster splits the batch by hash slot and pipelines one script call
// per slot: one round trip; each group is all or nothing on its own.
func (b *Backend) decideCluster(ctx context.Context, now time.Time, reqs []algo.Request, out []algo.Decision) error {
	var groups []*slotGroup
	keys, reqs := b.prepare(reqs, true)
	for i := range reqs {
		k := keys[i]
		s := slot(k)
		var g *slotGroup
		for _, h := range groups {
			if h.slot == s {
				g = h
				break
			}
		}
		if g == nil {
			g = &slotGroup{slot: s}
			groups = append(groups, g)
		}
		g.index = append(g.index, i)
		g.keys = append(g.keys, k)
		g.reqs = append(g.reqs, reqs[i])
	}
	for _, g := range groups {
		g.args = algo.AppendScriptArgs(make([]any, 0, 2+algo.ScriptArgsPerRequest*len(g.reqs)), now, b.minTTL, g.reqs)
	}

	if len(groups) == 1 {
		reply, err := b.run(ctx, b.cluster, groups[0].keys, groups[0].args)
		if err != nil {
			return err
		}
		_, err = algo.ParseScriptReply(reply, out[:len(reqs)])
		return err
	}

	functions := !b.scripts.Load()
	pipe := b.cluster.Pipeline()
	for _, g := range groups {
		if functions {
			g.cmd = pipe.FCall(ctx, b.fn, g.keys, g.args...)
		} else {
			g.cmd = pipe.EvalSha(ctx, b.sha, g.keys, g.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command's own error is read below
	var errs []error
	decided := make([]algo.Decision, len(reqs))
	reloaded := false
	for _, g := range groups {
		reply, err := g.cmd.Slice()
		switch {
		case isNoScript(err):
			// EVAL runs the group and caches the script on its master.
			reply, err = b.cluster.Eval(ctx, b.script, g.keys, g.args...).Slice()
		case functions && isNoFunction(err) && !reloaded:
			// Lost on some master: load the library everywhere, once.
			reloaded = true
			if lerr := b.loadLibrary(ctx); unsupported(lerr) {
				b.scripts.Store(true)
			}
			fallthrough
		case functions && (isNoFunction(err) || unsupported(err)):
			// run calls the function, or falls back to the script.
			reply, err = b.run(ctx, b.cluster, g.keys, g.args)
		}
		if err != nil {
			err = fmt.Errorf("redis: decision call: %w", err)
		}
		if err == nil {
			_, err = algo.ParseScriptReply(reply, decided[:len(g.reqs)])
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("slot %d: %w", g.slot, err))
			continue
		}
		for j, i := range g.index {
			out[i] = decided[j]
		}
	}
	return errors.Join(errs...)
}

// scriptSHA is the SHA1 digest Redis names a script by.
func scriptSHA(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}
