package dedup

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/effect"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

// query returns sql/name.sql with its placeholders filled in: {{columns}}, an effect's columns as they are
// reported (columns.sql, its status by ExpandStatus); {{written}}, the same with the status as stored, for the
// RETURNING of a statement that has just written it (its result as stored in its row, its body not
// expired); {{status_is $N}} (ExpandStatus); {{payload}} (payload.sql: how a stored payload is read).
func query(name string) string {
	cols := strings.NewReplacer("{{result}}", sqlFile("result"), "{{body_expired}}", sqlFile("body_expired")).
		Replace(sqlFile("columns"))
	written := strings.NewReplacer("{{status}}", "status", "{{result}}", "result", "{{body_expired}}",
		"false AS body_expired").Replace(sqlFile("columns"))
	return ExpandStatus(strings.NewReplacer("{{columns}}", cols, "{{written}}", written,
		"{{payload}}", sqlFile("payload")).Replace(sqlFile(name)))
}

var statusIsPlaceholder = regexp.MustCompile(`\{\{status_is (\$[0-9]+)\}\}`)

// ExpandStatus fills in the placeholders of an effect's status as it is reported, in SQL where the effect's
// columns are in scope: {{status}}, the status column (status.sql: `delivering` is not stored by a claim but
// read from the outbox row's lease), and {{status_is $N}}, the condition that it is the status in parameter
// $N, or that $N is NULL (status_is.sql). The operator's queries (package admin) use it too.
func ExpandStatus(sql string) string {
	leased := sqlFile("leased")
	sql = statusIsPlaceholder.ReplaceAllStringFunc(sql, func(m string) string {
		param := statusIsPlaceholder.FindStringSubmatch(m)[1]
		return strings.NewReplacer("$S", param, "{{leased}}", leased).Replace(sqlFile("status_is"))
	})
	return strings.ReplaceAll(sql, "{{status}}", strings.ReplaceAll(sqlFile("status"), "{{leased}}", leased))
}

func sqlFile(name string) string {
	b, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(err)
	}
	return strings.TrimSpace(string(b))
}

var (
	insertSQL        = query("insert")
	insertBatchSQL   = query("insert_batch")
	getBatchSQL      = query("get_batch")
	fenceSQL         = query("fence")
	forgetFencesSQL  = query("forget_fences")
	getSQL           = query("get")
	freeDanglingSQL  = query("free_dangling_key")
	listSQL          = query("list")
	claimSQL         = query("claim")
	claimLimitedSQL  = query("claim_limited")
	claimNewSQL      = query("claim_new")
	claimProbeSQL    = query("claim_probe")
	probeEndSQL      = sqlFile("probe_end")
	readPayloadsSQL  = query("read_payloads")
	leasedEffectsSQL = query("leased_effects")
	releaseSQL       = query("release")
	handBackSQL      = query("hand_back")
	finishSQL        = query("finish")
	finishBatchSQL   = query("finish_batch")
	lockLeasesSQL    = query("lock_leases")
	rescheduleSQL    = query("reschedule")
	deferSQL         = query("defer")
	extendLeaseSQL   = query("extend_lease")
	purgeSQL         = query("purge")
	freeKeysSQL      = sqlFile("free_keys")
	restoreKeysSQL   = sqlFile("restore_keys")
	backlogSQL       = query("backlog")
	terminalSQL      = query("terminal")
	pinSQL           = query("pin")
	unpinSQL         = strings.Split(query("unpin"), ";\n") // one statement each: SET takes one setting
)

var tracer = otel.Tracer("github.com/oncegate/oncegate/dedup")

// traceContext returns the W3C trace context of ctx as JSON, for the outbox row, or nil outside a trace. It is
// a json.RawMessage, not []byte, so that pgx's exec and simple protocol modes send it as JSON, not bytea.
func traceContext(ctx context.Context) json.RawMessage {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	b, _ := json.Marshal(carrier)
	return b
}

// pinned runs sql, an UPDATE or DELETE joined to a batch of rows (claim, finish_batch, release, terminal),
// behind pin.sql, in one round trip and one implicit transaction. Postgres plans a statement from its tables'
// statistics, which lag behind a queue's: a claim planned while the outbox's statistics still said it was
// small read every due row and sorted them to take 32 (14 ms with 4,500 due, growing with the backlog, in
// issue 14's benchmark), and a prepared statement's generic plan, made on empty tables, joined batches to
// oncegate_effects by sequential scans. Pinned, each plan is the ordered index scans and nested loops the
// statement is written for, whatever the statistics say (TestPinnedStatementsPlanIndexScansOnEmptyTables).
// Inside an explicit transaction (a TxProvider's), the settings end with the statement (unpin.sql). The rows
// must be closed, as any.
func pinned(ctx context.Context, db DBTX, sql string, args ...any) (pgx.Rows, error) {
	_, inTx := db.(pgx.Tx)
	b := &pgx.Batch{}
	b.Queue(pinSQL)
	b.Queue(sql, args...)
	if inTx {
		for _, q := range unpinSQL {
			b.Queue(q)
		}
	}
	br := db.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &pinnedRows{Rows: rows, br: br, unpin: inTx}, nil
}

// pinnedRows are a pinned statement's rows; closing them ends its batch.
type pinnedRows struct {
	pgx.Rows
	br    pgx.BatchResults
	unpin bool
	err   error
	done  bool
}

func (r *pinnedRows) Close() {
	if r.done {
		return
	}
	r.done = true
	r.Rows.Close()
	if r.unpin && r.Rows.Err() == nil {
		for range unpinSQL {
			if _, r.err = r.br.Exec(); r.err != nil {
				break
			}
		}
	}
	if err := r.br.Close(); r.err == nil {
		r.err = err
	}
}

func (r *pinnedRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// pinnedExec runs a pinned statement that returns no rows the caller needs.
func pinnedExec(ctx context.Context, db DBTX, sql string, args ...any) error {
	rows, err := pinned(ctx, db, sql, args...)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// DBTX is what the store runs on: a *pgxpool.Pool, or a pgx.Tx when an operation must commit with other
// writes (a TxProvider's effect and its Finish). Begin is there for Create's fenced path, which needs a
// transaction of its own (a savepoint, inside a pgx.Tx).
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

var (
	_ DBTX = (*pgxpool.Pool)(nil)
	_ DBTX = pgx.Tx(nil)
)

// DefaultRetention is how long a key is kept, counted from the creation of its effect and at least as long
// after the effect finished, unless the store is
// given another (WithRetention).
const DefaultRetention = 24 * time.Hour

// Store reads and writes effects.
type Store struct {
	db        DBTX
	retention time.Duration // of the keys it claims; 0 is DefaultRetention
	apart     bool          // bodies are written to oncegate_effect_bodies (WithBodiesApart)
	follow    *Follow       // when set, its retention and placement win over the two above (Following)
	batcher   *batcher      // nil: every Create is a statement of its own
}

// Follow is a key retention and a placement of bodies that change while stores write by them (Following):
// a gateway's follow its fleet's settings (partitions.Fleet), so that every gateway on a database writes
// keys that expire alike and bodies that go alike, whatever its own configuration says (an outside test:
// a gateway started with a retention of 1 minute beside a fleet of 3 wrote keys of a minute, and a job run
// again after two made a second effect). Until Set, the stores write by their own.
type Follow struct {
	retention atomic.Int64 // milliseconds; 0: not set
	hold      atomic.Int64 // milliseconds: a key's hold after its effect finished
	apart     atomic.Bool
}

// Set makes the stores that follow f write keys held for retention and, when apart, bodies apart, and hold a
// key for hold after its effect finished (SPEC §2): retention, or longer for a while after a takeover of the
// fleet's settings shortened it (partitions.Retentions.Hold), so that a key the old settings promised to hold
// is not re-claimed sooner.
func (f *Follow) Set(retention, hold time.Duration, apart bool) {
	f.apart.Store(apart)
	f.hold.Store(max(hold, retention, time.Millisecond).Milliseconds())
	f.retention.Store(max(retention, time.Millisecond).Milliseconds())
}

// Following returns the store writing by f once f is set.
func (s *Store) Following(f *Follow) *Store {
	c := *s
	c.follow = f
	return &c
}

// NewStore returns a store on db, usually a *pgxpool.Pool.
func NewStore(db DBTX) *Store { return &Store{db: db} }

// WithTx returns the store's operations inside tx: they commit or roll back with it.
func (s *Store) WithTx(tx pgx.Tx) *Store {
	return &Store{db: tx, retention: s.retention, apart: s.apart, follow: s.follow}
}

// WithBodiesApart returns the store writing the payloads (and later the stored answers) of the effects it
// creates to oncegate_effect_bodies instead of their rows (retention.payloads, migration 00025): their
// partitions can then be dropped before the effects'. Readers find a body either way.
func (s *Store) WithBodiesApart() *Store {
	c := *s
	c.apart = true
	return &c
}

// WithRetention returns the store with keys kept for d, counted from the creation of their effects: a key
// Create claims expires then, and the next Create under it after that, its effect terminal for d too (SPEC
// §2), makes a new effect (oncegate_keys). 0 is DefaultRetention.
func (s *Store) WithRetention(d time.Duration) *Store {
	c := *s
	c.retention = d
	return &c
}

// keyRetention is the store's key retention in milliseconds, as the insert statements take it.
func (s *Store) keyRetention() int64 {
	if s.follow != nil {
		if ms := s.follow.retention.Load(); ms > 0 {
			return ms
		}
	}
	return cmp.Or(s.retention, DefaultRetention).Milliseconds()
}

// keyHold is how long, in milliseconds, a key whose expiry has passed is still held after its effect
// finished (SPEC §2): the key retention, or the longer hold the store follows.
func (s *Store) keyHold() int64 {
	if s.follow != nil && s.follow.retention.Load() > 0 {
		return s.follow.hold.Load()
	}
	return s.keyRetention()
}

// bodiesApart says whether the bodies of the effects the store creates go to oncegate_effect_bodies.
func (s *Store) bodiesApart() bool {
	if s.follow != nil && s.follow.retention.Load() > 0 {
		return s.follow.apart.Load()
	}
	return s.apart
}

// NewEffect is a request for an effect.
type NewEffect struct {
	Tenant, Key, Type string
	Payload           json.RawMessage
	// JobID and JobEpoch, when JobID is set, name the queue job asking and its lease epoch, for fencing;
	// JobQueue its queue, when the client named it, and JobCreated the job's creation in the queue (unix
	// milliseconds; 0 when the client did not send it). A job is fenced within its queue by the pair
	// (JobCreated, JobEpoch): a job enqueued again under its ID is newer than the old one's every lease.
	JobID      string
	JobEpoch   int64
	JobQueue   string
	JobCreated int64
	// Tags are the client's own labels, kept as sent; Terms what an operator's search finds the effect by
	// (effect.SearchTerms: the tags and the provider's recipients, lowercased). Neither is part of the
	// fingerprint: a retry that adds a tag is the same effect, and keeps the first request's.
	Tags, Terms []string
	// Destination is where the effect will be delivered (providers.Destination of its payload), kept on its
	// outbox row so that a claim of a type with a fleet-wide limit can go by destination. Empty is unknown.
	Destination string
}

// Create records the effect and its outbox row, or returns the effect already stored under the key with
// replayed set. A stored effect with another fingerprint is a *KeyReusedError. It notifies no dispatcher: the
// caller announces a new effect once Create has returned (notifier.Batcher), outside its transaction.
func (s *Store) Create(ctx context.Context, ne NewEffect) (e *Effect, replayed bool, err error) {
	if nulEscape(ne.Payload) {
		// The payload is stored as json, which keeps the escape as text; jsonb and text refuse it, and so
		// would whatever a provider writes it into. Refused here, as jsonb used to.
		return nil, false, &UnstorableError{Reason: `a string in the payload holds \u0000 (NUL), which Postgres ` +
			"text and jsonb cannot hold", Err: errNUL}
	}
	fp, err := Fingerprint(ne.Type, ne.Payload)
	if err != nil {
		return nil, false, err
	}
	ctx, span := tracer.Start(ctx, "dedup.record", trace.WithAttributes(attribute.String("effect.type", ne.Type),
		attribute.String("idempotency.key", ne.Key)))
	defer span.End()
	tc := traceContext(ctx)
	// Drawn before the insert: of concurrent creates, the one whose insert wins keeps its id.
	stableID := effect.NewStableID(ne.Tenant, ne.Key)
	// Two tries: the stored effect can be purged by retention between the insert that lost and the read; a
	// third after freeing the key, when it points at an effect no longer stored (free_dangling_key.sql).
	for try := range 3 {
		if try == 2 {
			if freed, err := s.freeDangling(ctx, ne.Tenant, ne.Key); err != nil || !freed {
				return nil, false, cmp.Or(err, vanished(ne.Key))
			}
		}
		if ne.JobID != "" {
			e, err = s.createFenced(ctx, ne, fp, tc, stableID)
			var fenced *FencedError
			if errors.As(err, &fenced) {
				return nil, false, err
			}
		} else {
			e, err = s.insert(ctx, ne, fp, tc, stableID)
		}
		if err == nil {
			return e, false, nil
		}
		var taken *takenError
		switch {
		case errors.As(err, &taken) && taken.existing != nil:
			e = taken.existing
		case errors.As(err, &taken):
			continue // purged between the insert and the read
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, false, translate("record effect", err)
		default:
			e, err = s.Get(ctx, ne.Tenant, ne.Key)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, false, err
			}
		}
		if !bytes.Equal(e.Fingerprint, fp) {
			return nil, false, &KeyReusedError{Key: ne.Key, Existing: e}
		}
		span.SetAttributes(attribute.Bool("idempotency.replayed", true))
		return e, true, nil
	}
	return nil, false, vanished(ne.Key)
}

// vanished is the error of a create whose key's effect could not be read after the key was found taken.
func vanished(key string) error {
	return fmt.Errorf("dedup: effect %q vanished twice while being read", key)
}

// freeDangling frees the tenant's key if it points at an effect no longer stored (free_dangling_key.sql), and
// says whether it did.
func (s *Store) freeDangling(ctx context.Context, tenant, key string) (bool, error) {
	tag, err := s.db.Exec(ctx, freeDanglingSQL, tenant, key)
	if err != nil {
		return false, translate("free a key whose effect is gone", err)
	}
	return tag.RowsAffected() > 0, nil
}

// insert records a new effect: through a batch when the store batches, else in a statement of its own. It
// returns pgx.ErrNoRows when the key is taken, or a *takenError when a batch read the key's effect already.
func (s *Store) insert(ctx context.Context, ne NewEffect, fp []byte, tc json.RawMessage, stableID string) (*Effect, error) {
	if s.batcher == nil || s.batcher.creates.claimInline(false) {
		if s.batcher != nil {
			defer s.batcher.creates.releaseInline(false)
		}
		return inserted(scanCreated(s.db.QueryRow(ctx, insertSQL, ne.Tenant, ne.Key, ne.Type, fp, ne.Payload, tc, stableID,
			nil, nil, orNull(ne.Tags), orNull(ne.Terms), nil, orNil(ne.Destination), s.keyRetention(), s.bodiesApart(),
			s.keyHold())))
	}
	created, existing, err := s.batcher.insert(ctx, &insertion{ne: ne, fp: fp, trace: tc, stableID: stableID,
		retention: s.keyRetention(), hold: s.keyHold(), apart: s.bodiesApart()})
	switch {
	case err != nil:
		return nil, err
	case created != nil:
		return created, nil
	default:
		return nil, &takenError{existing: existing}
	}
}

// orNull is ss, or nil (SQL NULL) when it is empty: the search index holds only effects with terms.
func orNull(ss []string) []string {
	if len(ss) == 0 {
		return nil
	}
	return ss
}

// takenError says that a batch found the key taken, and carries the effect stored under it (nil when it was
// purged before the batch could read it).
type takenError struct{ existing *Effect }

func (*takenError) Error() string { return "dedup: the key is taken" }

// Get returns the tenant's effect under key.
func (s *Store) Get(ctx context.Context, tenant, key string) (*Effect, error) {
	e, err := scan(s.db.QueryRow(ctx, getSQL, tenant, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, translate("get effect", err)
	}
	return e, nil
}

// Filter selects a page of effects.
type Filter struct {
	Status effect.Status // empty: any
	Type   string        // empty: any
	Limit  int
	Cursor string // from the previous page's Page.Next
}

// Page is a page of effects, newest first. Next is empty on the last page.
type Page struct {
	Effects []*Effect
	Next    string
}

// List returns a page of the tenant's effects, newest first.
func (s *Store) List(ctx context.Context, tenant string, f Filter) (*Page, error) {
	var status, typ *string
	if f.Status != "" {
		v := string(f.Status)
		status = &v
	}
	if f.Type != "" {
		typ = &f.Type
	}
	var after *int64
	if f.Cursor != "" {
		raw, err := base64.RawURLEncoding.DecodeString(f.Cursor)
		if err != nil {
			return nil, ErrBadCursor
		}
		id, err := strconv.ParseInt(strings.TrimPrefix(string(raw), "id:"), 10, 64)
		if err != nil || !strings.HasPrefix(string(raw), "id:") {
			return nil, ErrBadCursor
		}
		after = &id
	}
	// Planned for its values (the simple protocol sends them in the text), as status_is.sql is written to be:
	// a gateway's connections keep generic plans (gateway.newPool), and one plan for every filter would read a
	// tenant's every effect to find its few failed ones.
	rows, err := s.db.Query(ctx, listSQL, pgx.QueryExecModeSimpleProtocol, tenant, status, typ, after, f.Limit+1)
	if err != nil {
		return nil, translate("list effects", err)
	}
	defer rows.Close()
	page := &Page{Effects: []*Effect{}}
	for rows.Next() {
		e, err := scan(rows)
		if err != nil {
			return nil, translate("list effects", err)
		}
		page.Effects = append(page.Effects, e)
	}
	if err := rows.Err(); err != nil {
		return nil, translate("list effects", err)
	}
	if len(page.Effects) > f.Limit {
		page.Effects = page.Effects[:f.Limit]
		last := page.Effects[len(page.Effects)-1]
		page.Next = base64.RawURLEncoding.EncodeToString([]byte("id:" + strconv.FormatInt(last.ID, 10)))
	}
	return page, nil
}

// Retry sends a retryable effect (effect.RetryableStatuses) back to pending, with a fresh count of attempts,
// and wakes the dispatchers: SendBack, as an operator's retry is. ErrNotRetryable in another status.
func (s *Store) Retry(ctx context.Context, tenant, key string) (*Effect, error) {
	e, err := s.SendBack(ctx, tenant, key, effect.RetryableStatuses(), Sender{By: "tenant " + tenant}, nil)
	var wrong *WrongStatusError
	if errors.As(err, &wrong) {
		return nil, ErrNotRetryable
	}
	return e, err
}

// ForgetFences deletes up to limit fences of queue jobs that asked for no effect for the keys' hold
// (retention.keys), the oldest first, and returns how many it deleted. The gateways' heartbeats call it, so
// that the fences kept are those of recent jobs, not of every job ID ever seen.
func (s *Store) ForgetFences(ctx context.Context, limit int) (int64, error) {
	var n int64
	if err := s.db.QueryRow(ctx, forgetFencesSQL, s.keyHold(), limit).Scan(&n); err != nil {
		return 0, translate("forget fences", err)
	}
	return n, nil
}

// createFenced raises the job's fence and records the effect in one transaction; pgx.ErrNoRows means the
// key existed, as for an unfenced insert.
func (s *Store) createFenced(ctx context.Context, ne NewEffect, fp []byte, tc json.RawMessage, stableID string) (*Effect, error) {
	var e *Effect
	var insertErr error
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var epoch int64
		if err := tx.QueryRow(ctx, fenceSQL, ne.Tenant, ne.JobQueue, ne.JobID, ne.JobCreated, ne.JobEpoch).Scan(&epoch); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return &FencedError{JobID: ne.JobID, Epoch: ne.JobEpoch}
			}
			return err
		}
		e, insertErr = inserted(scanCreated(tx.QueryRow(ctx, insertSQL, ne.Tenant, ne.Key, ne.Type, fp, ne.Payload, tc,
			stableID, ne.JobID, ne.JobEpoch, orNull(ne.Tags), orNull(ne.Terms), orNil(ne.JobQueue), orNil(ne.Destination),
			s.keyRetention(), s.bodiesApart(), s.keyHold())))
		var taken *takenError
		if errors.Is(insertErr, pgx.ErrNoRows) || errors.As(insertErr, &taken) {
			return nil // the key exists: keep the raised fence, and answer as a replay (or a reuse)
		}
		return insertErr
	})
	if err != nil {
		return nil, err
	}
	return e, insertErr
}

// scanCreated reads a row of insert.sql: the effect, and whether this statement created it.
func scanCreated(row pgx.Row) (*Effect, bool, error) {
	var e Effect
	var stableID *string
	var created bool
	err := row.Scan(&created, &e.ID, &e.Tenant, &e.Key, &e.Type, &e.Fingerprint, &e.Status, &e.Attempts, &e.Result,
		&e.LastError, &e.CreatedAt, &e.UpdatedAt, &e.DeliveredAt, &e.NextAttemptAt, &stableID, &e.BodyExpired)
	if err != nil {
		return nil, false, err
	}
	e.StableID = stableIDOf(e.Tenant, e.Key, stableID)
	return &e, created, nil
}

// inserted turns what insert.sql returned into insert's answer: the created effect, a *takenError with the
// stored one, or pgx.ErrNoRows when the key was taken by an effect the statement could not see.
func inserted(e *Effect, created bool, err error) (*Effect, error) {
	switch {
	case err != nil:
		return nil, err
	case created:
		return e, nil
	default:
		return nil, &takenError{existing: e}
	}
}

func scan(row pgx.Row) (*Effect, error) {
	var e Effect
	var stableID *string
	err := row.Scan(&e.ID, &e.Tenant, &e.Key, &e.Type, &e.Fingerprint, &e.Status, &e.Attempts, &e.Result,
		&e.LastError, &e.CreatedAt, &e.UpdatedAt, &e.DeliveredAt, &e.NextAttemptAt, &stableID, &e.BodyExpired)
	if err != nil {
		return nil, err
	}
	e.StableID = stableIDOf(e.Tenant, e.Key, stableID)
	return &e, nil
}

// stableIDOf is the effect's stable id: the one stored with it, or for an effect created before ids were
// stored, the one derived from tenant and key that its deliveries have carried.
func stableIDOf(tenant, key string, stored *string) string {
	if stored != nil && *stored != "" {
		return *stored
	}
	return effect.LegacyStableID(tenant, key)
}

func statusStrings(ss []effect.Status) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}
