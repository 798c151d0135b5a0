package algo

import (
	"strings"
	"testing"
)

// TestScriptHasEveryTwin checks that the script opens its driver with the
// KEYS/ARGV/return contract and defines a Lua twin for every algorithm,
// each in a file that opens by naming its Go step function.
func TestScriptHasEveryTwin(t *testing.T) {
	s := Script()
	for _, want := range []string{"KEYS[i]", "ARGV[1]", "ARGV[2]", "Returns {admitted"} {
		if !strings.Contains(s, want) {
			t.Errorf("the script's contract does not mention %q", want)
		}
	}
	for _, a := range Algorithms() {
		if !strings.Contains(s, "algorithms."+a.String()+" = {") {
			t.Errorf("the script defines no twin of %v", a)
		}
		src, err := luaFiles.ReadFile("lua/" + a.String() + ".lua")
		if err != nil {
			t.Errorf("%v: %v", a, err)
			continue
		}
		if !strings.HasPrefix(string(src), "-- "+a.String()+".lua: the twin of algo's ") {
			t.Errorf("lua/%s.lua does not open by naming its Go twin", a)
		}
	}
}
