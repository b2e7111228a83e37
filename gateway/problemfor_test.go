package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
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

// A client that hangs up while its request waits (on a stalled database, a held slot) stops the request, and
// that is logged as what it is, with the tenant and the key, not as the gateway's failure; the gateway's own
// failures name them too.
func TestAClientThatHungUpIsNotAFailure(t *testing.T) {
	var buf bytes.Buffer
	g := &Gateway{log: slog.New(slog.NewJSONHandler(&buf, nil))}
	request := func(ctx context.Context) *http.Request {
		r := httptest.NewRequest("POST", "/v1/effects", nil).WithContext(context.WithValue(ctx, tenantKey{}, "acme"))
		r.Header.Set("Idempotency-Key", "k1")
		return r
	}
	gone, hangUp := context.WithCancel(context.Background())
	hangUp()
	g.fail(httptest.NewRecorder(), request(gone), fmt.Errorf("dedup: record effect: %w", context.Canceled))
	g.fail(httptest.NewRecorder(), request(context.Background()), errors.New("dedup: record effect: boom"))
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	for i, want := range []string{"INFO", "ERROR"} {
		var rec map[string]any
		if err := json.Unmarshal(lines[i], &rec); err != nil {
			t.Fatal(err)
		}
		if rec["level"] != want || rec["tenant"] != "acme" || rec["key"] != "k1" {
			t.Errorf("line %d: %v; want %s with the tenant and the key", i, rec, want)
		}
	}
}
