package tests

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/redistest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// The worker's log is JSON, line by line, also while Redis is away: go-redis printed its own messages (a
// pool that cannot dial) as plain lines on the same stderr, 18 to 20 of them in an outside tester's worker
// logs over a few Redis restarts, which a log collector reading JSON cannot take.
func TestWorkerLogsOnlyJSONWhileRedisIsAway(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	w := proctest.Start(t, exec.Command(filepath.Join(bin, "worker"), "run", "--queue", testenv.Name(t, "q"),
		"--gateway", "http://127.0.0.1:1", "--api-key", apiKey, "--redis", srv.URL()))
	w.WaitLine("worker ", 30*time.Second)
	defer w.Signal(syscall.SIGTERM)
	srv.Kill()
	testenv.Eventually(t, 30*time.Second, "go-redis reports that it cannot dial", func() bool {
		return strings.Contains(w.Log(), "failed to dial")
	})
	srv.Start()
	for _, line := range strings.Split(strings.TrimSpace(w.Log()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a line of the worker's log is not JSON: %s", line)
		}
	}
}
