// Package reftest reads answers recorded from a run of envoyproxy/ratelimit
// (the reference), so that tests compare ratelimitd with them without the
// reference present.
//
// A recording is text: lines starting with "#" say how it was made (the
// reference's commit, the date, its settings); "@ NAME" starts a section,
// one run of the reference; "== DOMAIN ENTRIES" is one descriptor, its
// entries as the JSON of the reference's /json endpoint
// ([{"key":"k","value":"v"}]), sent once per answer that follows; each
// answer is a line of the JSON /json returned.
package reftest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Section is one run of the reference.
type Section struct {
	Name  string
	Cases []Case
}

// Case is one descriptor and the reference's answers to it, in order.
type Case struct {
	Domain  string
	Entries []Entry
	Answers []Answer
}

// Entry is one entry of a descriptor.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Answer is the reference's answer to a one-descriptor request: its
// overall code and that descriptor's status.
type Answer struct {
	Overall   string // OK, OVER_LIMIT
	Code      string
	Limit     uint32 // currentLimit.requestsPerUnit; 0 when no limit applied
	Unit      string // currentLimit.unit, such as MINUTE
	Remaining uint32
}

// Read reads the recording at path.
func Read(path string) ([]Section, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var sections []Section
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%s:%d: %s", path, n, fmt.Sprintf(format, args...))
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "@ "):
			sections = append(sections, Section{Name: strings.TrimPrefix(line, "@ ")})
		case len(sections) == 0:
			return nil, bad("an answer before the first \"@ \" section")
		case strings.HasPrefix(line, "== "):
			domain, entries, ok := strings.Cut(strings.TrimPrefix(line, "== "), " ")
			c := Case{Domain: domain}
			if !ok || json.Unmarshal([]byte(entries), &c.Entries) != nil {
				return nil, bad("want \"== DOMAIN [{\\\"key\\\":...}]\"")
			}
			s := &sections[len(sections)-1]
			s.Cases = append(s.Cases, c)
		default:
			s := &sections[len(sections)-1]
			if len(s.Cases) == 0 {
				return nil, bad("an answer before its \"== \" line")
			}
			var resp struct {
				OverallCode string
				Statuses    []struct {
					Code         string
					CurrentLimit struct {
						RequestsPerUnit uint32
						Unit            string
					}
					LimitRemaining uint32
				}
			}
			if err := json.Unmarshal([]byte(line), &resp); err != nil || len(resp.Statuses) != 1 {
				return nil, bad("want the JSON of a one-descriptor answer: %v", err)
			}
			st := resp.Statuses[0]
			c := &s.Cases[len(s.Cases)-1]
			c.Answers = append(c.Answers, Answer{Overall: resp.OverallCode, Code: st.Code,
				Limit: st.CurrentLimit.RequestsPerUnit, Unit: st.CurrentLimit.Unit, Remaining: st.LimitRemaining})
		}
	}
	return sections, sc.Err()
}

// Find returns the section named name, or nil.
func Find(sections []Section, name string) *Section {
	for i := range sections {
		if sections[i].Name == name {
			return &sections[i]
		}
	}
	return nil
}
