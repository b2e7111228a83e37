package admin_test

import (
	"encoding/json"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/outbox"
)

// Every field docs/cli.md lists for `breaker ls` is there, an absent one as null.
func TestBreakerJSONHasEveryDocumentedField(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(admin.Breaker{Gateway: "gw", BreakerState: outbox.BreakerState{Type: "hook", State: "closed"}})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"gateway", "gateway_alive", "type", "tenant", "destination", "state", "open_until",
		"last_used", "in_flight"} {
		if _, ok := m[f]; !ok {
			t.Errorf("%s is missing: %s", f, b)
		}
	}
	if m["open_until"] != nil || m["in_flight"] != float64(0) {
		t.Errorf("a closed, idle breaker: %s", b)
	}
}
