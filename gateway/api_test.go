package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/reliability"
)

// Every row of the API's status table, against the real server and database.
func TestCreateEffectStatusCodes(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Hostile input", "Every bad request of the API table (keys, JSON, types, payloads, \\\\u0000, sizes, content types, API keys)", "Problem+json with the right status and field; nothing recorded")
	result("21 bad requests refused, 0 recorded")
	h := startGateway(t, func(c *Config) { c.Limits.MaxBody = 1024 })

	r := h.post("signup:1", analytics("signup"))
	if r.status != 202 || r.header.Get("Location") != "/v1/effects/signup:1" || r.body["key"] != "signup:1" ||
		r.header.Get("Idempotent-Replayed") != "" || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("new key: %d %v %s", r.status, r.header, r.raw)
	}
	h.waitStatus(acmeKey, "signup:1", "delivered")

	// The same request again: the stored effect, terminal, so 200; no new effect, no new outbox row.
	r = h.post(`"signup:1"`, analytics("signup"))
	if r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" || r.body["status"] != "delivered" {
		t.Fatalf("replay of a delivered effect: %d %v %s", r.status, r.header, r.raw)
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects"); n != 1 {
		t.Fatalf("%d effects after a replay", n)
	}
	if n := h.count("SELECT count(*) FROM oncegate_outbox"); n != 0 {
		t.Fatalf("%d outbox rows after a replay of a delivered effect", n)
	}
	if n := h.count("SELECT count(*) FROM analytics_events"); n != 1 {
		t.Fatalf("%d analytics rows", n)
	}

	// Same key, another request.
	r = h.post("signup:1", analytics("login"))
	if r.status != 422 || r.body["type"] != "/problems/idempotency-key-reused" ||
		r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("key reuse: %d %s", r.status, r.raw)
	}

	// Two keys in one request: which one counts would be a guess, so neither does.
	r = h.req("POST", "/v1/effects", acmeKey, analytics("two"), "Idempotency-Key: two-a", "Idempotency-Key: two-b")
	if r.status != 400 || r.body["field"] != "Idempotency-Key" {
		t.Fatalf("two Idempotency-Key headers: %d %s", r.status, r.raw)
	}

	// With wait, a new effect is answered once delivered.
	r = h.req("POST", "/v1/effects", acmeKey, `{"type":"analytics","payload":{"name":"x"},"wait":"5s"}`,
		"Idempotency-Key: waited")
	if r.status != 200 || r.body["status"] != "delivered" || r.body["delivered_at"] == nil {
		t.Fatalf("wait: %d %s", r.status, r.raw)
	}

	cases := []struct {
		name    string
		key     string // "-" sends no header
		body    string
		apiKey  string
		ctype   string
		status  int
		problem string
		field   string
	}{
		{"missing key", "-", analytics("a"), acmeKey, "", 400, "invalid-request", "Idempotency-Key"},
		{"empty key", `""`, analytics("a"), acmeKey, "", 400, "invalid-request", "Idempotency-Key"},
		{"unterminated quote", `"abc`, analytics("a"), acmeKey, "", 400, "invalid-request", "Idempotency-Key"},
		{"key with a space", `"a b"`, analytics("a"), acmeKey, "", 400, "invalid-request", "Idempotency-Key"},
		{"key too long", strings.Repeat("k", 256), analytics("a"), acmeKey, "", 400, "invalid-request", "Idempotency-Key"},
		{"malformed JSON", "k1", `{"type":`, acmeKey, "", 400, "invalid-request", ""},
		{"a body that is not an object", "k1", `[1]`, acmeKey, "", 400, "invalid-request", ""},
		{"a body that is null", "k1", `null`, acmeKey, "", 400, "invalid-request", ""},
		{"unknown field", "k1", `{"type":"analytics","payload":{"name":"a"},"extra":1}`, acmeKey, "", 400, "invalid-request", "extra"},
		{"no type", "k1", `{"payload":{"name":"a"}}`, acmeKey, "", 400, "invalid-request", "type"},
		{"unknown type", "k1", `{"type":"fax","payload":{"name":"a"}}`, acmeKey, "", 400, "invalid-request", "type"},
		{"no payload", "k1", `{"type":"analytics"}`, acmeKey, "", 400, "invalid-request", "payload"},
		{"payload not an object", "k1", `{"type":"analytics","payload":[1]}`, acmeKey, "", 400, "invalid-request", "payload"},
		{"payload invalid for its provider", "k1", `{"type":"analytics","payload":{"properties":{}}}`, acmeKey, "", 400, "invalid-request", "payload.name"},
		{"payload field of the wrong type", "k1", `{"type":"analytics","payload":{"name":5}}`, acmeKey, "", 400, "invalid-request", "payload.name"},
		{"payload Postgres cannot store", "k1", `{"type":"analytics","payload":{"name":"a","properties":{"x":"\u0000"}}}`, acmeKey, "", 400, "invalid-request", "payload"},
		{"wait too long", "k1", `{"type":"analytics","payload":{"name":"a"},"wait":"31s"}`, acmeKey, "", 400, "invalid-request", "wait"},
		{"no API key", "k1", analytics("a"), "", "", 401, "unauthorized", ""},
		{"wrong API key", "k1", analytics("a"), "not-a-real-key", "", 401, "unauthorized", ""},
		{"body over the limit", "k1", `{"type":"analytics","payload":{"name":"` + strings.Repeat("a", 2000) + `"}}`, acmeKey, "", 413, "body-too-large", ""},
		{"not JSON", "k1", analytics("a"), acmeKey, "text/plain", 415, "unsupported-media-type", ""},
	}
	for _, c := range cases {
		headers := []string{}
		if c.key != "-" {
			headers = append(headers, "Idempotency-Key: "+c.key)
		}
		if c.ctype != "" {
			headers = append(headers, "Content-Type: "+c.ctype)
		}
		r := h.req("POST", "/v1/effects", c.apiKey, c.body, headers...)
		if r.status != c.status || r.body["type"] != "/problems/"+c.problem || r.body["status"] != float64(c.status) ||
			r.body["title"] == "" || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want %d %s", c.name, r.status, r.raw, c.status, c.problem)
			continue
		}
		if c.field != "" && r.body["field"] != c.field {
			t.Errorf("%s: field %v, want %s (%s)", c.name, r.body["field"], c.field, r.raw)
		}
		if d, _ := r.body["detail"].(string); strings.HasPrefix(d, " ") || d == "" {
			t.Errorf("%s: detail %q says nothing of what is wrong", c.name, d)
		}
		if c.status == 401 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: WWW-Authenticate %q", c.name, r.header.Get("WWW-Authenticate"))
		}
	}
	// None of the refused requests recorded anything.
	if n := h.count("SELECT count(*) FROM oncegate_effects"); n != 2 {
		t.Fatalf("%d effects after the refused requests, want 2", n)
	}
}

// A replay of an effect that is not terminal yet is a 202, with the header.
func TestReplayOfPendingEffectIs202(t *testing.T) {
	t.Parallel()
	// A table that does not exist keeps the effect pending (retrying) for as long as the test needs.
	h := startGateway(t, func(c *Config) {
		c.EffectTypes["later"] = EffectType{Provider: "postgres", Postgres: &postgresConfig{Table: "not_yet"},
			Retry: &Retry{BaseDelay: Duration(10 * 1e9)}}
	})
	body := `{"type":"later","payload":{"name":"a"}}`
	if r := h.post("p1", body); r.status != 202 {
		t.Fatalf("%d %s", r.status, r.raw)
	}
	r := h.post("p1", body)
	if r.status != 202 || r.header.Get("Idempotent-Replayed") != "true" || r.body["status"] == "delivered" {
		t.Fatalf("replay of a pending effect: %d %v %s", r.status, r.header, r.raw)
	}
	if n := h.count("SELECT count(*) FROM oncegate_outbox"); n != 1 {
		t.Fatalf("%d outbox rows, want 1", n)
	}
}

// 100 concurrent requests with one key: one effect, one delivery, 99 replays.
func TestConcurrentSameKeyMakesOneEffectAndOneDelivery(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "100 concurrent requests with one key", "One effect, one delivery, 99 replays")
	result("1 effect, 1 delivery, 99 replays")
	h := startGateway(t, nil)
	var mu sync.Mutex
	statuses := map[string]int{}
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			r := h.post("order:42", analytics("order"))
			mu.Lock()
			statuses[fmt.Sprintf("%d replayed=%s", r.status, r.header.Get("Idempotent-Replayed"))]++
			mu.Unlock()
		})
	}
	wg.Wait()
	created := statuses["202 replayed="] + statuses["200 replayed="]
	if created != 1 || created+statuses["202 replayed=true"]+statuses["200 replayed=true"] != 100 {
		t.Fatalf("answers: %v; want one creation and 99 replays", statuses)
	}
	h.waitStatus(acmeKey, "order:42", "delivered")
	if n := h.count("SELECT count(*) FROM analytics_events WHERE key = 'order:42'"); n != 1 {
		t.Fatalf("%d deliveries", n)
	}
	if n := h.count("SELECT attempts FROM oncegate_effects WHERE key = 'order:42'"); n != 1 {
		t.Fatalf("%d attempts", n)
	}
}

// Tenants' keys are separate effects, and a tenant never sees another's.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Auth", "Another tenant reads and retries a key it does not own",
		"404, never the data of another tenant; the same key is two effects")
	result("404 on read and retry")
	h := startGateway(t, nil)
	if r := h.req("POST", "/v1/effects", acmeKey, analytics("a"), "Idempotency-Key: k1"); r.status != 202 {
		t.Fatal(r.raw)
	}
	// globex's k1 with another body is a new effect, not a 422.
	if r := h.req("POST", "/v1/effects", globexKey, analytics("b"), "Idempotency-Key: k1"); r.status != 202 ||
		r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("globex k1: %d %s", r.status, r.raw)
	}
	if r := h.req("POST", "/v1/effects", globexKey, analytics("c"), "Idempotency-Key: acme-only"); r.status != 202 {
		t.Fatal(r.raw)
	}
	// A read and a retry of a key not found say it may have been retired (an outside tester's finding: the
	// read did not, while the retry did).
	retired := "or it was retired: an effect and its key are kept retention.keys"
	if r := h.req("GET", "/v1/effects/acme-only", acmeKey, ""); r.status != 404 || r.body["type"] != "/problems/not-found" ||
		!strings.Contains(r.raw, retired) {
		t.Fatalf("acme read globex's key: %d %s", r.status, r.raw)
	}
	if r := h.req("POST", "/v1/effects/acme-only/retry", acmeKey, ""); r.status != 404 || !strings.Contains(r.raw, retired) {
		t.Fatalf("acme retried globex's key: %d %s", r.status, r.raw)
	}
	r := h.req("GET", "/v1/effects", acmeKey, "")
	if data := r.body["data"].([]any); len(data) != 1 || data[0].(map[string]any)["key"] != "k1" {
		t.Fatalf("acme's list: %s", r.raw)
	}
	h.waitStatus(acmeKey, "k1", "delivered")
	h.waitStatus(globexKey, "k1", "delivered")
	if n := h.count("SELECT count(DISTINCT tenant) FROM analytics_events WHERE key = 'k1'"); n != 2 {
		t.Fatalf("k1 delivered for %d tenants, want 2", n)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	h := startGateway(t, nil)
	for i := range 7 {
		if r := h.post(fmt.Sprintf("e%d", i), analytics("x")); r.status != 202 {
			t.Fatal(r.raw)
		}
	}
	h.waitStatus(acmeKey, "e6", "delivered")
	var keys []string
	cursor := ""
	for page := 0; ; page++ {
		path := "/v1/effects?limit=3&type=analytics"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		r := h.req("GET", path, acmeKey, "")
		if r.status != 200 {
			t.Fatal(r.raw)
		}
		for _, e := range r.body["data"].([]any) {
			keys = append(keys, e.(map[string]any)["key"].(string))
		}
		next, _ := r.body["next_cursor"].(string)
		if next == "" {
			break
		}
		cursor = next
		if page > 5 {
			t.Fatal("pagination does not end")
		}
	}
	if strings.Join(keys, ",") != "e6,e5,e4,e3,e2,e1,e0" {
		t.Fatalf("pages gave %v, want newest first, each once", keys)
	}
	if r := h.req("GET", "/v1/effects?status=dead", acmeKey, ""); len(r.body["data"].([]any)) != 0 {
		t.Fatalf("status filter: %s", r.raw)
	}
	for _, bad := range []string{"status=lost", "limit=0", "limit=501", "cursor=zzz"} {
		if r := h.req("GET", "/v1/effects?"+bad, acmeKey, ""); r.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", bad, r.status, r.raw)
		}
	}
	// A query the gateway cannot read whole is refused, not read in part: a mangled cursor was read as none
	// (the listing started again from its first page), and of a parameter sent twice the first counted.
	for bad, field := range map[string]string{"limit=1&cursor=%%%": "query", "limit=1&limit=abc": "limit",
		"cursor=x&cursor=y": "cursor", "type=a;status=dead": "query"} {
		if r := h.req("GET", "/v1/effects?"+bad, acmeKey, ""); r.status != http.StatusBadRequest || r.body["field"] != field {
			t.Errorf("%s: %d %s, want 400 naming %s", bad, r.status, r.raw, field)
		}
	}
	if r := h.req("GET", "/v1/effects/e1?wait=1s&wait=2s", acmeKey, ""); r.status != http.StatusBadRequest || r.body["field"] != "wait" {
		t.Errorf("wait sent twice: %d %s", r.status, r.raw)
	}
	// A parameter a route does not take is refused too: a misspelt filter (?Status=dead) listed every
	// effect, and a create's ?wait=5s (its wait goes in the body) waited for nothing.
	for path, field := range map[string]string{"/v1/effects?Status=dead": "Status", "/v1/effects/e1?WAIT=5s": "WAIT",
		"/v1/effects/e1?=1": "query"} {
		if r := h.req("GET", path, acmeKey, ""); r.status != http.StatusBadRequest || r.body["field"] != field {
			t.Errorf("GET %s: %d %s, want a 400 naming %s", path, r.status, r.raw, field)
		}
	}
	for path, field := range map[string]string{"/v1/effects?wait=5s": "wait", "/v1/effects?x=%zz": "query",
		"/v1/effects/e1/retry?a=1;b=2": "query"} {
		r := h.req("POST", path, acmeKey, analytics("q"), "Idempotency-Key: query-refused")
		if r.status != http.StatusBadRequest || r.body["field"] != field {
			t.Errorf("POST %s: %d %s, want a 400 naming %s", path, r.status, r.raw, field)
		}
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects WHERE key = 'query-refused'"); n != 0 {
		t.Fatalf("a create with a refused query string recorded %d effects", n)
	}
	// A key in the path is held to the header's rules: a NUL byte reached Postgres and came back as its
	// refusal to store a payload, and a key longer than any create takes was a 404.
	long := strings.Repeat("k", dedup.MaxKeyLen+1)
	for _, path := range []string{"/v1/effects/%00", "/v1/effects/%FF?wait=1s", "/v1/effects/a%20b", "/v1/effects/" + long,
		"/v1/effects/%00/retry"} {
		method := "GET"
		if strings.HasSuffix(path, "/retry") {
			method = "POST"
		}
		r := h.req(method, path, acmeKey, "")
		if r.status != http.StatusBadRequest || r.body["field"] != "key" || strings.Contains(r.raw, "UTF8") {
			t.Errorf("%s %s: %d %s, want a 400 naming the key", method, path, r.status, r.raw)
		}
	}
}

// A job's effects are fenced by its lease epoch: once a request came with epoch 2, epoch 1 starts nothing.
func TestJobEpochFence(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "Requests of a job under an epoch older than one seen", "409 job-fenced, nothing recorded")
	result("409 for stale epochs, 0 recorded")
	h := startGateway(t, nil)
	send := func(key string, epoch string) response {
		return h.req("POST", "/v1/effects", acmeKey, analytics(key), "Idempotency-Key: "+key,
			"Oncegate-Job-Id: signup:user_6", "Oncegate-Job-Epoch: "+epoch)
	}
	if r := send("a:signup:user_6", "1"); r.status != 202 {
		t.Fatalf("epoch 1: %d %s", r.status, r.raw)
	}
	if r := send("b:signup:user_6", "2"); r.status != 202 {
		t.Fatalf("epoch 2: %d %s", r.status, r.raw)
	}
	for _, key := range []string{"c:signup:user_6", "a:signup:user_6"} {
		r := send(key, "1")
		if r.status != 409 || r.body["type"] != "/problems/job-fenced" {
			t.Fatalf("stale epoch 1, key %s: %d %s", key, r.status, r.raw)
		}
	}
	if n := h.count("SELECT count(*) FROM oncegate_effects"); n != 2 {
		t.Fatalf("%d effects, want 2: a fenced request recorded something", n)
	}
	if r := send("a:signup:user_6", "2"); r.status != 202 && r.status != 200 || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay under the current epoch: %d %s", r.status, r.raw)
	}
	// Another job is not fenced by this one; other tenants have their own fences.
	if r := h.req("POST", "/v1/effects", acmeKey, analytics("x"), "Idempotency-Key: x", "Oncegate-Job-Id: other",
		"Oncegate-Job-Epoch: 1"); r.status != 202 {
		t.Fatalf("another job: %d %s", r.status, r.raw)
	}
	if r := h.req("POST", "/v1/effects", globexKey, analytics("x"), "Idempotency-Key: y", "Oncegate-Job-Id: signup:user_6",
		"Oncegate-Job-Epoch: 1"); r.status != 202 {
		t.Fatalf("another tenant: %d %s", r.status, r.raw)
	}
	for _, bad := range [][]string{{"Oncegate-Job-Id: j"}, {"Oncegate-Job-Epoch: 1"}, {"Oncegate-Job-Id: j", "Oncegate-Job-Epoch: zero"}} {
		if r := h.req("POST", "/v1/effects", acmeKey, analytics("x"), append([]string{"Idempotency-Key: z"}, bad...)...); r.status != 400 {
			t.Errorf("%v: %d %s", bad, r.status, r.raw)
		}
	}
}

// A job is fenced within its queue and by its creation before its epoch: the same job ID in a second queue,
// or enqueued again after its queue was destroyed (epochs start again), was refused at every lease below the
// old job's epoch, used up its attempts and went dead (an outside test: 300 of 300 jobs of a queue made
// again). A run of the same job is still fenced by its epoch, and fences untouched for the keys' hold go.
func TestJobFenceIsPerQueueAndRanksAJobEnqueuedAgainAbove(t *testing.T) {
	t.Parallel()
	h := startGateway(t, nil)
	var n atomic.Int64
	send := func(job, queue, created, epoch string) response {
		headers := []string{fmt.Sprintf("Idempotency-Key: k%d", n.Add(1)), "Oncegate-Job-Id: " + job, "Oncegate-Job-Epoch: " + epoch}
		if queue != "" {
			headers = append(headers, "Oncegate-Job-Queue: "+queue)
		}
		if created != "" {
			headers = append(headers, "Oncegate-Job-Created: "+created)
		}
		return h.req("POST", "/v1/effects", acmeKey, analytics("x"), headers...)
	}
	// A fence the version before migration 00034 recorded (one epoch per job ID), as an old gateway of the
	// fleet does during a rolling upgrade.
	if _, err := h.pool.Exec(context.Background(),
		"INSERT INTO oncegate_job_fences (tenant, job_id, epoch) VALUES ('acme', 'user_9', 5)"); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		job, queue, created, epoch string
		want                       int
	}{
		{"user_7", "emails", "1700000000000", "5", 202},
		{"user_7", "crm", "1700000000500", "1", 202},    // another queue: another job
		{"user_7", "emails", "1700000000000", "4", 409}, // the same job, an older lease
		{"user_7", "emails", "1700000060000", "1", 202}, // enqueued again (its queue made again): newer
		{"user_7", "emails", "1700000000000", "9", 409}, // the old job's run, whatever its epoch
		{"user_7", "", "", "7", 202},                    // no queue named: the fence of the jobs of no named queue
		{"user_7", "", "", "6", 409},                    // ... which its epochs rank, as before
		{"user_7", "crm", "1700000000500", "2", 202},    // the other queue's job goes on
		{"user_7", "emails", "1700000060000", "2", 202}, // and so does the new one
		{"user_7", "emails", "1700000060000", "1", 409}, // whose older lease is fenced
		// A worker that sends no creation (an older version, beside newer ones in a rolling upgrade) is ranked
		// by its epoch alone: its stale run is refused, its successor's run taken, and a newer worker's run
		// below that successor refused in turn (ranked below every creation, the stale run was taken).
		{"user_8", "emails", "1700000060000", "5", 202},
		{"user_8", "emails", "", "4", 409},
		{"user_8", "emails", "", "6", 202},
		{"user_8", "emails", "1700000060000", "5", 409},
		{"user_8", "emails", "1700000060000", "7", 202},
		// Such a worker is fenced by the old gateways' fence too, as it was before: a stale run of a job an
		// old gateway saw at epoch 5 is refused by this one; a run that sends its creation is ranked by
		// this version's fence alone (the old one is one epoch per ID, whatever the queue or the job).
		{"user_9", "emails", "", "4", 409},
		{"user_9", "emails", "", "5", 202},
		{"user_9", "crm", "1700000000000", "1", 202},
	} {
		if r := send(c.job, c.queue, c.created, c.epoch); r.status != c.want {
			t.Fatalf("request %d (job %s, queue %q, created %q, epoch %s): %d %s, want %d", i, c.job, c.queue, c.created,
				c.epoch, r.status, r.raw, c.want)
		}
	}
	// A successor's run through an old gateway raises only the old fence: a stale run that sends its creation
	// is refused by this gateway too (it was taken: an outside test).
	if r := send("user_10", "emails", "1700000000000", "1"); r.status != 202 {
		t.Fatalf("user_10 epoch 1: %d %s", r.status, r.raw)
	}
	if _, err := h.pool.Exec(context.Background(), `UPDATE oncegate_job_fences SET epoch = 2, updated_at = now()
		WHERE tenant = 'acme' AND job_id = 'user_10'`); err != nil { // what an old gateway's upsert writes
		t.Fatal(err)
	}
	for epoch, want := range map[string]int{"1": 409, "2": 202} {
		if r := send("user_10", "emails", "1700000000000", epoch); r.status != want {
			t.Fatalf("user_10 epoch %s after an old gateway saw epoch 2: %d %s, want %d", epoch, r.status, r.raw, want)
		}
	}
	// Requests of one job with and without a creation at once: one order of the two fences' locks for
	// all (in two orders they deadlocked, and a legitimate run got a 500).
	for round := range 15 {
		job := fmt.Sprintf("race-%d", round)
		var wg sync.WaitGroup
		codes := make([]int, 3)
		for i, c := range [][2]string{{"1700000000000", "1"}, {"", "2"}, {"1700000000000", "3"}} {
			wg.Go(func() { codes[i] = send(job, "emails", c[0], c[1]).status })
		}
		wg.Wait()
		for i, code := range codes {
			if code != 202 && code != 409 || i == 2 && code != 202 {
				t.Fatalf("round %d: answers %v (epochs 1, 2, 3), want 202 or 409, and 202 for the newest", round, codes)
			}
		}
	}
	// The old gateways' fence is raised by this one's requests, never lowered, so that they fence what it
	// saw (and a rollback does).
	for job, want := range map[string]int{"user_7": 7, "user_8": 7, "user_9": 5} {
		if got := h.count("SELECT epoch FROM oncegate_job_fences WHERE tenant = 'acme' AND job_id = $1", job); got != want {
			t.Errorf("the old fence of %s is at %d, want %d", job, got, want)
		}
	}
	job := []string{"Oncegate-Job-Id: j", "Oncegate-Job-Epoch: 1"}
	future := fmt.Sprint(time.Now().Add(2 * time.Hour).UnixMilli())
	for field, bad := range map[string][][]string{
		"Oncegate-Job-Created": {{"Oncegate-Job-Created: 1700000000000"}, append(job, "Oncegate-Job-Created: 017"),
			append(job, "Oncegate-Job-Created: -5"), append(job, "Oncegate-Job-Created: "+future),
			append(job, "Oncegate-Job-Created: 1", "Oncegate-Job-Created: 2")},
		// Sent twice, the first value counted; sent empty, the queue was none.
		"Oncegate-Job-Queue": {append(job, "Oncegate-Job-Queue: qz", "Oncegate-Job-Queue: qa"), append(job, "Oncegate-Job-Queue: "),
			append(job, "Oncegate-Job-Queue: q\xff")},
		"Oncegate-Job-Epoch": {{"Oncegate-Job-Id: j", "Oncegate-Job-Epoch: 1", "Oncegate-Job-Epoch: 2"}},
		"Oncegate-Job-Id":    {{"Oncegate-Job-Id: j", "Oncegate-Job-Id: k", "Oncegate-Job-Epoch: 1"}},
	} {
		for _, headers := range bad {
			r := h.req("POST", "/v1/effects", acmeKey, analytics("x"), append([]string{"Idempotency-Key: bad"}, headers...)...)
			if r.status != 400 || r.body["field"] != field {
				t.Errorf("%q: %d %s, want a 400 naming %s", headers, r.status, r.raw, field)
			}
		}
	}

	// Fences untouched for the keys' hold are forgotten, the others kept.
	if _, err := h.pool.Exec(context.Background(), `UPDATE oncegate_run_fences SET updated_at = now() - interval '2 days'
		WHERE queue = 'crm' AND job_id = 'user_7'`); err != nil {
		t.Fatal(err)
	}
	forgot, err := h.g.store.ForgetFences(context.Background(), 100)
	if err != nil || forgot != 1 {
		t.Fatalf("forgot %d fences (%v), want the one untouched for 2 days", forgot, err)
	}
	if n := h.count("SELECT count(*) FROM oncegate_run_fences"); n != 21 {
		t.Fatalf("%d fences left, want 21", n)
	}
}

// /metrics names every tenant, destination and breaker, and the API's address is the tenants': with
// metrics_listen set it is served there only, with the probes, and the API's address answers 404 (an outside
// tester read another tenant's open breaker from /metrics without a key).
func TestMetricsListenKeepsTheMetricsOffTheAPIsAddress(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	h := startGateway(t, func(c *Config) { c.MetricsListen = addr })
	if r := h.req("GET", "/metrics", "", ""); r.status != http.StatusNotFound {
		t.Fatalf("/metrics on the API's address: %d %s", r.status, r.raw)
	}
	if r := h.req("GET", "/metrics", acmeKey, ""); r.status != http.StatusNotFound {
		t.Fatalf("/metrics on the API's address, with a tenant's key: %d", r.status)
	}
	for _, path := range []string{"/readyz", "/healthz"} {
		if r := h.req("GET", path, "", ""); r.status != http.StatusNotFound {
			t.Fatalf("%s on the API's address: %d %s", path, r.status, r.raw)
		}
	}
	// Every configured type has its backlog's series, 0 while nothing waits: a dashboard saw none until the
	// first backlog.
	for _, c := range [][2]string{{"/metrics", `oncegate_outbox_backlog{type="analytics"} 0`},
		{"/metrics", `oncegate_rate_limited_total{bucket="requests",tenant="acme"} 0`}, {"/readyz", ""}, {"/healthz", ""}} {
		path, want := c[0], c[1]
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("%s on metrics_listen: %d %.200s", path, resp.StatusCode, body)
		}
	}
	resp, err := http.Get("http://" + addr + "/v1/effects")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("the API on metrics_listen: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// The address is checked with the rest of the configuration.
	for _, bad := range []string{"notanaddr", "127.0.0.1:99999"} {
		c := (&Config{MetricsListen: bad}).WithDefaults()
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), "metrics_listen") {
			t.Errorf("metrics_listen %q: %v, want refused naming it", bad, err)
		}
	}
}
