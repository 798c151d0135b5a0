package ratelimitd_test

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path"
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
	"internal/redistest":    {"internal/pki"},
	"internal/xdstest":      {},
	"internal/reftest":      {},
	"internal/refproc":      {}, // how envoyproxy/ratelimit is run beside ratelimitd (tests, the load generator)
	"internal/wiretest":     {},
	"internal/pki":          {}, // throwaway certificate authorities for tests and the load generator
	"internal/clocktest":    {}, // the one fake clock of the tests
	"internal/rlqssim":      {}, // a simulated Envoy rate_limit_quota filter, for tests
	"internal/aigwsim":      {}, // Envoy AI Gateway's two rate-limit calls, simulated (issue 31)
	"internal/footprint":    {}, // benchmarks' memory per item
	"internal/rulegen":      {}, // large generated rule files, for tests and benchmarks
	"pkg/wire":              {}, // what every server does to a request, whatever its protocol
	"pkg/service":           {"pkg/algo", "pkg/config", "pkg/key", "pkg/wire", "proto/ratelimitd/v1"},
	"pkg/reload":            {"pkg/config"},
	"pkg/rlqs":              {"pkg/algo", "pkg/config", "pkg/key", "pkg/wire"}, // a service: takes its budget through the algo.Backend interface
	"pkg/region":            {"pkg/algo", "proto/ratelimitd/v1"},               // a backend in front of a backend, and the sync service between regions
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
var stdlibOnly = []string{"internal/clocktest", "internal/footprint", "internal/pki", "internal/rulegen", "internal/reftest", "internal/refproc", "pkg/algo", "pkg/algo/algotest", "pkg/key", "pkg/backend/memory", "pkg/backend/overlimit", "pkg/backend/breaker", "pkg/backend/lease", "pkg/tlsconfig", "pkg/topk"}

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

// TestCommandsImportNoTestSupport holds the commands apart from test
// support: no non-test package under cmd/ imports, directly or through
// other packages of ours, a package of ours named *test or *sim (a fake
// Redis, a fake clock, a simulated Envoy). What a command needs of such a
// package belongs in a package named for what it is, as internal/pki.
func TestCommandsImportNoTestSupport(t *testing.T) {
	imports := map[string][]string{} // package of ours -> the packages of ours it imports
	var load func(rel string) error
	load = func(rel string) error {
		if _, done := imports[rel]; done {
			return nil
		}
		pkg, err := build.ImportDir(rel, 0)
		if err != nil {
			return err
		}
		imports[rel] = nil
		for _, imp := range pkg.Imports {
			if ours, ok := strings.CutPrefix(imp, module+"/"); ok {
				imports[rel] = append(imports[rel], ours)
				if err := load(ours); err != nil {
					return err
				}
			}
		}
		return nil
	}
	var commands []string
	err := filepath.WalkDir("cmd", func(dir string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case !d.IsDir():
			return nil
		case d.Name() == "testdata":
			return filepath.SkipDir
		}
		rel := filepath.ToSlash(dir)
		if err := load(rel); err != nil {
			if _, none := err.(*build.NoGoError); none {
				return nil
			}
			return err
		}
		commands = append(commands, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(commands) < 2 {
		t.Fatalf("found the commands %v under cmd/, want ratelimitd and ratelimit-bench at least", commands)
	}
	for _, cmd := range commands {
		// Breadth first from the command, so that the chain reported is
		// the shortest.
		via := map[string]string{cmd: ""}
		for queue := []string{cmd}; len(queue) > 0; queue = queue[1:] {
			for _, imp := range imports[queue[0]] {
				if _, seen := via[imp]; seen {
					continue
				}
				via[imp] = queue[0]
				queue = append(queue, imp)
				if name := path.Base(imp); strings.HasSuffix(name, "test") || strings.HasSuffix(name, "sim") {
					chain := []string{imp}
					for p := via[imp]; p != ""; p = via[p] {
						chain = append(chain, p)
					}
					slices.Reverse(chain)
					t.Errorf("%s imports test support %s (%s): move what it needs to a package named for what it is", cmd, imp, strings.Join(chain, " -> "))
				}
			}
		}
	}
}

// maxFuncLines is the most lines a function of pkg/ or cmd/ratelimitd may
// run, counted from its func line to its closing brace inclusive. Past it a
// function is split by meaning (issue 30), not by line count.
const maxFuncLines = 100

// longFuncsAllowed lists the known exceptions to maxFuncLines, as
// file:function. Each must be removed from here when it is split:
// TestFunctionsShort fails if one is no longer long, or no longer exists.
var longFuncsAllowed = []string{}

// TestFunctionsShort holds every function declaration and function literal
// of pkg/ and cmd/ratelimitd (tests and generated code aside) to
// maxFuncLines, but for longFuncsAllowed.
func TestFunctionsShort(t *testing.T) {
	lengths := map[string]int{} // file:function -> lines, for every function
	for _, root := range []string{"pkg", "cmd/ratelimitd"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			switch {
			case err != nil:
				return err
			case d.IsDir() && d.Name() == "testdata":
				return filepath.SkipDir
			case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go"):
				return nil
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if ast.IsGenerated(f) {
				return nil
			}
			for name, lines := range funcLengths(fset, f) {
				lengths[filepath.ToSlash(path)+":"+name] = lines
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, fn := range slices.Sorted(maps.Keys(lengths)) {
		if lines := lengths[fn]; lines > maxFuncLines && !slices.Contains(longFuncsAllowed, fn) {
			t.Errorf("%s is %d lines, past %d: split it by meaning into steps that each say one thing", fn, lines, maxFuncLines)
		}
	}
	for _, fn := range longFuncsAllowed {
		switch lines, ok := lengths[fn]; {
		case !ok:
			t.Errorf("longFuncsAllowed names %s, which no longer exists: remove it from the list", fn)
		case lines <= maxFuncLines:
			t.Errorf("longFuncsAllowed names %s, which is now %d lines: remove it from the list", fn, lines)
		}
	}
}

// funcLengths returns the length in lines of each function of f, keyed by
// its name: Recv.name for a method, and for a function literal the name the
// compiler gives it (Outer.func1, Outer.func1.1, glob..func1 at package
// level).
func funcLengths(fset *token.FileSet, f *ast.File) map[string]int {
	lengths := map[string]int{}
	span := func(n ast.Node) int {
		return fset.Position(n.End()).Line - fset.Position(n.Pos()).Line + 1
	}
	// literals records the function literals under n, numbered within
	// their parent the way the compiler numbers closures.
	var literals func(parent, sep string, n ast.Node)
	literals = func(parent, sep string, n ast.Node) {
		count := 0
		ast.Inspect(n, func(c ast.Node) bool {
			lit, ok := c.(*ast.FuncLit)
			if !ok || c == n {
				return true
			}
			count++
			name := fmt.Sprintf("%s%s%d", parent, sep, count)
			lengths[name] = span(lit)
			literals(name, ".", lit.Body)
			return false
		})
	}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok {
			literals("glob.", ".func", decl)
			continue
		}
		name := fn.Name.Name
		if fn.Recv != nil && len(fn.Recv.List) == 1 {
			name = receiverType(fn.Recv.List[0].Type) + "." + name
		}
		if fn.Body == nil {
			continue
		}
		lengths[name] = span(fn)
		literals(name, ".func", fn.Body)
	}
	return lengths
}

// receiverType names a method's receiver type without its pointer or type
// parameters: T for T, *T, T[K] and *T[K, V].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return "?"
		}
	}
}
