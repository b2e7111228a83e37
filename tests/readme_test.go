package tests

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeSnippetPrelude declares what the README's Go snippets take from their surroundings. A snippet that
// needs more fails to build with "undefined: …": declare it here.
const readmeSnippetPrelude = `package main

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/redis/go-redis/v9"
	"github.com/stripe/stripe-go/v82"

	"github.com/oncegate/oncegate/client"
	"github.com/oncegate/oncegate/queue"
)

// Signup is the job payload of the README's handler.
type Signup struct{ User, Email string }

var (
	ctx     = context.Background()
	rdb     *redis.Client
	q       *queue.Queue
	apiKey  string
	payload []byte
)

func send(context.Context, *queue.Job) error { return nil }

// Every snippet need not use every import.
var (
	_ = json.Marshal
	_ = client.New
	_ = http.DefaultClient
	_ = stripe.NewClient
)

func main() {}
`

// The README's Go snippets build as an application would write them: in a module of its own that requires
// oncegate (replaced by this checkout), with only its exported API. Each snippet becomes the body of a
// function; the variables it declares at its top level are then marked used, as the code around a real
// snippet would use them.
func TestReadmeGoSnippetsBuildFromAnotherModule(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?ms)^```go\n(.*?)^```\n").FindAllSubmatch(readme, -1)
	if len(blocks) < 2 {
		t.Fatalf("%d Go snippets in README.md", len(blocks))
	}
	var src strings.Builder
	src.WriteString(readmeSnippetPrelude)
	for i, b := range blocks {
		body := string(b[1])
		fmt.Fprintf(&src, "\n// README snippet %d\nfunc snippet%d() {\n%s", i+1, i+1, body)
		for _, name := range declaredAtTop(t, body) {
			fmt.Fprintf(&src, "\t_ = %s\n", name)
		}
		src.WriteString("}\n")
	}

	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// Stripe's SDK is the one module a snippet uses besides oncegate (the proxy's example): its version and
	// sums are this test module's.
	gomod := fmt.Sprintf("module example.test/readme\n\ngo 1.26.0\n\nrequire github.com/oncegate/oncegate v0.0.0\n"+
		"require github.com/stripe/stripe-go/v82 %s\n\nreplace github.com/oncegate/oncegate => %s\n", stripeVersion(t), repo)
	sum, err := os.ReadFile("../go.sum")
	if err != nil {
		t.Fatal(err)
	}
	ours, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	sum = append(sum, ours...)
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, "main.go": []byte(src.String())} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command("go", "build", "-mod=mod", "-o", os.DevNull, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOWORK=off")
	var out bytes.Buffer
	build.Stdout, build.Stderr = &out, &out
	if err := build.Run(); err != nil {
		t.Fatalf("the README's Go snippets do not build from another module: %v\n%s\n%s", err, out.String(),
			numbered(src.String()))
	}
}

// stripeVersion is the version of Stripe's SDK that this module requires.
func stripeVersion(t *testing.T) string {
	t.Helper()
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`github.com/stripe/stripe-go/v82 (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("tests/go.mod does not require github.com/stripe/stripe-go/v82")
	}
	return string(m[1])
}

// declaredAtTop lists the variables that the statements of body declare with := at their top level.
func declaredAtTop(t *testing.T, body string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "snippet.go", "package p\nfunc f() {\n"+body+"\n}\n", 0)
	if err != nil {
		t.Fatalf("a README snippet does not parse: %v\n%s", err, body)
	}
	var names []string
	for _, st := range f.Decls[0].(*ast.FuncDecl).Body.List {
		if as, ok := st.(*ast.AssignStmt); ok && as.Tok == token.DEFINE {
			for _, l := range as.Lhs {
				if id, ok := l.(*ast.Ident); ok && id.Name != "_" {
					names = append(names, id.Name)
				}
			}
		}
	}
	return names
}

func numbered(src string) string {
	var b strings.Builder
	for i, l := range strings.Split(src, "\n") {
		fmt.Fprintf(&b, "%3d  %s\n", i+1, l)
	}
	return b.String()
}
