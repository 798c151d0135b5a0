package config

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// Load reads the rule file at path or, when path is a directory, every
// *.yaml and *.yml file directly inside it, in name order. Names starting
// with "." are skipped and symbolic links are followed, which is what a
// Kubernetes ConfigMap volume needs. The files are validated together with
// [Parse].
func Load(path string) (*Rules, error) {
	files, err := readFiles(path)
	if err != nil {
		return nil, err
	}
	return Parse(files...)
}

// Parse validates files as one rule set, one domain per file. It either
// returns every rule or, when anything is wrong, nil and an error joining one
// [*Error] per problem, ordered by file and line: nothing half-loads.
func Parse(files ...File) (*Rules, error) {
	rules := &Rules{domains: make(map[string]*Domain)}
	var errs []*Error
	h := sha256.New()
	for _, f := range files {
		p := parser{file: f.Name}
		d := p.parseFile(f.Data)
		if d != nil && d.Name != "" {
			if prev, dup := rules.domains[d.Name]; dup {
				p.fail(p.domainNode, "domain", "domain %q is already defined in %s; each domain lives in one file", d.Name, prev.File)
			} else {
				rules.domains[d.Name] = d
			}
		}
		slices.SortStableFunc(p.errs, func(a, b *Error) int {
			return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
		})
		errs = append(errs, p.errs...)
		rules.files = append(rules.files, f.Name)
		h.Write(binary.AppendUvarint(nil, uint64(len(f.Name))))
		h.Write([]byte(f.Name))
		h.Write(binary.AppendUvarint(nil, uint64(len(f.Data))))
		h.Write(f.Data)
	}
	if len(errs) > 0 {
		joined := make([]error, len(errs))
		for i, e := range errs {
			joined[i] = e
		}
		return nil, errors.Join(joined...)
	}
	rules.hash = hex.EncodeToString(h.Sum(nil))
	return rules, nil
}

func readFiles(path string) ([]File, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if !info.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		return []File{{Name: path, Data: data}}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var files []File
	for _, e := range entries {
		name := e.Name()
		if ext := filepath.Ext(name); strings.HasPrefix(name, ".") || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		full := filepath.Join(path, name)
		info, err := os.Stat(full) // follows symbolic links
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if info.IsDir() {
			continue
		}
		data, err := os.ReadFile(full)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		files = append(files, File{Name: full, Data: data})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("config: no rule files (*.yaml, *.yml) in directory %s", path)
	}
	return files, nil
}
