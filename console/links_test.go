package console_test

import (
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

var (
	hrefAttr   = regexp.MustCompile(`href="([^"]*)"`)
	hiddenAttr = regexp.MustCompile(`<input type="hidden" name="([^"]*)" value="([^"]*)">`)
)

// hrefByID is the href of the element with this id on the page, as a browser reads the attribute.
func hrefByID(t *testing.T, body, id string) string {
	t.Helper()
	m := regexp.MustCompile(`id="` + regexp.QuoteMeta(id) + `"[^>]*href="([^"]*)"|href="([^"]*)"[^>]*id="` +
		regexp.QuoteMeta(id) + `"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no link with id %q in the page", id)
	}
	return html.UnescapeString(m[1] + m[2])
}

// follow resolves href against the page's URL as a browser does and GETs it.
func (e *env) follow(c *http.Client, from, href string) (int, string, string) {
	e.t.Helper()
	base, err := url.Parse(e.url + from)
	if err != nil {
		e.t.Fatal(err)
	}
	ref, err := url.Parse(href)
	if err != nil {
		e.t.Fatalf("href %q on %s: %v", href, from, err)
	}
	u := base.ResolveReference(ref)
	code, _, body := e.get(c, u.RequestURI())
	return code, u.RequestURI(), body
}

// hiddenFields are a page's hidden form fields, decoded as a browser would post them.
func hiddenFields(body string) url.Values {
	v := url.Values{}
	for _, m := range hiddenAttr.FindAllStringSubmatch(body, -1) {
		if x := html.UnescapeString(m[2]); x != "" {
			v.Add(html.UnescapeString(m[1]), x)
		}
	}
	return v
}

// The "Retry all matching…" link and the next-page link keep the list's filters, whichever way the list was
// filtered: the dry run counts the filtered effects and its form posts the same filter.
func TestRetryMatchingAndNextPageKeepTheFilter(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 3000})
	c := e.client(admin.RoleOperator)
	var jobID string
	if err := e.db.QueryRow(t.Context(), "SELECT job_id FROM oncegate_effects WHERE status = 'failed' ORDER BY id LIMIT 1").
		Scan(&jobID); err != nil {
		t.Fatal(err)
	}
	retryable := "status IN ('failed', 'dead', 'unknown')"
	var failedKey string
	if err := e.db.QueryRow(t.Context(), "SELECT key FROM oncegate_effects WHERE status = 'failed' ORDER BY id LIMIT 1").
		Scan(&failedKey); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		list   string
		where  string
		fields url.Values
	}{
		{"/effects?status=failed&type=email", "status = 'failed' AND type = 'email'",
			url.Values{"status": {"failed"}, "type": {"email"}}},
		{"/effects?tenant=globex&type=webhook", "tenant = 'globex' AND type = 'webhook' AND " + retryable,
			url.Values{"tenant": {"globex"}, "type": {"webhook"}}},
		{"/effects?job=" + url.QueryEscape(jobID), "job_id = '" + jobID + "' AND " + retryable,
			url.Values{"job": {jobID}}},
		{"/effects?q=" + url.QueryEscape(jobID), "job_id = '" + jobID + "' AND " + retryable,
			url.Values{"job": {jobID}}},
		{"/effects?q=order-0-&status=failed", "key LIKE 'order-0-%' AND status = 'failed'",
			url.Values{"key_prefix": {"order-0-"}, "status": {"failed"}}},
		// A search (by key, tag or recipient) narrows the run as it narrows the list: its form dropped it, and
		// an outside tester's run retried every failed effect of every tenant, where the dry run counted 12.
		{"/effects?search=" + url.QueryEscape(failedKey) + "&status=failed", "key = '" + failedKey + "' AND status = 'failed'",
			url.Values{"search": {failedKey}, "status": {"failed"}}},
	} {
		code, _, body := e.get(c, tc.list)
		if code != 200 {
			t.Fatalf("GET %s: %d", tc.list, code)
		}
		href := hrefByID(t, body, "retry-matching")
		code, to, body := e.follow(c, tc.list, href)
		if code != 200 {
			t.Errorf("%s: Retry all matching (%s): %d", tc.list, href, code)
			continue
		}
		want := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_effects WHERE "+tc.where)
		if want == 0 {
			t.Fatalf("%s: the seed has no effect where %s", tc.list, tc.where)
		}
		if !strings.Contains(body, fmt.Sprintf(`id="dry-run-count">%d<`, want)) {
			t.Errorf("%s: %s does not count %d effects", tc.list, to, want)
		}
		if got := hiddenFields(body); got.Encode() != tc.fields.Encode() {
			t.Errorf("%s: %s posts the filter %q, want %q", tc.list, to, got.Encode(), tc.fields.Encode())
		}
	}
	// The next page keeps the filter too.
	list := "/effects?status=delivered&type=email&tenant=acme"
	code, _, body := e.get(c, list)
	if code != 200 {
		t.Fatalf("GET %s: %d", list, code)
	}
	code, to, body := e.follow(c, list, hrefByID(t, body, "next-page"))
	if code != 200 {
		t.Fatalf("next page %s: %d", to, code)
	}
	u, _ := url.Parse(to)
	q := u.Query()
	if q.Get("status") != "delivered" || q.Get("type") != "email" || q.Get("tenant") != "acme" || q.Get("cursor") == "" {
		t.Errorf("next page %s lost the filter", to)
	}
	for _, cell := range []string{"<td>webhook</td>", "<td>analytics</td>", "<td>globex</td>", `class="status failed"`} {
		if strings.Contains(body, cell) {
			t.Errorf("next page %s lists effects outside the filter (%s)", to, cell)
		}
	}
	if !strings.Contains(body, "<td>email</td>") {
		t.Errorf("next page %s lists no email effect", to)
	}
}

// A retry of all matching with no filter at all is refused at once, as bad input, before any run starts.
func TestRetryMatchingWithoutAFilterIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 1000})
	c := e.client(admin.RoleOperator)
	before := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_effects WHERE status IN ('failed', 'dead', 'unknown')")
	code, _, body := e.get(c, "/effects/retry-matching")
	// It counts nothing, and says so rather than "0 … match" (an outside tester's finding).
	if code != 200 || !strings.Contains(body, `id="no-filter"`) || strings.Contains(body, "retry-matching-go") ||
		strings.Contains(body, "dry-run-count") || !strings.Contains(body, "not counted") {
		t.Errorf("the dry run with no filter: %d, says so: %v, offers the run: %v", code,
			strings.Contains(body, `id="no-filter"`), strings.Contains(body, "retry-matching-go"))
	}
	code, hdr, body := e.post(c, "/effects/retry-matching", url.Values{"reason": {"everything"}, "status": {""}})
	if code != http.StatusBadRequest || !strings.Contains(body, "filter") {
		t.Fatalf("retry matching with no filter: %d %s\n%s", code, hdr.Get("Location"), body)
	}
	checkPage(t, "/effects/retry-matching", hdr, body)
	if n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_effects WHERE status IN ('failed', 'dead', 'unknown')"); n != before {
		t.Fatalf("a retry with no filter sent %d effects back", before-n)
	}
}

// awkward holds every character a link must encode: ":" (as in the README's welcome-email:user_6), a space,
// "&", "%", "<", "/", "+", "#", "?", "=" and non-ASCII.
const awkward = ":welcome-email:user_6 & 100% <b>/x+y#z?a=b é ☃"

// Every link on the pages that list queues, jobs and search results leads, followed as a browser follows
// it, to the page it names, for a queue name, a job ID and an effect type that all need encoding.
func TestLinksEncodeDataExactlyOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 1000, queueSuffix: awkward, deadPrefix: awkward})
	ctx := t.Context()
	job := e.dead[0]
	typ := "mail" + awkward
	// One effect made by that job, of that type, so that search results and the home page link them.
	if _, err := e.db.Exec(ctx, "UPDATE oncegate_effects SET job_id = $1, type = $2 WHERE id = (SELECT min(id) FROM oncegate_effects WHERE status = 'dead')",
		job, typ); err != nil {
		t.Fatal(err)
	}
	c := e.client(admin.RoleOperator)
	type target struct {
		path string
		want url.Values // the query the link must carry, decoded
	}
	for _, tc := range []struct {
		page  string
		wants []target
	}{
		{"/", []target{{"/queue", url.Values{"name": {e.queue}}}, {"/queue", url.Values{"name": {e.queue}, "state": {"dead"}}},
			{"/effects", url.Values{"type": {typ}}}}},
		{"/queues", []target{{"/queue", url.Values{"name": {e.queue}}}, {"/queue", url.Values{"name": {e.queue}, "state": {"dead"}}}}},
		{"/queue?" + url.Values{"name": {e.queue}, "state": {"dead"}}.Encode(), []target{
			{"/job", url.Values{"queue": {e.queue}, "id": {job}}}, {"/queue", url.Values{"name": {e.queue}, "state": {"ready"}}}}},
		{"/job?" + url.Values{"queue": {e.queue}, "id": {job}}.Encode(), []target{
			{"/queue", url.Values{"name": {e.queue}, "state": {"dead"}}}, {"/effects", url.Values{"job": {job}}}}},
		{"/effects?" + url.Values{"q": {job}}.Encode(), []target{
			{"/job", url.Values{"queue": {e.queue}, "id": {job}}}, {"/queue", url.Values{"name": {e.queue}, "state": {"dead"}}},
			{"/effects", url.Values{"job": {job}}}}},
		{"/effects?" + url.Values{"type": {typ}}.Encode(), []target{{"/effects", url.Values{"job": {job}}}}},
	} {
		code, _, body := e.get(c, tc.page)
		if code != 200 {
			t.Fatalf("GET %s: %d", tc.page, code)
		}
		base, _ := url.Parse(e.url + tc.page)
		found := make([]bool, len(tc.wants))
		for _, m := range hrefAttr.FindAllStringSubmatch(body, -1) {
			href := html.UnescapeString(m[1])
			ref, err := url.Parse(href)
			if err != nil {
				t.Errorf("%s: href %q: %v", tc.page, href, err)
				continue
			}
			u := base.ResolveReference(ref)
			if strings.HasPrefix(u.Path, "/assets/") || u.Host != base.Host {
				continue
			}
			for i, w := range tc.wants {
				if u.Path == w.path && u.Query().Encode() == w.want.Encode() {
					found[i] = true
				}
			}
			code, _, got := e.get(c, u.RequestURI())
			if code != 200 {
				t.Errorf("%s: the link %q answers %d", tc.page, href, code)
				continue
			}
			// The page the link opens is the one it names.
			q := u.Query()
			for _, v := range []string{q.Get("name"), q.Get("id")} {
				if v != "" && !strings.Contains(html.UnescapeString(got), v) {
					t.Errorf("%s: the link %q opens a page without %q", tc.page, href, v)
				}
			}
		}
		for i, w := range tc.wants {
			if !found[i] {
				t.Errorf("%s: no link to %s?%s", tc.page, w.path, w.want.Encode())
			}
		}
	}
}

// A job ID, a queue's name or an error with a character a reader cannot see as itself is shown with it
// escaped, as the CLI shows it, while links still carry the ID as it is: an unclosed bidi override in a job
// ID reversed the rest of its cell (an outside tester's finding), and a zero-width space makes two IDs alike.
func TestInvisibleCharactersAreShownEscaped(t *testing.T) {
	t.Parallel()
	const hidden = "j\u202eevil\u200bx-"
	e := setup(t, options{effects: 10, deadPrefix: hidden, queueSuffix: "-q\u202eh\u3164"})
	ctx := t.Context()
	job := e.dead[0]
	if _, err := e.db.Exec(ctx, "UPDATE oncegate_effects SET job_id = $1, job_queue = $2 WHERE id = (SELECT min(id) FROM oncegate_effects)",
		job, e.queue); err != nil {
		t.Fatal(err)
	}
	var key string
	if err := e.db.QueryRow(ctx, "SELECT key FROM oncegate_effects WHERE job_id = $1", job).Scan(&key); err != nil {
		t.Fatal(err)
	}
	c := e.client(admin.RoleOperator)
	for _, page := range []string{
		"/queue?" + url.Values{"name": {e.queue}, "state": {"dead"}}.Encode(),
		"/job?" + url.Values{"queue": {e.queue}, "id": {job}}.Encode(),
		"/effects?" + url.Values{"job": {job}}.Encode(),
		"/", "/queues", // the queue's name
	} {
		code, _, body := e.get(c, page)
		if code != 200 {
			t.Fatalf("GET %s: %d", page, code)
		}
		text := html.UnescapeString(body)
		if !strings.HasPrefix(page, "/queues") && page != "/" && !strings.Contains(text, `j\u202eevil\u200bx-`) {
			t.Errorf("%s does not show the job ID escaped", page)
		}
		// Raw, it may stand only where a link or a form carries it (percent-encoded or in an attribute).
		for _, m := range regexp.MustCompile(`>[^<]*[\x{202e}\x{200b}\x{3164}][^<]*<`).FindAllString(body, -1) {
			t.Errorf("%s shows an invisible character raw in its text: %q", page, m)
		}
	}
}
