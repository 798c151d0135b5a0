package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The reference's settings, recorded: testdata/reference-settings.txt lists
// the environment variables envoyproxy/ratelimit's src/settings/settings.go
// declares (the envconfig tags of its Settings struct, in their order),
// under a header naming the reference's commit and its date. It is written
// from a checkout of the reference by
//
//	go test ./cmd/ratelimitd -run TestReferenceSettingsFixture -record-settings=/path/to/ratelimit
//
// and read, without the flag, to hold referenceSettings and
// docs/migrating.md to it (TestReferenceSettingsFixture,
// TestMigratingDocListsEverySetting). No test needs the reference's source.

// settingsFixture is the recording's path.
const settingsFixture = "testdata/reference-settings.txt"

var recordSettings = flag.String("record-settings", "", "rewrite "+settingsFixture+" from the envoyproxy/ratelimit checkout at this path")

// settingsFromSource returns the envconfig names of the fields of the
// struct type Settings in src, a settings.go, in their order; and the
// fields it leaves out, which have no envconfig tag (a func, a pointer
// such as *tls.Config: state the reference computes, no setting). A field
// without a tag of a type a setting has (see decodable) is an error:
// envconfig would read it under a name derived from the field's, which the
// recorder would have to learn.
func settingsFromSource(src []byte) (names, untagged []string, err error) {
	f, err := parser.ParseFile(token.NewFileSet(), "settings.go", src, parser.SkipObjectResolution)
	if err != nil {
		return nil, nil, err
	}
	var st *ast.StructType
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == "Settings" {
			st, _ = ts.Type.(*ast.StructType)
			return false
		}
		return st == nil
	})
	if st == nil {
		return nil, nil, fmt.Errorf("no struct type Settings")
	}
	seen := map[string]bool{}
	for _, field := range st.Fields.List {
		fieldNames := []string{}
		for _, n := range field.Names {
			fieldNames = append(fieldNames, n.Name)
		}
		if len(fieldNames) == 0 {
			return nil, nil, fmt.Errorf("an embedded field %s: its settings would need reading too", types.ExprString(field.Type))
		}
		var tag reflect.StructTag
		if field.Tag != nil {
			s, err := strconv.Unquote(field.Tag.Value)
			if err != nil {
				return nil, nil, fmt.Errorf("field %s: tag %s: %v", fieldNames[0], field.Tag.Value, err)
			}
			tag = reflect.StructTag(s)
		}
		name, tagged := tag.Lookup("envconfig")
		switch {
		case tag.Get("ignored") == "true":
			untagged = append(untagged, fieldNames...)
			continue
		case !tagged && !ast.IsExported(fieldNames[0]):
			continue // envconfig cannot set it
		case !tagged && decodable(field.Type):
			return nil, nil, fmt.Errorf("field %s (%s) has no envconfig tag: envconfig reads it under a name of its own", fieldNames[0], types.ExprString(field.Type))
		case !tagged:
			untagged = append(untagged, fieldNames...)
			continue
		case len(fieldNames) != 1:
			return nil, nil, fmt.Errorf("fields %v share the tag %q", fieldNames, name)
		}
		name, _, _ = strings.Cut(name, ",")
		if name == "" || seen[name] {
			return nil, nil, fmt.Errorf("field %s: envconfig name %q empty or repeated", fieldNames[0], name)
		}
		seen[name] = true
		names = append(names, name)
	}
	return names, untagged, nil
}

// settingsRecording is testdata/reference-settings.txt: the names and the
// header's facts.
type settingsRecording struct {
	Commit    string // the reference's commit
	Committed string // its commit date, UTC, RFC 3339
	Names     []string
}

// decodable reports whether a field of type e is one a setting would
// have, a value envconfig decodes from text: a basic type, a duration, a
// slice or a map. Others (a func, a pointer, a type of another package
// such as grpc.UnaryServerInterceptor) hold state the reference computes.
func decodable(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return types.Universe.Lookup(e.Name) != nil
	case *ast.SelectorExpr:
		return types.ExprString(e) == "time.Duration"
	case *ast.ArrayType, *ast.MapType:
		return true
	}
	return false
}

// The header's "# key: value" lines the tests read.
const (
	settingsCommitKey    = "commit"
	settingsCommittedKey = "committed"
)

// format writes the recording as the recorder does.
func (r settingsRecording) format(untagged []string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `# The environment variables envoyproxy/ratelimit's src/settings/settings.go
# declares: the envconfig tags of the fields of its Settings struct, in their
# order. docs/migrating.md says what the tests hold to it.
# repository: envoyproxy/ratelimit
# %s: %s
# %s: %s
# how: go test ./cmd/ratelimitd -run TestReferenceSettingsFixture -record-settings=CHECKOUT
#   parses CHECKOUT/src/settings/settings.go with go/parser. Fields without an
#   envconfig tag, state the reference computes, are not listed:
#   %s
`, settingsCommitKey, r.Commit, settingsCommittedKey, r.Committed, strings.Join(untagged, ", "))
	for _, n := range r.Names {
		b.WriteString(n + "\n")
	}
	return b.Bytes()
}

// readSettingsFixture reads testdata/reference-settings.txt.
func readSettingsFixture(t *testing.T) settingsRecording {
	t.Helper()
	data, err := os.ReadFile(settingsFixture)
	if err != nil {
		t.Fatal(err)
	}
	var r settingsRecording
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if h, ok := strings.CutPrefix(line, "# "); ok {
			k, v, _ := strings.Cut(h, ": ")
			switch k {
			case settingsCommitKey:
				r.Commit = v
			case settingsCommittedKey:
				r.Committed = v
			}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r.Names = append(r.Names, line)
	}
	if len(r.Commit) != 40 || r.Committed == "" {
		t.Fatalf("%s names no commit (%q) or commit date (%q) of the reference", settingsFixture, r.Commit, r.Committed)
	}
	if _, err := time.Parse(time.RFC3339, r.Committed); err != nil {
		t.Fatalf("%s: commit date: %v", settingsFixture, err)
	}
	return r
}

// recordSettingsFixture rewrites testdata/reference-settings.txt from the
// reference's checkout at dir, which must be a git work tree with
// settings.go as committed.
func recordSettingsFixture(t *testing.T, dir string) {
	git := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
		if err != nil {
			t.Fatalf("git %v in %s: %v", args, dir, err)
		}
		return strings.TrimSpace(string(out))
	}
	const path = "src/settings/settings.go"
	if changed := git("status", "--porcelain", "--", path); changed != "" {
		t.Fatalf("%s differs from its commit (%s): record from a clean checkout", path, changed)
	}
	commit, date, _ := strings.Cut(git("log", "-1", "--format=%H %cI"), " ")
	committed, err := time.Parse(time.RFC3339, date)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(dir, path))
	if err != nil {
		t.Fatal(err)
	}
	names, untagged, err := settingsFromSource(src)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	r := settingsRecording{Commit: commit, Committed: committed.UTC().Format(time.RFC3339), Names: names}
	if err := os.WriteFile(settingsFixture, r.format(untagged), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %d settings of envoyproxy/ratelimit %s (%s)", settingsFixture, len(names), commit, r.Committed)
}

// TestReferenceSettingsFixture holds referenceSettings, the list
// compatibility mode checks the environment against, to the recorded
// settings of the reference: the same names, in the same order. With
// -record-settings=CHECKOUT it first rewrites the recording from a
// checkout of the reference; then a setting added upstream fails here
// until compatsettings.go and docs/migrating.md say what becomes of it.
//
// Shown failing against a broken build: with "TRACING_SAMPLING_RATE"
// deleted from referenceSettings ("missing TRACING_SAMPLING_RATE"), and
// with a name added to the recording by hand (a setting added upstream).
func TestReferenceSettingsFixture(t *testing.T) {
	if *recordSettings != "" {
		recordSettingsFixture(t, *recordSettings)
	}
	r := readSettingsFixture(t)
	if slices.Equal(referenceSettings, r.Names) {
		return
	}
	for _, n := range r.Names {
		if !slices.Contains(referenceSettings, n) {
			t.Errorf("referenceSettings (compatsettings.go) is missing %s, a setting of envoyproxy/ratelimit %.7s: add it, and say in docs/migrating.md what compatibility mode does with it", n, r.Commit)
		}
	}
	for _, n := range referenceSettings {
		if !slices.Contains(r.Names, n) {
			t.Errorf("referenceSettings (compatsettings.go) names %s, which envoyproxy/ratelimit %.7s no longer declares", n, r.Commit)
		}
	}
	if !t.Failed() {
		t.Errorf("referenceSettings is not in settings.go's order:\n got %v\nwant %v", referenceSettings, r.Names)
	}
}

// TestReferenceSettingsParser: the recorder's parser, on a settings.go of
// its own, lists the envconfig tags in their order, leaves out computed
// fields (a func, a pointer) and ignored ones, and refuses a field
// envconfig would read under a name the recording would not show.
//
// Shown failing against a broken build: the parser taking the field's
// name instead of its tag, and the parser skipping every untagged field.
func TestReferenceSettingsParser(t *testing.T) {
	src := "package settings\n\nimport \"time\"\n\n" +
		"type Other struct {\n\tA string `envconfig:\"NOT_THIS\"`\n}\n\n" +
		"type Settings struct {\n" +
		"\tHook   func()\n" +
		"\tIcept  grpc.UnaryServerInterceptor\n" +
		"\tTLS    *struct{}\n" +
		"\tZebra  string        `envconfig:\"ZEBRA\" default:\"z\"`\n" +
		"\tAlpha  time.Duration `envconfig:\"ALPHA_INTERVAL\"`\n" +
		"\tSkip   int           `envconfig:\"SKIPPED\" ignored:\"true\"`\n" +
		"\tinner  int\n" +
		"}\n"
	names, untagged, err := settingsFromSource([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ZEBRA", "ALPHA_INTERVAL"}; !slices.Equal(names, want) {
		t.Errorf("names %v, want %v", names, want)
	}
	if want := []string{"Hook", "Icept", "TLS", "Skip"}; !slices.Equal(untagged, want) {
		t.Errorf("left out %v, want %v", untagged, want)
	}
	bad := strings.Replace(src, "`envconfig:\"ALPHA_INTERVAL\"`", "", 1)
	if _, _, err := settingsFromSource([]byte(bad)); err == nil || !strings.Contains(err.Error(), "Alpha") {
		t.Errorf("an exported field without a tag: %v, want an error naming it", err)
	}
}
