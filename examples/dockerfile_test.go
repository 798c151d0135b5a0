package examples

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// dockerInstruction is one instruction of a Dockerfile, its continuation
// lines joined.
type dockerInstruction struct {
	Cmd  string // upper case: FROM, RUN, COPY, ...
	Args string
}

func readDockerfile(t *testing.T, path string) []dockerInstruction {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []dockerInstruction
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if s, more := strings.CutSuffix(trimmed, `\`); more {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, dockerInstruction{strings.ToUpper(cmd), strings.Join(strings.Fields(args), " ")})
		cur.Reset()
	}
	return out
}

// TestDockerfile checks the Dockerfile without a Docker engine: a Go
// builder as recent as go.mod asks, a static build of cmd/ratelimitd, a
// non-root distroless final stage with the example rules where CMD's -config
// points, the default ports exposed, and a .dockerignore that keeps every
// file the build reads.
func TestDockerfile(t *testing.T) {
	ins := readDockerfile(t, filepath.Join(repoRoot, "Dockerfile"))
	var froms []string
	args := map[string]string{}
	var build, link, user, entrypoint, cmd string
	var expose []string
	copies := map[string]string{} // destination -> source
	for _, in := range ins {
		switch in.Cmd {
		case "ARG":
			for _, a := range strings.Fields(in.Args) {
				k, v, _ := strings.Cut(a, "=")
				args[k] = v
			}
		case "FROM":
			froms = append(froms, in.Args)
		case "RUN":
			if strings.Contains(in.Args, "go build") {
				build = in.Args
			}
			if strings.Contains(in.Args, "ln -s") {
				link = in.Args
			}
		case "COPY":
			f := strings.Fields(in.Args)
			if len(froms) > 1 && len(f) >= 2 { // the final stage's copies
				copies[f[len(f)-1]] = strings.Join(f[:len(f)-1], " ")
			}
		case "USER":
			user = in.Args
		case "EXPOSE":
			expose = strings.Fields(in.Args)
		case "ENTRYPOINT":
			entrypoint = in.Args
		case "CMD":
			cmd = in.Args
		}
	}
	if len(froms) != 2 {
		t.Fatalf("the Dockerfile has %d stages; want a builder and a final stage", len(froms))
	}

	// The builder's Go is the one go.mod asks for.
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	builder := strings.ReplaceAll(froms[0], "${GO_VERSION}", args["GO_VERSION"])
	if goVersion == nil || !strings.Contains(builder, "golang:"+string(goVersion[1])+" ") {
		t.Errorf("the builder is %q; want golang:%s (go.mod's go version)", builder, goVersion[1])
	}
	for _, want := range []string{"CGO_ENABLED=0", `go build -trimpath -ldflags="-s -w" -o /ratelimitd ./cmd/ratelimitd`} {
		if !strings.Contains(build, want) {
			t.Errorf("the build step %q lacks %s", build, want)
		}
	}

	// The final stage: distroless, non-root.
	final := froms[1]
	if !strings.HasPrefix(final, "gcr.io/distroless/static") || !strings.HasSuffix(final, ":nonroot") {
		t.Errorf("the final stage is %q; want gcr.io/distroless/static-*:nonroot", final)
	}
	if user != "65532:65532" && user != "nonroot:nonroot" && user != "65532" {
		t.Errorf("USER %q; want 65532:65532 (distroless nonroot)", user)
	}
	if copies["/ratelimitd"] != "--from=build /ratelimitd" {
		t.Errorf("the final stage does not copy the binary from the build stage to /ratelimitd")
	}
	// envoyproxy/ratelimit's entry point runs the binary under the name
	// that turns compatibility mode on.
	if !strings.Contains(link, "ln -s /ratelimitd /links/bin/ratelimit") || copies["/"] != "--from=build /links/" {
		t.Errorf("the final stage has no /bin/ratelimit linked to /ratelimitd (RUN %q, COPY %q to /)", link, copies["/"])
	}
	var ep, cmdArgs []string
	if err := json.Unmarshal([]byte(entrypoint), &ep); err != nil || !slices.Equal(ep, []string{"/ratelimitd"}) {
		t.Errorf(`ENTRYPOINT %s; want ["/ratelimitd"] (exec form)`, entrypoint)
	}
	if err := json.Unmarshal([]byte(cmd), &cmdArgs); err != nil {
		t.Fatalf("CMD %s is not in exec form: %v", cmd, err)
	}
	flags := parseFlags(t, "CMD", cmdArgs)
	grpcPort, httpPort := ratelimitdPorts(t, flags)
	if got, want := slices.Sorted(slices.Values(expose)), []string{strconv.Itoa(httpPort), strconv.Itoa(grpcPort)}; !slices.Equal(got, want) {
		t.Errorf("EXPOSE %q; ratelimitd listens on %q", got, want)
	}

	// The rules CMD points at are the example rules, and they load.
	dest := strings.TrimSuffix(flags["config"], "/") + "/"
	src, ok := copies[dest]
	if !ok {
		t.Fatalf("nothing is copied to %s, where CMD's -config points", dest)
	}
	matches, err := filepath.Glob(filepath.Join(repoRoot, src))
	if err != nil || len(matches) == 0 {
		t.Fatalf("COPY %s %s copies nothing: %v", src, dest, err)
	}
	var files []config.File
	for _, m := range matches {
		data, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, config.File{Name: m, Data: data})
	}
	if _, err := config.Parse(files...); err != nil {
		t.Errorf("the rules copied to %s do not load: %v", dest, err)
	}

	// .dockerignore keeps what the build reads.
	needed := append([]string{"go.mod", "go.sum"}, buildInputs(t)...)
	for _, m := range matches {
		rel, err := filepath.Rel(repoRoot, m)
		if err != nil {
			t.Fatal(err)
		}
		needed = append(needed, rel)
	}
	ignore := readDockerignore(t)
	for _, p := range needed {
		if pat := dockerIgnored(t, ignore, filepath.ToSlash(p)); pat != "" {
			t.Errorf(".dockerignore pattern %q excludes %s, which the image build needs", pat, p)
		}
	}
}

// buildInputs returns the files of this module that go build
// ./cmd/ratelimitd reads, relative to the repository: the Go files and
// embedded files of every package it depends on.
func buildInputs(t *testing.T) []string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list the build's inputs: %v", err)
	}
	c := exec.Command(goCmd, "list", "-e", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{range .GoFiles}}{{$.Dir}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$.Dir}}/{{.}}
{{end}}{{end}}{{end}}`, "./cmd/ratelimitd")
	c.Dir = repoRoot
	out, err := c.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		rel, err := filepath.Rel(root, line)
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Fatalf("go list named %s, outside the repository", line)
		}
		files = append(files, rel)
	}
	if len(files) == 0 {
		t.Fatalf("go list found no files of cmd/ratelimitd")
	}
	return files
}

func readDockerignore(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.Contains(line, "**") || strings.HasPrefix(line, "!") {
			t.Fatalf(".dockerignore: %q: this test models plain patterns only (no ** or !)", line)
		}
		patterns = append(patterns, strings.TrimPrefix(filepath.ToSlash(filepath.Clean(line)), "/"))
	}
	return patterns
}

// dockerIgnored returns the pattern excluding path (slash-separated,
// relative to the context) or one of its parent directories, or "".
func dockerIgnored(t *testing.T, patterns []string, path string) string {
	t.Helper()
	parts := strings.Split(path, "/")
	for i := 1; i <= len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		for _, p := range patterns {
			ok, err := filepath.Match(p, prefix)
			if err != nil {
				t.Fatalf(".dockerignore: %q: %v", p, err)
			}
			if ok {
				return p
			}
		}
	}
	return ""
}
