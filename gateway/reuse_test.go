package gateway

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	httpprov "github.com/oncegate/oncegate/providers/http"
	"github.com/oncegate/oncegate/providers/smtp"
	"github.com/oncegate/oncegate/providers/webhook"
)

// Issue 13: once retention has purged a key, the key names a new effect, and the world must see a new one: a
// new analytics row (it used to be skipped, the old row's event_id reported as delivered), a new webhook-id,
// a new Message-ID, a new Idempotency-Key upstream (the old id used to go out with the new content, and a
// receiver that drops ids it has seen dropped the new message). Each receiver records the id it was sent.
func TestKeyUsedAgainAfterRetentionIsANewEffect(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Providers",
		"A key used again after retention purged its effect, for every provider kind",
		"A new effect: a new stable id at the webhook receiver, the SMTP server and the upstream, a new analytics row")
	var mu sync.Mutex
	seen := map[string][]string{} // type → ids received, in order
	note := func(typ, id string) {
		mu.Lock()
		defer mu.Unlock()
		seen[typ] = append(seen[typ], id)
	}
	hooks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		note("hook", r.Header.Get("webhook-id"))
		w.WriteHeader(204)
	}))
	t.Cleanup(hooks.Close)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		note("api", r.Header.Get("Idempotency-Key"))
		w.WriteHeader(201)
	}))
	t.Cleanup(upstream.Close)
	mail := smtptest.Start(t)
	mail.OnMessage(func(m smtptest.Message) { note("mail", m.MessageID) })
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	h := startGateway(t, func(c *Config) {
		c.Retention.Keys = Duration(time.Hour)
		c.EffectTypes["hook"] = EffectType{Provider: "webhook",
			Webhook: &webhook.Config{URL: hooks.URL, Secret: secret, AllowPrivateNetworks: true}}
		c.EffectTypes["api"] = EffectType{Provider: "http",
			HTTP: &httpprov.Config{BaseURL: upstream.URL, AllowPrivateNetworks: true}}
		c.EffectTypes["mail"] = EffectType{Provider: "smtp", SMTP: &smtp.Config{Addr: mail.Addr, From: "shop@acme.test"}}
	})
	payloads := map[string][2]string{
		"hook":      {`{"event":"order.paid","data":{"order":"first"}}`, `{"event":"order.paid","data":{"order":"second"}}`},
		"api":       {`{"method":"POST","path":"/orders","body":{"order":"first"}}`, `{"method":"POST","path":"/orders","body":{"order":"second"}}`},
		"mail":      {`{"to":["u@acme.test"],"subject":"first order","text":"1"}`, `{"to":["u@acme.test"],"subject":"second order","text":"2"}`},
		"analytics": {`{"name":"first"}`, `{"name":"second"}`},
	}
	ctx := context.Background()
	stable := map[string][]string{}
	for round := range 2 {
		for typ, p := range payloads {
			key := typ + ":order-1"
			if r := h.post(key, fmt.Sprintf(`{"type":%q,"payload":%s}`, typ, p[round])); r.status != 202 ||
				r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("round %d, %s: %d %s", round, typ, r.status, r.raw)
			}
			r := h.waitStatus(acmeKey, key, "delivered")
			stable[typ] = append(stable[typ], r.body["stable_id"].(string))
		}
		// Retention: every effect finished two hours ago, an hour past retention.keys.
		if _, err := h.pool.Exec(ctx, `UPDATE oncegate_effects SET finished_at = now() - interval '2 hours'`); err != nil {
			t.Fatal(err)
		}
		// A row locked by the attempt log's write (its foreign key) is skipped by this purge and taken by the
		// next one: purge until the write is done.
		testenv.Eventually(t, 10*time.Second, "every effect purged", func() bool {
			h.g.dispatcher.Purge(ctx)
			return h.count(`SELECT count(*) FROM oncegate_effects`) == 0
		})
	}
	mu.Lock()
	defer mu.Unlock()
	for typ, ids := range stable {
		if ids[0] == ids[1] {
			t.Errorf("%s: both effects under the key have stable id %s", typ, ids[0])
		}
		if typ == "analytics" {
			continue
		}
		want := fmt.Sprint(ids)
		if typ == "mail" {
			want = fmt.Sprintf("[<%s@acme.test> <%s@acme.test>]", ids[0], ids[1])
		}
		if got := fmt.Sprint(seen[typ]); got != want {
			t.Errorf("%s: the receiver saw ids %s, want %s", typ, got, want)
		}
	}
	rows := h.count(`SELECT count(DISTINCT effect_id) FROM analytics_events WHERE key = 'analytics:order-1'
		AND effect_id = ANY($1)`, stable["analytics"])
	if rows != 2 {
		t.Errorf("analytics: %d rows for the two effects under the key, want 2", rows)
	}
	result(fmt.Sprintf("two effects under one key per kind: 2 distinct ids at each of 3 receivers, %d analytics rows", rows))
}

// A postgres type whose table cannot keep one event per effect stops the start, naming the type; a database
// that cannot be reached does not (the gateway serves 503 until it is back).
func TestCheckRefusesATableWithoutUniqueEffectID(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) {
		c.EffectTypes["legacy"] = EffectType{Provider: "postgres", Postgres: &postgresConfig{Table: "legacy_events"}}
	})
	ctx := context.Background()
	if _, err := h.pool.Exec(ctx, `CREATE TABLE legacy_events (id bigserial PRIMARY KEY, tenant text, key text,
		name text, properties jsonb, occurred_at timestamptz, recorded_at timestamptz DEFAULT now(), UNIQUE (tenant, key))`); err != nil {
		t.Fatal(err)
	}
	err := h.g.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "effect type legacy") || !strings.Contains(err.Error(), "effect_id") {
		t.Fatalf("Check = %v, want the legacy type's table refused", err)
	}
	if _, err := h.pool.Exec(ctx, `ALTER TABLE legacy_events ADD COLUMN effect_id text UNIQUE`); err != nil {
		t.Fatal(err)
	}
	if err := h.g.Check(ctx); err != nil {
		t.Fatalf("Check after the fix = %v", err)
	}

	down := testConfig(t, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	g, err := New(down, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Check(ctx); err != nil {
		t.Fatalf("Check with the database down = %v, want nil (logged)", err)
	}
}
