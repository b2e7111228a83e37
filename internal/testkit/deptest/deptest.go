// Package deptest checks which packages a package links, in the manner of Tailscale's tstest/deptest: an
// import that drags a whole driver into a binary that never talks to it is a review comment nobody makes twice,
// so a test makes it instead.
package deptest

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Rule forbids Package, and everything it imports, from linking any package whose import path is one of
// Forbidden or lies below one of them.
type Rule struct {
	Package   string
	Forbidden []string
	// Why is printed with a violation, so the failure explains the rule.
	Why string
	// Dir is the folder of Package's module relative to this module's root: empty for this module, "bench"
	// for the benchmarks' module.
	Dir string
}

// Deps lists the import paths pkg links, itself included, test files excluded.
func Deps(t testing.TB, pkg string) []string {
	t.Helper()
	return goList(t, "", "-deps", pkg)
}

// goList runs `go list` in the module in dir (relative to this module's root; "" is this module) and returns
// the words it printed.
func goList(t testing.TB, dir string, args ...string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("deptest needs the go command: %v", err)
	}
	if dir != "" {
		gomod, err := exec.Command(goBin, "env", "GOMOD").Output()
		if err != nil || strings.TrimSpace(string(gomod)) == "" {
			t.Fatalf("go env GOMOD: %v (%q): deptest runs inside a module", err, gomod)
		}
		args = append([]string{"-C", filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), dir)}, args...)
	}
	args = append([]string{"list"}, args...)
	out, err := exec.Command(goBin, args...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	return strings.Fields(string(out))
}

// Packages lists the import paths that pattern (an import path, or one ending in "/...") matches.
func Packages(t testing.TB, pattern string) []string {
	t.Helper()
	return goList(t, "", pattern)
}

// PackagesOf is Packages of the rule's module: it lists what r.Package matches there.
func PackagesOf(t testing.TB, r Rule) []string {
	t.Helper()
	return goList(t, r.Dir, r.Package)
}

// Check fails t once for every entry of r.Forbidden that r.Package links, naming one linked package of it.
func Check(t *testing.T, r Rule) {
	t.Helper()
	deps := goList(t, r.Dir, "-deps", r.Package)
	for _, f := range r.Forbidden {
		for _, dep := range deps {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("%s links %s, which it must not (`go mod why -m` or `go list -deps` shows the path): %s",
					r.Package, dep, r.Why)
				break
			}
		}
	}
}
