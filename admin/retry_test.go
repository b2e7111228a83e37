package admin_test

import (
	"context"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
)

// A tenant's retry (POST /v1/effects/{key}/retry, dedup.Store.Retry) and an operator's are one statement:
// both clear an earlier resolution. When the tenant's retry was admin's own SQL's twin, it kept an operator's
// "resolved failed" mark, and the console showed the effect "delivered (resolved failed)" once it was delivered.
func TestTenantRetryAndOperatorRetryAreOne(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "u", 2, effect.StatusUnknown)
	for i, retry := range []func(key string) error{
		func(key string) error { _, err := dedup.NewStore(pool).Retry(ctx, "acme", key); return err },
		func(key string) error {
			_, err := svc.RetryEffect(ctx, alice, "acme", key, "the receiver lost it")
			return err
		},
	} {
		key := []string{"u0", "u1"}[i]
		if _, err := svc.ResolveEffect(ctx, alice, "acme", key, admin.ResolveFailed, "no record of it"); err != nil {
			t.Fatal(err)
		}
		if err := retry(key); err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
		d, err := svc.Effect(ctx, alice, "acme", key)
		if err != nil {
			t.Fatal(err)
		}
		if d.Status != effect.StatusPending || d.Resolution != nil || d.Attempts != 0 {
			t.Errorf("after retry %d: %s, resolution %+v, %d attempts", i, d.Status, d.Resolution, d.Attempts)
		}
	}
}
