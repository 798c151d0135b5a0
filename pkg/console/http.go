package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/pkg/service"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// The page: one HTML file, one script, one style sheet, embedded.
//
//go:embed ui/index.html ui/console.js ui/console.css
var uiFiles embed.FS

// ContentSecurityPolicy is sent with every answer under /ui: scripts,
// styles and fetches from this origin only, no inline script or style,
// no frames, no forms posting elsewhere, no plugins. Whatever a
// descriptor value holds, it cannot run.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// maxBody bounds the body of the page's POSTs.
const maxBody = 64 << 10

// asset is an embedded file, served with its hash as ETag.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// Handler serves the console for svc, under /ui:
//
//   - GET /ui/ the page (GET /ui redirects there), /ui/console.js and
//     /ui/console.css;
//   - GET /ui/api/state: a [State], this replica's view now;
//   - GET /ui/api/rules: a [RulesList], every rule in force;
//   - POST /ui/api/peek: the body of POST /json in, what
//     ratelimitd.v1.RateLimiter/Peek answers out (protojson): what remains
//     and when it resets, nothing consumed;
//   - POST /ui/api/reset: the body of POST /json with one descriptor in,
//     what ratelimitd.v1.RateLimiter/Reset answers out; 403 unless the
//     service allows resets (-enable-reset).
//
// Every answer forbids caching and framing and carries
// [ContentSecurityPolicy]; the POSTs are refused (403) from other origins
// (http.CrossOriginProtection) and unless their body is JSON.
func (c *Console) Handler(svc *service.Service) http.Handler {
	assets := embeddedAssets()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		// Relative, so that a proxy serving the console under a prefix
		// keeps it (http.Redirect would make it absolute).
		w.Header().Set("Location", "ui/")
		w.WriteHeader(http.StatusMovedPermanently)
	})
	serveAsset := func(w http.ResponseWriter, r *http.Request) {
		a, ok := assets[r.PathValue("file")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", a.contentType)
		w.Header().Set("ETag", a.etag)
		w.Header().Set("Cache-Control", "no-cache") // revalidate: a new binary brings a new page
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
	}
	mux.HandleFunc("GET /ui/{$}", serveAsset) // the page: no file
	mux.HandleFunc("GET /ui/{file}", serveAsset)
	mux.HandleFunc("GET /ui/api/state", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, c.State(svc.Rules(), svc.ResetEnabled()))
	})
	mux.HandleFunc("GET /ui/api/rules", func(w http.ResponseWriter, r *http.Request) {
		var src Source
		if c.opts.Source != nil {
			src = c.opts.Source()
		}
		writeJSON(w, http.StatusOK, rulesList(svc.Rules(), src))
	})
	mux.HandleFunc("POST /ui/api/peek", func(w http.ResponseWriter, r *http.Request) {
		req, ok := readRequest(w, r)
		if !ok {
			return
		}
		pr := &ratelimitdv1.PeekRequest{Domain: req.Domain, Descriptors: ownDescriptors(req), Hits: uint64(req.HitsAddend)}
		resp, err := svc.API().Peek(r.Context(), pr)
		writeProto(w, resp, err)
	})
	mux.HandleFunc("POST /ui/api/reset", c.serveReset(svc))
	mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		service.WriteJSONError(w, http.StatusNotFound, "no such page of the ops console")
	})
	return guarded(mux)
}

// embeddedAssets returns the files of the embedded page by name, the page
// itself (index.html) under "", each with its content type and ETag. It
// panics when they cannot be read: the binary is broken.
func embeddedAssets() map[string]asset {
	assets := map[string]asset{}
	err := fs.WalkDir(uiFiles, "ui", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := uiFiles.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		assets[path.Base(p)] = asset{body: body, contentType: mime.TypeByExtension(path.Ext(p)), etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic("console: reading the embedded page: " + err.Error()) // the binary is broken
	}
	assets[""] = assets["index.html"]
	delete(assets, "index.html")
	return assets
}

// serveReset answers POST /ui/api/reset: the counters of the one
// descriptor of the request reset through svc's own API, and logged;
// 403 unless svc allows resets.
func (c *Console) serveReset(svc *service.Service) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !svc.ResetEnabled() {
			service.WriteJSONError(w, http.StatusForbidden, "reset is off: start the server with -enable-reset to let operators clear counters")
			return
		}
		req, ok := readRequest(w, r)
		if !ok {
			return
		}
		if len(req.Descriptors) != 1 {
			service.WriteJSONError(w, http.StatusBadRequest, fmt.Sprintf("descriptors: a reset takes exactly one descriptor, not %d", len(req.Descriptors)))
			return
		}
		rr := &ratelimitdv1.ResetRequest{Domain: req.Domain, Descriptor_: ownDescriptors(req)[0]}
		resp, err := svc.API().Reset(r.Context(), rr)
		if err == nil {
			c.log.Info("console: counters reset from the ops console", "domain", req.Domain, "rule", resp.GetRule(),
				"counters", resp.GetCounters(), "remote", r.RemoteAddr)
		}
		writeProto(w, resp, err)
	}
}

// guarded returns next refusing cross-origin requests that change state
// (http.CrossOriginProtection), every answer forbidding caching and
// framing and carrying ContentSecurityPolicy.
func guarded(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		service.WriteJSONError(w, http.StatusForbidden, "cross-origin request refused: the console's calls come from its own page")
	}))
	protected := cop.Handler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		protected.ServeHTTP(w, r)
	})
}

// readRequest reads a RateLimitRequest in JSON (protojson), the body of
// POST /json, for a console POST: as POST /json reads it, but only with a
// JSON Content-Type and at most maxBody bytes. When it cannot, it answers
// the error and returns false.
func readRequest(w http.ResponseWriter, r *http.Request) (*rlsv3.RateLimitRequest, bool) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		// A form of another site cannot send JSON without the preflight
		// this server never grants.
		service.WriteJSONError(w, http.StatusUnsupportedMediaType, "the body must be JSON (Content-Type: application/json)")
		return nil, false
	}
	return service.ReadRLSRequest(w, r, maxBody)
}

// ownDescriptors are req's descriptors in the own API's terms.
func ownDescriptors(req *rlsv3.RateLimitRequest) []*ratelimitdv1.Descriptor {
	out := make([]*ratelimitdv1.Descriptor, len(req.Descriptors))
	for i, d := range req.Descriptors {
		od := &ratelimitdv1.Descriptor{Entries: make([]*ratelimitdv1.Entry, len(d.Entries))}
		for j, e := range d.Entries {
			od.Entries[j] = &ratelimitdv1.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if h := d.GetHitsAddend(); h != nil {
			od.Hits = h.Value
		}
		out[i] = od
	}
	return out
}

// writeProto answers m in JSON (protojson, zero values included), or err
// with the HTTP status of its gRPC code.
func writeProto(w http.ResponseWriter, m proto.Message, err error) {
	if err != nil {
		st := status.Convert(err)
		service.WriteJSONError(w, service.HTTPStatus(st.Code()), st.Message())
		return
	}
	out, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		service.WriteJSONError(w, http.StatusInternalServerError, "encoding the answer: "+err.Error())
		return
	}
	var compact bytes.Buffer
	if json.Compact(&compact, out) == nil {
		out = compact.Bytes()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(out, '\n'))
}

// writeJSON answers v in JSON. encoding/json escapes <, > and & in
// strings, so no descriptor value reads as markup even if the answer were
// taken for HTML.
func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		service.WriteJSONError(w, http.StatusInternalServerError, "encoding the answer: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}
