// Package admin holds every operator operation once, over the gateway's Postgres and the queues' Redis:
// effects (list, show, retry, resolve, bulk retry), paused effect types, queues (list, pause, jobs, dead
// letters, workers), gateways and their breakers, and the audit log. The `oncegate` CLI is one face of it and
// the web console another; neither does anything this package does not.
//
// The guarantee it keeps: every action that changes something is checked against the actor's role and
// written to the append-only audit log (who, what, on how many, with which filter, why, how it ended); a
// change to the database commits in the same transaction as its audit row, so there is never one without the
// other. Reads are bounded: every listing is a keyset (or, in Redis, a range) page, never a COUNT or a scan.
//
// admin owns roles, the audit log and the operator's read models; it writes no effect, outbox or paused-type
// row itself. Those changes are dedup.Store methods, run inside admin's audit transaction (the way riverui
// calls River's JobRetryTx), so a tenant's retry and an operator's are one statement.
//
// The API is plain Go types with stable JSON field names (docs/cli.md lists them), filters as structs and
// pages with opaque cursors, so that a web console serves the same values as JSON.
package admin

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/dedup"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

func query(name string) string {
	b, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(err)
	}
	cols, _ := sqlFiles.ReadFile("sql/effect_columns.sql")
	// An effect's status as the API reports it: delivering is read from its outbox row's lease.
	return dedup.ExpandStatus(strings.ReplaceAll(string(b), "{{columns}}", strings.TrimSpace(string(cols))))
}

var (
	effectsListSQL      = query("effects_list")
	effectsCountSQL     = query("effects_count")
	effectsSinceSQL     = query("effects_since")
	effectGetSQL        = query("effect_get")
	effectTenantsSQL    = query("effect_tenants")
	attemptsListSQL     = query("attempts_list")
	effectByIDSQL       = query("effect_by_id")
	auditInsertSQL      = query("audit_insert")
	auditListSQL        = query("audit_list")
	typesPausedSQL      = query("types_paused")
	typesListSQL        = query("types_list")
	destinationRatesSQL = query("destination_rates")
	tenantRatesSQL      = query("tenant_rates")
	typeKnownSQL        = query("type_known")
	gatewaysListSQL     = query("gateways_list")
	jobEffectsSQL       = query("job_effects")
)

// Role is what an operator may do. Each role may do what the ones before it may.
type Role string

const (
	// RoleViewer reads everything: effects, queues, jobs, fleet, audit.
	RoleViewer Role = "viewer"
	// RoleOperator also retries, resolves and requeues, and pauses and resumes queues and effect types.
	RoleOperator Role = "operator"
	// RoleAdmin also destroys: purges dead jobs.
	RoleAdmin Role = "admin"
)

// Roles lists the roles, least first.
func Roles() []Role { return []Role{RoleViewer, RoleOperator, RoleAdmin} }

func (r Role) rank() int {
	for i, v := range Roles() {
		if r == v {
			return i + 1
		}
	}
	return 0
}

// Valid reports whether r is one of Roles.
func (r Role) Valid() bool { return r.rank() > 0 }

// Actor is who asks: an operator's name and role. A tenant's API key is never an actor.
type Actor struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
}

// Config is what a Service runs on. Either store may be nil: the operations that need it then fail with
// ErrUnavailable naming what is missing.
type Config struct {
	// DB is the gateway's database. New sets plan_cache_mode = force_custom_plan on the pools it makes
	// (Connect); a pool made elsewhere should do the same, so that each filter combination gets its index.
	DB *pgxpool.Pool
	// Redis is the queues' Redis.
	Redis redis.UniversalClient
	// QueueRegistry is the Redis key of the set of queue names; defaults to queue.DefaultRegistry.
	QueueRegistry string
	// JaegerURL, when set, makes an effect's trace id a link: JaegerURL + "/trace/" + id.
	JaegerURL string
	// GatewayGoneAfter is how long a gateway may go unseen before it is shown as gone. Defaults to three
	// heartbeats (15 s).
	GatewayGoneAfter time.Duration
	// FoldGoneAfter is how long a gone gateway stays in the fleet's listings before it is folded into a
	// count (FleetFilter.All shows it). Defaults to DefaultFoldGoneAfter.
	FoldGoneAfter time.Duration
}

// DefaultFoldGoneAfter is Config.FoldGoneAfter's default: long enough to read what a crashed gateway last
// reported, short enough that a day of deploys does not bury the live fleet.
const DefaultFoldGoneAfter = time.Hour

// DefaultGatewayGoneAfter is Config.GatewayGoneAfter's default: three gateway heartbeats.
const DefaultGatewayGoneAfter = 15 * time.Second

// Service is the operator's service layer.
type Service struct {
	cfg Config
	db  *pgxpool.Pool
	rdb redis.UniversalClient
}

// New returns a service over cfg's stores.
func New(cfg Config) *Service {
	if cfg.GatewayGoneAfter <= 0 {
		cfg.GatewayGoneAfter = DefaultGatewayGoneAfter
	}
	if cfg.FoldGoneAfter <= 0 {
		cfg.FoldGoneAfter = DefaultFoldGoneAfter
	}
	return &Service{cfg: cfg, db: cfg.DB, rdb: cfg.Redis}
}

// The bounds of an operator's call on the database, unless DATABASE_URL sets its own (connect_timeout, or
// options=-c statement_timeout=…): an operator paged during an incident must get an answer or an error,
// never a prompt that hangs on a database that stopped answering or a table someone locked.
const (
	// ConnectTimeout bounds opening a connection, the server's greeting and authentication included.
	ConnectTimeout = 5 * time.Second
	// StatementTimeout bounds every statement on the server (the slowest listing measured takes milliseconds;
	// a bulk batch of BulkBatch rows well under a second).
	StatementTimeout = 15 * time.Second
	// LockTimeout bounds the wait for a lock another session holds (an operator's change waits for a gateway's
	// delivery transaction of the same row at most this long, then says the database is busy).
	LockTimeout = 5 * time.Second
)

// Connect opens a pool on databaseURL as the service wants it: every statement planned with its parameters,
// and every connection, statement and lock wait bounded (ConnectTimeout, StatementTimeout, LockTimeout).
func Connect(ctx context.Context, databaseURL string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, &InvalidError{Field: "DATABASE_URL", Reason: err.Error()}
	}
	params := pc.ConnConfig.RuntimeParams
	params["plan_cache_mode"] = "force_custom_plan"
	params["application_name"] = "oncegate-admin"
	// A listing's plan over partitioned effects is costed as if every partition were read (each row's
	// replays and attempts, one probe per partition), which crosses jit_above_cost: a 1,000-row page then
	// spent 4.5 s compiling itself and 10 ms running. These are lookups; compiling never pays.
	if _, ok := params["jit"]; !ok {
		params["jit"] = "off"
	}
	if _, ok := params["statement_timeout"]; !ok {
		params["statement_timeout"] = fmt.Sprint(StatementTimeout.Milliseconds())
	}
	if _, ok := params["lock_timeout"]; !ok {
		params["lock_timeout"] = fmt.Sprint(LockTimeout.Milliseconds())
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = ConnectTimeout
	}
	pc.MaxConns = 4
	return pgxpool.NewWithConfig(ctx, pc)
}

// Errors the callers branch on (the CLI's exit codes follow them).
var (
	// ErrNotFound: no such effect, queue, job or type.
	ErrNotFound = errors.New("not found")
	// ErrWrongState: the action does not apply to the target's state (retry of a delivered effect).
	ErrWrongState = errors.New("wrong state")
	// ErrForbidden: the actor's role may not do this.
	ErrForbidden = errors.New("forbidden")
	// ErrInvalid: bad input; an *InvalidError names the field.
	ErrInvalid = errors.New("invalid")
	// ErrPartial: a bulk action applied to some of its targets only; a *BulkError says how far it got.
	ErrPartial = errors.New("partly applied")
	// ErrUnavailable: a store the operation needs is not configured or not reachable.
	ErrUnavailable = errors.New("unavailable")
)

// InvalidError is bad input to an operation, naming the field (the CLI's flag) at fault.
type InvalidError struct {
	Field  string
	Reason string
}

func (e *InvalidError) Error() string        { return e.Field + ": " + e.Reason }
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// NotFoundError names what was not found, and where a thing can also be gone by design, says how.
type NotFoundError struct{ What, Hint string }

func (e *NotFoundError) Error() string {
	if e.Hint != "" {
		return e.What + " not found (" + e.Hint + ")"
	}
	return e.What + " not found"
}
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// StateError says why the target's state refuses the action.
type StateError struct{ Msg string }

func (e *StateError) Error() string        { return e.Msg }
func (e *StateError) Is(target error) bool { return target == ErrWrongState }

// ForbiddenError names the role an action needs.
type ForbiddenError struct {
	Action string
	Needs  Role
	Has    Role
}

func (e *ForbiddenError) Error() string {
	return fmt.Sprintf("%s needs the %s role; you have %s", e.Action, e.Needs, e.Has)
}
func (e *ForbiddenError) Is(target error) bool { return target == ErrForbidden }

// unavailable says which store an operation lacks.
func unavailable(what string) error {
	return fmt.Errorf("%w: %s", ErrUnavailable, what)
}

func (s *Service) needDB() error {
	if s.db == nil {
		return unavailable("this needs the gateway's database: set DATABASE_URL")
	}
	return nil
}

// needDBUp is for a change made in Redis and audited in Postgres after it: the database must answer first,
// and hold an audit log this role may write, so that a change is not made with no audit entry to show for it
// (a database that fails between the check and the entry is the window left, milliseconds wide). A database
// the gateway never migrated let `dead requeue` change Redis, then fail for want of oncegate_audit.
func (s *Service) needDBUp(ctx context.Context) error {
	if err := s.needDB(); err != nil {
		return err
	}
	var writable *bool
	err := s.db.QueryRow(ctx, `SELECT has_table_privilege(to_regclass('oncegate_audit'), 'INSERT')`).Scan(&writable)
	switch {
	case err != nil:
		return dbError("reach the database for the audit log, before changing anything", err)
	case writable == nil:
		return unavailable("the database has no audit log (oncegate_audit): it is not one a gateway has " +
			"migrated (`gateway migrate`); nothing was changed")
	case !*writable:
		return unavailable("this database role may not write the audit log (oncegate_audit); nothing was changed")
	}
	return nil
}

func (s *Service) needRedis() error {
	if s.rdb == nil {
		return unavailable("this needs the queues' Redis: set REDIS_URL")
	}
	return nil
}

// allow checks the actor's role for an action; a mutating action refused is audited as denied.
func (s *Service) allow(ctx context.Context, a Actor, action string, needs Role, target string) error {
	return s.allowAudited(ctx, a, needs, Audit{Action: action, Target: target})
}

// allowAudited is allow for an action whose refusal is audited with what it asked for (e: action, target,
// filter, reason), so that the entry of a denied change says as much as that of a done one.
func (s *Service) allowAudited(ctx context.Context, a Actor, needs Role, e Audit) error {
	if strings.TrimSpace(a.Name) == "" {
		return &InvalidError{Field: "operator", Reason: "an operator name is needed (--operator, $ONCEGATE_OPERATOR or the OS user)"}
	}
	if err := checkText("operator", a.Name); err != nil {
		return err
	}
	if !a.Role.Valid() {
		return &InvalidError{Field: "role", Reason: fmt.Sprintf("%q is not a role: want viewer, operator or admin", a.Role)}
	}
	if a.Role.rank() >= needs.rank() {
		return nil
	}
	err := &ForbiddenError{Action: e.Action, Needs: needs, Has: a.Role}
	if needs != RoleViewer && s.db != nil {
		// Written before the reason is checked: only so much of it is kept.
		e.Count, e.Outcome, e.Reason = 0, "denied", clip(e.Reason, MaxReason)
		_, _ = s.audit(ctx, s.db, a, e)
	}
	return err
}

// MaxReason bounds a change's reason, in bytes: a sentence or a ticket link, not a document. The audit log
// is append-only, so what goes in stays.
const MaxReason = 2000

// requireReason refuses a mutating action without a reason, or with one over MaxReason.
func requireReason(reason string) error {
	if strings.TrimSpace(reason) == "" {
		return &InvalidError{Field: "reason", Reason: "a reason is required for every change (it goes to the audit log)"}
	}
	if len(reason) > MaxReason {
		return &InvalidError{Field: "reason", Reason: fmt.Sprintf("%d bytes, over the limit of %d: say why in a "+
			"sentence, and link to the rest", len(reason), MaxReason)}
	}
	return checkText("reason", reason)
}

// clip cuts s to at most n bytes, on a character boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// Audit is one entry of the audit log.
type Audit struct {
	ID      int64           `json:"id"`
	At      time.Time       `json:"at"`
	Actor   string          `json:"actor"`
	Role    Role            `json:"role"`
	Action  string          `json:"action"`
	Target  string          `json:"target"`
	Count   int64           `json:"count"`
	Filter  json.RawMessage `json:"filter"`
	Reason  string          `json:"reason"`
	Outcome string          `json:"outcome"`
}

// AuditActions are the actions the audit log records, for the filter of AuditLog and the docs' list.
// Every audited change names one of them; audit refuses any other, so that a new action cannot be written
// without being listed here (and a filter cannot ask for an action that no entry can have). token.list and
// the reads that reveal stored bodies are audited too, as refused or done.
var AuditActions = []string{
	"effect.retry", "effect.retry-matching", "effect.resolve", "effect.reveal",
	"type.pause", "type.resume", "destination.resume",
	"queue.pause", "queue.resume", "dead.requeue", "dead.purge", "job.enqueue", "job.reveal",
	"console.login", "token.create", "token.revoke", "token.list",
}

func knownAuditAction(action string) bool { return slices.Contains(AuditActions, action) }

type execer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// audit appends an entry, on db (the pool, or the transaction of the change it records).
func (s *Service) audit(ctx context.Context, db execer, a Actor, e Audit) (Audit, error) {
	if !knownAuditAction(e.Action) {
		return e, fmt.Errorf("admin: write the audit log: %q is not in AuditActions", e.Action)
	}
	e.Actor, e.Role = a.Name, a.Role
	if e.Outcome == "" {
		e.Outcome = "done"
	}
	var filter *string
	if len(e.Filter) > 0 {
		f := string(e.Filter)
		filter = &f
	}
	err := db.QueryRow(ctx, auditInsertSQL, e.Actor, string(e.Role), e.Action, e.Target, e.Count, filter, e.Reason,
		e.Outcome).Scan(&e.ID, &e.At)
	if err != nil {
		return e, fmt.Errorf("admin: write the audit log: %w", err)
	}
	return e, nil
}

// auditAfter records an action already done outside Postgres (in Redis): done, or failed with err.
func (s *Service) auditAfter(ctx context.Context, a Actor, e Audit, actErr error) error {
	if actErr != nil {
		// A change to Redis is one atomic step (a flag, a script): failed, it changed nothing.
		e.Count, e.Outcome = 0, "failed: "+actErr.Error()
	}
	_, err := s.audit(context.WithoutCancel(ctx), s.db, a, e)
	if actErr != nil {
		return actErr
	}
	return err
}

// AuditFilter selects audit entries.
type AuditFilter struct {
	Actor  string    `json:"actor,omitempty"`
	Action string    `json:"action,omitempty"`
	Since  time.Time `json:"since,omitzero"`
}

// AuditPage is a page of the audit log, newest first.
type AuditPage struct {
	Entries []Audit `json:"entries"`
	Next    string  `json:"next_cursor"`
}

// Page asks for one page: at most Limit items after Cursor (from the previous page's next_cursor).
type Page struct {
	Limit  int
	Cursor string
}

// DefaultLimit and MaxLimit bound a page.
const (
	DefaultLimit = 50
	MaxLimit     = 1000
)

func (p Page) limit() (int, error) {
	switch {
	case p.Limit == 0:
		return DefaultLimit, nil
	case p.Limit < 0 || p.Limit > MaxLimit:
		return 0, &InvalidError{Field: "limit", Reason: fmt.Sprintf("want 1 to %d", MaxLimit)}
	}
	return p.Limit, nil
}

// AuditLog returns a page of the audit log.
func (s *Service) AuditLog(ctx context.Context, a Actor, f AuditFilter, p Page) (*AuditPage, error) {
	if err := s.allow(ctx, a, "audit.list", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
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
	if err := checkTexts("actor", f.Actor, "action", f.Action); err != nil {
		return nil, err
	}
	if f.Action != "" && !knownAuditAction(f.Action) {
		return nil, &InvalidError{Field: "action", Reason: fmt.Sprintf("%q is not an audited action: want one of %s",
			f.Action, strings.Join(AuditActions, ", "))}
	}
	rows, err := s.db.Query(ctx, auditListSQL, nullString(f.Actor), nullString(f.Action), nullTime(f.Since), below, limit+1)
	if err != nil {
		return nil, dbError("list the audit log", err)
	}
	entries, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Audit, error) {
		var e Audit
		var filter *string
		var role string
		err := r.Scan(&e.ID, &e.At, &e.Actor, &role, &e.Action, &e.Target, &e.Count, &filter, &e.Reason, &e.Outcome)
		e.Role = Role(role)
		if filter != nil {
			e.Filter = json.RawMessage(*filter)
		}
		return e, err
	})
	if err != nil {
		return nil, dbError("list the audit log", err)
	}
	page := &AuditPage{Entries: entries}
	if len(entries) > limit {
		page.Entries = entries[:limit]
		page.Next = encodeIDCursor(page.Entries[limit-1].ID)
	}
	return page, nil
}

// dbError is where the driver's errors become the service's: a database that cannot answer now (down, out of
// connections, a network fault, a bound of Connect's run out) is ErrUnavailable, text Postgres refuses (a NUL,
// bytes that are not UTF-8) is an *InvalidError of field "input", and anything else is wrapped with op.
func dbError(op string, err error) error {
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("admin: %s: %w", op, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57014": // query_canceled: statement_timeout
			return fmt.Errorf("%w: %s: the database did not answer within %s: %v", ErrUnavailable, op,
				StatementTimeout, err)
		case "55P03": // lock_not_available: lock_timeout
			return fmt.Errorf("%w: %s: the rows are locked by another session (a delivery in flight, or "+
				"someone's transaction) for over %s; try again: %v", ErrUnavailable, op, LockTimeout, err)
		}
	}
	if dedup.Unavailable(err) {
		return fmt.Errorf("%w: %s: %v", ErrUnavailable, op, err)
	}
	if reason, ok := dedup.Unstorable(err); ok {
		return &InvalidError{Field: "input", Reason: op + ": the database refused a value: " + reason}
	}
	return fmt.Errorf("admin: %s: %w", op, err)
}

// checkText refuses text that Postgres cannot hold (a NUL byte, bytes that are not UTF-8), naming its field,
// before it reaches a statement.
func checkText(field, v string) error {
	switch {
	case !utf8.ValidString(v):
		return &InvalidError{Field: field, Reason: "not valid UTF-8"}
	case strings.IndexByte(v, 0) >= 0:
		return &InvalidError{Field: field, Reason: "holds a NUL byte"}
	}
	return nil
}

// checkTexts is checkText over field, value pairs.
func checkTexts(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := checkText(pairs[i], pairs[i+1]); err != nil {
			return err
		}
	}
	return nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
