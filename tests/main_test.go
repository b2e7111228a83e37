package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/leaktest"
)

// bin holds the project's binaries, built once for the whole package.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "oncegate-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = dir
	for _, cmd := range []string{"gateway", "worker", "killtest", "oncegate"} {
		// Built in the root module, with its go.mod, as they ship: not with this test module's requirements.
		build := exec.Command("go", "build", "-C", "..", "-o", filepath.Join(dir, cmd), "./cmd/"+cmd)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", cmd, err)
			os.Exit(1)
		}
	}
	specCheck.install()
	code := leaktest.Check(m.Run())
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
