package admin_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/effect"
)

// `type pause` refuses a type nothing knows (a misspelt one was paused, exit 0, and nothing was paused for
// real), and `type ls` lists every type: those a gateway's heartbeat names, those effects have, the paused.
func TestTypesAreTheOnesSomethingKnows(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "d", 1, effect.StatusDelivered) // type hook, from an effect
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_gateways (id, started_at, last_seen, types)
		VALUES ('gw-1', now(), now(), '{hook,order-webhook}'), ('gw-gone', now(), now() - interval '1 hour', '{old-type}')`); err != nil {
		t.Fatal(err)
	}
	if err := svc.PauseType(ctx, alice, "ordr-webhook", "typo"); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("pausing a misspelt type: %v", err)
	}
	for _, typ := range []string{"order-webhook", "old-type"} {
		if err := svc.PauseType(ctx, alice, typ, "maintenance"); err != nil {
			t.Fatalf("pausing %s: %v", typ, err)
		}
	}
	ts, err := svc.Types(ctx, viv)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(ts)
	var lines []string
	for _, x := range ts {
		lines = append(lines, fmt.Sprintf("%s paused=%v gateways=%d", x.Type, x.Paused, x.Gateways))
	}
	want := []string{"hook paused=false gateways=1", "old-type paused=true gateways=0", "order-webhook paused=true gateways=1"}
	if fmt.Sprint(lines) != fmt.Sprint(want) {
		t.Fatalf("types:\n got %q\nwant %q\n(%s)", lines, want, got)
	}
}
