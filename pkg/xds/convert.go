package xds

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// FilePrefix starts the name of the rule file each RateLimitConfig
// resource becomes: "xds:" and the resource's name. Errors, /rlconfig and
// the rules' file list show it.
const FilePrefix = "xds:"

// The rule-file YAML a RateLimitConfig becomes. Fields absent from the
// resource are left out, so that the parser sees what a hand-written file
// would hold and reports what is missing the same way.
type yamlFile struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value,omitempty"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
	ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
	DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
	Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlRateLimit struct {
	RequestsPerUnit *uint32       `yaml:"requests_per_unit,omitempty"`
	Unit            string        `yaml:"unit,omitempty"`
	Unlimited       bool          `yaml:"unlimited,omitempty"`
	Name            string        `yaml:"name,omitempty"`
	Replaces        []yamlReplace `yaml:"replaces,omitempty"`
}

type yamlReplace struct {
	Name string `yaml:"name"`
}

// ToFile converts one RateLimitConfig into the rule file it stands for,
// named FilePrefix + its name. Parsed with config.Parse, it means exactly
// what the same rules written in a file mean, and is validated the same
// way.
func ToFile(c *rlsconfv3.RateLimitConfig) (config.File, error) {
	data, err := yaml.Marshal(yamlFile{Domain: c.GetDomain(), Descriptors: descriptors(c.GetDescriptors())})
	if err != nil {
		return config.File{}, fmt.Errorf("resource %q: %w", c.GetName(), err)
	}
	return config.File{Name: FilePrefix + c.GetName(), Data: data}, nil
}

func descriptors(ds []*rlsconfv3.RateLimitDescriptor) []yamlDescriptor {
	if len(ds) == 0 {
		return nil
	}
	out := make([]yamlDescriptor, len(ds))
	for i, d := range ds {
		out[i] = yamlDescriptor{
			Key:            d.GetKey(),
			Value:          d.GetValue(),
			RateLimit:      rateLimit(d.GetRateLimit()),
			ShadowMode:     d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(),
			Descriptors:    descriptors(d.GetDescriptors()),
		}
	}
	return out
}

// rateLimit converts a policy. An unlimited policy leaves out the unit
// UNKNOWN and a count of 0, which is how the proto says "not set"; any
// other unit or count is kept, and the parser then rejects it beside
// unlimited as it would in a file. A counted policy always has its count
// (0 admits nothing, as in a file) and its unit: UNKNOWN, or a number the
// enum does not name, reaches the parser as an unknown unit.
func rateLimit(p *rlsconfv3.RateLimitPolicy) *yamlRateLimit {
	if p == nil {
		return nil
	}
	y := &yamlRateLimit{Unlimited: p.GetUnlimited(), Name: p.GetName()}
	unit := unitName(p.GetUnit())
	if !y.Unlimited || p.GetUnit() != rlsconfv3.RateLimitUnit_UNKNOWN {
		y.Unit = unit
	}
	if n := p.GetRequestsPerUnit(); !y.Unlimited || n != 0 {
		y.RequestsPerUnit = &n
	}
	for _, r := range p.GetReplaces() {
		y.Replaces = append(y.Replaces, yamlReplace{Name: r.GetName()})
	}
	return y
}

// unitName is the rule-file name of u: "second" for SECOND, "unknown" for
// UNKNOWN, the number for a value the enum does not name.
func unitName(u rlsconfv3.RateLimitUnit) string {
	if name, ok := rlsconfv3.RateLimitUnit_name[int32(u)]; ok {
		return strings.ToLower(name)
	}
	return strconv.Itoa(int(u))
}

// Parse turns the resources of one DiscoveryResponse into one rule set:
// each must be a RateLimitConfig, and together they must be a valid rule
// set (one domain per resource, no domain twice), exactly as files are.
// The resources are taken in the order of their names, so the same
// resources always make the same rules hash, whatever order the server
// sends them in.
func Parse(resources []*anypb.Any) (*config.Rules, error) {
	confs := make([]*rlsconfv3.RateLimitConfig, 0, len(resources))
	for i, res := range resources {
		c := &rlsconfv3.RateLimitConfig{}
		if err := anypb.UnmarshalTo(res, c, proto.UnmarshalOptions{}); err != nil {
			return nil, fmt.Errorf("resource %d (%s): not a RateLimitConfig: %w", i, res.GetTypeUrl(), err)
		}
		confs = append(confs, c)
	}
	slices.SortStableFunc(confs, func(a, b *rlsconfv3.RateLimitConfig) int { return strings.Compare(a.GetName(), b.GetName()) })
	files := make([]config.File, 0, len(confs))
	seen := make(map[string]bool, len(confs))
	for _, c := range confs {
		if seen[c.GetName()] {
			return nil, fmt.Errorf("two resources are named %q; each RateLimitConfig needs a name of its own", c.GetName())
		}
		seen[c.GetName()] = true
		f, err := ToFile(c)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return config.Parse(files...)
}
