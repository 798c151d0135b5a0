package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
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
	node  string // the primary serving the slot, as the client's slot map says
	index []int  // positions in the batch
	keys  []string
	reqs  []algo.Request
	args  []any
	bound lateBound // the call's not-after instant
	cmd   *goredis.Cmd
}

// Gate is what [Backend.DecideVia] asks before it sends a call to the
// primaries of a Cluster, and tells afterwards how each fared: a circuit
// breaker's circuits, one per primary (package breaker).
type Gate interface {
	// Admit lets the call reach the primaries at nodes (host:port, "" for
	// slots the client has no map of), or says why not.
	Admit(nodes []string) error
	// Done reports how the call went on node: nil when it answered.
	Done(node string, err error)
}

// DecideVia decides as [Backend.Decide] does, through gate: on a Cluster,
// with the primaries the batch's slots map to, so that a circuit breaker
// keeps a circuit per primary and a dead one fails only the calls that
// reach it. A batch one of whose primaries gate refuses is sent nowhere:
// no part of it is counted. Elsewhere the server is one node, "".
//
// A refused or failed primary also asks the client to reload its slot
// map (CLUSTER SLOTS): a replica promoted in a dead primary's place is
// found within a reload (go-redis runs at most one at a time, 200 ms
// apart), not at the next periodic one.
func (b *Backend) DecideVia(ctx context.Context, gate Gate, reqs []algo.Request, out []algo.Decision) error {
	if b.cluster == nil || b.co != nil {
		if err := gate.Admit([]string{""}); err != nil {
			return err
		}
		err := b.Decide(ctx, reqs, out)
		gate.Done("", err)
		return err
	}
	if err := check(reqs, out); err != nil || len(reqs) == 0 {
		return err
	}
	var now time.Time
	if b.opts.Now != nil {
		now = b.opts.Now()
	}
	return b.decideCluster(ctx, now, reqs, out, gate)
}

// primary returns the address of the primary serving key's slot in the
// client's slot map, or "" when the client has none (no node answered).
func (b *Backend) primary(ctx context.Context, key string) string {
	c, err := b.cluster.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// decideCluster splits the batch by hash slot and pipelines one script call
// per slot: one round trip; each group is all or nothing on its own. With
// a gate, the primaries are admitted first and their outcomes reported.
func (b *Backend) decideCluster(ctx context.Context, now time.Time, reqs []algo.Request, out []algo.Decision, gate Gate) error {
	keys := make([]string, len(reqs))
	reqs = b.prepare(keys, reqs, true)
	var groupBuf [4]*slotGroup // the groups of most batches, on the stack
	groups := groupBySlot(groupBuf[:0], keys, reqs)
	start := time.Now()
	giveUp := b.giveUp(ctx, start)
	unbound := false // a group carries no not-after instant
	for _, g := range groups {
		g.bound = b.primaryBound(ctx, g.keys[0], start, giveUp)
		g.args = algo.AppendScriptArgs(make([]any, 0, 2+algo.ScriptArgsPerRequest*len(g.reqs)), now, b.minTTL, g.bound.notAfter, g.reqs)
		unbound = unbound || g.bound.notAfter.IsZero()
	}
	if unbound {
		var cancel context.CancelFunc
		ctx, cancel = endAtGiveUp(ctx, lateBound{}, giveUp)
		defer cancel()
	}
	nodes, err := b.admitPrimaries(ctx, gate, groups)
	if err != nil {
		return err
	}
	if len(groups) == 1 {
		return b.decideGroup(ctx, groups[0], out[:len(reqs)], gate)
	}
	functions := b.pipelineGroups(ctx, groups)
	var errs []error
	failed := make([]error, len(nodes)) // the first error of each node
	decided := make([]algo.Decision, len(reqs))
	reloaded := false
	for _, g := range groups {
		reply, err := b.groupReply(ctx, g, functions, &reloaded)
		if err == nil {
			_, err = algo.ParseScriptReply(reply, decided[:len(g.reqs)])
		}
		if err != nil {
			err = b.nodeFailed(ctx, g, err)
			errs = append(errs, err)
			if i := slices.Index(nodes, g.node); i >= 0 && failed[i] == nil {
				failed[i] = nodeVerdict(err)
			}
			continue
		}
		for j, i := range g.index {
			out[i] = decided[j]
		}
	}
	if gate != nil {
		for i, n := range nodes {
			gate.Done(n, failed[i])
		}
	}
	return errors.Join(errs...)
}

// groupBySlot groups the requests reqs of a batch, whose keys are keys,
// by hash slot, and appends the groups to groups in the order of their
// first request, each with its requests in batch order.
func groupBySlot(groups []*slotGroup, keys []string, reqs []algo.Request) []*slotGroup {
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
	return groups
}

// admitPrimaries names the primary of each group and returns them, each
// once, once gate admits them; it returns gate's error, having asked the
// client to reload its slot map, when gate refuses them. Without a gate
// it names none.
func (b *Backend) admitPrimaries(ctx context.Context, gate Gate, groups []*slotGroup) ([]string, error) {
	if gate == nil {
		return nil, nil
	}
	var nodes []string
	for _, g := range groups {
		g.node = b.primary(ctx, g.keys[0])
		if !slices.Contains(nodes, g.node) {
			nodes = append(nodes, g.node)
		}
	}
	if err := gate.Admit(nodes); err != nil {
		// The slot map may name a primary that was replaced.
		b.cluster.ReloadState(ctx)
		return nil, err
	}
	return nodes, nil
}

// decideGroup decides a batch whose requests all share g's slot with one
// call, and reports its outcome to gate (nil: none).
func (b *Backend) decideGroup(ctx context.Context, g *slotGroup, out []algo.Decision, gate Gate) error {
	reply, err := b.run(ctx, b.cluster, g.keys, g.args)
	if err == nil {
		_, err = algo.ParseScriptReply(reply, out)
	}
	if err != nil {
		b.checkLate(g.bound, err)
		err = b.nodeFailed(ctx, g, err)
	}
	if gate != nil {
		gate.Done(g.node, nodeVerdict(err))
	}
	return err
}

// pipelineGroups sends the call of every group in one pipeline, setting
// each group's cmd; functions reports whether they call the library's
// function rather than the script.
func (b *Backend) pipelineGroups(ctx context.Context, groups []*slotGroup) (functions bool) {
	functions = !b.scripts.Load()
	pipe := b.cluster.Pipeline()
	for _, g := range groups {
		if functions {
			g.cmd = pipe.FCall(ctx, b.fn, g.keys, g.args...)
		} else {
			g.cmd = pipe.EvalSha(ctx, b.sha, g.keys, g.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command's own error is read by groupReply
	return functions
}

// groupReply returns the reply of g's pipelined call (functions: of the
// function), calling g again where its master lost the script or the
// function, or runs no functions. The first group that finds the
// function lost loads the library on every master, and sets reloaded.
func (b *Backend) groupReply(ctx context.Context, g *slotGroup, functions bool, reloaded *bool) ([]any, error) {
	reply, err := g.cmd.Slice()
	switch {
	case isNoScript(err):
		// EVAL runs the group and caches the script on its master.
		reply, err = b.cluster.Eval(ctx, b.script, g.keys, g.args...).Slice()
	case functions && isNoFunction(err) && !*reloaded:
		// Lost on some master: load the library everywhere, once.
		*reloaded = true
		if lerr := b.loadLibrary(ctx); unsupported(lerr) {
			b.scripts.Store(true)
		}
		fallthrough
	case functions && (isNoFunction(err) || unsupported(err)):
		// run calls the function, or falls back to the script.
		reply, err = b.run(ctx, b.cluster, g.keys, g.args)
	}
	if err != nil {
		b.checkLate(g.bound, err)
		err = fmt.Errorf("redis: decision call: %w", err)
	}
	return reply, err
}

// nodeFailed names the group's slot (and primary, when known) in err, and
// asks the client to reload its slot map when err says the primary may
// be gone or the Cluster is changing.
func (b *Backend) nodeFailed(ctx context.Context, g *slotGroup, err error) error {
	var reply goredis.Error
	if !errors.As(err, &reply) || clusterChanging(err) {
		b.cluster.ReloadState(ctx)
	}
	if g.node != "" {
		return fmt.Errorf("primary %s, slot %d: %w", g.node, g.slot, err)
	}
	return fmt.Errorf("slot %d: %w", g.slot, err)
}

// nodeVerdict is what a primary's failure err says of the primary itself:
// nothing when it answered that the Cluster is changing (CLUSTERDOWN while
// a failed primary is replaced, TRYAGAIN while a slot moves). Such an
// answer is quick, the primary is alive, and its keys are decided again
// the moment the Cluster is whole; opening its circuit would only add a
// cooldown.
func nodeVerdict(err error) error {
	if clusterChanging(err) {
		return nil
	}
	return err
}

// clusterChanging reports whether err is a Cluster's answer that its
// configuration is changing: CLUSTERDOWN or TRYAGAIN.
func clusterChanging(err error) bool {
	return err != nil && (goredis.HasErrorPrefix(err, "CLUSTERDOWN") || goredis.HasErrorPrefix(err, "TRYAGAIN") ||
		strings.Contains(err.Error(), "CLUSTERDOWN") || strings.Contains(err.Error(), "TRYAGAIN"))
}

// scriptSHA is the SHA1 digest Redis names a script by.
func scriptSHA(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}
