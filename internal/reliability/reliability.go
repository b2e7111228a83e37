// Package reliability collects the fault and hostile-input tests' rows into docs/reliability.md. A test calls
// Record with the fault it inflicts, what it checks and what it measured; when RELIABILITY_OUT names a file,
// the row is appended there as a JSON line. The row's status is not the test's to say: Render takes it from
// `go test -json`'s verdict on the test that reported the row, so PASS means go test saw that test pass, and a
// row whose test failed, was skipped or never finished says so (scripts/reliability).
package reliability

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Row is one fault or hostile input and what the test found.
type Row struct {
	Area    string `json:"area"`
	Fault   string `json:"fault"`
	Checked string `json:"checked"`
	Result  string `json:"result"`
	// Package and Test name the test that reported the row, as `go test -json` names it.
	Package string `json:"package"`
	Test    string `json:"test"`
	// Status is go test's verdict on Test, set by Render: PASS, FAIL, SKIP, or NOT RUN when go test's output
	// has no verdict on it (its binary crashed or timed out, or it was not run).
	Status  string `json:"status,omitempty"`
	Command string `json:"command"`
}

var mu sync.Mutex

// Record registers the row of the calling test. It is written at once, so that a test whose binary dies still
// has its row (without a result, and NOT RUN or FAIL as go test saw it), and again when the test ends, with
// the result: the returned function sets it, for figures measured in the test.
func Record(t testing.TB, area, fault, checked string) func(result string) {
	row := Row{Area: area, Fault: fault, Checked: checked, Test: t.Name()}
	if _, file, _, ok := runtime.Caller(1); ok {
		row.Package = importPath(filepath.Dir(file))
		row.Command = "go test " + pkgDir(file) + " -run '^" + strings.Split(t.Name(), "/")[0] + "$'"
	}
	write := func(r Row) {
		out := os.Getenv("RELIABILITY_OUT")
		if out == "" {
			return
		}
		b, _ := json.Marshal(r)
		mu.Lock()
		defer mu.Unlock()
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("reliability: %v", err)
			return
		}
		defer f.Close()
		_, _ = f.Write(append(b, '\n'))
	}
	write(row)
	t.Cleanup(func() { write(row) })
	return func(result string) { row.Result = result }
}

// importPath returns the import path of the package in dir: its module's path (go.mod's module line) and the
// folder below the module's root.
func importPath(dir string) string {
	for d := dir; d != filepath.Dir(d); d = filepath.Dir(d) {
		f, err := os.Open(filepath.Join(d, "go.mod"))
		if err != nil {
			continue
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if mod, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
				if r := rel(d, dir); r != "." {
					return strings.Trim(mod, `"`) + "/" + r
				}
				return strings.Trim(mod, `"`)
			}
		}
		return ""
	}
	return ""
}

// pkgDir returns the package argument of a go test command run from the repository's root: "./dir" in the
// root module, "-C mod ./dir" in a nested one (tests/ is a module of its own).
func pkgDir(file string) string {
	dir := filepath.Dir(file)
	mod := ""
	for d := dir; d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			if mod != "" {
				return "-C " + rel(d, mod) + " " + pkg(rel(mod, dir))
			}
			mod = d
		}
		if _, err := os.Stat(filepath.Join(d, ".git")); err == nil {
			break
		}
	}
	if mod == "" {
		return "."
	}
	return pkg(rel(mod, dir))
}

func pkg(rel string) string {
	if rel == "." {
		return "."
	}
	return "./" + rel
}

func rel(base, target string) string {
	r, err := filepath.Rel(base, target)
	if err != nil {
		return target
	}
	return filepath.ToSlash(r)
}
