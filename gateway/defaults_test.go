package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// Each default has one owner: every Default constant of the gateway is declared in defaults.go (none in
// another file of the package or in cmd/gateway), and each is put to use where the defaults are filled:
// WithDefaults (and Retry.withDefaults), poolConfig (the pool's two) or providerKinds (a kind's own).
func TestDefaultsHaveOneOwner(t *testing.T) {
	fset := token.NewFileSet()
	used := map[string]bool{}
	var declared []string
	for _, pattern := range []string{"*.go", "../cmd/gateway/*.go"} {
		files, _ := filepath.Glob(pattern)
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.GenDecl:
					for _, s := range d.Specs {
						v, ok := s.(*ast.ValueSpec)
						if !ok {
							continue
						}
						for _, n := range v.Names {
							if strings.HasPrefix(n.Name, "Default") {
								if path != "defaults.go" {
									t.Errorf("%s: %s declared outside defaults.go", fset.Position(n.Pos()), n.Name)
								}
								declared = append(declared, n.Name)
							}
							if n.Name == "providerKinds" {
								markUsed(v, used)
							}
						}
					}
				case *ast.FuncDecl:
					if d.Name.Name == "WithDefaults" || d.Name.Name == "withDefaults" || d.Name.Name == "poolConfig" {
						markUsed(d, used)
					}
				}
			}
		}
	}
	if len(declared) < 30 {
		t.Fatalf("found %d Default constants: the test no longer reads the package", len(declared))
	}
	for _, name := range declared {
		if !used[name] {
			t.Errorf("%s is filled in by none of WithDefaults, withDefaults, poolConfig and providerKinds", name)
		}
	}
}

func markUsed(n ast.Node, used map[string]bool) {
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			used[id.Name] = true
		}
		return true
	})
}

// docs/configuration.md's default column says what WithDefaults fills: every row whose default is one value
// (`10s`, `256KiB`, `false`) is read as the file would read it and compared with the filled configuration
// (keys without a section prefix being the effect type's).
func TestDocumentedDefaultsAreTheDefaults(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	c := (&Config{Dev: true}).WithDefaults()
	et := c.EffectTypes[DefaultEffectType]
	rowRe := regexp.MustCompile("(?m)^\\| `([a-z_.]+)` \\| `([^`]*)` \\|")
	rows := rowRe.FindAllSubmatch(doc, -1)
	for _, m := range rows {
		key, value := string(m[1]), string(m[2])
		field, ok := fieldAt(reflect.ValueOf(c).Elem(), key)
		if !ok {
			field, ok = fieldAt(reflect.ValueOf(&et).Elem(), key)
		}
		if !ok {
			t.Errorf("docs/configuration.md: %s: no such key of the configuration or of an effect type", key)
			continue
		}
		want := reflect.New(field.Type())
		if err := yaml.Unmarshal([]byte(value), want.Interface()); err != nil {
			t.Errorf("docs/configuration.md: %s: default %q does not read as a value: %v", key, value, err)
			continue
		}
		if got := field.Interface(); !reflect.DeepEqual(want.Elem().Interface(), got) {
			if d, ok := got.(Duration); ok {
				got = time.Duration(d)
			}
			t.Errorf("docs/configuration.md: %s: documented default %q, WithDefaults fills %v", key, value, got)
		}
	}
	if len(rows) < 30 {
		t.Fatalf("%d rows with a default compared: the test no longer reads the page", len(rows))
	}
}

// fieldAt follows a dotted key through the struct v by the fields' yaml names.
func fieldAt(v reflect.Value, key string) (reflect.Value, bool) {
	for _, name := range strings.Split(key, ".") {
		for v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, false
		}
		found := false
		for i := 0; i < v.NumField(); i++ {
			if strings.Split(v.Type().Field(i).Tag.Get("yaml"), ",")[0] == name {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, false
		}
	}
	return v, true
}
