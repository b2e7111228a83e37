package client

import (
	"os/exec"
	"strings"
	"testing"
)

// An application that calls the gateway from its handlers imports client; it must not inherit the queue or
// its Redis driver with it (a job's ID and epoch are all ForJob needs).
func TestClientDoesNotDependOnTheQueue(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/oncegate/oncegate/client").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/oncegate/oncegate/queue" || strings.HasPrefix(dep, "github.com/redis/go-redis") {
			t.Errorf("client depends on %s", dep)
		}
	}
}
