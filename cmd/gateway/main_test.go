package main

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stderrOf runs f with os.Stderr going to a file, and returns the lines f wrote there.
func stderrOf(t *testing.T, f func()) []string {
	t.Helper()
	file, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	saved := os.Stderr
	os.Stderr = file
	defer func() { os.Stderr = saved }()
	f()
	if _, err := file.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for s := bufio.NewScanner(file); s.Scan(); {
		lines = append(lines, s.Text())
	}
	return lines
}

// A start that fails returns its error to main (so deferred clean-up, telemetry's flush included, runs) and
// logs it exactly once. Not parallel: it swaps os.Stderr.
func TestFailedStartLogsOnce(t *testing.T) {
	t.Setenv("OTEL_SDK_DISABLED", "true")
	bad := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(bad, []byte("listne: 127.0.0.1:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	everywhere := filepath.Join(t.TempDir(), "everywhere.yaml")
	if err := os.WriteFile(everywhere, []byte("listen: 0.0.0.0:8080\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want string // in the one line logged; "" for nothing logged
	}{
		{"bad config", []string{"migrate", "--config", bad}, `"err":"config ` + bad + `: listne: unknown field`},
		{"bad log level", []string{"serve", "--log-level", "loud"}, "gateway: log level"},
		{"no tenants", []string{"serve"}, `"err":"config: tenants: missing`},
		{"--dev on every interface", []string{"serve", "--dev", "--config", everywhere}, `listen: \"0.0.0.0:8080\": --dev listens on loopback only`},
		{"unknown command", []string{"dance"}, ""},
	} {
		var err error
		lines := stderrOf(t, func() { err = run(c.args) })
		if err == nil {
			t.Errorf("%s: run returned no error", c.name)
			continue
		}
		if c.want == "" {
			if !errors.Is(err, errUsage) || len(lines) != 0 {
				t.Errorf("%s: %v, logged %q; want the usage error for main, nothing logged", c.name, err, lines)
			}
			continue
		}
		if len(lines) != 1 || !strings.Contains(lines[0], c.want) {
			t.Errorf("%s: logged %q, want one line with %q", c.name, lines, c.want)
		}
	}
}
