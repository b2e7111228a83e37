package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// Chaos mode at a small size: workers and gateways SIGKILLed at random and restarted while jobs of all three
// kinds run. Nothing may be lost, and no analytics event recorded twice.
func TestChaosLosesNothing(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Whole system", "600 jobs of three kinds; a worker or gateway SIGKILLed about every 700 ms", "Lost = 0 for every type; analytics duplicates 0; no dead job")
	cmd := exec.Command(filepath.Join(bin, "killtest"), "--bin", bin, "--json", "--jobs", "600", "--kill-every", "700ms")
	cmd.Env = append(os.Environ(), "REDIS_URL="+testenv.RedisURL(), "DATABASE_URL="+pgtest.AdminURL())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("killtest: %v\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	var res struct {
		Chaos struct {
			Rows []struct {
				Type       string `json:"type"`
				Jobs       int    `json:"jobs"`
				Delivered  int    `json:"delivered"`
				Lost       int    `json:"lost"`
				Duplicated int    `json:"duplicated"`
			} `json:"rows"`
			Kills    map[string]int `json:"kills"`
			DeadJobs int            `json:"dead_jobs"`
		} `json:"chaos"`
		OK bool `json:"ok"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("kills %v", res.Chaos.Kills)
	kills := 0
	for _, n := range res.Chaos.Kills {
		kills += n
	}
	lost, dups := 0, 0
	for _, r := range res.Chaos.Rows {
		lost += r.Lost
		dups += r.Duplicated
	}
	result(fmt.Sprintf("%d kills; lost %d, duplicated %d, dead jobs %d", kills, lost, dups, res.Chaos.DeadJobs))
	if !res.OK || len(res.Chaos.Rows) != 3 || res.Chaos.DeadJobs != 0 {
		t.Fatalf("%s", out)
	}
	for _, r := range res.Chaos.Rows {
		t.Logf("%s: %d jobs, %d delivered, %d lost, %d duplicated", r.Type, r.Jobs, r.Delivered, r.Lost, r.Duplicated)
		if r.Lost != 0 || r.Delivered != r.Jobs {
			t.Errorf("%s lost %d of %d", r.Type, r.Lost, r.Jobs)
		}
	}
	if kills == 0 {
		t.Fatal("no process was killed: the run proved nothing")
	}
}
