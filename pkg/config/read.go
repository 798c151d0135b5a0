package config

// Reading: which files of a rule directory are rule files, in each mode,
// and a warning for every file that looks like one but is not read.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// sniffBytes is how much of a file not read is looked at to tell whether
// it is a rule file.
const sniffBytes = 64 << 10

// readFiles returns the rule files at path as opts say, and a warning for
// each file not read that looks like a rule file.
func readFiles(path string, opts Options) ([]File, []*Error, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	if !info.IsDir() {
		data, err := readBounded(path)
		if err != nil {
			return nil, nil, fmt.Errorf("config: %w", err)
		}
		return []File{{Name: path, Data: data}}, nil, nil
	}
	r := reader{root: path, opts: opts}
	if err := r.dir(path); err != nil {
		return nil, nil, err
	}
	if len(r.files) == 0 {
		if opts.Reference {
			what := "files"
			if opts.Prefix != "" {
				what = fmt.Sprintf("files whose path below it starts with %q (\"/\" read as \".\")", opts.Prefix)
			}
			return nil, r.warns, fmt.Errorf("config: no rule files in directory %s: envoyproxy/ratelimit's layout reads every file below it, and it holds no %s", path, what)
		}
		return nil, r.warns, fmt.Errorf("config: no rule files (*.yaml, *.yml) in directory %s", path)
	}
	return r.files, r.warns, nil
}

// reader walks one rule directory.
type reader struct {
	root  string
	opts  Options
	files []File
	warns []*Error
}

func (r *reader) warn(name, format string, args ...any) {
	r.warns = append(r.warns, &Error{File: name, Msg: fmt.Sprintf(format, args...)})
}

// dir reads directory d in name order: in reference mode its
// subdirectories too, in native mode only its own files (unread warns of
// those below).
func (r *reader) dir(d string) error {
	entries, err := os.ReadDir(d)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	for _, e := range entries {
		name, full := e.Name(), filepath.Join(d, e.Name())
		if strings.HasPrefix(name, ".") {
			// Kubernetes keeps a ConfigMap's files in ..data and
			// timestamped directories, reached through the links
			// beside them: a dot directory is never read, nor warned
			// of. A dot file that looks like rules is warned of.
			if !e.IsDir() {
				r.sniff(full, "not read: names starting with \".\" are skipped; rename it without the dot to load it")
			}
			continue
		}
		link := e.Type()&fs.ModeSymlink != 0
		info, err := os.Stat(full) // follows symbolic links
		if err != nil {
			if isRuleName(name) {
				return fmt.Errorf("config: %w", err)
			}
			r.warn(full, "not read: %v", err)
			continue
		}
		switch {
		case info.IsDir() && r.opts.Reference && link:
			// goruntime's filepath.Walk does not follow it: reading it
			// fails and is logged, and the walk goes on.
			r.warn(full, "not read: a symbolic link to a directory, which envoyproxy/ratelimit does not follow either; link the files themselves, or move the directory here")
		case info.IsDir() && r.opts.Reference:
			if err := r.dir(full); err != nil {
				return err
			}
		case info.IsDir():
			r.unread(full)
		case !info.Mode().IsRegular():
			// A socket or device: never a rule file.
		case r.opts.Reference:
			if rel := r.rel(full); r.opts.Prefix != "" && !strings.HasPrefix(rel, r.opts.Prefix) {
				r.sniff(full, "not read: envoyproxy/ratelimit, watching the runtime root, reads only the files whose path below %s starts with %q (here %q)", r.root, r.opts.Prefix, rel)
				continue
			}
			if err := r.read(full); err != nil {
				return err
			}
		case isRuleName(name):
			if err := r.read(full); err != nil {
				return err
			}
		default:
			r.sniff(full, "not read: it holds a domain, but only files named *.yaml or *.yml are rule files; rename it to load it")
		}
	}
	return nil
}

// inSubdirectory is the warning of a rule file native mode finds below
// the root, formatted with the root.
const inSubdirectory = "not read: rule files are read only directly in %s, not in its subdirectories; move it there (envoyproxy/ratelimit's compatibility mode reads subdirectories)"

// unread warns of the rule-looking files below directory d, which native
// mode does not read. Symbolic links to directories are not followed
// (they could loop); those to files are read.
func (r *reader) unread(d string) {
	entries, err := os.ReadDir(d)
	if err != nil {
		r.warn(d, "not read, nor looked into: %v", err)
		return
	}
	for _, e := range entries {
		name, full := e.Name(), filepath.Join(d, e.Name())
		if strings.HasPrefix(name, ".") {
			continue
		}
		switch {
		case e.IsDir():
			r.unread(full)
		case e.Type()&fs.ModeSymlink != 0:
			if info, err := os.Stat(full); err == nil && info.Mode().IsRegular() {
				r.sniffDomain(full, inSubdirectory, r.root)
			}
		case e.Type().IsRegular():
			r.sniffDomain(full, inSubdirectory, r.root)
		}
	}
}

// read adds the file at name to the rule files.
func (r *reader) read(name string) error {
	data, err := readBounded(name)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	r.files = append(r.files, File{Name: name, Data: data})
	return nil
}

// readBounded reads the file at name, but no more than one byte past
// MaxFileSize: enough for Parse to refuse a file too large, without
// holding all of it.
func readBounded(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var b bytes.Buffer
	if info, err := f.Stat(); err == nil && info.Mode().IsRegular() {
		b.Grow(int(min(info.Size(), MaxFileSize) + bytes.MinRead))
	}
	_, err = b.ReadFrom(io.LimitReader(f, MaxFileSize+1))
	return b.Bytes(), err
}

// sniff warns, with the message format says, of the file at name when it
// looks like a rule file: named *.yaml or *.yml, or holding a line that
// starts with "domain:".
func (r *reader) sniff(name, format string, args ...any) {
	if isRuleName(name) || holdsDomain(name) {
		r.warn(name, format, args...)
	}
}

// sniffDomain warns, with the message format says, of the file at name
// when it holds a line that starts with "domain:", as every rule file
// does: the YAML files a subdirectory of rules may hold for other
// programs (Envoy's configs beside them, say) are not rule files.
func (r *reader) sniffDomain(name, format string, args ...any) {
	if holdsDomain(name) {
		r.warn(name, format, args...)
	}
}

// rel is name's path below the root, each "/" written ".", as goruntime
// names its keys.
func (r *reader) rel(name string) string {
	rel, err := filepath.Rel(r.root, name)
	if err != nil {
		return name
	}
	return strings.ReplaceAll(filepath.ToSlash(rel), "/", ".")
}

func isRuleName(name string) bool {
	ext := filepath.Ext(name)
	return ext == ".yaml" || ext == ".yml"
}

// holdsDomain reports whether the file at name starts a line with
// "domain:" in its first sniffBytes.
func holdsDomain(name string) bool {
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, sniffBytes))
	sc.Buffer(make([]byte, 0, 4096), sniffBytes)
	for sc.Scan() {
		if bytes.HasPrefix(sc.Bytes(), []byte("domain:")) {
			return true
		}
	}
	return false
}
