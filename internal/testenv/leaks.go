package testenv

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// backgroundGoroutines are goroutines that outlive a test binary's tests by design, not by a leak: each is
// started once per process by a library and has no way to be stopped.
var backgroundGoroutines = []goleak.Option{}

// Main runs the package's tests and exits, failing a passing run that leaves goroutines behind: a worker, a
// dispatcher, a listener or a pool that a test forgot to close. Call it from TestMain.
func Main(m *testing.M) {
	os.Exit(NoLeaks(m.Run()))
}

// NoLeaks returns code, the result of m.Run, or 1 when the tests passed (code 0) but goroutines other than the
// known background ones still run after a short grace (goleak retries for about a second, so a goroutine that
// is on its way out is not reported). A failed run is returned as is: its leftover goroutines are a
// consequence of the failure, not news. For a TestMain that does more after m.Run than exit.
func NoLeaks(code int) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(backgroundGoroutines...); err != nil {
		fmt.Fprintf(os.Stderr, "goroutines still running after the tests passed (a test leaks them):\n%v\n", err)
		return 1
	}
	return code
}
