package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
)

// EffectFilter selects effects. Empty fields select everything.
type EffectFilter struct {
	Tenant    string        `json:"tenant,omitempty"`
	Type      string        `json:"type,omitempty"`
	Status    effect.Status `json:"status,omitempty"`
	KeyPrefix string        `json:"key_prefix,omitempty"`
	Since     time.Time     `json:"since,omitzero"` // created at or after
	JobID     string        `json:"job_id,omitempty"`
	// Search finds effects by their key (exactly), or by one of their tags or recipients (an email's
	// addresses, or an address's local part), in any case.
	Search string `json:"search,omitempty"`
}

func (f EffectFilter) check() error {
	if err := checkTexts("tenant", f.Tenant, "type", f.Type, "key_prefix", f.KeyPrefix, "job", f.JobID,
		"search", f.Search); err != nil {
		return err
	}
	if f.Search != "" && strings.TrimSpace(f.Search) == "" {
		return &InvalidError{Field: "search", Reason: "blank: name a key, a tag or a recipient"}
	}
	if f.Status != "" && !f.Status.Valid() {
		return &InvalidError{Field: "status", Reason: fmt.Sprintf("%q is not a status: want one of %s", f.Status,
			joinStatuses(effect.Statuses()))}
	}
	return nil
}

// likePattern turns a key prefix into a LIKE pattern that matches exactly the keys that start with it.
func (f EffectFilter) likePattern() *string {
	if f.KeyPrefix == "" {
		return nil
	}
	p := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(f.KeyPrefix) + "%"
	return &p
}

func (f EffectFilter) status() *string { return nullString(string(f.Status)) }

// searchTerm and searchKey are the search as the index holds terms (lowercased), and as typed for the key.
func (f EffectFilter) searchTerm() *string { return nullString(effect.SearchTerm(f.Search)) }
func (f EffectFilter) searchKey() *string  { return nullString(strings.TrimSpace(f.Search)) }

// match is f as the store's bulk changes take it.
func (f EffectFilter) match() dedup.Match {
	return dedup.Match{Tenant: f.Tenant, Type: f.Type, Status: f.Status, KeyPrefix: f.KeyPrefix, Since: f.Since,
		JobID: f.JobID, Search: f.Search}
}

// empty reports whether f selects every effect.
func (f EffectFilter) empty() bool { return f == EffectFilter{} }

func (f EffectFilter) json() json.RawMessage {
	b, _ := json.Marshal(f)
	return b
}

// Effect is an effect as an operator sees it in a listing.
type Effect struct {
	ID            int64         `json:"id"`
	Tenant        string        `json:"tenant"`
	Key           string        `json:"key"`
	Type          string        `json:"type"`
	Status        effect.Status `json:"status"`
	Attempts      int           `json:"attempts"`
	CreatedAt     time.Time     `json:"created_at"`
	UpdatedAt     time.Time     `json:"updated_at"`
	DeliveredAt   *time.Time    `json:"delivered_at"`
	NextAttemptAt *time.Time    `json:"next_attempt_at"`
	LastError     *string       `json:"last_error"`
	// The job that created it (Oncegate-Job-Id and -Epoch of the creating request), if it named one.
	JobID    *string `json:"job_id"`
	JobEpoch *int64  `json:"job_epoch"`
	// JobQueue is the job's queue, when the creating request named it (Oncegate-Job-Queue).
	JobQueue *string `json:"job_queue"`
	// TraceID is the W3C trace id of the creating request.
	TraceID *string `json:"trace_id"`
	// Replays counts the requests it absorbed after the first; the last came at LastReplayAt from job epoch
	// LastReplayEpoch (a stale worker shows up as an epoch below JobEpoch).
	Replays         int64      `json:"replays"`
	LastReplayAt    *time.Time `json:"last_replay_at"`
	LastReplayEpoch *int64     `json:"last_replay_epoch"`
	// Resolution is an operator's answer to an unknown effect: delivered, failed or resend.
	Resolution *Resolution `json:"resolution"`
	// Tags are the client's labels (the request's tags or Oncegate-Tags), as sent.
	Tags []string `json:"tags"`
	// Interrupted counts the attempts whose gateway died, or lost its lease, before recording an outcome:
	// each may have reached the destination, so an effect delivered with one may have been received twice
	// (under one stable id). The attempts column does not count them.
	Interrupted int64 `json:"interrupted"`
	// BodyExpired: the payload and the result were kept apart (retention.payloads) and are gone; the effect
	// still says what happened, with whom and when.
	BodyExpired bool `json:"body_expired"`
}

// Resolution is how an operator resolved an `unknown` effect.
type Resolution struct {
	As     string    `json:"as"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// Resolutions an operator can give an unknown effect.
const (
	ResolveDelivered = "delivered"
	ResolveFailed    = "failed"
	ResolveResend    = "resend"
)

func scanEffect(r pgx.Row, extra ...any) (*Effect, error) {
	var e Effect
	var status string
	var as, by, reason *string
	var at *time.Time
	dest := []any{&e.ID, &e.Tenant, &e.Key, &e.Type, &status, &e.Attempts, &e.CreatedAt, &e.UpdatedAt,
		&e.DeliveredAt, &e.NextAttemptAt, &e.LastError, &e.JobID, &e.JobEpoch, &e.TraceID, &e.Replays,
		&e.LastReplayAt, &e.LastReplayEpoch, &as, &by, &at, &reason, &e.Tags, &e.JobQueue, &e.Interrupted, &e.BodyExpired}
	if err := r.Scan(append(dest, extra...)...); err != nil {
		return nil, err
	}
	e.Status = effect.Status(status)
	if e.Tags == nil {
		e.Tags = []string{}
	}
	if as != nil {
		e.Resolution = &Resolution{As: *as}
		if by != nil {
			e.Resolution.By = *by
		}
		if at != nil {
			e.Resolution.At = *at
		}
		if reason != nil {
			e.Resolution.Reason = *reason
		}
	}
	return &e, nil
}

// sinceID is the lowest id an effect created at or after since can have (effects_since.sql), for a filter
// by creation time to read from; nil when there is no such filter. One more round trip, for those listings
// only: the plan of the listing then sees the id.
func (s *Service) sinceID(ctx context.Context, since time.Time) (*int64, error) {
	if since.IsZero() {
		return nil, nil
	}
	var from int64
	if err := s.db.QueryRow(ctx, effectsSinceSQL, since).Scan(&from); err != nil {
		return nil, dbError("find the effects created since "+since.Format(time.RFC3339), err)
	}
	return &from, nil
}

// EffectPage is a page of effects, newest first. NextCursor is empty on the last page.
type EffectPage struct {
	Effects    []*Effect `json:"effects"`
	NextCursor string    `json:"next_cursor"`
}

// Effects returns a page of the effects that match f, newest first.
func (s *Service) Effects(ctx context.Context, a Actor, f EffectFilter, p Page) (*EffectPage, error) {
	if err := s.allow(ctx, a, "effect.list", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	limit, err := p.limit()
	if err != nil {
		return nil, err
	}
	below, err := decodeIDCursor(p.Cursor)
	if err != nil {
		return nil, err
	}
	from, err := s.sinceID(ctx, f.Since)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, effectsListSQL, nullString(f.Tenant), nullString(f.Type), f.status(),
		f.likePattern(), nullTime(f.Since), below, nullString(f.JobID), limit+1, f.searchTerm(), f.searchKey(), from)
	if err != nil {
		return nil, dbError("list effects", err)
	}
	effects, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Effect, error) { return scanEffect(r) })
	if err != nil {
		return nil, dbError("list effects", err)
	}
	page := &EffectPage{Effects: effects}
	if page.Effects == nil {
		page.Effects = []*Effect{}
	}
	if len(effects) > limit {
		page.Effects = effects[:limit]
		page.NextCursor = encodeIDCursor(page.Effects[limit-1].ID)
	}
	return page, nil
}

// Attempt is one delivery attempt of an effect.
type Attempt struct {
	// Series counts the sends of the effect: 1 for the first, and one more after each retry, resend or
	// resolution, whose own row (attempt 0) starts it. Attempt numbers start from 1 in each series.
	Series    int       `json:"series"`
	Attempt   int       `json:"attempt"`
	StartedAt time.Time `json:"started_at"`
	Gateway   string    `json:"gateway"`
	// Destination is where the attempt went (scheme, host and port, as destination ls names it); null on a
	// row that records a change, and on attempts logged before migration 00012.
	Destination *string `json:"destination"`
	LeaseToken  *string `json:"lease_token"`
	// Outcome: delivered, failed, retry, in_doubt, or interrupted (the gateway died or lost its lease first);
	// or, for a row that records a change, retried, resent, "resolved delivered" or "resolved failed".
	Outcome   string   `json:"outcome"`
	Error     *string  `json:"error"`
	LatencyMS *float64 `json:"latency_ms"`
	// By is who made a change (retried, resent, resolved: "operator alice", "tenant acme"); Error holds
	// their reason. Empty on a delivery attempt.
	By string `json:"by,omitempty"`
}

// Change reports whether the row records a change (a retry, resend or resolution), not a delivery attempt.
func (a Attempt) Change() bool { return a.By != "" }

// changeOutcomes are the outcomes of the rows that record a change rather than an attempt.
var changeOutcomes = map[string]bool{"retried": true, "resent": true, "resolved delivered": true,
	"resolved failed": true}

// EffectDetail is everything known of one effect.
type EffectDetail struct {
	Effect
	StableID string          `json:"stable_id"`
	Payload  json.RawMessage `json:"payload"`
	Result   json.RawMessage `json:"result"`
	// AttemptLog is every delivery attempt, oldest first (Effect.Attempts counts the failed ones since the
	// last retry, as the API does).
	AttemptLog []Attempt `json:"attempt_log"`
	// TraceURL links the trace id to Jaeger, when the service knows Jaeger's address.
	TraceURL string `json:"trace_url,omitempty"`
	// Revealed: Payload and Result are as stored (RevealEffect), not redacted to their shape (Effect).
	Revealed bool `json:"revealed"`
	// LeaseOwner and LeaseExpiresAt are the lease of the effect's outbox row, while a gateway holds one:
	// the gateway delivering it (as gateway ls names it) and when another may rescue it. Null otherwise.
	LeaseOwner     *string    `json:"lease_owner"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
}

// resolveTenant finds the tenant of key when none is given: the one tenant holding it.
func (s *Service) resolveTenant(ctx context.Context, tenant, key string) (string, error) {
	if key == "" {
		return "", &InvalidError{Field: "key", Reason: "an effect key is needed"}
	}
	if err := checkTexts("key", key, "tenant", tenant); err != nil {
		return "", err
	}
	if tenant != "" {
		return tenant, nil
	}
	rows, err := s.db.Query(ctx, effectTenantsSQL, key)
	if err != nil {
		return "", dbError("find the effect's tenant", err)
	}
	tenants, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", dbError("find the effect's tenant", err)
	}
	switch len(tenants) {
	case 0:
		return "", &NotFoundError{What: fmt.Sprintf("effect %q", key), Hint: retiredHint}
	case 1:
		return tenants[0], nil
	}
	return "", &InvalidError{Field: "tenant", Reason: fmt.Sprintf("the key %q is used by several tenants; name one", key)}
}

// Effect returns an effect with its attempts, and its payload and result redacted to their shape (Redact);
// RevealEffect shows them. An empty tenant finds the one tenant that holds key.
func (s *Service) Effect(ctx context.Context, a Actor, tenant, key string) (*EffectDetail, error) {
	if err := s.allow(ctx, a, "effect.show", RoleViewer, key); err != nil {
		return nil, err
	}
	d, err := s.effect(ctx, tenant, key)
	if err != nil {
		return nil, err
	}
	d.Payload, d.Result = Redact(d.Payload), Redact(d.Result)
	return d, nil
}

// RevealEffect is Effect with the payload and the result as stored, for an operator; the reveal is audited
// (effect.reveal), as reading an address or a message is itself something an auditor asks about.
func (s *Service) RevealEffect(ctx context.Context, a Actor, tenant, key string) (*EffectDetail, error) {
	target := key
	if tenant != "" {
		target = tenant + "/" + key
	}
	if err := s.allow(ctx, a, "effect.reveal", RoleOperator, target); err != nil {
		return nil, err
	}
	d, err := s.effect(ctx, tenant, key)
	if err != nil {
		return nil, err
	}
	if _, err := s.audit(ctx, s.db, a, Audit{Action: "effect.reveal", Target: d.Tenant + "/" + d.Key, Count: 1}); err != nil {
		return nil, err
	}
	d.Revealed = true
	return d, nil
}

// effect reads an effect whole, its payload and result as stored.
func (s *Service) effect(ctx context.Context, tenant, key string) (*EffectDetail, error) {
	if err := s.needDB(); err != nil {
		return nil, err
	}
	tenant, err := s.resolveTenant(ctx, tenant, key)
	if err != nil {
		return nil, err
	}
	var d EffectDetail
	var stable, payload, result *string
	e, err := scanEffect(s.db.QueryRow(ctx, effectGetSQL, tenant, key), &stable, &payload, &result,
		&d.LeaseOwner, &d.LeaseExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &NotFoundError{What: fmt.Sprintf("effect %q of tenant %q", key, tenant), Hint: retiredHint}
	}
	if err != nil {
		return nil, dbError("read the effect", err)
	}
	d.Effect = *e
	if stable != nil {
		d.StableID = *stable
	}
	if payload != nil {
		d.Payload = json.RawMessage(*payload)
	}
	if result != nil {
		d.Result = json.RawMessage(*result)
	}
	rows, err := s.db.Query(ctx, attemptsListSQL, e.ID)
	if err != nil {
		return nil, dbError("read the attempts", err)
	}
	d.AttemptLog, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var at Attempt
		err := r.Scan(&at.Attempt, &at.StartedAt, &at.Gateway, &at.Destination, &at.LeaseToken, &at.Outcome, &at.Error,
			&at.LatencyMS)
		return at, err
	})
	if err != nil {
		return nil, dbError("read the attempts", err)
	}
	if d.AttemptLog == nil {
		d.AttemptLog = []Attempt{}
	}
	series := 1
	for i := range d.AttemptLog {
		if at := &d.AttemptLog[i]; at.Attempt == 0 && changeOutcomes[at.Outcome] {
			at.By, at.Gateway = at.Gateway, ""
			series++
		}
		d.AttemptLog[i].Series = series
	}
	if s.cfg.JaegerURL != "" && e.TraceID != nil {
		d.TraceURL = strings.TrimSuffix(s.cfg.JaegerURL, "/") + "/trace/" + *e.TraceID
	}
	return &d, nil
}

// RetryEffect sends a failed, dead or unknown effect back to pending, audited with reason.
func (s *Service) RetryEffect(ctx context.Context, a Actor, tenant, key, reason string) (*Effect, error) {
	return s.resend(ctx, a, "effect.retry", tenant, key, reason, nil, effect.RetryableStatuses())
}

// ResolveEffect resolves an `unknown` effect: as delivered or failed (terminal, nothing sent), or resend (back
// to pending, delivered again). The resolution stays on the effect, and the audit log has it.
func (s *Service) ResolveEffect(ctx context.Context, a Actor, tenant, key, as, reason string) (*Effect, error) {
	switch as {
	case ResolveResend:
		res := ResolveResend
		return s.resend(ctx, a, "effect.resolve", tenant, key, reason, &res, []effect.Status{effect.StatusUnknown})
	case ResolveDelivered, ResolveFailed:
	default:
		return nil, &InvalidError{Field: "as", Reason: fmt.Sprintf("%q: want delivered, failed or resend", as)}
	}
	if err := s.prepareChange(ctx, a, "effect.resolve", key, reason); err != nil {
		return nil, err
	}
	tenant, err := s.resolveTenant(ctx, tenant, key)
	if err != nil {
		return nil, err
	}
	var out *Effect
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		e, err := dedup.NewStore(tx).Resolve(ctx, tenant, key, effect.Status(as), a.Name, reason)
		if err != nil {
			return changeError("resolve", key, tenant, err)
		}
		if out, err = s.effectByID(ctx, tx, e.ID); err != nil {
			return err
		}
		_, err = s.audit(ctx, tx, a, Audit{Action: "effect.resolve", Target: tenant + "/" + key, Count: 1,
			Filter: mustJSON(map[string]string{"as": as}), Reason: reason})
		return err
	})
	return out, err
}

// prepareChange runs the checks every change needs: role, reason, database.
func (s *Service) prepareChange(ctx context.Context, a Actor, action, target, reason string) error {
	return s.prepareAudited(ctx, a, Audit{Action: action, Target: target, Reason: reason})
}

// prepareAudited is prepareChange for a change whose refusal is audited with its filter too.
func (s *Service) prepareAudited(ctx context.Context, a Actor, e Audit) error {
	reason := e.Reason
	if err := s.allowAudited(ctx, a, RoleOperator, e); err != nil {
		return err
	}
	if err := requireReason(reason); err != nil {
		return err
	}
	return s.needDB()
}

func (s *Service) resend(ctx context.Context, a Actor, action, tenant, key, reason string, resolution *string,
	from []effect.Status) (*Effect, error) {
	// A refusal is audited with the target as asked: the tenant too when one was given, so that a key two
	// tenants use says whose was tried.
	target := key
	if tenant != "" {
		target = tenant + "/" + key
	}
	if err := s.prepareChange(ctx, a, action, target, reason); err != nil {
		return nil, err
	}
	tenant, err := s.resolveTenant(ctx, tenant, key)
	if err != nil {
		return nil, err
	}
	var out *Effect
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var res *dedup.Resolution
		if resolution != nil {
			res = &dedup.Resolution{As: *resolution, By: a.Name, Reason: reason}
		}
		e, err := dedup.NewStore(tx).SendBack(ctx, tenant, key, from, dedup.Operator(a.Name, reason), res)
		if err != nil {
			return changeError(strings.TrimPrefix(action, "effect."), key, tenant, err)
		}
		if out, err = s.effectByID(ctx, tx, e.ID); err != nil {
			return err
		}
		var filter json.RawMessage
		if resolution != nil {
			filter = mustJSON(map[string]string{"as": *resolution})
		}
		_, err = s.audit(ctx, tx, a, Audit{Action: action, Target: tenant + "/" + key, Count: 1, Filter: filter,
			Reason: reason})
		return err
	})
	return out, err
}

// effectByID reads an effect as an operator sees it, inside the change's transaction.
func (s *Service) effectByID(ctx context.Context, tx pgx.Tx, id int64) (*Effect, error) {
	e, err := scanEffect(tx.QueryRow(ctx, effectByIDSQL, id))
	if err != nil {
		return nil, dbError("read the effect", err)
	}
	return e, nil
}

// retiredHint tells a key that never was from one retired: an operator chasing a complaint about an old
// effect otherwise cannot tell a typo from retention (an outside tester's finding).
const retiredHint = "or retired: an effect and its key are kept retention.keys after the effect finished, then dropped"

// changeError explains a change the store refused: the effect is missing, or in a state the change refuses.
func changeError(verb, key, tenant string, err error) error {
	var wrong *dedup.WrongStatusError
	switch {
	case errors.Is(err, dedup.ErrNotFound):
		return &NotFoundError{What: fmt.Sprintf("effect %q of tenant %q", key, tenant), Hint: retiredHint}
	case errors.Is(err, dedup.ErrBodyExpired):
		return &StateError{Msg: fmt.Sprintf("cannot %s effect %q: its payload expired (retention.payloads), so "+
			"there is nothing to send again", verb, key)}
	case errors.As(err, &wrong):
		return &StateError{Msg: fmt.Sprintf("cannot %s effect %q: it is %s, and only %s can be", verb, key,
			wrong.Status, joinStatuses(wrong.Allowed))}
	}
	return dbError(verb+" the effect", err)
}

// CountEffects counts the effects that match f: the dry run of a bulk action. It is one COUNT, asked for on
// purpose, never part of a listing.
func (s *Service) CountEffects(ctx context.Context, a Actor, f EffectFilter) (int64, error) {
	return s.countEffects(ctx, a, f, false)
}

// countEffects is CountEffects; sendable counts only effects whose payload is still there to send.
func (s *Service) countEffects(ctx context.Context, a Actor, f EffectFilter, sendable bool) (int64, error) {
	if err := s.allow(ctx, a, "effect.count", RoleViewer, ""); err != nil {
		return 0, err
	}
	if err := s.needDB(); err != nil {
		return 0, err
	}
	if err := f.check(); err != nil {
		return 0, err
	}
	from, err := s.sinceID(ctx, f.Since)
	if err != nil {
		return 0, err
	}
	var n int64
	err = s.db.QueryRow(ctx, effectsCountSQL, nullString(f.Tenant), nullString(f.Type), f.status(),
		f.likePattern(), nullTime(f.Since), nullString(f.JobID), f.searchTerm(), f.searchKey(), from, sendable).Scan(&n)
	if err != nil {
		return 0, dbError("count effects", err)
	}
	return n, nil
}

// CountRetryable counts the effects matching f that a retry applies to (failed, dead, unknown, and with their
// payload still there: not one whose body expired under retention.payloads): the dry run of RetryEffects.
func (s *Service) CountRetryable(ctx context.Context, a Actor, f EffectFilter) (int64, error) {
	if err := checkBulkFilter(f); err != nil {
		return 0, err
	}
	if f.Status != "" {
		return s.countEffects(ctx, a, f, true)
	}
	var total int64
	for _, st := range effect.RetryableStatuses() {
		f.Status = st
		n, err := s.countEffects(ctx, a, f, true)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// CheckRetryEffects runs every check of RetryEffects (role, reason, filter) and changes nothing, for a face
// that starts the retry after it has answered (the console's progress page): a refusal then reaches the
// operator at once. A role's refusal is audited as RetryEffects would audit it.
func (s *Service) CheckRetryEffects(ctx context.Context, a Actor, f EffectFilter, reason string) error {
	if err := s.prepareAudited(ctx, a, Audit{Action: "effect.retry-matching", Filter: f.json(), Reason: reason}); err != nil {
		return err
	}
	return checkBulkFilter(f)
}

// checkBulkFilter refuses the filters a bulk retry does not take: bad ones, none at all (a slip that would
// resend every failed, dead and unknown effect of every tenant, at_most_once ones included), and a status a
// retry does not apply to.
func checkBulkFilter(f EffectFilter) error {
	if err := f.check(); err != nil {
		return err
	}
	if f.empty() {
		return &InvalidError{Field: "filter", Reason: "a bulk retry needs at least one filter (status, type, " +
			"tenant, key prefix, since or job): retrying every failed, dead and unknown effect of every tenant " +
			"at once is not something to do by omission"}
	}
	if f.Status != "" && !f.Status.Retryable() {
		return &StateError{Msg: fmt.Sprintf("effects that are %s cannot be retried; only %s can be",
			f.Status, joinStatuses(effect.RetryableStatuses()))}
	}
	return nil
}

// BulkResult is what a bulk action did.
type BulkResult struct {
	// Matched is how many targets the dry-run count found when the action started.
	Matched int64 `json:"matched"`
	// Applied is how many it changed.
	Applied int64 `json:"applied"`
	// Batches is how many transactions it took, each audited on its own.
	Batches int `json:"batches"`
}

// BulkError is a bulk action that stopped, or left targets unchanged, after applying to some.
type BulkError struct {
	Result BulkResult
	Err    error // nil when it ran to the end but some targets had changed state or were held meanwhile
}

func (e *BulkError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("applied to %d of %d before an error: %v", e.Result.Applied, e.Result.Matched, e.Err)
	}
	return fmt.Sprintf("applied to %d of %d: the others changed state or were held by another action meanwhile",
		e.Result.Applied, e.Result.Matched)
}
func (e *BulkError) Is(target error) bool { return target == ErrPartial }
func (e *BulkError) Unwrap() error        { return e.Err }

// BulkBatch is how many effects one transaction of a bulk action changes.
const BulkBatch = 500

// BatchTimeout bounds one batch of a bulk action, from its first statement to its commit.
const BatchTimeout = 30 * time.Second

// RetryEffects retries every failed, dead or unknown effect matching f, in batches of BulkBatch, each batch
// one transaction with its own audit entry (so an interrupted bulk action leaves an audit entry for every
// change it made). progress, if set, is called after each batch. An error after some batches, or fewer
// applied than matched at the start, is a *BulkError (ErrPartial).
func (s *Service) RetryEffects(ctx context.Context, a Actor, f EffectFilter, reason string,
	progress func(BulkResult)) (BulkResult, error) {
	var res BulkResult
	if err := s.prepareAudited(ctx, a, Audit{Action: "effect.retry-matching", Filter: f.json(), Reason: reason}); err != nil {
		return res, err
	}
	n, err := s.CountRetryable(ctx, a, f)
	if err != nil {
		return res, err
	}
	res.Matched = n
	var below *int64
	for {
		var ids []int64
		// A bulk action may run for minutes over a million effects, so the caller need not bound it; each
		// batch is bounded instead, so that one that stops answering ends the action with an error.
		bctx, cancel := context.WithTimeout(ctx, BatchTimeout)
		err := pgx.BeginFunc(bctx, s.db, func(tx pgx.Tx) error {
			ctx := bctx
			var err error
			ids, err = dedup.NewStore(tx).SendBackMatching(ctx, f.match(), effect.RetryableStatuses(), below, BulkBatch,
				dedup.Operator(a.Name, reason))
			if err != nil || len(ids) == 0 {
				return err
			}
			_, err = s.audit(ctx, tx, a, Audit{Action: "effect.retry-matching", Count: int64(len(ids)),
				Filter: f.json(), Reason: reason})
			return err
		})
		cancel()
		if err != nil {
			if res.Applied > 0 {
				return res, &BulkError{Result: res, Err: dbError("retry effects", err)}
			}
			return res, dbError("retry effects", err)
		}
		if len(ids) == 0 {
			break
		}
		res.Applied += int64(len(ids))
		res.Batches++
		low := ids[0]
		for _, id := range ids {
			low = min(low, id)
		}
		below = &low
		if progress != nil {
			progress(res)
		}
	}
	if res.Applied < res.Matched {
		return res, &BulkError{Result: res}
	}
	return res, nil
}

func statusStrings(ss []effect.Status) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

func joinStatuses(ss []effect.Status) string {
	return strings.Join(statusStrings(ss), ", ")
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}
