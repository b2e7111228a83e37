package admin_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
)

// After a key is claimed again (its retention passed, its effect dead), the operator's reads and changes by
// key are of the new effect, with or without the tenant named (`effect show KEY` finds one tenant, though
// two of its effects are under the key until the purge), and the old one is still listed.
func TestOperatorByKeySeesTheKeysNewEffect(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	store := dedup.NewStore(pool)
	ne := dedup.NewEffect{Tenant: "acme", Key: "order-1", Type: "hook", Payload: json.RawMessage(`{}`)}
	old, _, err := store.Create(ctx, ne)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `WITH o AS (DELETE FROM oncegate_outbox RETURNING effect_id)
		UPDATE oncegate_effects SET status = 'dead', finished_at = now() - interval '25 hours' WHERE id IN (SELECT effect_id FROM o)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE oncegate_keys SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	fresh, replayed, err := store.Create(ctx, ne)
	if err != nil || replayed || fresh.ID == old.ID {
		t.Fatalf("re-claim: %v %v %+v", err, replayed, fresh)
	}
	for _, tenant := range []string{"acme", ""} {
		d, err := svc.Effect(ctx, viv, tenant, "order-1")
		if err != nil || d.ID != fresh.ID || d.StableID != fresh.StableID {
			t.Fatalf("effect show (tenant %q): %v %+v, want effect %d", tenant, err, d, fresh.ID)
		}
	}
	// The retry is of the new effect, which is pending: refused; the dead one stays dead.
	if _, err := svc.RetryEffect(ctx, alice, "", "order-1", "r"); err == nil {
		t.Fatal("a retry by key retried the key's old, dead effect")
	}
	page, err := svc.Effects(ctx, viv, admin.EffectFilter{Search: "order-1"}, admin.Page{Limit: 10})
	if err != nil || len(page.Effects) != 2 || page.Effects[1].ID != old.ID || page.Effects[1].Status != effect.StatusDead {
		t.Fatalf("listing by key: %v %+v", err, page)
	}
}
