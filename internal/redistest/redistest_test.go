package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// client returns a go-redis client of opt, closed when t ends, that
// fails fast: the servers here are on loopback.
func client(t *testing.T, opt *redis.Options) *redis.Client {
	t.Helper()
	opt.Protocol, opt.DisableIdentity = 2, true
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 2*time.Second, 2*time.Second, 2*time.Second
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestStartAnswersPing(t *testing.T) {
	s := Start(t)
	opt, err := redis.ParseURL(s.URL)
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", s.URL, err)
	}
	if err := client(t, opt).Ping(ctx(t)).Err(); err != nil {
		t.Fatalf("PING %s: %v", s.URL, err)
	}
}

func TestNodeKillRestart(t *testing.T) {
	n := StartNode(t, "--maxmemory", "10mb")
	c := client(t, &redis.Options{Addr: n.Addr})
	if got, err := c.ConfigGet(ctx(t), "maxmemory").Result(); err != nil || got["maxmemory"] != "10485760" {
		t.Fatalf("CONFIG GET maxmemory = %v, %v; want the extra arg applied", got, err)
	}
	n.Kill(t)
	if err := c.Ping(ctx(t)).Err(); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	n.Kill(t) // a killed node: nothing to do
	n.Restart(t)
	if err := c.Ping(ctx(t)).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if got, err := c.ConfigGet(ctx(t), "maxmemory").Result(); err != nil || got["maxmemory"] != "10485760" {
		t.Fatalf("after Restart CONFIG GET maxmemory = %v, %v; want the same command line", got, err)
	}
}

func TestStartNodeReportsLog(t *testing.T) {
	// A failed start is reported with redis-server's own words.
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		StartNode(ft, "--no-such-option", "1")
	}()
	if !strings.Contains(ft.msg, "no-such-option") || !strings.Contains(ft.msg, "Bad directive") {
		t.Fatalf("StartNode with a bad option failed with %q; want redis-server's message", ft.msg)
	}
}

// TestClusterWithReplicas: each master gets its replica, in sync, and
// the options reach every node.
func TestClusterWithReplicas(t *testing.T) {
	t.Parallel()
	c := StartClusterWith(t, ClusterOptions{Masters: 3, Replicas: 1, Args: []string{"--cluster-require-full-coverage", "no"}})
	if len(c.Nodes) != 3 || len(c.Replicas) != 3 || len(c.ReplicaOf) != 3 {
		t.Fatalf("cluster = %+v; want 3 masters and 3 replicas", c)
	}
	replicated := map[int]bool{}
	for i, r := range c.Replicas {
		m, err := replicaOf(r.Addr)
		if err != nil || m != c.Nodes[c.ReplicaOf[i]].Addr {
			t.Errorf("replica %s replicates %q (%v), want %s", r.Addr, m, err, c.Nodes[c.ReplicaOf[i]].Addr)
		}
		replicated[c.ReplicaOf[i]] = true
	}
	if len(replicated) != 3 {
		t.Errorf("replicas of masters %v; want one of each", replicated)
	}
	for _, n := range append(c.Nodes, c.Replicas...) {
		if err := query(n.Addr, func(ctx context.Context, c *redis.Client) error {
			v, err := c.ConfigGet(ctx, "cluster-require-full-coverage").Result()
			if err == nil && v["cluster-require-full-coverage"] != "no" {
				err = fmt.Errorf("cluster-require-full-coverage is %q", v["cluster-require-full-coverage"])
			}
			return err
		}); err != nil {
			t.Errorf("node %s: %v", n.Addr, err)
		}
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	if len(c.Nodes) != 3 || len(c.Seeds) != 3 || strings.Count(c.URL, "redis://") != 3 {
		t.Fatalf("cluster = %+v; want 3 nodes, seeds and URLs", c)
	}
	for _, n := range c.Nodes {
		if role, err := roleOf(n.Addr); err != nil || role != "master" {
			t.Fatalf("ROLE of %s = %q, %v; want master", n.Addr, role, err)
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Seeds, Protocol: 2, DisableIdentity: true,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second,
	})
	defer cc.Close()
	for _, k := range []string{"a", "b", "c", "{user}1"} {
		if err := cc.Set(ctx(t), k, "v-"+k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		if got, err := cc.Get(ctx(t), k).Result(); err != nil || got != "v-"+k {
			t.Fatalf("GET %s = %q, %v", k, got, err)
		}
	}

	// A restarted node keeps its identity and slots through nodes.conf.
	n := c.Nodes[0]
	id := func() string {
		var s string
		if err := query(n.Addr, func(ctx context.Context, c *redis.Client) error {
			var err error
			s, err = c.Do(ctx, "CLUSTER", "MYID").Text()
			return err
		}); err != nil {
			t.Fatalf("CLUSTER MYID %s: %v", n.Addr, err)
		}
		return s
	}
	before := id()
	n.Kill(t)
	if _, err := os.Stat(filepath.Join(n.dir, "nodes.conf")); err != nil {
		t.Fatalf("nodes.conf of a killed node: %v", err)
	}
	n.Restart(t)
	if after := id(); after != before {
		t.Fatalf("CLUSTER MYID after Restart = %s, before %s", after, before)
	}
	c.Wait(t)
	if got, err := cc.Get(ctx(t), "a").Result(); err != nil || got != "v-a" {
		t.Fatalf("GET a after a restart = %q, %v", got, err)
	}
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t, 1, 3)
	if len(s.Replicas) != 1 || len(s.Sentinels) != 3 || strings.Count(s.URL, "redis://") != 3 {
		t.Fatalf("sentinel = %+v; want 1 replica and 3 sentinels", s)
	}
	var addrs []string
	for _, u := range strings.Split(s.URL, ",") {
		addrs = append(addrs, strings.TrimPrefix(u, "redis://"))
	}
	fc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: s.MasterName, SentinelAddrs: addrs, Protocol: 2, DisableIdentity: true,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second,
	})
	defer fc.Close()
	if err := fc.Set(ctx(t), "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the sentinels: %v", err)
	}
	for _, n := range s.Sentinels {
		if got, err := s.masterAddr(n.Addr); err != nil || got != s.Master.Addr {
			t.Fatalf("sentinel %s names master %q, %v; want %s", n.Addr, got, err, s.Master.Addr)
		}
	}

	old := s.Master.Addr
	start := time.Now()
	s.Master.Kill(t)
	got := s.WaitForFailover(t, old, 20*time.Second)
	t.Logf("failover from %s to %s took %v", old, got, time.Since(start).Round(time.Millisecond))
	if got != s.Replicas[0].Addr {
		t.Fatalf("WaitForFailover = %s; want the replica %s", got, s.Replicas[0].Addr)
	}
	if v, err := client(t, &redis.Options{Addr: got}).Get(ctx(t), "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET k on the new master = %q, %v; want the replicated value", v, err)
	}
}

func TestStartWithTLS(t *testing.T) {
	s := StartWith(t, Options{TLS: true})
	if !strings.HasPrefix(s.URL, "rediss://") || s.CAFile == "" {
		t.Fatalf("server = %+v; want a rediss:// URL and a CAFile", s)
	}
	pem, err := os.ReadFile(s.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("CAFile %s holds no PEM certificate", s.CAFile)
	}
	opt, err := redis.ParseURL(s.URL)
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", s.URL, err)
	}
	opt.TLSConfig.RootCAs = pool
	if err := client(t, opt).Ping(ctx(t)).Err(); err != nil {
		t.Fatalf("PING over TLS with the CA: %v", err)
	}
	if err := client(t, &redis.Options{Addr: s.Addr}).Ping(ctx(t)).Err(); err == nil {
		t.Fatal("PING without TLS succeeded")
	}
	if err := client(t, &redis.Options{Addr: s.Addr, TLSConfig: &tls.Config{}}).Ping(ctx(t)).Err(); err == nil {
		t.Fatal("PING over TLS without trusting the CA succeeded")
	}
}

func TestStartWithACL(t *testing.T) {
	s := StartWith(t, Options{User: "app", Password: "s3cret"})
	if !strings.HasPrefix(s.URL, "redis://app:s3cret@") {
		t.Fatalf("URL = %q; want redis://app:s3cret@...", s.URL)
	}
	opt, err := redis.ParseURL(s.URL)
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", s.URL, err)
	}
	if err := client(t, opt).Ping(ctx(t)).Err(); err != nil {
		t.Fatalf("PING as app: %v", err)
	}
	err = client(t, &redis.Options{Addr: s.Addr}).Ping(ctx(t)).Err()
	if err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("PING without a password: %v; want NOAUTH", err)
	}
	err = client(t, &redis.Options{Addr: s.Addr, Username: "app", Password: "wrong"}).Ping(ctx(t)).Err()
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("PING with a wrong password: %v; want WRONGPASS", err)
	}
	err = client(t, &redis.Options{Addr: s.Addr, Password: "s3cret"}).Ping(ctx(t)).Err()
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("PING as the default user: %v; want WRONGPASS (it is off)", err)
	}
}

func TestStartWithTLSAndPassword(t *testing.T) {
	s := StartWith(t, Options{TLS: true, Password: "pw"})
	if !strings.HasPrefix(s.URL, "rediss://:pw@") {
		t.Fatalf("URL = %q; want rediss://:pw@...", s.URL)
	}
	opt, err := redis.ParseURL(s.URL)
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", s.URL, err)
	}
	pem, _ := os.ReadFile(s.CAFile)
	opt.TLSConfig.RootCAs = x509.NewCertPool()
	opt.TLSConfig.RootCAs.AppendCertsFromPEM(pem)
	if err := client(t, opt).Ping(ctx(t)).Err(); err != nil {
		t.Fatalf("PING over TLS with the password: %v", err)
	}
}

// The fall-through paths run with a PATH that holds no real
// redis-server, and without CI=true, so they skip rather than fail.

func TestStartWithoutRedisServerSkips(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("REDIS_URL", "")
	t.Setenv("CI", "")
	var s *Server
	t.Run("start", func(t *testing.T) { s = Start(t) })
	// Where a Docker engine answers, Start ran a container instead;
	// here (Docker CLI, no engine) it must skip, not fail.
	if s != nil {
		t.Logf("a Docker engine answered: Start gave %s", s.URL)
	}
}

func TestStartWithTLSUnsupportedSkips(t *testing.T) {
	dir := t.TempDir()
	fake := "#!/bin/sh\n" +
		"echo '*** FATAL CONFIG FILE ERROR (Redis 7.0.15) ***' >&2\n" +
		"echo \">>> 'tls-port \\\"1\\\"'\" >&2\n" +
		"echo 'Bad directive or wrong number of arguments' >&2\n" +
		"exit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "redis-server"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	t.Setenv("CI", "")
	skipped := false
	t.Run("start", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		StartWith(t, Options{TLS: true})
	})
	if !skipped {
		t.Fatal("StartWith(TLS) on a redis-server without TLS did not skip")
	}
}

// fakeT records the message of Fatalf and stops the caller with a panic.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = strings.TrimSpace(fmt.Sprintf(format, args...))
	panic(f)
}

func TestHourEndWait(t *testing.T) {
	hour := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		now    time.Time
		margin time.Duration
		want   time.Duration
	}{
		{hour.Add(-5 * time.Second), 15 * time.Second, 6 * time.Second}, // the CI run that crossed 10:00
		{hour.Add(-15 * time.Second), 15 * time.Second, 0},
		{hour, 15 * time.Second, 0},
		{hour.Add(59*time.Minute + 50*time.Second), 30 * time.Second, 11 * time.Second},
	} {
		if got := hourEndWait(tc.now, tc.margin); got != tc.want {
			t.Errorf("hourEndWait(%v, %v) = %v, want %v", tc.now.Format(time.TimeOnly), tc.margin, got, tc.want)
		}
	}
}
