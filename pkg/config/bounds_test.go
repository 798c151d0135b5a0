package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMaxFileSize refuses a file larger than MaxFileSize, given to Parse
// or read by Load, with one error naming the bound, and loads one of
// MaxFileSize bytes.
func TestMaxFileSize(t *testing.T) {
	const head = "domain: big\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n"
	fill := func(size int) []byte {
		b := make([]byte, size)
		copy(b, head)
		for i := len(head); i < size; i++ {
			b[i] = ' '
		}
		b[size-1] = '\n'
		return b
	}
	if _, err := Parse(File{Name: "big.yaml", Data: fill(MaxFileSize)}); err != nil {
		t.Errorf("a file of MaxFileSize bytes: %.300v", err)
	}
	want := fmt.Sprintf("big.yaml: the file is larger than %d bytes (64 MiB), the most a rule file may hold", MaxFileSize)
	_, err := Parse(File{Name: "big.yaml", Data: fill(MaxFileSize + 1)})
	if errs := unwrap(err); len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), want) {
		t.Errorf("Parse: err = %.300v, want %q", err, want)
	}

	// Load reads no more than a byte past the bound of a larger file.
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "big.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(head); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 * MaxFileSize); err != nil { // sparse: zeros, never written
		t.Fatal(err)
	}
	f.Close()
	want = filepath.Join(dir, "big.yaml") + ": the file is larger than"
	for _, path := range []string{dir, filepath.Join(dir, "big.yaml")} {
		_, err := Load(path)
		if errs := unwrap(err); len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), want) {
			t.Errorf("Load(%s): err = %.300v, want %q", path, err, want)
		}
	}
}
