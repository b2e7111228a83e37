package admin

// The operations the web console needs beyond the CLI's: operator tokens and console sessions (stored as
// SHA-256 hashes only), the search by trace id, the home page's overview, and the audited reveal of a payload.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	tokenCreateSQL        = query("token_create")
	tokenLoginSQL         = query("token_login")
	tokenAuthSQL          = query("token_auth")
	tokenRevokeSQL        = query("token_revoke")
	tokensListSQL         = query("tokens_list")
	sessionGetSQL         = query("session_get")
	sessionEndSQL         = query("session_end")
	effectsByTraceSQL     = query("effects_by_trace")
	overviewTypesSQL      = query("overview_types")
	overviewWindowSQL     = query("overview_window_start")
	overviewCreatedSQL    = query("overview_created")
	overviewFinishedSQL   = query("overview_finished")
	overviewBacklogSQL    = query("overview_backlog")
	overviewNeedsHumanSQL = query("overview_needs_human")
)

// TokenPrefix starts every operator token, so that a leaked one is recognisable (secret scanners, logs).
const TokenPrefix = "ogop_"

// ErrUnauthenticated: no such live token or session.
var ErrUnauthenticated = errors.New("unauthenticated")

func secret(prefix string) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

func hash(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// Token is an operator token as listed (never its secret).
type Token struct {
	ID        int64      `json:"id"`
	Name      string     `json:"name"`
	Role      Role       `json:"role"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	LastUsed  *time.Time `json:"last_used"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// CreateToken makes an operator token named name (the operator's name in the audit log) with role, and
// returns its secret: shown once, stored only as its SHA-256. Needs the admin role; audited.
func (s *Service) CreateToken(ctx context.Context, a Actor, name string, role Role) (string, error) {
	if err := s.allow(ctx, a, "token.create", RoleAdmin, name); err != nil {
		return "", err
	}
	if err := s.needDB(); err != nil {
		return "", err
	}
	if strings.TrimSpace(name) == "" {
		return "", &InvalidError{Field: "name", Reason: "a token needs the name of the operator who holds it"}
	}
	if err := checkText("NAME", name); err != nil {
		return "", err
	}
	if !role.Valid() {
		return "", &InvalidError{Field: "role", Reason: fmt.Sprintf("%q is not a role: want viewer, operator or admin", role)}
	}
	tok := secret(TokenPrefix)
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var id int64
		var at time.Time
		if err := tx.QueryRow(ctx, tokenCreateSQL, name, string(role), hash(tok), a.Name).Scan(&id, &at); err != nil {
			return dbError("create the token", err)
		}
		_, err := s.audit(ctx, tx, a, Audit{Action: "token.create", Target: name, Count: 1,
			Filter: mustJSON(map[string]any{"role": role, "token_id": id})})
		return err
	})
	if err != nil {
		return "", err
	}
	return tok, nil
}

// RevokeToken revokes every live token named name, and their sessions. Needs the admin role; audited.
func (s *Service) RevokeToken(ctx context.Context, a Actor, name, reason string) (int64, error) {
	return s.revokeToken(ctx, a, name, nil, reason)
}

// RevokeTokenID revokes the live token named name whose id is id (Token.ID), and its sessions: a rotation,
// which leaves the holder's other tokens alive. A NotFoundError when name has no live token of that id.
// Needs the admin role; audited.
func (s *Service) RevokeTokenID(ctx context.Context, a Actor, name string, id int64, reason string) error {
	_, err := s.revokeToken(ctx, a, name, &id, reason)
	return err
}

func (s *Service) revokeToken(ctx context.Context, a Actor, name string, id *int64, reason string) (int64, error) {
	if err := s.allow(ctx, a, "token.revoke", RoleAdmin, name); err != nil {
		return 0, err
	}
	if err := requireReason(reason); err != nil {
		return 0, err
	}
	if err := checkText("NAME", name); err != nil {
		return 0, err
	}
	if err := s.needDB(); err != nil {
		return 0, err
	}
	var n int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, tokenRevokeSQL, name, id).Scan(&n); err != nil {
			return dbError("revoke the token", err)
		}
		if n == 0 && id != nil {
			return &NotFoundError{What: fmt.Sprintf("live token %d named %q", *id, name)}
		}
		if n == 0 {
			return &NotFoundError{What: fmt.Sprintf("live token named %q", name)}
		}
		var filter json.RawMessage
		if id != nil {
			filter = mustJSON(map[string]any{"token_id": *id})
		}
		_, err := s.audit(ctx, tx, a, Audit{Action: "token.revoke", Target: name, Count: n, Reason: reason,
			Filter: filter})
		return err
	})
	return n, err
}

// Tokens lists the operator tokens (names, roles, use; never secrets). Needs the admin role.
func (s *Service) Tokens(ctx context.Context, a Actor) ([]Token, error) {
	if err := s.allow(ctx, a, "token.list", RoleAdmin, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, tokensListSQL)
	if err != nil {
		return nil, dbError("list tokens", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Token, error) {
		var t Token
		var role string
		err := r.Scan(&t.ID, &t.Name, &role, &t.CreatedBy, &t.CreatedAt, &t.LastUsed, &t.RevokedAt)
		t.Role = Role(role)
		return t, err
	})
	if err != nil {
		return nil, dbError("list tokens", err)
	}
	if out == nil {
		out = []Token{}
	}
	return out, nil
}

// Login trades a live operator token for a console session that lasts ttl: the session's secret (for a
// cookie) and who it is. An unknown or revoked token is ErrUnauthenticated. The attempt is audited either way
// (a failed one under the name "unknown"), so that guessing shows in the log.
func (s *Service) Login(ctx context.Context, token string, ttl time.Duration) (string, Actor, error) {
	if err := s.needDB(); err != nil {
		return "", Actor{}, err
	}
	sess := secret("")
	var a Actor
	var role string
	err := s.db.QueryRow(ctx, tokenLoginSQL, hash(strings.TrimSpace(token)), hash(sess), ttl.Seconds()).Scan(&a.Name, &role)
	if errors.Is(err, pgx.ErrNoRows) {
		_, _ = s.audit(ctx, s.db, Actor{Name: "unknown", Role: RoleViewer}, Audit{Action: "console.login",
			Outcome: "denied: no such live token"})
		return "", Actor{}, ErrUnauthenticated
	}
	if err != nil {
		return "", Actor{}, dbError("log in", err)
	}
	a.Role = Role(role)
	if _, err := s.audit(ctx, s.db, a, Audit{Action: "console.login", Count: 1}); err != nil {
		return "", Actor{}, err
	}
	return sess, a, nil
}

// Session returns who holds a live console session; ErrUnauthenticated when it expired, ended, or its token
// was revoked.
func (s *Service) Session(ctx context.Context, session string) (Actor, error) {
	return s.actorBy(ctx, sessionGetSQL, session)
}

// TokenActor returns who holds a live operator token, for API calls that send it as a bearer token. A token
// that is no live one is audited as a failed login, as on the login page, so that guessing through the API
// shows in the log too (the console throttles an address's failures, which bounds the entries).
func (s *Service) TokenActor(ctx context.Context, token string) (Actor, error) {
	a, err := s.actorBy(ctx, tokenAuthSQL, token)
	if errors.Is(err, ErrUnauthenticated) {
		_, _ = s.audit(ctx, s.db, Actor{Name: "unknown", Role: RoleViewer}, Audit{Action: "console.login",
			Target: "api", Outcome: "denied: no such live token"})
	}
	return a, err
}

func (s *Service) actorBy(ctx context.Context, sql, secret string) (Actor, error) {
	if err := s.needDB(); err != nil {
		return Actor{}, err
	}
	if secret == "" {
		return Actor{}, ErrUnauthenticated
	}
	var a Actor
	var role string
	err := s.db.QueryRow(ctx, sql, hash(secret)).Scan(&a.Name, &role)
	if errors.Is(err, pgx.ErrNoRows) {
		return Actor{}, ErrUnauthenticated
	}
	if err != nil {
		return Actor{}, dbError("check the session", err)
	}
	a.Role = Role(role)
	return a, nil
}

// Logout ends a console session (and clears expired ones).
func (s *Service) Logout(ctx context.Context, session string) error {
	if err := s.needDB(); err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, sessionEndSQL, hash(session)); err != nil {
		return dbError("log out", err)
	}
	return nil
}

// EffectsByTrace lists the effects created by requests of one trace, newest first, at most limit.
func (s *Service) EffectsByTrace(ctx context.Context, a Actor, traceID string, limit int) ([]*Effect, error) {
	if err := s.allow(ctx, a, "effect.list", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	if err := checkText("trace_id", traceID); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, effectsByTraceSQL, traceID, limit)
	if err != nil {
		return nil, dbError("find the trace's effects", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Effect, error) { return scanEffect(r) })
	if err != nil {
		return nil, dbError("find the trace's effects", err)
	}
	return out, nil
}

// Minutes is how many one-minute buckets the overview's charts hold: the last hour.
const Minutes = 60

// NeedsHumanCap bounds the overview's counts of dead and unknown effects.
const NeedsHumanCap = 10_000

// TypeOverview is one effect type over the last hour: per-minute counts (index 0 is the oldest minute), what
// waits, and whether an operator paused it.
type TypeOverview struct {
	Type      string       `json:"type"`
	Created   [Minutes]int `json:"created"`
	Delivered [Minutes]int `json:"delivered"`
	Failed    [Minutes]int `json:"failed"` // failed, dead or unknown
	Backlog   int64        `json:"backlog"`
	// OldestDueSeconds is how long the oldest due outbox row of the type has waited.
	OldestDueSeconds float64 `json:"oldest_due_seconds"`
	Paused           bool    `json:"paused"`
}

// Overview is what the console's home page shows of the effects.
type Overview struct {
	Since time.Time      `json:"since"`
	Types []TypeOverview `json:"types"`
	// DeadEffects and UnknownEffects are counted up to NeedsHumanCap.
	DeadEffects    int64 `json:"dead_effects"`
	UnknownEffects int64 `json:"unknown_effects"`
}

// EffectsOverview reads the last hour of every effect type, the backlog and what needs a human. Each part is
// bounded by the last hour's traffic, the outbox or a capped count: never a scan of the effects table.
func (s *Service) EffectsOverview(ctx context.Context, a Actor) (*Overview, error) {
	if err := s.allow(ctx, a, "effect.overview", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	var now time.Time
	if err := s.db.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return nil, dbError("read the clock", err)
	}
	since := now.Truncate(time.Minute).Add(-(Minutes - 1) * time.Minute)
	o := &Overview{Since: since}
	byType := map[string]*TypeOverview{}
	get := func(t string) *TypeOverview {
		if v, ok := byType[t]; ok {
			return v
		}
		v := &TypeOverview{Type: t}
		byType[t] = v
		return v
	}
	rows, err := s.db.Query(ctx, overviewTypesSQL)
	if err != nil {
		return nil, dbError("list effect types", err)
	}
	types, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, dbError("list effect types", err)
	}
	for _, t := range types {
		get(t)
	}
	var typ, status string
	var minute int
	var n int64
	var from int64
	if err := s.db.QueryRow(ctx, overviewWindowSQL, since).Scan(&from); err != nil {
		return nil, dbError("find the last hour's effects", err)
	}
	rows, _ = s.db.Query(ctx, overviewCreatedSQL, since, from)
	if _, err := pgx.ForEachRow(rows, []any{&typ, &minute, &n}, func() error {
		if minute >= 0 && minute < Minutes {
			get(typ).Created[minute] += int(n)
		}
		return nil
	}); err != nil {
		return nil, dbError("count effects created", err)
	}
	rows, _ = s.db.Query(ctx, overviewFinishedSQL, since)
	if _, err := pgx.ForEachRow(rows, []any{&typ, &status, &minute, &n}, func() error {
		if minute < 0 || minute >= Minutes {
			return nil
		}
		if status == "delivered" {
			get(typ).Delivered[minute] += int(n)
		} else {
			get(typ).Failed[minute] += int(n)
		}
		return nil
	}); err != nil {
		return nil, dbError("count effects finished", err)
	}
	var oldest *time.Time
	var dbNow time.Time
	rows, _ = s.db.Query(ctx, overviewBacklogSQL)
	if _, err := pgx.ForEachRow(rows, []any{&typ, &n, &oldest, &dbNow}, func() error {
		t := get(typ)
		t.Backlog = n
		if oldest != nil {
			t.OldestDueSeconds = dbNow.Sub(*oldest).Seconds()
		}
		return nil
	}); err != nil {
		return nil, dbError("read the backlog", err)
	}
	paused, err := s.PausedTypes(ctx, a)
	if err != nil {
		return nil, err
	}
	for _, p := range paused {
		get(p.Type).Paused = true
	}
	if err := s.db.QueryRow(ctx, overviewNeedsHumanSQL, NeedsHumanCap).Scan(&o.DeadEffects, &o.UnknownEffects); err != nil {
		return nil, dbError("count what needs a human", err)
	}
	for _, t := range byType {
		o.Types = append(o.Types, *t)
	}
	slices.SortFunc(o.Types, func(x, y TypeOverview) int { return strings.Compare(x.Type, y.Type) })
	return o, nil
}
