package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

var (
	jobPayload    = regexp.MustCompile(`(?s)<pre id="job-payload">(.*?)</pre>`)
	effectPayload = regexp.MustCompile(`(?s)<pre id="payload">(.*?)</pre>`)
	effectResult  = regexp.MustCompile(`(?s)<pre id="result">(.*?)</pre>`)
)

// One rule for every payload (an outside tester found three): an effect's payload and result and a job's
// payload are redacted for every role, on the pages and in the API, until an operator reveals them with a
// POST, which is audited; a viewer cannot reveal.
func TestPayloadsAreRedactedByOneRule(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 1000})
	jobPath := "/job?queue=" + e.queue + "&id=" + e.dead[0]
	tenant, key := e.effectWith("delivered")
	effectPath := "/effect?tenant=" + tenant + "&key=" + key
	reveals := func(action string) int {
		return pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_audit WHERE action = $1 AND outcome = 'done'", action)
	}
	redacted := func(s string) bool {
		return strings.Contains(s, "‹") && !strings.Contains(s, "@example.com") && !strings.Contains(s, `"order": 1`) &&
			!strings.Contains(s, "msg-")
	}
	for _, role := range []admin.Role{admin.RoleViewer, admin.RoleOperator, admin.RoleAdmin} {
		c := e.client(role)
		code, _, body := e.get(c, jobPath)
		m := jobPayload.FindStringSubmatch(body)
		if code != 200 || m == nil || !redacted(html.UnescapeString(m[1])) {
			t.Errorf("%s: the job page: %d, payload %q", role, code, m)
		}
		code, _, body = e.get(c, effectPath)
		p, r := effectPayload.FindStringSubmatch(body), effectResult.FindStringSubmatch(body)
		if code != 200 || p == nil || r == nil || !redacted(html.UnescapeString(p[1])) || !redacted(html.UnescapeString(r[1])) {
			t.Errorf("%s: the effect page: %d, payload %q, result %q", role, code, p, r)
		}
		code, _, body = e.apiGet(e.tokens[role], "/api/v1/job?queue="+e.queue+"&id="+e.dead[0])
		var j admin.JobDetail
		if code != 200 || json.Unmarshal([]byte(body), &j) != nil || !redacted(j.Payload) || j.Revealed {
			t.Errorf("%s: GET /api/v1/job: %d %s", role, code, body)
		}
		code, _, body = e.apiGet(e.tokens[role], "/api/v1/effect?tenant="+tenant+"&key="+key)
		var d admin.EffectDetail
		if code != 200 || json.Unmarshal([]byte(body), &d) != nil || !redacted(string(d.Payload)) ||
			!redacted(string(d.Result)) || d.Revealed {
			t.Errorf("%s: GET /api/v1/effect: %d %s", role, code, body)
		}
	}

	// A viewer cannot reveal; an operator can, and each reveal is in the audit log.
	if code, _, _ := e.apiPost(e.tokens[admin.RoleViewer], "/api/v1/job/reveal",
		map[string]any{"queue": e.queue, "ids": []string{e.dead[0]}}); code != 403 {
		t.Fatalf("a viewer's job reveal: %d", code)
	}
	code, _, body := e.apiPost(e.tokens[admin.RoleOperator], "/api/v1/job/reveal",
		map[string]any{"queue": e.queue, "ids": []string{e.dead[0]}})
	var j admin.JobDetail
	if code != 200 || json.Unmarshal([]byte(body), &j) != nil || !j.Revealed || !strings.Contains(j.Payload, `"order":1`) {
		t.Fatalf("an operator's job reveal: %d %s", code, body)
	}
	code, _, body = e.post(e.client(admin.RoleOperator), "/job/reveal", url.Values{"queue": {e.queue}, "id": {e.dead[0]}})
	if m := jobPayload.FindStringSubmatch(body); code != 200 || m == nil || !strings.Contains(html.UnescapeString(m[1]), `"order": 1`) {
		t.Fatalf("the job page's reveal: %d %q", code, m)
	}
	code, _, body = e.post(e.client(admin.RoleOperator), "/effect/reveal", url.Values{"tenant": {tenant}, "key": {key}})
	if r := effectResult.FindStringSubmatch(body); code != 200 || r == nil || !strings.Contains(html.UnescapeString(r[1]), "msg-") {
		t.Fatalf("the effect page's reveal shows the result: %d %q", code, r)
	}
	if n, m := reveals("job.reveal"), reveals("effect.reveal"); n != 2 || m != 1 {
		t.Fatalf("audited: %d job reveals (want 2), %d effect reveals (want 1)", n, m)
	}
}

// An effect whose body expired (retention.payloads) says so on its page and in the API, shows no payload,
// result or retry form, and a retry posted anyway is refused with the reason, the effect left as it was.
func TestAnEffectWhoseBodyExpiredSaysSo(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 200})
	tenant, key := e.effectWith("dead")
	// Its body kept apart, then its partition of bodies dropped: neither payload column, no body row.
	if _, err := e.db.Exec(context.Background(), `UPDATE oncegate_effects SET payload = NULL, legacy_payload = NULL,
		result = NULL WHERE tenant = $1 AND key = $2`, tenant, key); err != nil {
		t.Fatal(err)
	}
	op := e.client(admin.RoleOperator)
	code, _, body := e.get(op, "/effect?tenant="+url.QueryEscape(tenant)+"&key="+url.QueryEscape(key))
	if code != 200 || !strings.Contains(body, `id="body-expired"`) || strings.Contains(body, `id="payload"`) ||
		strings.Contains(body, `action="/effect/retry"`) || !strings.Contains(body, "dead") {
		t.Fatalf("the effect page: %d, expired shown %v, retry form %v", code, strings.Contains(body, `id="body-expired"`),
			strings.Contains(body, `action="/effect/retry"`))
	}
	code, _, body = e.apiGet(e.tokens[admin.RoleOperator], "/api/v1/effect?tenant="+url.QueryEscape(tenant)+"&key="+url.QueryEscape(key))
	var d admin.EffectDetail
	if code != 200 || json.Unmarshal([]byte(body), &d) != nil || !d.BodyExpired || string(d.Payload) != "null" {
		t.Fatalf("GET /api/v1/effect: %d %s", code, body)
	}
	// The listings say so too: the page's row and the API's.
	if code, _, body := e.get(op, "/effects?tenant="+url.QueryEscape(tenant)+"&status=dead&key_prefix="+url.QueryEscape(key)); code != 200 ||
		strings.Count(body, "body expired</span>") != 1 {
		t.Fatalf("the effects page: %d, %d rows say body expired, want 1", code, strings.Count(body, "body expired</span>"))
	}
	code, _, body = e.apiGet(e.tokens[admin.RoleOperator], "/api/v1/effects?tenant="+url.QueryEscape(tenant)+"&status=dead&key_prefix="+url.QueryEscape(key))
	var page admin.EffectPage
	if code != 200 || json.Unmarshal([]byte(body), &page) != nil {
		t.Fatalf("GET /api/v1/effects: %d %.300s", code, body)
	}
	for _, l := range page.Effects {
		if l.BodyExpired != (l.Key == key) {
			t.Fatalf("GET /api/v1/effects: %s body_expired %v", l.Key, l.BodyExpired)
		}
	}
	code, _, body = e.post(op, "/effect/retry", url.Values{"tenant": {tenant}, "key": {key}, "reason": {"again"}},
		"Sec-Fetch-Site", "same-origin", "Origin", e.url)
	if s := e.status(tenant, key); s != "dead" || !strings.Contains(body+fmt.Sprint(code), "retention.payloads") {
		t.Fatalf("a retry posted anyway: %d %.300s; the effect is %s", code, body, s)
	}
}
