package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is a master with replicas, watched by Sentinels; every one a
// Node.
type Sentinel struct {
	// MasterName is the name the sentinels monitor the master under.
	MasterName string
	// Master is the master as started. After a failover it is no longer
	// the master: ask the sentinels, or use WaitForFailover's answer.
	Master *Node
	// Replicas replicate Master.
	Replicas []*Node
	// Sentinels run redis-server --sentinel.
	Sentinels []*Node
	// URL lists the sentinels as comma-separated redis://addr URLs.
	URL string
}

// StartSentinel starts a master, replicas replicating it, and sentinels
// (at least 1) monitoring it with a quorum of sentinels/2+1, a master
// judged down after 1 s and a failover timeout of 5 s. It returns once
// every replica is online at the master and every sentinel knows the
// master, sees every replica up and linked, and knows the other
// sentinels. Without redis-server in PATH, t is skipped, or fails under
// CI=true.
func StartSentinel(t testing.TB, replicas, sentinels int) *Sentinel {
	t.Helper()
	if replicas < 0 || sentinels < 1 {
		t.Fatalf("redistest: StartSentinel(%d, %d): want replicas >= 0 and sentinels >= 1", replicas, sentinels)
	}
	bin := redisServer(t)
	// Any of them may become master: none waits 5 s (the default) for
	// more replicas before a full sync.
	fast := []string{"--repl-diskless-sync-delay", "0"}
	s := &Sentinel{MasterName: "mymaster", Master: StartNode(t, fast...)}
	host, port, _ := net.SplitHostPort(s.Master.Addr)
	for range replicas {
		s.Replicas = append(s.Replicas, StartNode(t, append(fast, "--replicaof", host, port)...))
	}
	if err := waitUntil(topologyTimeout, "replicas online at master "+s.Master.Addr, func() error {
		return replicasOnline(s.Master.Addr, replicas)
	}); err != nil {
		t.Fatalf("redistest: %v", err)
	}

	quorum := sentinels/2 + 1
	var addrs []string
	for range sentinels {
		n, err := launch(t, bin, func(dir string) ([]string, int, error) {
			ports, err := freePorts(1)
			if err != nil {
				return nil, 0, err
			}
			// Sentinel rewrites this file with what it learns; it is
			// kept, so a restarted sentinel remembers.
			conf := filepath.Join(dir, "sentinel.conf")
			name := s.MasterName
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %q\nlogfile %q\n", ports[0], dir, filepath.Join(dir, "redis.log")) +
				fmt.Sprintf("sentinel monitor %s %s %s %d\n", name, host, port, quorum) +
				fmt.Sprintf("sentinel down-after-milliseconds %s 1000\n", name) +
				fmt.Sprintf("sentinel failover-timeout %s 5000\n", name) +
				fmt.Sprintf("sentinel parallel-syncs %s 1\n", name)
			if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
				return nil, 0, err
			}
			return []string{conf, "--sentinel"}, ports[0], nil
		}, probe{})
		if err != nil {
			t.Fatalf("redistest: starting sentinel %s: %v", bin, err)
		}
		s.Sentinels = append(s.Sentinels, n)
		addrs = append(addrs, n.Addr)
	}
	s.URL = "redis://" + strings.Join(addrs, ",redis://")

	for _, n := range s.Sentinels {
		if err := waitUntil(topologyTimeout, "sentinel "+n.Addr+" knowing master, replicas and sentinels", func() error {
			return s.sentinelReady(n.Addr, replicas, sentinels-1)
		}); err != nil {
			t.Fatalf("redistest: %v", err)
		}
	}
	return s
}

// WaitForFailover polls the sentinels until one names a master other
// than old (an addr, 127.0.0.1:port) and that node answers ROLE master,
// and returns its addr. It fails t when timeout passes first.
func (s *Sentinel) WaitForFailover(t testing.TB, old string, timeout time.Duration) string {
	t.Helper()
	var addr string
	err := waitUntil(timeout, "a master other than "+old, func() error {
		var errs []string
		for _, n := range s.Sentinels {
			a, err := s.masterAddr(n.Addr)
			switch {
			case err != nil:
				errs = append(errs, fmt.Sprintf("sentinel %s: %v", n.Addr, err))
			case a == old:
				errs = append(errs, fmt.Sprintf("sentinel %s still names %s", n.Addr, a))
			default:
				role, err := roleOf(a)
				if err != nil || role != "master" {
					errs = append(errs, fmt.Sprintf("sentinel %s names %s, whose ROLE is %q (%v)", n.Addr, a, role, err))
					continue
				}
				addr = a
				return nil
			}
		}
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	})
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return addr
}

// masterAddr asks the sentinel at addr for the master's addr.
func (s *Sentinel) masterAddr(addr string) (string, error) {
	var a string
	err := querySentinel(addr, func(ctx context.Context, c *redis.SentinelClient) error {
		hp, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
		if err != nil {
			return err
		}
		if len(hp) != 2 {
			return fmt.Errorf("SENTINEL get-master-addr-by-name answered %q", hp)
		}
		a = net.JoinHostPort(hp[0], hp[1])
		return nil
	})
	return a, err
}

// sentinelReady tells whether the sentinel at addr names the master,
// sees replicas replicas up and linked, and knows others other
// sentinels.
func (s *Sentinel) sentinelReady(addr string, replicas, others int) error {
	m, err := s.masterAddr(addr)
	if err != nil {
		return err
	}
	if m != s.Master.Addr {
		return fmt.Errorf("it names master %s, want %s", m, s.Master.Addr)
	}
	return querySentinel(addr, func(ctx context.Context, c *redis.SentinelClient) error {
		rs, err := c.Replicas(ctx, s.MasterName).Result()
		if err != nil {
			return err
		}
		up := 0
		for _, r := range rs {
			if r["flags"] == "slave" && r["master-link-status"] == "ok" {
				up++
			}
		}
		if up != replicas {
			return fmt.Errorf("SENTINEL replicas lists %d up and linked, want %d: %v", up, replicas, rs)
		}
		if others == 0 {
			return nil
		}
		ss, err := c.Sentinels(ctx, s.MasterName).Result()
		if err != nil {
			return err
		}
		if len(ss) != others {
			return fmt.Errorf("SENTINEL sentinels lists %d, want %d", len(ss), others)
		}
		return nil
	})
}

// replicasOnline tells whether the master at addr has n replicas, all
// online.
func replicasOnline(addr string, n int) error {
	return query(addr, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if got := infoField(info, "connected_slaves"); got != strconv.Itoa(n) {
			return fmt.Errorf("INFO replication says connected_slaves:%s, want %d", got, n)
		}
		for i := range n {
			if v := infoField(info, "slave"+strconv.Itoa(i)); !strings.Contains(v, "state=online") {
				return fmt.Errorf("INFO replication says slave%d:%s", i, v)
			}
		}
		return nil
	})
}

// querySentinel is query for a sentinel.
func querySentinel(addr string, fn func(ctx context.Context, c *redis.SentinelClient) error) error {
	c := redis.NewSentinelClient(&redis.Options{
		Addr: addr, Protocol: 2, DisableIdentity: true,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaxRetries: -1, PoolSize: 1,
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return fn(ctx, c)
}
