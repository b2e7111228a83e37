package admin_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
)

// An operator finds a customer's effects by the customer: an email by its recipient's address alone, or its
// local part, in any case; any effect by a tag its client gave it; and by its key. Paged with "carol got two
// emails", an on-call engineer could find nothing without a key. Both of the store's insert paths (a
// statement of its own, and a group commit's lone request) write the terms; dedup's own tests run the batch.
func TestSearchByRecipientTagOrKey(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	for i, store := range []*dedup.Store{dedup.NewStore(pool), dedup.NewStore(pool).WithGroupCommit(dedup.DefaultGroupCommit)} {
		for _, e := range []struct {
			key, typ   string
			tags, rcpt []string
		}{
			{"welcome-carol", "email", []string{"customer:42"}, []string{"Carol@Example.test"}},
			{"welcome-bob", "email", nil, []string{"bob@example.test"}},
			{"order-hook", "webhook", []string{"customer:42", "order:9"}, nil},
			{"plain", "webhook", nil, nil},
		} {
			tenant := []string{"acme", "globex"}[i]
			_, _, err := store.Create(ctx, dedup.NewEffect{Tenant: tenant, Key: e.key, Type: e.typ,
				Payload: json.RawMessage(`{}`), Tags: e.tags, Terms: effect.SearchTerms(e.tags, e.rcpt)})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	find := func(f admin.EffectFilter) []string {
		t.Helper()
		p, err := svc.Effects(ctx, viv, f, admin.Page{})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, e := range p.Effects {
			keys = append(keys, e.Tenant+"/"+e.Key)
		}
		slices.Sort(keys)
		n, err := svc.CountEffects(ctx, viv, f)
		if err != nil || n != int64(len(keys)) {
			t.Errorf("%+v: count %d (%v), listed %d", f, n, err, len(keys))
		}
		return keys
	}
	for search, want := range map[string][]string{
		"carol@example.test":  {"acme/welcome-carol", "globex/welcome-carol"},
		"  CAROL ":            {"acme/welcome-carol", "globex/welcome-carol"},
		"customer:42":         {"acme/order-hook", "acme/welcome-carol", "globex/order-hook", "globex/welcome-carol"},
		"order:9":             {"acme/order-hook", "globex/order-hook"},
		"plain":               {"acme/plain", "globex/plain"},
		"Plain":               nil, // a key is exact; no tag or recipient is "plain"
		"example.test":        nil, // a domain alone is no term
		"nobody@example.test": nil,
	} {
		if got := find(admin.EffectFilter{Search: search}); !slices.Equal(got, want) {
			t.Errorf("search %q: %v, want %v", search, got, want)
		}
	}
	if got := find(admin.EffectFilter{Search: "customer:42", Tenant: "acme", Type: "email"}); !slices.Equal(got, []string{"acme/welcome-carol"}) {
		t.Errorf("search with tenant and type: %v", got)
	}
	d, err := svc.Effect(ctx, viv, "acme", "order-hook")
	if err != nil || !slices.Equal(d.Tags, []string{"customer:42", "order:9"}) {
		t.Fatalf("order-hook's tags: %v %v", d.Tags, err)
	}

	// A bulk retry takes the search as a filter too: carol's effects, and nobody else's.
	if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET status = 'dead', finished_at = now()`); err != nil {
		t.Fatal(err)
	}
	res, err := svc.RetryEffects(ctx, alice, admin.EffectFilter{Search: "carol"}, "carol got none", nil)
	if err != nil || res.Applied != 2 {
		t.Fatalf("retry matching carol: %+v %v", res, err)
	}
	if got := find(admin.EffectFilter{Status: effect.StatusPending}); !slices.Equal(got, []string{"acme/welcome-carol", "globex/welcome-carol"}) {
		t.Fatalf("pending after the retry: %v", got)
	}
	if _, err := svc.Effects(ctx, viv, admin.EffectFilter{Search: " "}, admin.Page{}); err == nil {
		t.Fatal("a blank search is accepted")
	}
}
