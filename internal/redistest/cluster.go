package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// Cluster is a Redis Cluster of masters without replicas, each a Node.
type Cluster struct {
	// Nodes are the masters, in the order they were started.
	Nodes []*Node
	// Seeds are the nodes' addresses, 127.0.0.1:port.
	Seeds []string
	// URL lists the nodes as comma-separated redis://addr URLs.
	URL string
}

// StartCluster starts masters (at least 3) cluster-enabled redis-server
// nodes, joins them with redis-cli --cluster create, and returns once
// every node reports cluster_state:ok and sees all 16384 slots served.
// Without redis-server or redis-cli in PATH, t is skipped, or fails
// under CI=true.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("redistest: StartCluster(%d): redis-cli --cluster create needs at least 3 masters", masters)
	}
	bin := redisServer(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		unavailable(t, "no redis-cli in PATH to create a cluster (install it: apt-get install -y redis-tools)")
	}
	c := &Cluster{}
	for range masters {
		n, err := launch(t, bin, func(dir string) ([]string, int, error) {
			// The bus port is chosen too: the default, port+10000, can
			// be past 65535 or taken.
			ports, err := freePorts(2)
			if err != nil {
				return nil, 0, err
			}
			return append(baseArgs(dir, ports[0]),
				"--cluster-enabled", "yes",
				"--cluster-config-file", "nodes.conf",
				"--cluster-node-timeout", "2000",
				"--cluster-port", strconv.Itoa(ports[1])), ports[0], nil
		}, probe{})
		if err != nil {
			t.Fatalf("redistest: starting cluster node %s: %v", bin, err)
		}
		c.Nodes = append(c.Nodes, n)
		c.Seeds = append(c.Seeds, n.Addr)
	}
	c.URL = "redis://" + strings.Join(c.Seeds, ",redis://")

	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Seeds...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: %s %s: %v\n%s", cli, strings.Join(args, " "), err, out)
	}
	c.Wait(t)
	return c
}

// Wait returns once every node of c answers cluster_state:ok and sees
// all 16384 slots served, or fails t after 20 s: after StartCluster, or
// after a node was restarted.
func (c *Cluster) Wait(t testing.TB) {
	t.Helper()
	for _, n := range c.Nodes {
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
