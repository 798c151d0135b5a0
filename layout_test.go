package ratelimitd_test

import (
	"go/build"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/ratelimitd/ratelimitd"

// allowedDeps is the dependency direction of ratelimitd's packages: for each
// package, the packages of this module it may import (non-test code).
// cmd -> service -> config, algo, key, wire; config -> algo, whose
// algorithms rule files name; backends (and the over-limit cache and the
// lease engine in front of them) -> algo; algo and wire import nothing of
// ours. A new package must be added here.
var allowedDeps = map[string][]string{
	"pkg/algo":              {},
	"pkg/algo/algotest":     {"pkg/algo"},
	"pkg/key":               {"pkg/algo"},
	"pkg/config":            {"pkg/algo"},
	"pkg/backend/memory":    {"pkg/algo"},
	"pkg/backend/redis":     {"pkg/algo"},
	"pkg/backend/overlimit": {"pkg/algo"},
	"pkg/backend/breaker":   {"pkg/algo"},
	"pkg/backend/lease":     {"pkg/algo"},
	"internal/redistest":    {"internal/pkitest"},
	"internal/xdstest":      {},
	"internal/reftest":      {},
	"internal/wiretest":     {},
	"internal/pkitest":      {},
	"pkg/wire":              {}, // what every server does to a request, whatever its protocol
	"pkg/service":           {"pkg/algo", "pkg/config", "pkg/key", "pkg/wire", "proto/ratelimitd/v1"},
	"pkg/reload":            {"pkg/config"},
	"pkg/rlqs":              {"pkg/algo", "pkg/config", "pkg/key", "pkg/wire"}, // a service: takes its budget through the algo.Backend interface
	"pkg/rlqs/rlqssim":      {},
	"pkg/region":            {"pkg/algo", "proto/ratelimitd/v1"}, // a backend in front of a backend, and the sync service between regions
	"pkg/xds":               {"pkg/config"},
	"pkg/metrics":           {"pkg/backend/breaker", "pkg/config", "pkg/service"},
	"pkg/metrics/refstats":  {"pkg/config", "pkg/metrics", "pkg/service"},
	"pkg/tlsconfig":         {},
	"pkg/client":            {"proto/ratelimitd/v1"},
	"pkg/topk":              {},
	"pkg/console":           {"pkg/config", "pkg/service", "pkg/topk", "proto/ratelimitd/v1"}, // an observer of the service, and the page that shows it
	"cmd/ratelimitd":        {"*"},
	"cmd/ratelimit-bench":   {"*"},
}

// stdlibOnly lists packages that may import nothing outside the standard
// library.
var stdlibOnly = []string{"internal/reftest", "pkg/algo", "pkg/algo/algotest", "pkg/key", "pkg/backend/memory", "pkg/backend/overlimit", "pkg/backend/breaker", "pkg/backend/lease", "pkg/tlsconfig", "pkg/topk"}

func TestDependencyDirection(t *testing.T) {
	seen := map[string]bool{}
	for _, root := range []string{"pkg", "cmd", "internal"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			switch {
			case err != nil:
				return err
			case !d.IsDir():
				return nil
			case d.Name() == "testdata":
				return filepath.SkipDir
			}
			pkg, err := build.ImportDir(path, 0)
			if _, none := err.(*build.NoGoError); none {
				return nil
			}
			if err != nil {
				return err
			}
			rel := filepath.ToSlash(path)
			seen[rel] = true
			allowed, known := allowedDeps[rel]
			if !known {
				t.Errorf("package %s is not in allowedDeps: decide what it may import", rel)
				return nil
			}
			for _, imp := range pkg.Imports {
				if ours, ok := strings.CutPrefix(imp, module+"/"); ok {
					if !slices.Contains(allowed, "*") && !slices.Contains(allowed, ours) {
						t.Errorf("%s imports %s; it may import only %v", rel, ours, allowed)
					}
					continue
				}
				if slices.Contains(stdlibOnly, rel) && strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") {
					t.Errorf("%s imports %s; it may import only the standard library", rel, imp)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for p := range allowedDeps {
		if !seen[p] {
			t.Errorf("allowedDeps names %s, which has no Go package", p)
		}
	}
}
