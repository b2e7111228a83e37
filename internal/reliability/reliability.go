// Package reliability collects the results of the fault and hostile-input tests into docs/reliability.md.
// A test calls Record with the fault it inflicts, what it checks and what it measured; when RELIABILITY_OUT
// names a file, the row is appended there as a JSON line when the test ends, with PASS or FAIL. The table is
// made from those lines (scripts/reliability), never typed by hand.
package reliability

import (
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
	Status  string `json:"status"`
	Command string `json:"command"`
}

var mu sync.Mutex

// Record registers the row of the calling test; it is written when the test ends, with its verdict. result
// may be updated by calling the returned function (for figures measured later in the test).
func Record(t testing.TB, area, fault, checked string) func(result string) {
	row := Row{Area: area, Fault: fault, Checked: checked}
	if _, file, _, ok := runtime.Caller(1); ok {
		row.Command = "go test " + pkgDir(file) + " -run '^" + strings.Split(t.Name(), "/")[0] + "$'"
	}
	t.Cleanup(func() {
		out := os.Getenv("RELIABILITY_OUT")
		if out == "" {
			return
		}
		row.Status = "PASS"
		if t.Failed() {
			row.Status = "FAIL"
		} else if t.Skipped() {
			row.Status = "SKIP"
		}
		b, _ := json.Marshal(row)
		mu.Lock()
		defer mu.Unlock()
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("reliability: %v", err)
			return
		}
		defer f.Close()
		_, _ = f.Write(append(b, '\n'))
	})
	return func(result string) { row.Result = result }
}

// pkgDir returns the directory of file relative to the module root.
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
