package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// readyTimeout bounds how long a starting redis-server may take to
// answer.
const readyTimeout = 10 * time.Second

// Node is one redis-server process started by this package. It is killed
// when the test that started it ends.
type Node struct {
	// Addr is 127.0.0.1:port, the port clients use (the TLS port for a
	// TLS server).
	Addr string

	bin   string
	args  []string
	dir   string // the node's working dir: logs, nodes.conf, sentinel.conf
	probe probe

	mu   sync.Mutex
	cmd  *exec.Cmd  // nil while the node is not running
	done chan error // receives cmd.Wait's result
}

// StartNode starts redis-server from PATH on a free loopback port,
// without persistence, in a fresh t.TempDir() with its log there, adding
// args (e.g. "--replicaof", "127.0.0.1", "6379") to the command line. It
// returns once the node answers PING (an answer of NOAUTH counts, for
// nodes started with a password). Without redis-server in PATH, t is
// skipped, or fails under CI=true.
func StartNode(t testing.TB, args ...string) *Node {
	t.Helper()
	bin := redisServer(t)
	n, err := launch(t, bin, func(dir string) ([]string, int, error) {
		ports, err := freePorts(1)
		if err != nil {
			return nil, 0, err
		}
		return append(baseArgs(dir, ports[0]), args...), ports[0], nil
	}, probe{})
	if err != nil {
		t.Fatalf("redistest: starting %s: %v", bin, err)
	}
	return n
}

// Kill sends SIGKILL to the node and waits until the process has exited.
// Killing a node that is not running does nothing.
func (n *Node) Kill(t testing.TB) {
	t.Helper()
	if err := n.stop(); err != nil {
		t.Fatalf("redistest: killing %s: %v", n.Addr, err)
	}
}

// Restart starts a killed node again with the same port, directory and
// command line, so a cluster node finds its nodes.conf and a sentinel its
// rewritten config, and waits until it answers PING. Restarting a node
// that runs fails t: Kill it first.
func (n *Node) Restart(t testing.TB) {
	t.Helper()
	n.mu.Lock()
	running := n.cmd != nil
	n.mu.Unlock()
	if running {
		t.Fatalf("redistest: Restart of %s, which is running: Kill it first", n.Addr)
	}
	if err := n.spawn(); err != nil {
		t.Fatalf("redistest: restarting %s: %v", n.Addr, err)
	}
}

// Freeze stops the node with SIGSTOP: it keeps its connections, and the
// kernel keeps accepting new ones and queueing what clients send, but it
// runs nothing, as a Redis stalled by the machine. Thaw resumes it.
func (n *Node) Freeze(t testing.TB) {
	t.Helper()
	stop, _ := freezeSignals()
	n.signal(t, stop)
}

// Thaw resumes a node Freeze stopped (SIGCONT): it then runs what its
// clients sent meanwhile.
func (n *Node) Thaw(t testing.TB) {
	t.Helper()
	_, cont := freezeSignals()
	n.signal(t, cont)
}

func (n *Node) signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if sig == nil {
		t.Skip("redistest: this system has no SIGSTOP and SIGCONT to freeze a node with")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		t.Fatalf("redistest: %v to %s, which is not running", sig, n.Addr)
	}
	if err := n.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("redistest: %v to %s: %v", sig, n.Addr, err)
	}
}

// baseArgs is the command line every plain node starts from.
func baseArgs(dir string, port int) []string {
	return []string{
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"),
	}
}

// launch starts a node whose command line args makes for a fresh dir,
// with port the one clients use. A free port can be taken between being
// chosen and being bound, so it tries three times, each in a new dir.
func launch(t testing.TB, bin string, args func(dir string) (cmdline []string, port int, err error), p probe) (*Node, error) {
	t.Helper()
	var lastErr error
	for range 3 {
		dir := t.TempDir()
		cmdline, port, err := args(dir)
		if err != nil {
			return nil, err
		}
		n := &Node{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			bin:  bin, args: cmdline, dir: dir, probe: p,
		}
		t.Cleanup(func() { _ = n.stop() })
		if lastErr = n.spawn(); lastErr == nil {
			return n, nil
		}
	}
	return nil, lastErr
}

// spawn starts the process and waits until it is ready; on failure the
// process is gone and the error holds its output and log.
func (n *Node) spawn() error {
	out, err := os.OpenFile(filepath.Join(n.dir, "stdout.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(n.bin, n.args...)
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	out.Close() // the child has its own copy
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()

	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			n.mu.Lock()
			n.cmd, n.done = nil, nil
			n.mu.Unlock()
			return fmt.Errorf("redis-server on %s exited (%v)%s", n.Addr, err, n.logs())
		default:
		}
		if last = n.probe.check(n.Addr); last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = n.stop()
	return fmt.Errorf("redis-server on %s was not ready within %v (last try: %v)%s", n.Addr, readyTimeout, last, n.logs())
}

// stop kills the process, if any, and waits for it to exit.
func (n *Node) stop() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return nil
	}
	err := n.cmd.Process.Kill()
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-n.done
	n.cmd, n.done = nil, nil
	return nil
}

// logs returns the node's output and log for an error message: the last
// 8 KiB of each.
func (n *Node) logs() string {
	var s string
	for _, f := range []string{"stdout.log", "redis.log"} {
		b, err := os.ReadFile(filepath.Join(n.dir, f))
		if err != nil || len(b) == 0 {
			continue
		}
		if len(b) > 8<<10 {
			b = append([]byte("..."), b[len(b)-8<<10:]...)
		}
		s += fmt.Sprintf("\n--- %s:\n%s", filepath.Join(n.dir, f), b)
	}
	return s
}
