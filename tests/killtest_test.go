package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// The crash demo, as the README runs it: real worker, gateway and SMTP processes, a real SIGKILL, and the
// seeds' table as the answer.
func TestCrashDemoPrintsTheSeedsTable(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Whole system", "The seeds' experiment: worker SIGKILLed after the email of user_6",
		"in-memory 6/14/0, lease queue 20/0/1, oncegate 20/0/0")
	cmd := exec.Command(filepath.Join(bin, "killtest"), "--bin", bin, "--json")
	cmd.Env = append(os.Environ(), "REDIS_URL="+testenv.RedisURL(), "DATABASE_URL="+pgtest.AdminURL())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("killtest: %v\n%s", err, out)
	}
	var res struct {
		Strategies []struct {
			Strategy          string  `json:"strategy"`
			UsersEmailed      int     `json:"users_emailed"`
			UsersNeverEmailed int     `json:"users_never_emailed"`
			DuplicateEmails   int     `json:"duplicate_emails"`
			TakeoverSeconds   float64 `json:"takeover_seconds"`
		} `json:"strategies"`
		OK bool `json:"oncegate_exactly_once"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := [][3]int{{6, 14, 0}, {20, 0, 1}, {20, 0, 0}}
	if len(res.Strategies) != 3 || !res.OK {
		t.Fatalf("%s", out)
	}
	for i, s := range res.Strategies {
		if got := [3]int{s.UsersEmailed, s.UsersNeverEmailed, s.DuplicateEmails}; got != want[i] {
			t.Errorf("%s: %v, want %v", s.Strategy, got, want[i])
		}
		if i > 0 {
			t.Logf("%s: user_6's job re-ran %.2fs after the kill", s.Strategy, s.TakeoverSeconds)
		}
	}
	og := res.Strategies[2]
	result(fmt.Sprintf("oncegate: %d emailed, %d never, %d duplicates", og.UsersEmailed, og.UsersNeverEmailed,
		og.DuplicateEmails))
}
