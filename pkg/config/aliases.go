package config

// Aliases: what a file's aliases expand it to, bounded before the file is
// walked (MaxAliasNodes), and aliases that name a node holding them.

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// saturated caps the node counts of aliasScan, so that sums of counts
// never overflow.
const saturated = 1 << 62

// aliasScan walks a document once, in document order, counting its own
// nodes and the nodes its aliases expand to.
type aliasScan struct {
	// done holds the nodes each anchored node expands to, once walked.
	// An anchor comes before every alias naming it, so an alias naming a
	// node not done names one that holds it.
	done  map[*yaml.Node]uint64
	plain uint64    // the file's own nodes, each alias one
	path  []pathSeg // the field being walked
	// widest is the alias naming the most nodes, of widestN, at
	// widestField; cycle is the first alias naming a node that holds it.
	widest, cycle           *yaml.Node
	widestN                 uint64
	widestField, cycleField string
}

// pathSeg is one step of a field's path: a field name, or an index when
// name is empty.
type pathSeg struct {
	name  string
	index int
}

// checkAliases refuses, with one error, a document (root) that holds an
// alias naming a node that holds it, or whose aliases add more nodes than
// MaxAliasNodes and than the file holds itself. It walks every node once,
// each alias's target counted from what it counted before.
func (p *parser) checkAliases(root *yaml.Node) bool {
	a := aliasScan{done: make(map[*yaml.Node]uint64)}
	total := a.walk(root)
	if a.cycle != nil {
		p.fail(a.cycle, a.cycleField, "the alias *%s names a node that holds it (anchored at line %d), which would nest without end; "+
			"an alias names a node written before it and outside it", a.cycle.Value, a.cycle.Alias.Line)
		return false
	}
	added := total - min(total, a.plain)
	if allowed := max(MaxAliasNodes, a.plain); added > allowed {
		p.fail(a.widest, a.widestField, "aliases expand the file by %s YAML nodes, each use of an alias counting again the nodes it names (%s for this one); "+
			"at most %d are accepted, or as many as the file holds itself (%d here) if more: nest or repeat fewer aliases, or write the repeated parts out",
			nodesText(added), nodesText(a.widestN), MaxAliasNodes, a.plain)
		return false
	}
	return true
}

// walk returns the nodes n expands to, itself included, counting what it
// finds on the way.
func (a *aliasScan) walk(n *yaml.Node) uint64 {
	a.plain++
	if n.Kind == yaml.AliasNode {
		e, ok := a.done[n.Alias]
		if !ok {
			if a.cycle == nil {
				a.cycle, a.cycleField = n, a.field()
			}
			return 1
		}
		if e > a.widestN {
			a.widest, a.widestN, a.widestField = n, e, a.field()
		}
		return e
	}
	total := uint64(1)
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i < len(n.Content); i += 2 {
			total = min(total+a.walk(n.Content[i]), saturated)
			if i+1 < len(n.Content) {
				name := "?"
				if k := resolve(n.Content[i]); k.Kind == yaml.ScalarNode {
					name = k.Value
				}
				a.path = append(a.path, pathSeg{name: name})
				total = min(total+a.walk(n.Content[i+1]), saturated)
				a.path = a.path[:len(a.path)-1]
			}
		}
	default:
		for i, c := range n.Content {
			a.path = append(a.path, pathSeg{index: i})
			total = min(total+a.walk(c), saturated)
			a.path = a.path[:len(a.path)-1]
		}
	}
	if n.Anchor != "" {
		a.done[n] = total
	}
	return total
}

// field returns the path being walked as error messages name fields:
// "descriptors[2].rate_limit".
func (a *aliasScan) field() string {
	var b strings.Builder
	for _, s := range a.path {
		if s.name == "" {
			fmt.Fprintf(&b, "[%d]", s.index)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.name)
	}
	return b.String()
}

// nodesText writes a node count, or what it is more than when saturated.
func nodesText(n uint64) string {
	if n >= saturated {
		return "more than " + strconv.FormatUint(saturated, 10)
	}
	return strconv.FormatUint(n, 10)
}
