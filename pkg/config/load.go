package config

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"
)

// File is one rule file: its name, used in messages, and its content.
type File struct {
	Name string
	Data []byte
}

// Error is one problem in a rule file. Its text reads
// "file:line:column: field: message", and the message says what would be
// accepted instead.
type Error struct {
	File   string
	Line   int // 1-based; 0 when the problem concerns the whole file
	Column int
	// Field is the path of the offending field, such as
	// "descriptors[0].rate_limit.unit"; empty for the file itself.
	Field string
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Options say how rule files are read and decoded. The zero value is
// ratelimitd's own (native) reading; docs/rules.md compares the two.
type Options struct {
	// Reference reads and decodes rule files as envoyproxy/ratelimit
	// does, for its compatibility mode:
	//
	//   - A directory is read recursively, every file whatever its name,
	//     as its runtime loader (lyft/goruntime's filepath.Walk) does;
	//     a symbolic link to a file is read, one to a directory is not
	//     followed (a warning says so).
	//   - Documents after a file's first are not read (yaml.v2's
	//     Unmarshal reads one), each with a warning.
	//   - A field given twice in one mapping takes its last value, with a
	//     warning.
	//
	// Native mode reads the *.yaml and *.yml files directly in the
	// directory, refuses a second document with content and a field
	// given twice, and warns of every rule-looking file it does not read.
	Reference bool
	// Prefix, with Reference and a directory, keeps the files whose path
	// below the directory, each "/" written ".", starts with Prefix:
	// envoyproxy/ratelimit with RUNTIME_WATCH_ROOT=true reads
	// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY so, with RUNTIME_APPDIRECTORY+"."
	// as prefix (src/provider/file_provider.go, sendEvent). Empty: every
	// file.
	Prefix string
}

// Load reads the rule file at path or, when path is a directory, the rule
// files of it in native mode: every *.yaml and *.yml file directly inside
// it, in name order. Names starting with "." are skipped and symbolic
// links are followed, which is what a Kubernetes ConfigMap volume needs.
// The files are validated together with [Parse].
func Load(path string) (*Rules, error) {
	return LoadOptions(path, Options{})
}

// LoadOptions is [Load] reading and decoding as opts say. Files it does
// not read although they look like rule files are in the warnings of the
// rules it returns ([Rules.Warnings]).
func LoadOptions(path string, opts Options) (*Rules, error) {
	files, warns, err := readFiles(path, opts)
	if err != nil {
		return nil, err
	}
	rules, err := ParseOptions(opts, files...)
	if err != nil {
		return nil, err
	}
	rules.warnings = append(warns, rules.warnings...)
	return rules, nil
}

// Parse validates files as one rule set, one domain per file, in native
// mode. It either returns every rule or, when anything is wrong, nil and
// an error joining one [*Error] per problem, ordered by file and line:
// nothing half-loads. A file larger than [MaxFileSize] is refused unread.
func Parse(files ...File) (*Rules, error) {
	return ParseOptions(Options{}, files...)
}

// ParseOptions is [Parse] decoding as opts say. What it accepts but warns
// of is in [Rules.Warnings].
func ParseOptions(opts Options, files ...File) (*Rules, error) {
	rules := &Rules{domains: make(map[string]*Domain)}
	var order []*Domain // in load order, to number their rules
	var errs []*Error
	h := sha256.New()
	for _, f := range files {
		p := parser{file: f.Name, reference: opts.Reference}
		d := p.parseFile(f.Data)
		if d != nil && d.Name != "" {
			if prev, dup := rules.domains[d.Name]; dup {
				p.fail(p.domainNode, "domain", "domain %q is already defined in %s; each domain lives in one file", d.Name, prev.File)
			} else {
				rules.domains[d.Name] = d
				order = append(order, d)
			}
		}
		sortErrors(p.errs)
		sortErrors(p.warns)
		errs = append(errs, p.errs...)
		rules.warnings = append(rules.warnings, p.warns...)
		rules.files = append(rules.files, f.Name)
		hashFile(h, f)
	}
	if len(errs) > 0 {
		joined := make([]error, len(errs))
		for i, e := range errs {
			joined[i] = e
		}
		return nil, errors.Join(joined...)
	}
	rules.hash = hex.EncodeToString(h.Sum(nil))
	for _, d := range order {
		for _, r := range d.rules {
			r.index = rules.numRules
			rules.numRules++
		}
	}
	return rules, nil
}

// hashFile adds file f to h, the hash of a rule set ([Rules.Hash]).
func hashFile(h hash.Hash, f File) {
	h.Write(binary.AppendUvarint(nil, uint64(len(f.Name))))
	h.Write([]byte(f.Name))
	h.Write(binary.AppendUvarint(nil, uint64(len(f.Data))))
	h.Write(f.Data)
}

// HashOf returns the [Rules.Hash] that [LoadOptions] would give the rule
// files at path, read as opts say, without parsing them: what tells a
// watcher whether the files changed since the rules in force were loaded,
// at the cost of reading them, where parsing a domain of 100,000
// descriptors takes seconds. An error is LoadOptions' error reading them;
// files that would not parse have a hash all the same.
func HashOf(path string, opts Options) (string, error) {
	files, _, err := readFiles(path, opts)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, f := range files {
		hashFile(h, f)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// sortErrors orders problems by line and column.
func sortErrors(errs []*Error) {
	slices.SortStableFunc(errs, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
}
