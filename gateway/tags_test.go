package gateway

import (
	"fmt"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/providers/smtp"
)

// A client tags an effect, in the body or in the Oncegate-Tags header, and an email's recipients become
// search terms by themselves: the stored row holds the tags as sent and the terms lowercased. Tags an
// operator could not search by or read are a 400 naming where they came from, and so is sending both.
func TestTagsAndRecipientsAreStoredForSearch(t *testing.T) {
	t.Parallel()
	mail := smtptest.Start(t)
	h := startGateway(t, func(c *Config) {
		c.EffectTypes["mail"] = EffectType{Provider: "smtp", SMTP: &smtp.Config{Addr: mail.Addr, From: "shop@acme.test"}}
	})
	stored := func(key string) string {
		t.Helper()
		var tags, terms []string
		if err := h.pool.QueryRow(t.Context(), `SELECT tags, search_terms FROM oncegate_effects WHERE key = $1`, key).
			Scan(&tags, &terms); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%q %q", tags, terms)
	}
	if r := h.post("welcome-carol", `{"type":"mail","tags":["Customer:42"],"payload":{"to":["Carol <Carol@Example.test>"],`+
		`"cc":["ops@acme.test"],"subject":"Welcome","text":"hi"}}`); r.status != 202 {
		t.Fatalf("mail with tags: %d %s", r.status, r.raw)
	}
	if got, want := stored("welcome-carol"), `["Customer:42"] ["customer:42" "carol@example.test" "carol" "ops@acme.test" "ops"]`; got != want {
		t.Errorf("welcome-carol: %s, want %s", got, want)
	}
	if r := h.req("POST", "/v1/effects", acmeKey, analytics("signup"), "Idempotency-Key: by-header",
		"Oncegate-Tags: customer:42, order:9"); r.status != 202 {
		t.Fatalf("tags in the header: %d %s", r.status, r.raw)
	}
	if got, want := stored("by-header"), `["customer:42" "order:9"] ["customer:42" "order:9"]`; got != want {
		t.Errorf("by-header: %s, want %s", got, want)
	}
	if r := h.post("untagged", analytics("plain")); r.status != 202 || stored("untagged") != "[] []" {
		t.Errorf("untagged: %d, stored %s (want NULLs, outside the search index)", r.status, stored("untagged"))
	}
	for name, c := range map[string]struct {
		body    string
		headers []string
		field   string
	}{
		"both":         {`{"type":"analytics","tags":["a"],"payload":{"name":"x"}}`, []string{"Oncegate-Tags: b"}, "tags"},
		"empty tag":    {`{"type":"analytics","tags":[""],"payload":{"name":"x"}}`, nil, "tags"},
		"control":      {`{"type":"analytics","tags":["a\u001b[2J"],"payload":{"name":"x"}}`, nil, "tags"},
		"comma":        {`{"type":"analytics","tags":["a,b"],"payload":{"name":"x"}}`, nil, "tags"},
		"too many":     {`{"type":"analytics","tags":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"],"payload":{"name":"x"}}`, nil, "tags"},
		"not a list":   {`{"type":"analytics","tags":"a","payload":{"name":"x"}}`, nil, "tags"},
		"blank header": {analytics("x"), []string{"Oncegate-Tags: , "}, "Oncegate-Tags"},
	} {
		r := h.req("POST", "/v1/effects", acmeKey, c.body, append([]string{"Idempotency-Key: bad-" + strings.ReplaceAll(name, " ", "-")}, c.headers...)...)
		if r.status != 400 || r.body["field"] != c.field {
			t.Errorf("%s: %d %s, want 400 naming %s", name, r.status, r.raw, c.field)
		}
	}
	if n := h.count(`SELECT count(*) FROM oncegate_effects WHERE key LIKE 'bad-%'`); n != 0 {
		t.Fatalf("%d refused effects were recorded", n)
	}
}

// A worker names its job's queue beside the job (Oncegate-Job-Queue, which the Go client's InQueue sends),
// and the effect keeps it, so that an operator goes from the effect to its job without guessing the queue.
func TestTheJobsQueueIsStoredWithTheEffect(t *testing.T) {
	t.Parallel()
	h := startGateway(t, nil)
	if r := h.req("POST", "/v1/effects", acmeKey, analytics("signup"), "Idempotency-Key: with-queue",
		"Oncegate-Job-Id: signup:user_6", "Oncegate-Job-Epoch: 1", "Oncegate-Job-Queue: signups"); r.status != 202 {
		t.Fatalf("with a queue: %d %s", r.status, r.raw)
	}
	if n := h.count(`SELECT count(*) FROM oncegate_effects WHERE key = 'with-queue' AND job_queue = 'signups'
		AND job_id = 'signup:user_6'`); n != 1 {
		t.Fatal("the job's queue is not stored")
	}
	for name, headers := range map[string][]string{
		"without-job": {"Oncegate-Job-Queue: signups"},
		"braces":      {"Oncegate-Job-Id: j", "Oncegate-Job-Epoch: 1", "Oncegate-Job-Queue: {q}"},
	} {
		r := h.req("POST", "/v1/effects", acmeKey, analytics("x"), append([]string{"Idempotency-Key: " + name}, headers...)...)
		if r.status != 400 || r.body["field"] != "Oncegate-Job-Queue" {
			t.Errorf("%s: %d %s", name, r.status, r.raw)
		}
	}
}
