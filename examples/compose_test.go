package examples

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var composeDir = filepath.Join(repoRoot, "deploy", "compose")

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command   []string `yaml:"command"`
	Volumes   []string `yaml:"volumes"`
	Ports     []string `yaml:"ports"`
	DependsOn []string `yaml:"depends_on"`
}

// TestCompose checks deploy/compose/compose.yaml: its services, that Envoy
// mounts the example bootstrap and runs a version that reads it, that
// ratelimitd is built from the Dockerfile with flags it has, and that every
// address in the Envoy bootstrap is a compose service listening on that port.
func TestCompose(t *testing.T) {
	path := filepath.Join(composeDir, "compose.yaml")
	var cf struct {
		Services map[string]composeService `yaml:"services"`
	}
	docs := yamlDocs(t, path)
	if err := docs[0].Decode(&cf); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, name := range []string{"envoy", "ratelimitd", "redis", "backend"} {
		if _, ok := cf.Services[name]; !ok {
			t.Fatalf("%s has no service %s", path, name)
		}
	}
	for name, s := range cf.Services {
		if s.Image == "" && s.Build == nil {
			t.Errorf("service %s has neither image nor build", name)
		}
		for _, d := range s.DependsOn {
			if _, ok := cf.Services[d]; !ok {
				t.Errorf("service %s depends on %s, which is not a service", name, d)
			}
		}
	}

	// Envoy mounts examples/envoy/envoy.yaml where it reads its bootstrap.
	envoy := cf.Services["envoy"]
	if m := regexp.MustCompile(`^envoyproxy/envoy:v1\.(\d+)`).FindStringSubmatch(envoy.Image); m == nil {
		t.Errorf("envoy runs image %q; want envoyproxy/envoy:v1.N...", envoy.Image)
	} else if minor, _ := strconv.Atoi(m[1]); minor < 27 {
		t.Errorf("envoy runs %s; the per-route domains of the bootstrap need Envoy 1.27 or later", envoy.Image)
	}
	configPath := "/etc/envoy/envoy.yaml" // the image's default
	if i := slices.Index(envoy.Command, "-c"); i >= 0 && i+1 < len(envoy.Command) {
		configPath = envoy.Command[i+1]
	}
	mounted := false
	for _, v := range envoy.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || parts[1] != configPath {
			continue
		}
		mounted = true
		src := filepath.Join(composeDir, parts[0])
		if _, err := os.Stat(src); err != nil {
			t.Errorf("envoy mounts %s, which does not exist: %v", parts[0], err)
		}
		if want := filepath.Join(repoRoot, "examples", envoyBootstrapPath); filepath.Clean(src) != filepath.Clean(want) {
			t.Errorf("envoy mounts %s at %s; want the example bootstrap examples/%s", parts[0], configPath, envoyBootstrapPath)
		}
	}
	if !mounted {
		t.Errorf("envoy does not mount its bootstrap at %s", configPath)
	}

	// ratelimitd is built from the Dockerfile, on Redis.
	rl := cf.Services["ratelimitd"]
	if rl.Build == nil {
		t.Fatalf("service ratelimitd is not built from the repository")
	}
	if _, err := os.Stat(filepath.Join(composeDir, rl.Build.Context, cmpOr(rl.Build.Dockerfile, "Dockerfile"))); err != nil {
		t.Errorf("service ratelimitd builds %s in %s: %v", rl.Build.Dockerfile, rl.Build.Context, err)
	}
	flags := parseFlags(t, "service ratelimitd command", rl.Command)
	if flags["backend"] != "redis" {
		t.Errorf("ratelimitd runs -backend=%s; want redis", flags["backend"])
	}
	if rh := flags["response-headers"]; rh != "" && rh != "none" {
		t.Errorf("ratelimitd runs -response-headers=%s: Envoy already adds X-RateLimit-* headers, so clients would get both", rh)
	}
	u, err := url.Parse(flags["redis-url"])
	if err != nil {
		t.Fatalf("-redis-url: %v", err)
	}
	if _, ok := cf.Services[u.Hostname()]; !ok || u.Port() != "6379" {
		t.Errorf("-redis-url=%s is not the redis service's port 6379", flags["redis-url"])
	}
	rulesMounted := false
	for _, v := range rl.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == flags["config"] {
			rulesMounted = filepath.Clean(filepath.Join(composeDir, parts[0])) == filepath.Clean(filepath.Join(repoRoot, "examples"))
		}
	}
	if !rulesMounted {
		t.Errorf("ratelimitd's -config=%s is not the mounted examples directory", flags["config"])
	}

	// Each address of the Envoy bootstrap is a compose service, listening
	// on the port Envoy calls.
	grpcPort, _ := ratelimitdPorts(t, flags)
	listens := map[string]int{"ratelimitd": grpcPort}
	for _, arg := range cf.Services["backend"].Command {
		if addr, ok := strings.CutPrefix(arg, "-listen="); ok {
			listens["backend"] = addrPort(t, addr)
		}
	}
	b := envoyBootstrap(t)
	for _, c := range b.GetStaticResources().GetClusters() {
		for _, le := range c.GetLoadAssignment().GetEndpoints() {
			for _, e := range le.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				port, ok := listens[sa.GetAddress()]
				switch {
				case !ok:
					t.Errorf("Envoy cluster %s calls %s, which is not a compose service this test knows the port of", c.GetName(), sa.GetAddress())
				case uint32(port) != sa.GetPortValue():
					t.Errorf("Envoy cluster %s calls %s:%d; the service listens on %d", c.GetName(), sa.GetAddress(), sa.GetPortValue(), port)
				}
			}
		}
	}
}
