package dedup

// The writes an operator makes (oncegate's CLI and console, through package admin) and the tenant's retry,
// as typed Store methods: this package is the one writer of the effect, outbox and paused-type tables, so a
// retry means one thing whoever asks for it, and every write keeps the rules the dispatchers rely on (an
// outbox row exists exactly while an effect has something to deliver; a lease is only ever cleared with its
// row handed back). admin calls these inside its own transaction (Store.WithTx), with its audit entry.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/notifier"
)

var (
	sendBackSQL         = query("send_back")
	sendBackMatchingSQL = query("send_back_matching")
	resolveSQL          = query("resolve")
	pauseTypeSQL        = query("pause_type")
	resumeTypeSQL       = query("resume_type")
)

// WrongStatusError: the effect is in Status, and the change takes only effects in one of Allowed.
type WrongStatusError struct {
	Status  effect.Status
	Allowed []effect.Status
}

func (e *WrongStatusError) Error() string {
	return fmt.Sprintf("dedup: the effect is %s, and only %s can be", e.Status, joinStatuses(e.Allowed))
}

func joinStatuses(ss []effect.Status) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = string(s)
	}
	if len(parts) == 1 {
		return parts[0] + " effects"
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " or " + parts[len(parts)-1] + " effects"
}

// Resolution is an operator's decision on an `unknown` effect, kept on it with who made it and why.
type Resolution struct {
	As, By, Reason string
}

// Sender is who sends an effect back, or resolves it, and why, as its attempt log shows them: the row it
// writes there starts a new series of attempts, so the history before it stays readable.
type Sender struct {
	// By names them: "operator alice", "tenant acme".
	By     string
	Reason string
}

// Operator is the Sender of an operator's change.
func Operator(name, reason string) Sender { return Sender{By: "operator " + name, Reason: reason} }

// SendBack sends the effect under (tenant, key), if it is in one of from, back to pending with a fresh count
// of attempts and a due outbox row, and wakes the dispatchers. It is the one statement behind a tenant's retry,
// an operator's retry (res nil: an earlier resolution is cleared) and an operator's "resend" resolution (res
// kept on the effect). ErrNotFound, or a *WrongStatusError naming the status it is in.
func (s *Store) SendBack(ctx context.Context, tenant, key string, from []effect.Status, who Sender,
	res *Resolution) (*Effect, error) {
	var as, by *string
	reason := who.Reason
	if res != nil {
		as, by, reason = &res.As, &res.By, res.Reason
	}
	e, err := scan(s.db.QueryRow(ctx, sendBackSQL, tenant, key, statusStrings(from), as, by, reason,
		notifier.TopicOutbox, effect.StatusPending, who.By))
	if err == nil {
		return e, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, translate("send effect back", err)
	}
	return nil, s.whyNot(ctx, tenant, key, from)
}

// Resolve makes an `unknown` effect terminal as delivered or failed, with the operator's resolution kept on
// it, and wakes the requests waiting for it. ErrNotFound, or a *WrongStatusError.
func (s *Store) Resolve(ctx context.Context, tenant, key string, as effect.Status, by, reason string) (*Effect, error) {
	if as != effect.StatusDelivered && as != effect.StatusFailed {
		return nil, fmt.Errorf("dedup: resolve as %q: want delivered or failed", as)
	}
	e, err := scan(s.db.QueryRow(ctx, resolveSQL, tenant, key, as, by, reason, notifier.TopicEffectDone,
		effect.StatusUnknown, Operator(by, reason).By))
	if err == nil {
		return e, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, translate("resolve effect", err)
	}
	return nil, s.whyNot(ctx, tenant, key, []effect.Status{effect.StatusUnknown})
}

// whyNot explains a change that matched no row: the effect is missing, or in another status.
func (s *Store) whyNot(ctx context.Context, tenant, key string, allowed []effect.Status) error {
	cur, err := s.Get(ctx, tenant, key)
	if err != nil {
		return err
	}
	if cur.BodyExpired && slices.Contains(allowed, cur.Status) {
		return ErrBodyExpired
	}
	return &WrongStatusError{Status: cur.Status, Allowed: allowed}
}

// Match selects effects for a bulk change; an empty field matches any.
type Match struct {
	Tenant, Type string
	Status       effect.Status
	KeyPrefix    string
	Since        time.Time // created at or after
	JobID        string
	// Search is what an operator searches for: the effect's key (exactly), or one of its tags or recipients
	// (in any case: effect.SearchTerm).
	Search string
}

// SendBackMatching is SendBack (an operator's retry) for at most limit effects that match m and are in one of
// from, with ids below below (nil: any), newest first; rows another transaction holds are skipped. It returns
// the ids sent back, lowest last, and wakes the dispatchers of their types.
func (s *Store) SendBackMatching(ctx context.Context, m Match, from []effect.Status, below *int64, limit int,
	who Sender) ([]int64, error) {
	var like *string
	if m.KeyPrefix != "" {
		p := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(m.KeyPrefix) + "%"
		like = &p
	}
	var since *time.Time
	if !m.Since.IsZero() {
		since = &m.Since
	}
	rows, err := s.db.Query(ctx, sendBackMatchingSQL, orNil(m.Tenant), orNil(m.Type), orNil(string(m.Status)), like,
		since, orNil(m.JobID), below, limit, statusStrings(from), effect.StatusPending,
		orNil(effect.SearchTerm(m.Search)), orNil(strings.TrimSpace(m.Search)), who.By, who.Reason)
	if err != nil {
		return nil, translate("send effects back", err)
	}
	var ids []int64
	types := map[string]bool{}
	for rows.Next() {
		var id int64
		var typ string
		if err := rows.Scan(&id, &typ); err != nil {
			rows.Close()
			return nil, translate("send effects back", err)
		}
		ids = append(ids, id)
		types[typ] = true
	}
	if err := rows.Err(); err != nil {
		return nil, translate("send effects back", err)
	}
	for typ := range types {
		if _, err := s.db.Exec(ctx, "SELECT pg_notify($1, $2)", string(notifier.TopicOutbox), typ); err != nil {
			return nil, translate("wake the dispatchers", err)
		}
	}
	return ids, nil
}

func orNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// PauseType stops every gateway's dispatcher from claiming rows of typ (claim.sql): they wait, uncharged,
// until ResumeType. It reports false when typ was paused already (the first pause is kept).
func (s *Store) PauseType(ctx context.Context, typ, by, reason string) (bool, error) {
	var ok bool
	err := s.db.QueryRow(ctx, pauseTypeSQL, typ, by, reason).Scan(&ok)
	return ok, translate("pause type", err)
}

// ResumeType lets the dispatchers claim typ's rows again and wakes them. It reports false when typ was not
// paused.
func (s *Store) ResumeType(ctx context.Context, typ string) (bool, error) {
	var ok bool
	err := s.db.QueryRow(ctx, resumeTypeSQL, typ, string(notifier.TopicOutbox)).Scan(&ok)
	return ok, translate("resume type", err)
}

var resumeDestinationSQL = query("resume_destination")

// LiftedPause is a destination's pause that ResumeDestination lifted.
type LiftedPause struct {
	Until    time.Time // when it was to end
	Status   int       // the answer that set it, 429 or 503
	PausedBy string    // the gateway that got that answer
	Due      int64     // the destination's rows waiting for a retry, due now
}

// ResumeDestination lifts the pause of destination dest of typ (resume_destination.sql): its rows waiting for
// a retry are due now, and the dispatchers are woken. It reports false when dest was not paused.
func (s *Store) ResumeDestination(ctx context.Context, typ, dest string) (LiftedPause, bool, error) {
	var l LiftedPause
	err := s.db.QueryRow(ctx, resumeDestinationSQL, typ, dest, string(notifier.TopicOutbox)).
		Scan(&l.Until, &l.Status, &l.PausedBy, &l.Due)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, nil
	}
	if err != nil {
		return l, false, translate("resume destination", err)
	}
	return l, true, nil
}

var barrierSQL = query("barrier")

// BarrierSlots is how many barriers one gateway may run at once (the rows of its own it rewrites).
const BarrierSlots = 8

// Barrier returns once everything committed before it is as durable as a commit now is: under synchronous
// replication, on a synchronous standby (the barrier's own commit waits for the WAL up to it). A replay calls
// it before acknowledging an effect that an earlier request may have committed only locally (a commit whose
// wait for the standby was cut short by a timeout or a disconnect is kept on the primary, unreplicated).
func (s *Store) Barrier(ctx context.Context, gateway string, slot int) error {
	if _, err := s.db.Exec(ctx, barrierSQL, gateway, slot%BarrierSlots); err != nil {
		return translate("wait for the standby", err)
	}
	return nil
}
