package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// Cluster is a Redis Cluster of masters, each a Node, with the replicas
// StartClusterWith was asked for.
type Cluster struct {
	// Nodes are the masters as created, in the order they were started.
	// After a failover one of them may be a replica: ask the nodes.
	Nodes []*Node
	// Replicas are the replicas as created; Replicas[i] replicates
	// ReplicaOf[i], an index into Nodes.
	Replicas  []*Node
	ReplicaOf []int
	// Seeds are the masters' addresses, 127.0.0.1:port.
	Seeds []string
	// URL lists the masters as comma-separated redis://addr URLs.
	URL string
}

// ClusterOptions ask StartClusterWith for a Cluster.
type ClusterOptions struct {
	// Masters is the number of masters, at least 3.
	Masters int
	// Replicas is the number of replicas of each master.
	Replicas int
	// Args are added to every node's command line, such as
	// "--cluster-require-full-coverage", "no".
	Args []string
}

// StartCluster starts masters (at least 3) cluster-enabled redis-server
// nodes, joins them with redis-cli --cluster create, and returns once
// every node reports cluster_state:ok and sees all 16384 slots served.
// Without redis-server or redis-cli in PATH, t is skipped, or fails
// under CI=true.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{Masters: masters})
}

// StartClusterWith starts a Cluster as o asks: StartCluster, with
// o.Replicas replicas of each master and o.Args on every node's command
// line. It returns once every node reports cluster_state:ok and sees all
// 16384 slots served, and every replica is in sync with its master.
// Nodes fail over after 2 s of silence (cluster-node-timeout 2000).
func StartClusterWith(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	if o.Masters < 3 || o.Replicas < 0 {
		t.Fatalf("redistest: StartClusterWith(%+v): redis-cli --cluster create needs at least 3 masters", o)
	}
	bin := redisServer(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		unavailable(t, "no redis-cli in PATH to create a cluster (install it: apt-get install -y redis-tools)")
	}
	var all []*Node
	for range o.Masters * (1 + o.Replicas) {
		n, err := launch(t, bin, func(dir string) ([]string, int, error) {
			// The bus port is chosen too: the default, port+10000, can
			// be past 65535 or taken.
			ports, err := freePorts(2)
			if err != nil {
				return nil, 0, err
			}
			args := append(baseArgs(dir, ports[0]),
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "2000",
				"--cluster-port", strconv.Itoa(ports[1]))
			if o.Replicas > 0 {
				// Any of them may become master: none waits 5 s (the
				// default) for more replicas before a full sync.
				args = append(args, "--repl-diskless-sync-delay", "0")
			}
			return append(args, o.Args...), ports[0], nil
		}, probe{})
		if err != nil {
			t.Fatalf("redistest: starting cluster node %s: %v", bin, err)
		}
		all = append(all, n)
	}
	addrs := make([]string, len(all))
	for i, n := range all {
		addrs[i] = n.Addr
	}

	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: %s %s: %v\n%s", cli, strings.Join(args, " "), err, out)
	}
	c := &Cluster{}
	if o.Replicas == 0 {
		c.Nodes = all
	} else {
		// redis-cli chooses the masters: ask each node what it became.
		masterOf := map[string]string{}
		for _, n := range all {
			if err := waitUntil(topologyTimeout, "cluster node "+n.Addr+" knowing its role", func() error {
				m, err := replicaOf(n.Addr)
				masterOf[n.Addr] = m
				return err
			}); err != nil {
				t.Fatalf("redistest: %v", err)
			}
		}
		for _, n := range all {
			if masterOf[n.Addr] == "" {
				c.Nodes = append(c.Nodes, n)
			}
		}
		for _, n := range all {
			if m := masterOf[n.Addr]; m != "" {
				i := slices.IndexFunc(c.Nodes, func(x *Node) bool { return x.Addr == m })
				if i < 0 {
					t.Fatalf("redistest: cluster node %s replicates %s, which is not a master", n.Addr, m)
				}
				c.Replicas = append(c.Replicas, n)
				c.ReplicaOf = append(c.ReplicaOf, i)
			}
		}
		if len(c.Nodes) != o.Masters {
			t.Fatalf("redistest: redis-cli made %d masters of %d nodes, want %d", len(c.Nodes), len(all), o.Masters)
		}
	}
	for _, n := range c.Nodes {
		c.Seeds = append(c.Seeds, n.Addr)
	}
	c.URL = "redis://" + strings.Join(c.Seeds, ",redis://")
	c.Wait(t)
	return c
}

// replicaOf returns the master a cluster node at addr replicates, as
// host:port, with its link up; "" for a master. A replica whose link is
// not up yet is an error, so that callers wait.
func replicaOf(addr string) (string, error) {
	var master string
	err := query(addr, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if infoField(info, "role") != "slave" {
			return nil
		}
		if s := infoField(info, "master_link_status"); s != "up" {
			return fmt.Errorf("INFO replication says master_link_status:%s", s)
		}
		master = net.JoinHostPort(infoField(info, "master_host"), infoField(info, "master_port"))
		return nil
	})
	return master, err
}

// WaitForPromotion polls the replicas of the master Nodes[i] until one
// answers ROLE master, and returns it with the time it was first seen so
// (to within 10 ms). It fails t when timeout passes first.
func (c *Cluster) WaitForPromotion(t testing.TB, i int, timeout time.Duration) (*Node, time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for j, r := range c.Replicas {
			if c.ReplicaOf[j] != i {
				continue
			}
			if role, err := roleOf(r.Addr); err == nil && role == "master" {
				return r, time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no replica of %s became master within %v", c.Nodes[i].Addr, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Wait returns once every node of c (masters and replicas) answers
// cluster_state:ok and sees all 16384 slots served, or fails t after 20 s:
// after StartCluster, or after a node was restarted.
func (c *Cluster) Wait(t testing.TB) {
	t.Helper()
	for _, n := range append(slices.Clip(c.Nodes), c.Replicas...) {
		if err := waitUntil(topologyTimeout, "cluster node "+n.Addr+" ready", func() error {
			return clusterReady(n.Addr)
		}); err != nil {
			t.Fatalf("redistest: %v", err)
		}
	}
}

// clusterReady tells whether the node at addr reports the cluster ok and
// every slot served.
func clusterReady(addr string) error {
	return query(addr, func(ctx context.Context, c *redis.Client) error {
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		if state := infoField(info, "cluster_state"); state != "ok" {
			return fmt.Errorf("CLUSTER INFO says cluster_state:%s", state)
		}
		// cluster_slots_ok counts the assigned slots whose master is up.
		if ok := infoField(info, "cluster_slots_ok"); ok != strconv.Itoa(clusterSlots) {
			return fmt.Errorf("CLUSTER INFO says cluster_slots_ok:%s of %d", ok, clusterSlots)
		}
		return nil
	})
}
