package dedup

import (
	"bytes"
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

func query(name string) string {
	cols, _ := sqlFiles.ReadFile("sql/columns.sql")
	q, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(err)
	}
	return strings.ReplaceAll(string(q), "{{columns}}", strings.TrimSpace(string(cols)))
}

var (
	insertSQL = query("insert")
	fenceSQL  = query("fence")
	getSQL    = query("get")
	listSQL   = query("list")
	retrySQL  = query("retry")
)

var (
	// ErrNotFound: the tenant has no effect under that key.
	ErrNotFound = errors.New("dedup: no effect under that key")
	// ErrNotRetryable: only dead, failed and unknown effects can be sent back to pending.
	ErrNotRetryable = errors.New("dedup: effect is not dead, failed or unknown")
)

// FencedError is returned when a request names a queue job under an epoch lower than one the gateway has
// seen for that job: the worker lost its lease to a successor, and may not start effects any more.
type FencedError struct {
	JobID string
	Epoch int64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("dedup: job %q is fenced: epoch %d is behind a newer lease of the job", e.JobID, e.Epoch)
}

// KeyReusedError is returned when a key the tenant already used arrives with another request.
type KeyReusedError struct {
	Key      string
	Existing *Effect
}

func (e *KeyReusedError) Error() string {
	return fmt.Sprintf("dedup: idempotency key %q was used for another request", e.Key)
}

var tracer = otel.Tracer("github.com/oncegate/oncegate/dedup")

// traceContext returns the W3C trace context of ctx as JSON, for the outbox row, or nil outside a trace.
func traceContext(ctx context.Context) []byte {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	b, _ := json.Marshal(carrier)
	return b
}

// Store reads and writes effects.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// NewEffect is a request for an effect.
type NewEffect struct {
	Tenant, Key, Type string
	Payload           json.RawMessage
	// JobID and JobEpoch, when JobID is set, name the queue job asking and its lease epoch, for fencing.
	JobID    string
	JobEpoch int64
}

// Create records the effect and its outbox row, or returns the effect already stored under the key with
// replayed set. A stored effect with another fingerprint is a *KeyReusedError.
func (s *Store) Create(ctx context.Context, ne NewEffect) (e *Effect, replayed bool, err error) {
	fp, err := Fingerprint(ne.Type, ne.Payload)
	if err != nil {
		return nil, false, err
	}
	ctx, span := tracer.Start(ctx, "dedup.record", trace.WithAttributes(attribute.String("effect.type", ne.Type),
		attribute.String("idempotency.key", ne.Key)))
	defer span.End()
	tc := traceContext(ctx)
	// Two tries: the stored effect can be purged by retention between the insert that lost and the read.
	for range 2 {
		if ne.JobID != "" {
			e, err = s.createFenced(ctx, ne, fp, tc)
			var fenced *FencedError
			if errors.As(err, &fenced) {
				return nil, false, err
			}
		} else {
			e, err = scan(s.pool.QueryRow(ctx, insertSQL, ne.Tenant, ne.Key, ne.Type, fp, ne.Payload, tc))
		}
		if err == nil {
			return e, false, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, false, fmt.Errorf("dedup: record effect: %w", err)
		}
		e, err = s.Get(ctx, ne.Tenant, ne.Key)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		if !bytes.Equal(e.Fingerprint, fp) {
			return nil, false, &KeyReusedError{Key: ne.Key, Existing: e}
		}
		span.SetAttributes(attribute.Bool("idempotency.replayed", true))
		return e, true, nil
	}
	return nil, false, fmt.Errorf("dedup: effect %q vanished twice while being read", ne.Key)
}

// Get returns the tenant's effect under key.
func (s *Store) Get(ctx context.Context, tenant, key string) (*Effect, error) {
	e, err := scan(s.pool.QueryRow(ctx, getSQL, tenant, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("dedup: get effect: %w", err)
	}
	return e, nil
}

// Filter selects a page of effects.
type Filter struct {
	Status Status // empty: any
	Type   string // empty: any
	Limit  int
	Cursor string // from the previous page's Page.Next
}

// Page is a page of effects, newest first. Next is empty on the last page.
type Page struct {
	Effects []*Effect
	Next    string
}

// ErrBadCursor is returned for a cursor that no page handed out.
var ErrBadCursor = errors.New("dedup: invalid cursor")

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
	rows, err := s.pool.Query(ctx, listSQL, tenant, status, typ, after, f.Limit+1)
	if err != nil {
		return nil, fmt.Errorf("dedup: list effects: %w", err)
	}
	defer rows.Close()
	page := &Page{Effects: []*Effect{}}
	for rows.Next() {
		e, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("dedup: list effects: %w", err)
		}
		page.Effects = append(page.Effects, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("dedup: list effects: %w", err)
	}
	if len(page.Effects) > f.Limit {
		page.Effects = page.Effects[:f.Limit]
		last := page.Effects[len(page.Effects)-1]
		page.Next = base64.RawURLEncoding.EncodeToString([]byte("id:" + strconv.FormatInt(last.ID, 10)))
	}
	return page, nil
}

// Retry sends a dead, failed or unknown effect back to pending, with a fresh count of attempts.
func (s *Store) Retry(ctx context.Context, tenant, key string) (*Effect, error) {
	e, err := scan(s.pool.QueryRow(ctx, retrySQL, tenant, key))
	if err == nil {
		return e, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("dedup: retry effect: %w", err)
	}
	if _, err := s.Get(ctx, tenant, key); err != nil {
		return nil, err
	}
	return nil, ErrNotRetryable
}

// createFenced raises the job's fence and records the effect in one transaction; pgx.ErrNoRows means the
// key existed, as for an unfenced insert.
func (s *Store) createFenced(ctx context.Context, ne NewEffect, fp []byte, tc []byte) (*Effect, error) {
	var e *Effect
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var epoch int64
		if err := tx.QueryRow(ctx, fenceSQL, ne.Tenant, ne.JobID, ne.JobEpoch).Scan(&epoch); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return &FencedError{JobID: ne.JobID, Epoch: ne.JobEpoch}
			}
			return err
		}
		var err error
		e, err = scan(tx.QueryRow(ctx, insertSQL, ne.Tenant, ne.Key, ne.Type, fp, ne.Payload, tc))
		if errors.Is(err, pgx.ErrNoRows) {
			// The key exists: keep the raised fence, answer as a replay (or a reuse) below.
			return nil
		}
		return err
	})
	if err == nil && e == nil {
		return nil, pgx.ErrNoRows
	}
	return e, err
}

func scan(row pgx.Row) (*Effect, error) {
	var e Effect
	err := row.Scan(&e.ID, &e.Tenant, &e.Key, &e.Type, &e.Fingerprint, &e.Status, &e.Attempts, &e.Result,
		&e.LastError, &e.CreatedAt, &e.UpdatedAt, &e.DeliveredAt, &e.NextAttemptAt)
	if err != nil {
		return nil, err
	}
	return &e, nil
}
