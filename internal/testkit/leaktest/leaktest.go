// Package leaktest fails a test binary whose tests pass but leave goroutines running: a worker, a dispatcher,
// a listener or a pool that a test forgot to stop. Every package with tests calls it from its TestMain
// (.ci/run checks that each does), so a leak cannot pass CI unseen. It is go.uber.org/goleak with the
// project's grace and list of known background goroutines, kept apart from testenv so that the programs
// using testenv's helpers (the benchmarks) do not depend on goleak.
package leaktest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// backgroundGoroutines are goroutines that may outlive a test binary's tests by design, not by a leak: ones a
// library starts once per process with no way to stop them. There are none today: the OpenTelemetry SDK's
// processors, pgx pools and go-redis clients all stop when closed, and tests close them; an option belongs
// here only with the reason it cannot be closed.
var backgroundGoroutines []goleak.Option

// leakGrace is how long goroutines get to finish after the tests, since a closed pool or server lets its
// goroutines go asynchronously: a leak is what still runs after it. Generous, for a loaded 2-core CI machine.
const leakGrace = 5 * time.Second

// Main runs the package's tests and exits, failing a passing run that leaves goroutines behind. Call it from
// TestMain.
func Main(m *testing.M) {
	os.Exit(Check(m.Run()))
}

// Check returns code, the result of m.Run, or 1 when the tests passed (code 0) but goroutines other than the
// known background ones still run after leakGrace. A failed run is returned as is: its leftover goroutines are
// a consequence of the failure, not news. For a TestMain that does more after m.Run than exit.
func Check(code int) int {
	if code != 0 {
		return code
	}
	deadline := time.Now().Add(leakGrace)
	for {
		err := goleak.Find(backgroundGoroutines...) // itself retries for about half a second
		if err == nil {
			return code
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "goroutines still running %v after the tests passed (a test leaks them):\n%v\n", leakGrace, err)
			return 1
		}
		time.Sleep(100 * time.Millisecond)
	}
}
