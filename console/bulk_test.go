package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
)

// "Retry selected" answers as the API and the CLI do: when none of the ticked effects is in a state a retry
// applies to, a wrong state (409); 207 only when some were retried and some not.
func TestRetrySelectedNoneAppliedIsWrongState(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 1000})
	c := e.client(admin.RoleOperator)
	sel := func(status string) string {
		tenant, key := e.effectWith(status)
		return url.Values{"tenant": {tenant}, "key": {key}}.Encode()
	}
	delivered, pending := sel("delivered"), sel("pending")
	code, hdr, body := e.post(c, "/effects/retry-selected", url.Values{"sel": {delivered, pending}, "reason": {"try"}})
	if code != http.StatusConflict || !strings.Contains(body, "none of 2") {
		t.Fatalf("retry selected of a delivered and a pending effect: %d, want 409\n%s", code, body)
	}
	checkPage(t, "/effects/retry-selected", hdr, body)
	missing := url.Values{"tenant": {"acme"}, "key": {"no-such-effect"}}.Encode()
	if code, _, body := e.post(c, "/effects/retry-selected", url.Values{"sel": {missing}, "reason": {"try"}}); code != http.StatusNotFound {
		t.Fatalf("retry selected of an effect that does not exist: %d, want 404\n%s", code, body)
	}
	dTenant, dKey := e.effectWith("dead")
	dead := url.Values{"tenant": {dTenant}, "key": {dKey}}.Encode()
	code, _, body = e.post(c, "/effects/retry-selected", url.Values{"sel": {dead, delivered}, "reason": {"try"}})
	if code != http.StatusMultiStatus || !strings.Contains(body, "retried 1 of 2") {
		t.Fatalf("retry selected of a dead and a delivered effect: %d, want 207\n%s", code, body)
	}
	if s := e.status(dTenant, dKey); s != "pending" {
		t.Fatalf("the dead effect is %s after its retry", s)
	}
}
