package deptest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// ownedTables are written by package dedup alone: it keeps the rules the dispatchers rely on (an outbox row
// exists exactly while its effect has something to deliver, a key points at the effect its last claim made,
// a lease is cleared only with its row handed back,
// a retry means one thing whoever asks). When admin wrote them with SQL of its own, a tenant's retry and an
// operator's disagreed about an operator's resolution.
var ownedTables = regexp.MustCompile(`(?is)\b(insert\s+into|update|delete\s+from|truncate(\s+table)?|copy|merge\s+into)\s+(only\s+)?oncegate_(effects|effect_bodies|keys|outbox|paused_types)\b`)

// writersAllowed are the paths that may write them besides dedup: the schema's migrations, and the seeders of
// tests and benchmarks, which make a million rows faster than the API would.
var writersAllowed = []string{"dedup/", "migrations/", "internal/testkit/", "bench/"}

func TestOneWriterOfTheEffectTables(t *testing.T) {
	out, err := exec.Command("git", "-C", repoRoot(t), "ls-files", "--cached", "--others", "--exclude-standard", "*.go", "*.sql").Output()
	if err != nil {
		t.Fatalf("listing the repository's files needs a git checkout (git ls-files): %v", err)
	}
	checked := 0
	for _, path := range strings.Fields(string(out)) {
		if strings.HasSuffix(path, "_test.go") || allowedWriter(path) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot(t), path))
		if os.IsNotExist(err) {
			continue // deleted, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		checked++
		if m := ownedTables.Find(b); m != nil {
			t.Errorf("%s writes a table that only dedup writes (%q): add a typed dedup.Store method and call it", path, m)
		}
	}
	if checked < 50 {
		t.Fatalf("checked only %d files: the list of the repository's files is wrong", checked)
	}
}

func allowedWriter(path string) bool {
	for _, p := range writersAllowed {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
