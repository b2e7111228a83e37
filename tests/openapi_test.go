package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/oncegate/oncegate/gateway"
)

// The gateway's OpenAPI description is checked two ways here: as a document, by kin-openapi's validator, and
// against the gateway itself, by validating every request that these tests send to a gateway binary and
// every answer they get, with kin-openapi's openapi3filter. TestMain puts specCheck in front of
// http.DefaultTransport, which every client without a transport of its own uses (http.Get,
// http.DefaultClient, &http.Client{Timeout: …}); watchGateway names the hosts to check and the test that a
// mismatch fails.

const specPath = "../gateway/openapi.yaml"

type spec struct {
	doc    *openapi3.T
	router routers.Router
}

var loadSpec = sync.OnceValues(func() (*spec, error) {
	doc, err := openapi3.NewLoader().LoadFromFile(specPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", specPath, err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("%s: %w", specPath, err)
	}
	// Route by path and method alone: the gateways here listen on ports of their own, not on the server
	// the description names.
	routed := *doc
	routed.Servers = nil
	router, err := gorillamux.NewRouter(&routed)
	if err != nil {
		return nil, err
	}
	return &spec{doc: doc, router: router}, nil
})

func init() {
	// The problem pages are HTML, validated as the string the description says they are.
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
}

func TestOpenAPIDocumentIsValid(t *testing.T) {
	t.Parallel()
	s, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	if !s.doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi %s, want 3.1", s.doc.OpenAPI)
	}
}

// conformance is the checking transport. A mismatch is reported to the test that started the gateway.
type conformance struct {
	next     http.RoundTripper
	mu       sync.Mutex
	gateways map[string]*watched // host:port → its watcher
}

type watched struct {
	report  func(error)
	checked atomic.Int64
}

var specCheck = &conformance{gateways: map[string]*watched{}}

// install puts the check in front of http.DefaultTransport.
func (c *conformance) install() {
	c.next = http.DefaultTransport
	http.DefaultTransport = c
}

// watchGateway has every exchange with the gateway at base checked against the description, until t ends;
// a mismatch fails t. It returns the count of exchanges checked.
func watchGateway(t *testing.T, base string) *atomic.Int64 {
	t.Helper()
	w := &watched{report: func(err error) { t.Errorf("OpenAPI: %v", err) }}
	specCheck.watch(t, base, w)
	return &w.checked
}

func (c *conformance) watch(t *testing.T, base string, w *watched) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.gateways[u.Host] = w
	c.mu.Unlock()
	t.Cleanup(func() {
		c.mu.Lock()
		if c.gateways[u.Host] == w {
			delete(c.gateways, u.Host)
		}
		c.mu.Unlock()
	})
}

// checked is the count of exchanges checked with the gateway at base, which watchGateway named.
func (c *conformance) checked(base string) *atomic.Int64 {
	u, _ := url.Parse(base)
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.gateways[u.Host]; w != nil {
		return &w.checked
	}
	return new(atomic.Int64)
}

func (c *conformance) CloseIdleConnections() {
	if ci, ok := c.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

func (c *conformance) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	w := c.gateways[req.URL.Host]
	c.mu.Unlock()
	if w == nil {
		return c.next.RoundTrip(req)
	}
	var reqBody []byte
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		reqBody, err = io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	sent := req.Clone(req.Context())
	sent.Body = io.NopCloser(bytes.NewReader(reqBody))
	resp, err := c.next.RoundTrip(sent)
	if err != nil {
		return nil, err
	}
	resp.Request = req
	respBody, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		// Cut off (a gateway killed mid-answer): hand on what came and the error, and check nothing.
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(respBody), errReader{err}))
		return resp, nil
	}
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	if err := errors.Join(checkExchange(req, reqBody, resp, respBody), checkProblemKind(resp, respBody)); err != nil {
		// kin-openapi's errors quote the whole schema: the place and the rule come first, and are enough.
		w.report(fmt.Errorf("%s %s → %d: %.700s\n  answer: %.400s", req.Method, req.URL.RequestURI(), resp.StatusCode,
			err.Error(), respBody))
	}
	w.checked.Add(1)
	return resp, nil
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// checkExchange holds one exchange to the description. A request it describes must get an answer it
// describes, for that status (an undescribed status is a mismatch), with the headers it requires and a body
// of its schema. A request it refuses must be refused: a 4xx. A path it does not have must be a 404 problem,
// and a method it does not have for the path a 405 problem whose Allow lists exactly the methods it has.
func checkExchange(req *http.Request, reqBody []byte, resp *http.Response, respBody []byte) error {
	s, err := loadSpec()
	if err != nil {
		return err
	}
	ctx := context.Background()
	probe := req.Clone(ctx)
	probe.Body = io.NopCloser(bytes.NewReader(reqBody))
	proxyPathAsOneSegment(probe)
	route, params, err := s.router.FindRoute(probe)
	switch {
	case errors.Is(err, routers.ErrPathNotFound):
		return s.checkProblem(resp, respBody, http.StatusNotFound)
	case errors.Is(err, routers.ErrMethodNotAllowed):
		if allow, want := resp.Header.Get("Allow"), strings.Join(s.methods(req), ", "); allow != want {
			return fmt.Errorf("Allow %q, the description has %q for this path", allow, want)
		}
		return s.checkProblem(resp, respBody, http.StatusMethodNotAllowed)
	case err != nil:
		return err
	}
	opts := &openapi3filter.Options{
		IncludeResponseStatus: true,
		MultiError:            true,
		SkipSettingDefaults:   true,
		AuthenticationFunc: func(_ context.Context, in *openapi3filter.AuthenticationInput) error {
			token, ok := strings.CutPrefix(in.RequestValidationInput.Request.Header.Get("Authorization"), "Bearer ")
			if !ok || strings.TrimSpace(token) == "" {
				return errors.New("no bearer API key")
			}
			return nil
		},
	}
	in := &openapi3filter.RequestValidationInput{Request: probe, PathParams: params, Route: route, Options: opts}
	if reqErr := openapi3filter.ValidateRequest(ctx, in); reqErr != nil && (resp.StatusCode < 400 || resp.StatusCode > 499) {
		return fmt.Errorf("a request that the description refuses got %d: %v", resp.StatusCode, reqErr)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode,
		Header: resp.Header, Options: opts}
	out.SetBodyBytes(respBody)
	return openapi3filter.ValidateResponse(ctx, out)
}

// proxyPathAsOneSegment rewrites a request to the dedup proxy, /v1/proxy/{type}/{path…}, so that its path
// under the type is one segment ("/" escaped): an OpenAPI path parameter takes one segment, and the
// description's {path} stands for the rest of the path, which the gateway's router takes whole.
func proxyPathAsOneSegment(r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), "/v1/proxy/")
	if !ok {
		return
	}
	typ, path, ok := strings.Cut(rest, "/")
	if !ok || path == "" {
		return
	}
	u := *r.URL
	u.RawPath = "/v1/proxy/" + typ + "/" + strings.ReplaceAll(path, "/", "%2F")
	u.Path, _ = url.PathUnescape(u.RawPath)
	r.URL = &u
}

// methods lists the methods the description has for req's path.
func (s *spec) methods(req *http.Request) []string {
	var out []string
	for _, m := range []string{"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"} {
		probe := req.Clone(context.Background())
		probe.Method = m
		if _, _, err := s.router.FindRoute(probe); err == nil {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

func (s *spec) checkProblem(resp *http.Response, body []byte, status int) error {
	if resp.StatusCode != status {
		return fmt.Errorf("status %d, want %d", resp.StatusCode, status)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		return fmt.Errorf("Content-Type %q", ct)
	}
	if resp.Request != nil && resp.Request.Method == http.MethodHead {
		if len(body) != 0 {
			return fmt.Errorf("a body of %d bytes in an answer to HEAD", len(body))
		}
		return nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return err
	}
	return s.doc.Components.Schemas["Problem"].Value.VisitJSON(v, openapi3.EnableJSONSchema2020())
}

// checkProblemKind holds a problem to the gateway's registry of problem types: a type it lists, with that
// type's one title and status, the status of the answer.
func checkProblemKind(resp *http.Response, body []byte) error {
	if resp.Header.Get("Content-Type") != "application/problem+json" ||
		(resp.Request != nil && resp.Request.Method == http.MethodHead) { // no body to hold
		return nil
	}
	var p gateway.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		return err
	}
	for _, k := range gateway.ProblemKinds() {
		if k.Type() == p.Type {
			if p.Title != k.Title || p.Status != k.Status || resp.StatusCode != k.Status {
				return fmt.Errorf("problem %s: title %q and status %d in a %d, the gateway's kind has %q and %d",
					p.Type, p.Title, p.Status, resp.StatusCode, k.Title, k.Status)
			}
			return nil
		}
	}
	return fmt.Errorf("problem type %q is not one of gateway.ProblemKinds", p.Type)
}
