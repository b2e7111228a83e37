// Package rows is the reliability package's fixture: tests that report rows and then pass, fail, skip or take
// their binary down, run by TestStatusIsGoTestsVerdict with `go test -json`. They do nothing unless it asks.
package rows

import (
	"os"
	"testing"

	"github.com/oncegate/oncegate/internal/reliability"
)

func fixture(t *testing.T) {
	if os.Getenv("RELIABILITY_FIXTURE") == "" {
		t.Skip("run by internal/reliability's TestStatusIsGoTestsVerdict")
	}
}

func TestPasses(t *testing.T) {
	fixture(t)
	reliability.Record(t, "Fixture", "passes", "nothing")("measured 1")
}

func TestFails(t *testing.T) {
	fixture(t)
	reliability.Record(t, "Fixture", "fails", "nothing")("measured 2, which is wrong")
	t.Error("the check failed")
}

func TestFailsInACleanupAfterItsRow(t *testing.T) {
	fixture(t)
	t.Cleanup(func() { t.Error("a clean-up registered before the row fails the test after the row is written") })
	reliability.Record(t, "Fixture", "fails late", "nothing")("measured 3")
}

func TestSkips(t *testing.T) {
	fixture(t)
	reliability.Record(t, "Fixture", "skips", "nothing")
	t.Skip("no such service here")
}

func TestSubtests(t *testing.T) {
	fixture(t)
	t.Run("one", func(t *testing.T) { reliability.Record(t, "Fixture", "a subtest", "nothing")("measured 4") })
}

// Last: it takes the binary down before the test ends, as a timeout or a crash does.
func TestDies(t *testing.T) {
	fixture(t)
	reliability.Record(t, "Fixture", "dies", "nothing")
	os.Exit(3)
}
