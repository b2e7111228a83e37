package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/dedup"
)

// Every store error has one problem, whichever route met it: /v1/effects and /v1/proxy answered a reused
// key with different details when each handler had its own switch.
func TestProblemForEveryStoreError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err        error
		kind       *ProblemKind
		field      string
		retryAfter int
	}{
		{about(&dedup.KeyReusedError{Key: "k"}, "k", "t"), probKeyReused, "Idempotency-Key", 0},
		{about(&dedup.FencedError{JobID: "j", Epoch: 2}, "k", "t"), probFenced, "Oncegate-Job-Epoch", 0},
		{about(&dedup.UnstorableError{Reason: "NUL"}, "k", "t"), probInvalid, "payload", 0},
		{about(dedup.ErrNotFound, "k", ""), probNotFound, "", 0},
		{about(dedup.ErrNotRetryable, "k", ""), probNotRetryable, "", 0},
		{about(dedup.ErrTypePaused, "k", "t"), probTypePaused, "", typePausedRetry},
		{dedup.ErrBadCursor, probInvalid, "cursor", 0},
		{fmt.Errorf("create: %w", dedup.ErrUnavailable), probUnavailable, "", 1},
		{fmt.Errorf("create: %w: %w", dedup.ErrUnavailable, dedup.ErrNoPartition), probUnavailable, "", 1},
		{errors.New("anything else"), probInternal, "", 0},
		{invalid("wait", "too long"), probInvalid, "wait", 0},
	} {
		p := problemFor(tc.err)
		if p.kind != tc.kind || p.field != tc.field || p.retryAfter != tc.retryAfter || p.detail == "" {
			t.Errorf("%v: %+v", tc.err, p)
		}
	}
}

func TestAReusedKeyReadsTheSameOnEveryRoute(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int64) { w.WriteHeader(201) })
	h := proxyGateway(t, up, nil)
	h.post("reused", analytics("a"))
	direct := h.post("reused", analytics("b"))
	h.req("POST", "/v1/proxy/payments/x", acmeKey, `{"a":1}`, "Idempotency-Key: reused-proxied")
	proxied := h.req("POST", "/v1/proxy/payments/x", acmeKey, `{"a":2}`, "Idempotency-Key: reused-proxied")
	want := func(key string) string {
		return fmt.Sprintf("the key %q was used for another request; use a new key for a new request, or send "+
			"exactly the same request to get its answer", key)
	}
	if direct.status != 422 || direct.body["detail"] != want("reused") || direct.body["field"] != "Idempotency-Key" {
		t.Errorf("/v1/effects: %d %s", direct.status, direct.raw)
	}
	if proxied.status != 422 || proxied.body["detail"] != want("reused-proxied") || proxied.body["field"] != "Idempotency-Key" {
		t.Errorf("/v1/proxy: %d %s", proxied.status, proxied.raw)
	}
}
