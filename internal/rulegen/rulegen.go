// Package rulegen writes large generated rule files for tests and
// benchmarks: one domain whose descriptors are route=rN, each with a
// nested key-only descriptor user limited to 1,000,000 per second, the
// shape of a domain of per-tenant limits that issue 33 loads at 100 to
// 100,000 routes.
package rulegen

import (
	"bytes"
	"strconv"
)

// Key and Nested are the keys of a generated domain's two levels.
const (
	Key    = "route"
	Nested = "user"
)

// Routes returns a rule file of domain holding n routes, r0 to r(n-1):
//
//	domain: <domain>
//	descriptors:
//	  - key: route
//	    value: r0
//	    descriptors:
//	      - key: user
//	        rate_limit:
//	          unit: second
//	          requests_per_unit: 1000000
//
// and so on for each route. It is about 150 bytes a route.
func Routes(domain string, n int) []byte {
	var b bytes.Buffer
	b.Grow(64 + n*150)
	b.WriteString("domain: ")
	b.WriteString(domain)
	b.WriteString("\ndescriptors:\n")
	for i := range n {
		b.WriteString("  - key: " + Key + "\n    value: ")
		b.WriteString(Value(i))
		b.WriteString("\n    descriptors:\n      - key: " + Nested + "\n        rate_limit:\n          unit: second\n          requests_per_unit: 1000000\n")
	}
	return b.Bytes()
}

// Value is route i's value: "r" and i.
func Value(i int) string {
	return "r" + strconv.Itoa(i)
}
