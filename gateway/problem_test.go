package gateway

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
)

// bareRoutes is the router of a gateway without a database: enough for what is answered before any handler
// runs (404, 405) and for the pages that need none.
func bareRoutes() *mux.Router { return (&Gateway{registry: prometheus.NewRegistry()}).routes() }

// servedMethods maps each route's path template to the methods served there.
func servedMethods(t *testing.T, r *mux.Router) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := r.Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		path, err := route.GetPathTemplate()
		if err != nil {
			return nil
		}
		methods, err := route.GetMethods()
		if err != nil {
			return nil
		}
		out[path] = append(out[path], methods...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for p := range out {
		sort.Strings(out[p])
	}
	return out
}

// A method that a path does not take is a 405 problem whose Allow lists exactly the methods that path
// takes, for every path served, /v1 ones included (those were a 404), and whatever the API key.
func TestWrongMethodIs405WithAllow(t *testing.T) {
	t.Parallel()
	r := bareRoutes()
	served := servedMethods(t, r)
	if len(served) < 8 {
		t.Fatalf("walked only %v", served)
	}
	checked := 0
	for tmpl, methods := range served {
		path := strings.NewReplacer("{key}", "some%2Fkey", "{name}", "invalid-request").Replace(tmpl)
		for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
			if slices.Contains(methods, m) {
				continue
			}
			req := httptest.NewRequest(m, path, strings.NewReader(`{"type":"x"}`))
			req.Header.Set("Authorization", "Bearer "+acmeKey)
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			var p Problem
			_ = json.Unmarshal(w.Body.Bytes(), &p)
			if w.Code != 405 || w.Header().Get("Allow") != strings.Join(methods, ", ") ||
				w.Header().Get("Content-Type") != "application/problem+json" ||
				p.Type != "/problems/method-not-allowed" || p.Title != probMethodNotAllowed.Title || p.Status != 405 {
				t.Errorf("%s %s: %d Allow %q %s; want 405 Allow %q", m, path, w.Code, w.Header().Get("Allow"),
					w.Body.String(), strings.Join(methods, ", "))
			}
			checked++
		}
	}
	// A path that is not served is a 404 whatever the method.
	for _, m := range []string{"GET", "PUT"} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(m, "/v1/nothing", nil))
		if w.Code != 404 || w.Header().Get("Allow") != "" || !strings.Contains(w.Body.String(), "/problems/not-found") {
			t.Errorf("%s /v1/nothing: %d %v %s", m, w.Code, w.Header(), w.Body.String())
		}
	}
	t.Logf("%d wrong methods on %d paths", checked, len(served))
}

// Every problem type's URI serves a page that says what the problem means and what to do about it.
func TestEveryProblemTypeResolves(t *testing.T) {
	t.Parallel()
	r := bareRoutes()
	for _, k := range ProblemKinds() {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest("GET", k.Type(), nil))
		body := html.UnescapeString(w.Body.String())
		if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") ||
			!strings.Contains(body, "<h1>"+k.Title+"</h1>") || !strings.Contains(body, k.Means) ||
			!strings.Contains(body, k.Do) || !strings.Contains(body, "status "+strconv.Itoa(k.Status)) {
			t.Errorf("%s: %d %s\n%s", k.Type(), w.Code, w.Header().Get("Content-Type"), body)
		}
	}
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/problems/no-such-problem", nil))
	if w.Code != 404 || w.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("unknown problem type: %d %s", w.Code, w.Body.String())
	}
}

// The problem types the code can answer with are the registry's, each with one title and a status, and the
// OpenAPI description lists exactly them. What the code can answer with is read from its source: every
// ProblemKind literal, and no "/problems/" string outside problem.go.
func TestProblemTypesAreRegisteredAndDescribed(t *testing.T) {
	t.Parallel()
	registered := map[string]ProblemKind{}
	for _, k := range ProblemKinds() {
		if _, dup := registered[k.Slug]; dup {
			t.Errorf("%s registered twice", k.Slug)
		}
		if k.Title == "" || k.Means == "" || k.Do == "" || http.StatusText(k.Status) == "" || k.Status < 400 {
			t.Errorf("%s is incomplete: %+v", k.Slug, k)
		}
		registered[k.Slug] = k
	}

	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	inCode := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if f != "problem.go" && strings.Contains(string(src), "/problems/") {
			t.Errorf("%s spells a problem type itself; use a ProblemKind of problem.go", f)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			if id, ok := lit.Type.(*ast.Ident); !ok || id.Name != "ProblemKind" {
				return true
			}
			for _, e := range lit.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok && kv.Key.(*ast.Ident).Name == "Slug" {
					slug, _ := strconv.Unquote(kv.Value.(*ast.BasicLit).Value)
					inCode[slug] = true
				}
			}
			return true
		})
	}
	for slug := range inCode {
		if _, ok := registered[slug]; !ok {
			t.Errorf("problem type %s is in the code but not in problemKinds", slug)
		}
	}
	if len(inCode) != len(registered) {
		t.Errorf("%d problem kinds in the code, %d registered", len(inCode), len(registered))
	}

	var doc struct {
		Components struct {
			Schemas struct {
				Problem struct {
					Properties struct {
						Type struct {
							Enum []string `yaml:"enum"`
						} `yaml:"type"`
					} `yaml:"properties"`
				} `yaml:"Problem"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	described := doc.Components.Schemas.Problem.Properties.Type.Enum
	var want []string
	for slug := range registered {
		want = append(want, "/problems/"+slug)
	}
	sort.Strings(want)
	sort.Strings(described)
	if !slices.Equal(described, want) {
		t.Errorf("openapi.yaml's Problem.type enum is %v, the gateway's types %v", described, want)
	}
}
