package reliability_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/reliability"
)

// A row's status is what `go test -json` said of the test that reported it, not what the test wrote: the
// fixture's tests (testdata/rows) run for real, and a test that fails after its row was written, or whose
// binary dies, is not PASS however its row reads.
func TestStatusIsGoTestsVerdict(t *testing.T) {
	t.Parallel()
	rowsFile := filepath.Join(t.TempDir(), "rows.jsonl")
	cmd := exec.Command("go", "test", "-json", "-count=1", "./testdata/rows")
	cmd.Env = append(os.Environ(), "RELIABILITY_OUT="+rowsFile, "RELIABILITY_FIXTURE=1")
	out, err := cmd.Output()
	if err == nil {
		t.Fatalf("go test of the fixture passed, and it has failing tests:\n%s", out)
	}
	// A row that claims PASS for a failing test: the file's word is not taken.
	f, err := os.OpenFile(rowsFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(`{"area":"Fixture","fault":"fails","package":"github.com/oncegate/oncegate/internal/reliability/testdata/rows","test":"TestFails","status":"PASS","result":"typed"}` + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(rowsFile)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := reliability.ReadRows(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	verdicts, err := reliability.Verdicts(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	doc, failing := reliability.Render(rows, verdicts)

	const pkg = "github.com/oncegate/oncegate/internal/reliability/testdata/rows"
	want := map[string]string{"passes": "PASS", "fails": "FAIL", "fails late": "FAIL", "skips": "SKIP",
		"a subtest": "PASS", "dies": "NOT RUN"}
	if len(rows) != len(want) {
		t.Errorf("%d rows, want %d: %+v", len(rows), len(want), rows)
	}
	for _, r := range rows {
		line := ""
		for l := range strings.SplitSeq(doc, "\n") {
			if strings.HasPrefix(l, "| "+r.Fault+" |") {
				line = l
			}
		}
		if !strings.Contains(line, "| "+want[r.Fault]+" |") {
			t.Errorf("row %q: %q, want status %s", r.Fault, line, want[r.Fault])
		}
		if r.Package != pkg {
			t.Errorf("row %q: package %q, want %q", r.Fault, r.Package, pkg)
		}
	}
	if len(failing) != 4 {
		t.Errorf("%d rows not passing, want 4 (fails, fails late, skips, dies)", len(failing))
	}
	if strings.Contains(doc, "measured 2") || strings.Contains(doc, "measured 3") || strings.Contains(doc, "typed") {
		t.Errorf("a row whose test failed shows the result it reported:\n%s", doc)
	}
	for _, s := range []string{"| measured 1 |", "| measured 4 |",
		"`go test ./internal/reliability/testdata/rows -run '^TestSubtests$'`", "6 rows, 4 not passing."} {
		if !strings.Contains(doc, s) {
			t.Errorf("the table has no %q:\n%s", s, doc)
		}
	}
}
