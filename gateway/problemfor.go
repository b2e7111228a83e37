package gateway

// The API's handlers return errors, and problemFor maps each to the problem it is answered with, once for
// every route: a reused key, a fenced job, an unstorable payload, a missing effect or a database away read
// the same on /v1/effects and on /v1/proxy. A handler's own refusals are *problemError values (invalid,
// refuse); everything else is the store's, named by its type.

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/oncegate/oncegate/dedup"
)

// problemError is a refusal as a handler returns it: the problem it is answered with.
type problemError struct {
	kind       *ProblemKind
	field      string
	detail     string
	retryAfter int // seconds; 0 sends no Retry-After
}

func (e *problemError) Error() string { return e.kind.Slug + ": " + e.detail }

// refuse is a refusal with the problem kind k.
func refuse(k *ProblemKind, field, detail string) error {
	return &problemError{kind: k, field: field, detail: detail}
}

// invalid refuses a request whose field (or body, when field is "") is at fault.
func invalid(field, detail string) error { return refuse(probInvalid, field, detail) }

// subjectError names the key and the effect type a store error was about, for its problem's detail.
type subjectError struct {
	key, typ string
	err      error
}

func (e *subjectError) Error() string { return e.err.Error() }
func (e *subjectError) Unwrap() error { return e.err }

// about names the key and effect type (either may be "") that err, a store's, was about.
func about(err error, key, typ string) error {
	if err == nil {
		return nil
	}
	return &subjectError{key: key, typ: typ, err: err}
}

// typePausedRetry is the Retry-After of a request refused because its type is paused: an operator's pause
// lasts minutes, and a client that comes back every second would only add load to an incident.
const typePausedRetry = 30

// problemFor maps an error a handler returned to the problem it is answered with.
func problemFor(err error) *problemError {
	var (
		pe         *problemError
		subject    subjectError
		on         *subjectError
		fenced     *dedup.FencedError
		reused     *dedup.KeyReusedError
		unstorable *dedup.UnstorableError
	)
	if errors.As(err, &on) {
		subject = *on
	}
	switch {
	case errors.As(err, &pe):
		return pe
	case errors.As(err, &fenced):
		return &problemError{kind: probFenced, field: "Oncegate-Job-Epoch", detail: fmt.Sprintf("job %q was "+
			"leased again under a newer epoch than %d, or enqueued again since: this worker lost the job and may "+
			"not start effects for it; stop the handler", fenced.JobID, fenced.Epoch)}
	case errors.As(err, &reused):
		return &problemError{kind: probKeyReused, field: "Idempotency-Key", detail: fmt.Sprintf("the key %q was "+
			"used for another request; use a new key for a new request, or send exactly the same request to get "+
			"its answer", reused.Key)}
	case errors.As(err, &unstorable):
		// Valid JSON that Postgres cannot store, such as a \u0000 escape.
		return &problemError{kind: probInvalid, field: "payload", detail: "the payload cannot be stored: " +
			unstorable.Reason}
	case errors.Is(err, dedup.ErrNotFound):
		return &problemError{kind: probNotFound, detail: notFound(subject.key)}
	case errors.Is(err, dedup.ErrBodyExpired):
		return &problemError{kind: probNotRetryable, detail: "the effect's payload expired (retention.payloads): " +
			"it cannot be sent again; send it as a new request under a new Idempotency-Key"}
	case errors.Is(err, dedup.ErrNotRetryable):
		return &problemError{kind: probNotRetryable, detail: "only dead, failed and unknown effects can be retried"}
	case errors.Is(err, dedup.ErrTypePaused):
		return &problemError{kind: probTypePaused, retryAfter: typePausedRetry, detail: fmt.Sprintf("an operator "+
			"paused delivery of effect type %q; retry with the same Idempotency-Key after the type is resumed",
			subject.typ)}
	case errors.Is(err, dedup.ErrBadCursor):
		return &problemError{kind: probInvalid, field: "cursor", detail: "the cursor is not one this API handed out"}
	case errors.Is(err, dedup.ErrNoPartition):
		return &problemError{kind: probUnavailable, retryAfter: 1, detail: "the database has no partition for " +
			"the present yet (a gateway's partition manager makes it at its next pass; /readyz says when); retry " +
			"with the same Idempotency-Key: nothing was recorded"}
	case errors.Is(err, dedup.ErrUnavailable) && dedup.NoPrimary(err):
		return &problemError{kind: probUnavailable, retryAfter: 1, detail: "the database is read-only: no server " +
			"reached takes writes (a failover in progress, or default_transaction_read_only on); retry once a " +
			"primary is back (a create with the same Idempotency-Key: this attempt recorded nothing)"}
	case errors.Is(err, dedup.ErrUnavailable):
		return &problemError{kind: probUnavailable, retryAfter: 1, detail: "the database did not answer in time " +
			"(it is unreachable, or its commits wait for a synchronous standby that is not there); retry with the " +
			"same Idempotency-Key: it records the effect once, or returns it once it is recorded for good"}
	}
	return &problemError{kind: probInternal, detail: "the request failed; it is safe to retry with the same " +
		"Idempotency-Key"}
}

// notFound is the detail of a 404 for key: a key may never have been sent, or may have been retired by
// retention, and an operator chasing an old effect cannot tell which without being told.
func notFound(key string) string {
	return fmt.Sprintf("no effect under the key %q (or it was retired: an effect and its key are kept "+
		"retention.keys after the effect finished, then dropped)", key)
}

// fail answers a request with the problem of err, and logs what the client is not told.
func (g *Gateway) fail(w http.ResponseWriter, r *http.Request, err error) {
	p := problemFor(err)
	var reused *dedup.KeyReusedError
	var on *subjectError
	tenant, _ := r.Context().Value(tenantKey{}).(string) // none before authentication
	key := r.Header.Get("Idempotency-Key")
	switch {
	case r.Context().Err() != nil && errors.Is(err, r.Context().Err()):
		// The client hung up (or its server's deadline passed) while the request waited: nothing failed that
		// an operator must look into, and the client, if it retries with its key, gets the one effect.
		g.log.Info("the client went away before its answer; the request stopped", "path", r.URL.Path,
			"tenant", tenant, "key", key, "err", err)
	case p.kind == probUnavailable:
		g.log.Warn("database unavailable", "path", r.URL.Path, "tenant", tenant, "key", key, "err", err)
	case p.kind == probInternal:
		g.log.Error("request failed", "path", r.URL.Path, "tenant", tenant, "key", key, "err", err)
	case errors.As(err, &reused) && errors.As(err, &on):
		g.metrics.keyReuses.WithLabelValues(on.typ).Inc()
	}
	if p.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(p.retryAfter))
	}
	writeProblem(w, p.kind, p.field, p.detail)
}

// api adapts a handler that returns its refusal as an error.
func (g *Gateway) api(h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			g.fail(w, r, err)
		}
	}
}
