package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// wanLinksMain runs `ratelimit-bench wan-links`: slow links between
// regions on loopback (toxiproxy), in a process of their own, so that the
// load test can run them at low priority: on one machine, the CPU a link
// spends moving bytes would otherwise be taken from the region measured,
// which on a real network it never is.
//
// It reads commands from stdin, one a line, and answers each on stdout:
//
//	link NAME LATENCY_MS    a link on a free loopback port, LATENCY_MS each
//	                        way, leading nowhere yet: answers "NAME ADDR"
//	route NAME UPSTREAM     lead link NAME to the loopback UPSTREAM:
//	                        answers "ok NAME"
//
// A command it cannot run is answered "error: ..."; it exits when stdin
// ends.
func wanLinksMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "ratelimit-bench wan-links: unexpected argument %q; it reads its commands from stdin (see loadtest_regions.go)\n", args[0])
		return exitUsage
	}
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	links := map[string]*toxiproxy.Proxy{}
	defer func() {
		for _, p := range links {
			p.Stop()
		}
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		var line string
		select {
		case <-ctx.Done():
			return exitOK
		case l, ok := <-lines:
			if !ok {
				return exitOK
			}
			line = l
		}
		answer, err := wanCommand(tp, links, strings.Fields(line))
		if err != nil {
			answer = "error: " + err.Error()
		}
		fmt.Fprintln(stdout, answer)
	}
}

// wanCommand runs one command of wan-links on links.
func wanCommand(tp *toxiproxy.ApiServer, links map[string]*toxiproxy.Proxy, f []string) (string, error) {
	switch {
	case len(f) == 3 && f[0] == "link":
		name := f[1]
		ms, err := strconv.Atoi(f[2])
		if err != nil || ms < 0 {
			return "", fmt.Errorf("link %s: latency %q is not a number of milliseconds", name, f[2])
		}
		if links[name] != nil {
			return "", fmt.Errorf("link %s exists", name)
		}
		p := toxiproxy.NewProxy(tp, name, "127.0.0.1:0", "127.0.0.1:1")
		if err := p.Start(); err != nil {
			return "", err
		}
		for _, dir := range []string{"upstream", "downstream"} {
			toxic := fmt.Sprintf(`{"name": "wan-%s", "type": "latency", "stream": %q, "attributes": {"latency": %d}}`, dir, dir, ms)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
				p.Stop()
				return "", err
			}
		}
		links[name] = p
		return name + " " + p.Listen, nil
	case len(f) == 3 && f[0] == "route":
		p := links[f[1]]
		if p == nil {
			return "", fmt.Errorf("no link %s", f[1])
		}
		if err := checkLoopback(f[2]); err != nil {
			return "", err
		}
		if err := p.Update(&toxiproxy.Proxy{Listen: p.Listen, Upstream: f[2], Enabled: true}); err != nil {
			return "", err
		}
		return "ok " + f[1], nil
	}
	return "", fmt.Errorf("unknown command %q; want link NAME LATENCY_MS, or route NAME UPSTREAM", strings.Join(f, " "))
}

// wanLinks is a wan-links process the load test runs, and talks to.
type wanLinks struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	pid  int
	done chan struct{}
}

// startWANLinks starts this program's wan-links, where says.
func (lt *loadtest) startWANLinks(where placement) (*wanLinks, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding ratelimit-bench itself for its wan-links: %w", err)
	}
	bin, args := self, []string{"wan-links"}
	if where == elsewhere {
		nice, err := exec.LookPath("nice")
		if err != nil {
			return nil, fmt.Errorf("starting wan-links at low priority: %w", err)
		}
		bin, args = nice, append([]string{"-n", "19", self}, args...)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = cleanEnv()
	cmd.SysProcAttr = childAttr()
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &wanLinks{cmd: cmd, in: in, out: bufio.NewScanner(out), pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(w.done)
	}()
	return w, nil
}

// do sends one command and returns its answer.
func (w *wanLinks) do(cmd string) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := fmt.Fprintln(w.in, cmd); err != nil {
		return "", fmt.Errorf("wan-links: %s: %w", cmd, err)
	}
	if !w.out.Scan() {
		return "", fmt.Errorf("wan-links: %s: no answer (%v)", cmd, w.out.Err())
	}
	answer := w.out.Text()
	if msg, bad := strings.CutPrefix(answer, "error: "); bad {
		return "", fmt.Errorf("wan-links: %s: %s", cmd, msg)
	}
	return answer, nil
}

// link makes a link of latency ms each way and returns its address.
func (w *wanLinks) link(name string, ms int64) (string, error) {
	answer, err := w.do(fmt.Sprintf("link %s %d", name, ms))
	if err != nil {
		return "", err
	}
	got, addr, ok := strings.Cut(answer, " ")
	if !ok || got != name {
		return "", fmt.Errorf("wan-links: link %s: answered %q", name, answer)
	}
	return addr, nil
}

// route leads link name to upstream.
func (w *wanLinks) route(name, upstream string) error {
	answer, err := w.do(fmt.Sprintf("route %s %s", name, upstream))
	if err == nil && answer != "ok "+name {
		err = fmt.Errorf("wan-links: route %s: answered %q", name, answer)
	}
	return err
}

// stop ends the process: its stdin closes.
func (w *wanLinks) stop() {
	w.in.Close()
	<-w.done
}
