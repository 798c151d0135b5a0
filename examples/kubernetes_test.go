package examples

import (
	"bytes"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

var kubernetesDir = filepath.Join(repoRoot, "deploy", "kubernetes")

// k8sObject is one document of a manifest.
type k8sObject struct {
	File       string
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	node *yaml.Node
}

// decode decodes the whole object into v.
func (o k8sObject) decode(t *testing.T, v any) {
	t.Helper()
	if err := o.node.Decode(v); err != nil {
		t.Fatalf("%s: %s %s: %v", o.File, o.Kind, o.Metadata.Name, err)
	}
}

// k8sManifests reads every document of deploy/kubernetes/*.yaml.
func k8sManifests(t *testing.T) []k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", kubernetesDir, err)
	}
	var objs []k8sObject
	for _, f := range files {
		for _, doc := range yamlDocs(t, f) {
			o := k8sObject{File: filepath.Base(f), node: doc}
			if err := doc.Decode(&o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

// find returns the object of kind and name; it fails the test when there is
// none.
func find(t *testing.T, objs []k8sObject, kind, name string) k8sObject {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	t.Fatalf("no %s named %s in %s", kind, name, kubernetesDir)
	return k8sObject{}
}

type k8sDeployment struct {
	Spec struct {
		Replicas int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec k8sPodSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sPodSpec struct {
	TerminationGracePeriodSeconds *int               `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               k8sSecurityContext `yaml:"securityContext"`
	Containers                    []k8sContainer     `yaml:"containers"`
	Volumes                       []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type k8sSecurityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Capabilities             struct {
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type k8sContainer struct {
	Name            string             `yaml:"name"`
	Image           string             `yaml:"image"`
	Args            []string           `yaml:"args"`
	Ports           []k8sPort          `yaml:"ports"`
	ReadinessProbe  *k8sProbe          `yaml:"readinessProbe"`
	LivenessProbe   *k8sProbe          `yaml:"livenessProbe"`
	SecurityContext k8sSecurityContext `yaml:"securityContext"`
	Lifecycle       struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type k8sPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
}

type k8sService struct {
	Spec struct {
		ClusterIP string            `yaml:"clusterIP"`
		Selector  map[string]string `yaml:"selector"`
		Ports     []struct {
			Name        string `yaml:"name"`
			Port        int    `yaml:"port"`
			TargetPort  any    `yaml:"targetPort"` // a number or a port name
			AppProtocol string `yaml:"appProtocol"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

// resolvePort returns the container port that p (a number or a port name)
// names in c, or 0.
func resolvePort(c k8sContainer, p any) int {
	for _, cp := range c.Ports {
		switch p := p.(type) {
		case int:
			if cp.ContainerPort == p {
				return p
			}
		case string:
			if cp.Name == p {
				return cp.ContainerPort
			}
		}
	}
	return 0
}

// isSubset reports whether every label of sel is in labels.
func isSubset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// addrPort returns the port of a listen address such as ":8081".
func addrPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return n
}

// ratelimitdPorts returns the gRPC and HTTP ports ratelimitd listens on
// with flags.
func ratelimitdPorts(t *testing.T, flags map[string]string) (grpc, http int) {
	t.Helper()
	return addrPort(t, cmpOr(flags["grpc-addr"], ":8081")), addrPort(t, cmpOr(flags["http-addr"], ":8080"))
}

// configMapRules returns the rule files of the ConfigMap ratelimitd-rules,
// loaded with pkg/config.
func configMapRules(t *testing.T, objs []k8sObject) (*config.Rules, []config.File) {
	t.Helper()
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	o := find(t, objs, "ConfigMap", "ratelimitd-rules")
	o.decode(t, &cm)
	var files []config.File
	for _, name := range slices.Sorted(maps.Keys(cm.Data)) { // the order of a mounted directory
		files = append(files, config.File{Name: o.File + ": " + name, Data: []byte(cm.Data[name])})
	}
	rules, err := config.Parse(files...)
	if err != nil {
		t.Fatalf("the rules of ConfigMap %s do not load: %v", o.Metadata.Name, err)
	}
	return rules, files
}

// TestKubernetesManifests checks deploy/kubernetes: every document is a
// Kubernetes object, kustomization.yaml lists every manifest, and the
// Deployment, Services, PodDisruptionBudget and ConfigMap agree with each
// other and with ratelimitd.
func TestKubernetesManifests(t *testing.T) {
	objs := k8sManifests(t)

	var kust struct {
		Namespace string   `yaml:"namespace"`
		Resources []string `yaml:"resources"`
	}
	var ns string
	var manifests []string
	for _, o := range objs {
		if o.APIVersion == "" || o.Kind == "" {
			t.Errorf("%s: a document without apiVersion or kind", o.File)
		}
		if o.Kind == "Kustomization" {
			o.decode(t, &kust)
			continue
		}
		if o.Metadata.Name == "" {
			t.Errorf("%s: a %s without metadata.name", o.File, o.Kind)
		}
		if o.Kind == "Namespace" {
			ns = o.Metadata.Name
		}
		if !slices.Contains(manifests, o.File) {
			manifests = append(manifests, o.File)
		}
	}
	if ns == "" {
		t.Fatalf("no Namespace in %s", kubernetesDir)
	}
	for _, o := range objs {
		if o.Kind != "Namespace" && o.Kind != "Kustomization" && o.Metadata.Namespace != ns {
			t.Errorf("%s: %s %s is in namespace %q; want %q", o.File, o.Kind, o.Metadata.Name, o.Metadata.Namespace, ns)
		}
	}
	slices.Sort(manifests)
	if listed := slices.Sorted(slices.Values(kust.Resources)); !slices.Equal(listed, manifests) {
		t.Errorf("kustomization.yaml lists %q; the manifests are %q", listed, manifests)
	}
	if kust.Namespace != ns {
		t.Errorf("kustomization.yaml sets namespace %q; want %q", kust.Namespace, ns)
	}

	// The ratelimitd Deployment.
	var dep k8sDeployment
	depObj := find(t, objs, "Deployment", "ratelimitd")
	depObj.decode(t, &dep)
	pod := dep.Spec.Template.Spec
	podLabels := dep.Spec.Template.Metadata.Labels
	if dep.Spec.Replicas < 2 {
		t.Errorf("ratelimitd runs %d replicas; want at least 2", dep.Spec.Replicas)
	}
	if !isSubset(dep.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("the Deployment's selector %v does not select its pods %v", dep.Spec.Selector.MatchLabels, podLabels)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("the ratelimitd pod has %d containers; want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	flags := parseFlags(t, "Deployment ratelimitd args", c.Args)
	grpcPort, httpPort := ratelimitdPorts(t, flags)
	if p := resolvePort(c, "grpc"); p != grpcPort {
		t.Errorf("container port grpc is %d; ratelimitd serves gRPC on %d", p, grpcPort)
	}
	if p := resolvePort(c, "http"); p != httpPort {
		t.Errorf("container port http is %d; ratelimitd serves HTTP on %d", p, httpPort)
	}
	for name, probe := range map[string]*k8sProbe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		switch {
		case probe == nil || probe.HTTPGet == nil:
			t.Errorf("ratelimitd has no httpGet %s", name)
		case probe.HTTPGet.Path != "/healthcheck":
			t.Errorf("%s probes %s; want /healthcheck", name, probe.HTTPGet.Path)
		case resolvePort(c, probe.HTTPGet.Port) != httpPort:
			t.Errorf("%s probes port %v; ratelimitd serves HTTP on %d", name, probe.HTTPGet.Port, httpPort)
		}
	}
	checkHardened(t, "ratelimitd", pod, c)
	for _, r := range []string{"cpu", "memory"} {
		if c.Resources.Requests[r] == "" {
			t.Errorf("ratelimitd requests no %s", r)
		}
	}
	if c.Resources.Limits["memory"] == "" {
		t.Errorf("ratelimitd has no memory limit")
	}

	// Shutdown fits the grace period.
	shutdown := 15 * time.Second
	if s, ok := flags["shutdown-timeout"]; ok {
		var err error
		if shutdown, err = time.ParseDuration(s); err != nil {
			t.Fatalf("-shutdown-timeout=%s: %v", s, err)
		}
	}
	delay := 5 * time.Second
	if s, ok := flags["shutdown-delay"]; ok {
		var err error
		if delay, err = time.ParseDuration(s); err != nil {
			t.Fatalf("-shutdown-delay=%s: %v", s, err)
		}
	}
	preStop := 0
	if ps := c.Lifecycle.PreStop; ps != nil && ps.Sleep != nil {
		preStop = ps.Sleep.Seconds
	}
	grace := 30 // Kubernetes' default
	if pod.TerminationGracePeriodSeconds != nil {
		grace = *pod.TerminationGracePeriodSeconds
	}
	if need := time.Duration(preStop)*time.Second + delay + shutdown; time.Duration(grace)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds %d leaves no margin over the preStop sleep (%ds), -shutdown-delay (%v) and -shutdown-timeout (%v)", grace, preStop, delay, shutdown)
	}

	// The rules: -config is where the ConfigMap is mounted, and they load.
	rules, files := configMapRules(t, objs)
	mounted := false
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == "ratelimitd-rules" && vm.MountPath == flags["config"] {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("-config=%s is not where ConfigMap ratelimitd-rules is mounted", flags["config"])
	}
	if len(rules.Domains()) == 0 {
		t.Errorf("ConfigMap ratelimitd-rules holds no rules")
	}
	// Each rule file is a copy of the example of the same name.
	for _, f := range files {
		_, name, _ := strings.Cut(f.Name, ": ")
		example, err := os.ReadFile(name)
		if err != nil || filepath.Base(name) != name {
			t.Errorf("ConfigMap ratelimitd-rules: %s is not one of the example rule files: %v", name, err)
			continue
		}
		if !bytes.Equal(example, f.Data) {
			t.Errorf("ConfigMap ratelimitd-rules: %s differs from examples/%s; copy it over (indented by 4 spaces)", name, name)
		}
	}

	// Redis: -redis-url names the Redis Service's port, which reaches the
	// Redis pod.
	if flags["backend"] != "redis" {
		t.Errorf("-backend=%s; the manifests run the redis backend", flags["backend"])
	}
	u, err := url.Parse(flags["redis-url"])
	if err != nil {
		t.Fatalf("-redis-url: %v", err)
	}
	var redisSvc k8sService
	find(t, objs, "Service", u.Hostname()).decode(t, &redisSvc)
	var redisDep k8sDeployment
	find(t, objs, "Deployment", "redis").decode(t, &redisDep)
	redisPort, _ := strconv.Atoi(u.Port())
	reaches := false
	for _, p := range redisSvc.Spec.Ports {
		if p.Port == redisPort && resolvePort(redisDep.Spec.Template.Spec.Containers[0], p.TargetPort) == 6379 {
			reaches = true
		}
	}
	if !reaches || !isSubset(redisSvc.Spec.Selector, redisDep.Spec.Template.Metadata.Labels) {
		t.Errorf("-redis-url=%s does not reach the Redis pod through Service %s", flags["redis-url"], u.Hostname())
	}

	// The ratelimitd Services select the pods and target their ports.
	for _, name := range []string{"ratelimitd", "ratelimitd-headless"} {
		var svc k8sService
		find(t, objs, "Service", name).decode(t, &svc)
		if !isSubset(svc.Spec.Selector, podLabels) {
			t.Errorf("Service %s selects %v; the pods are %v", name, svc.Spec.Selector, podLabels)
		}
		for _, p := range svc.Spec.Ports {
			target := resolvePort(c, p.TargetPort)
			switch {
			case target == 0:
				t.Errorf("Service %s port %s targets %v, which the container does not expose", name, p.Name, p.TargetPort)
			case p.Name == "grpc" && (target != grpcPort || p.AppProtocol != "grpc"):
				t.Errorf("Service %s port grpc targets %d with appProtocol %q; want %d, grpc (Istio and gateways need HTTP/2)", name, target, p.AppProtocol, grpcPort)
			case p.Name == "http" && target != httpPort:
				t.Errorf("Service %s port http targets %d; want %d", name, target, httpPort)
			case p.Name != "grpc" && p.Name != "http":
				t.Errorf("Service %s has a port %q; want grpc or http", name, p.Name)
			}
		}
	}

	// The PodDisruptionBudget keeps a replica and covers the pods.
	var pdb struct {
		Spec struct {
			MinAvailable int `yaml:"minAvailable"`
			Selector     struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		} `yaml:"spec"`
	}
	find(t, objs, "PodDisruptionBudget", "ratelimitd").decode(t, &pdb)
	if pdb.Spec.MinAvailable != 1 || !isSubset(pdb.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("the PodDisruptionBudget keeps %d of the pods %v; want 1 of %v", pdb.Spec.MinAvailable, pdb.Spec.Selector.MatchLabels, podLabels)
	}
	if pdb.Spec.MinAvailable >= dep.Spec.Replicas {
		t.Errorf("the PodDisruptionBudget's minAvailable %d blocks every voluntary disruption of %d replicas", pdb.Spec.MinAvailable, dep.Spec.Replicas)
	}

	var redisPod = redisDep.Spec.Template.Spec
	checkHardened(t, "redis", redisPod, redisPod.Containers[0])
}

// checkHardened checks that a container runs as a non-root user, on a
// read-only root file system, without privilege escalation or capabilities.
func checkHardened(t *testing.T, name string, pod k8sPodSpec, c k8sContainer) {
	t.Helper()
	isTrue := func(b ...*bool) bool {
		for _, b := range b {
			if b != nil {
				return *b
			}
		}
		return false
	}
	if !isTrue(c.SecurityContext.RunAsNonRoot, pod.SecurityContext.RunAsNonRoot) {
		t.Errorf("%s: runAsNonRoot is not set", name)
	}
	if !isTrue(c.SecurityContext.ReadOnlyRootFilesystem) {
		t.Errorf("%s: readOnlyRootFilesystem is not set", name)
	}
	if c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", name)
	}
	if !slices.Contains(c.SecurityContext.Capabilities.Drop, "ALL") {
		t.Errorf("%s: capabilities do not drop ALL", name)
	}
}
