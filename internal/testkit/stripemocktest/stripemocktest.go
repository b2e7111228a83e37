// Package stripemocktest runs Stripe's stripe-mock (the real mock server Stripe publishes for its SDKs' tests)
// on loopback for tests. The binary comes from scripts/stripe-mock, which builds it once into a cache folder;
// Start runs that script itself when the binary is missing, so the test runs wherever the Go module proxy is
// reachable, and skips, saying so, only where it is not and CI is not set (under CI it fails).
package stripemocktest

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// Version is the stripe-mock release the project tests against.
const Version = "v0.203.0"

// build runs scripts/stripe-mock once per test binary and remembers its answer.
var build = sync.OnceValues(func() (string, error) {
	if b := os.Getenv("STRIPE_MOCK_BIN"); b != "" {
		return b, nil
	}
	script, err := findScript()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(script).Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", script, err)
	}
	return strings.TrimSpace(string(out)), nil
})

// findScript finds scripts/stripe-mock in the working directory or one above it (the tests module).
func findScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for range 4 {
		p := filepath.Join(dir, "scripts", "stripe-mock")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		dir = filepath.Dir(dir)
	}
	return "", fmt.Errorf("scripts/stripe-mock not found above the working directory")
}

// Start runs stripe-mock until the test ends and returns its base URL (http://127.0.0.1:port).
func Start(t *testing.T) string {
	t.Helper()
	bin, err := build()
	if err != nil {
		if testenv.CI() {
			t.Fatalf("no stripe-mock, and under CI the proxy's SDK test must run: %v", err)
		}
		t.Skipf("no stripe-mock (run scripts/stripe-mock, which needs the Go module proxy): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	proctest.Start(t, exec.Command(bin, "-http-addr", addr))
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/v1/charges")
		if err == nil {
			resp.Body.Close()
			return base
		}
		if time.Now().After(deadline) {
			t.Fatalf("stripe-mock did not answer on %s within 30s: %v", base, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
