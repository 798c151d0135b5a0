package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestWANLinks drives wan-links as the load test does, over its stdin and
// stdout: a link carries bytes to the upstream it is routed to, each way
// no sooner than its latency; bad commands are answered with an error
// and change nothing.
func TestWANLinks(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr bytes.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- wanLinksMain(ctx, nil, inR, outW, &stderr)
		outW.Close()
	}()
	answers := bufio.NewScanner(outR)
	do := func(cmd string) string {
		t.Helper()
		if _, err := fmt.Fprintln(inW, cmd); err != nil {
			t.Fatal(err)
		}
		if !answers.Scan() {
			t.Fatalf("%s: no answer", cmd)
		}
		return answers.Text()
	}

	answer := do("link a-b 50")
	name, addr, ok := strings.Cut(answer, " ")
	if !ok || name != "a-b" {
		t.Fatalf("link: answered %q, want \"a-b ADDR\"", answer)
	}
	for cmd, want := range map[string]string{
		"link a-b 50":                       "error: link a-b exists",
		"link c-d soon":                     `error: link c-d: latency "soon" is not a number of milliseconds`,
		"route x-y 127.0.0.1:1":             "error: no link x-y",
		"route a-b 192.0.2.1:80":            "error: ",
		"delete a-b":                        "error: unknown command",
		"route a-b " + echo.Addr().String(): "ok a-b",
	} {
		if got := do(cmd); !strings.HasPrefix(got, want) {
			t.Errorf("%s: answered %q, want %q...", cmd, got, want)
		}
	}

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("through the link: read %q, %v; want the echo", line, err)
	}
	if rtt := time.Since(start); rtt < 100*time.Millisecond {
		t.Errorf("round trip through a link of 50 ms each way took %v, want at least 100ms", rtt)
	}

	inW.Close()
	select {
	case code := <-exited:
		if code != exitOK {
			t.Fatalf("wan-links exited %d: %s", code, stderr.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wan-links did not exit when its stdin ended")
	}
}
