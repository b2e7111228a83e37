package gateway

import (
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
)

var routeVarPattern = regexp.MustCompile(`\{(\w+):[^}]*\}`)

// The OpenAPI description and the router agree: every route served is described, and every described
// operation is served.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	var doc struct {
		OpenAPI string                    `yaml:"openapi"`
		Paths   map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Fatalf("openapi %q", doc.OpenAPI)
	}
	described := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			described[strings.ToUpper(method)+" "+path] = true
		}
	}
	r := (&Gateway{registry: prometheus.NewRegistry()}).routes()
	served := map[string]bool{}
	err := r.Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		path, err := route.GetPathTemplate()
		if err != nil {
			return nil
		}
		methods, err := route.GetMethods()
		if err != nil {
			return nil // a subrouter's prefix
		}
		// A variable's pattern ({path:.*}, which takes the rest of the path) is the router's business; the
		// description names the variable alone.
		path = routeVarPattern.ReplaceAllString(path, "{$1}")
		for _, m := range methods {
			served[m+" "+path] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k := range served {
		if !described[k] {
			t.Errorf("served but not described: %s", k)
		}
	}
	for k := range described {
		if !served[k] {
			t.Errorf("described but not served: %s", k)
		}
	}
	if len(served) < 8 {
		keys := make([]string, 0, len(served))
		for k := range served {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		t.Fatalf("walked only %v", keys)
	}
}

// A plain scalar in a YAML flow mapping ends at its first comma: `{ description: a, b. }` is a description
// "a" and a key "b." with no value, which YAML accepts and OpenAPI does not. No key of openapi.yaml is
// without a value.
func TestOpenAPIHasNoKeyWithoutAValue(t *testing.T) {
	var root yaml.Node
	if err := yaml.Unmarshal(openAPI, &root); err != nil {
		t.Fatal(err)
	}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if v.Kind == yaml.ScalarNode && v.Tag == "!!null" && v.Value == "" {
					t.Errorf("openapi.yaml:%d: %q has no value (a comma in an unquoted flow scalar?)", k.Line, k.Value)
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&root)
}
