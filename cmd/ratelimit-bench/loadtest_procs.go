package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// child is a process the load test started.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done
	log  string        // where its output goes
}

func (ch *child) pid() int { return ch.cmd.Process.Pid }

// placement says whether a process the load test starts stands for one on
// this machine or for one that would run on machines of its own (a peer
// region's servers).
type placement bool

const (
	here placement = false
	// elsewhere runs the process at the lowest CPU priority (nice 19), so
	// that on a shared machine its work takes as little CPU as can be from
	// the processes measured, as it would take none on machines of its
	// own. Its CPU time is still reported.
	elsewhere placement = true
)

// start starts bin with args, its output into a log file of the load
// test's directory; the kernel kills it should the load test die without
// stopping it.
func (lt *loadtest) start(name, bin string, args []string, stderr io.Writer, where placement) (*child, error) {
	return lt.startEnv(name, bin, args, cleanEnv(), stderr, where)
}

// startEnv is start with the whole environment of the process given: env.
func (lt *loadtest) startEnv(name, bin string, args, env []string, stderr io.Writer, where placement) (*child, error) {
	if where == elsewhere {
		nice, err := exec.LookPath("nice")
		if err != nil {
			return nil, fmt.Errorf("starting %s at low priority: %w", name, err)
		}
		bin, args = nice, append([]string{"-n", "19", bin}, args...)
	}
	logPath := filepath.Join(lt.dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = lt.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	if stderr != nil {
		cmd.Stderr = io.MultiWriter(logf, stderr)
	}
	cmd.Env = env
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	ch := &child{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		ch.err = cmd.Wait()
		logf.Close() // only now: with stderr, the copy to the log runs until the end
		close(ch.done)
	}()
	lt.mu.Lock()
	lt.children = append(lt.children, ch)
	lt.mu.Unlock()
	return ch, nil
}

// cleanEnv is this process's environment without RATELIMITD_ variables,
// which would change the servers' configuration.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RATELIMITD_") {
			env = append(env, kv)
		}
	}
	return env
}

// stop ends ch: SIGTERM, then SIGKILL after 3 seconds.
func (lt *loadtest) stop(ch *child) {
	select {
	case <-ch.done:
		return
	default:
	}
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ch.done:
	case <-time.After(3 * time.Second):
		_ = ch.cmd.Process.Kill()
		<-ch.done
	}
}

// stopAll stops every process the load test started and removes its
// directory.
func (lt *loadtest) stopAll() {
	lt.mu.Lock()
	children := lt.children
	lt.children = nil
	lt.mu.Unlock()
	for _, ch := range children {
		lt.stop(ch)
	}
	if lt.dir != "" {
		_ = os.RemoveAll(lt.dir)
	}
}

// tail returns the end of ch's log, for an error message.
func (ch *child) tail() string {
	b, _ := os.ReadFile(ch.log)
	if len(b) > 4<<10 {
		b = b[len(b)-4<<10:]
	}
	return fmt.Sprintf("\n--- %s:\n%s", ch.log, b)
}

// startRedis starts redis-server on a free loopback port. A port found
// free can be taken before redis-server binds it, so it tries three
// times, and checks the server answering is its own (INFO's process_id).
func (lt *loadtest) startRedis(ctx context.Context, where placement) (*child, string, error) {
	var last error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, "", err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		lt.redises++
		rdir := filepath.Join(lt.dir, fmt.Sprintf("redis-%d", lt.redises-1))
		if err := os.Mkdir(rdir, 0o755); err != nil {
			return nil, "", err
		}
		ch, err := lt.start(fmt.Sprintf("redis-%d", lt.redises-1), lt.cfg.RedisServer, []string{
			"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
			"--save", "", "--appendonly", "no", "--dir", rdir,
		}, nil, where)
		if err != nil {
			return nil, "", err
		}
		if last = waitRedis(ctx, ch, addr); last == nil {
			lt.logf("redis-server (PID %d) on %s", ch.pid(), addr)
			return ch, addr, nil
		}
		lt.stop(ch)
	}
	return nil, "", last
}

// waitRedis waits until the redis-server of ch answers on addr.
func waitRedis(ctx context.Context, ch *child, addr string) error {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-ch.done:
			return fmt.Errorf("redis-server exited (%v)%s", ch.err, ch.tail())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		// A bare TCP connection first: go-redis logs every refused dial.
		var info string
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			info, err = rdb.Info(ctx, "server").Result()
		}
		if err == nil {
			if !strings.Contains(info, fmt.Sprintf("process_id:%d\r", ch.pid())) {
				return fmt.Errorf("another Redis answers on %s", addr)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready within 10s: %v%s", addr, err, ch.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startRatelimitd starts ratelimitd on ports of 127.0.0.1 it picks itself
// and returns its gRPC address.
func (lt *loadtest) startRatelimitd(ctx context.Context, name string, extra ...string) (*child, string, error) {
	return lt.startRatelimitdAt(ctx, here, name, extra...)
}

// startRatelimitdAt is startRatelimitd, placed where says.
func (lt *loadtest) startRatelimitdAt(ctx context.Context, where placement, name string, extra ...string) (*child, string, error) {
	return lt.startServer(ctx, name, lt.cfg.Ratelimitd, lt.ratelimitdArgs(extra), where)
}

// ratelimitdArgs returns the flags every ratelimitd of the load test is
// started with, then extra.
func (lt *loadtest) ratelimitdArgs(extra []string) []string {
	return append([]string{
		"-config", lt.cfg.Config,
		"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-log-format", "json", "-watch-config=false", "-shutdown-timeout", "1s", "-shutdown-delay", "0s",
	}, extra...)
}

// startFloor starts this program's floor-server on a port of 127.0.0.1 it
// picks itself and returns its gRPC address.
func (lt *loadtest) startFloor(ctx context.Context) (*child, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("finding ratelimit-bench itself for its floor-server: %w", err)
	}
	return lt.startServer(ctx, "floor-server", self, []string{"floor-server", "-addr", "127.0.0.1:0"}, here)
}

// startServer starts the gRPC server bin with args and returns its
// address, read from its JSON log line "serving gRPC".
func (lt *loadtest) startServer(ctx context.Context, name, bin string, args []string, where placement) (*child, string, error) {
	lt.logf("starting %s", shellJoin(append([]string{bin}, args...)))
	pr, pw := io.Pipe()
	ch, err := lt.start(name, bin, args, pw, where)
	if err != nil {
		pw.Close()
		return nil, "", err
	}
	go func() {
		<-ch.done
		pw.Close()
	}()
	type ready struct{ addr, lua string }
	found := make(chan ready, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var lua string
		for sc.Scan() {
			var rec struct{ Msg, Addr, Lua string }
			if json.Unmarshal(sc.Bytes(), &rec) != nil {
				continue
			}
			switch {
			case rec.Msg == "backend ready":
				lua = rec.Lua
			case rec.Msg == "serving gRPC" && rec.Addr != "":
				select {
				case found <- ready{rec.Addr, lua}:
				default:
				}
			}
		}
		io.Copy(io.Discard, pr) // never block the child's writes
	}()
	select {
	case r := <-found:
		lt.logf("%s (PID %d) serving gRPC on %s", name, ch.pid(), r.addr)
		if r.lua != "" {
			lt.logf("%s decides with Redis %s", name, r.lua)
			lt.lua = r.lua
		}
		return ch, r.addr, nil
	case <-ch.done:
		return nil, "", fmt.Errorf("%s exited (%v) before serving%s", name, ch.err, ch.tail())
	case <-time.After(15 * time.Second):
		return nil, "", fmt.Errorf("%s did not log \"serving gRPC\" within 15s%s", name, ch.tail())
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
}

// shellJoin joins a command line for a shell, quoting what needs it.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@%+", r))
		}) < 0 {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
