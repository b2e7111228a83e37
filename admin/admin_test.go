package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

var (
	alice = admin.Actor{Name: "alice", Role: admin.RoleOperator}
	viv   = admin.Actor{Name: "viv", Role: admin.RoleViewer}
)

// newService returns a service on a database of the test's own, and that database's pool.
func newService(t *testing.T) (*admin.Service, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.Database(t)
	pool, err := admin.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return admin.New(admin.Config{DB: pool}), pool
}

// seed inserts n effects of tenant acme with keys prefix0..prefix(n-1), all in status, straight in SQL.
func seed(t *testing.T, pool *pgxpool.Pool, prefix string, n int, status effect.Status) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, status, finished_at)
		SELECT 'acme', $1 || i, 'hook', '\x00', '{}'::json, $2,
		       CASE WHEN $2 IN ('delivered', 'failed', 'dead', 'unknown') THEN now() END
		FROM generate_series(0, $3 - 1) AS i`, prefix, string(status), n)
	if err != nil {
		t.Fatal(err)
	}
	pgtest.KeyEffects(t, pool)
}

func TestPagesWalkEveryEffectOnceNewestFirst(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "k", 120, effect.StatusDead)
	seed(t, pool, "other", 10, effect.StatusDelivered)
	seen := map[string]bool{}
	var last int64 = 1 << 62
	cursor := ""
	pages := 0
	for {
		p, err := svc.Effects(ctx, viv, admin.EffectFilter{Status: effect.StatusDead, KeyPrefix: "k"},
			admin.Page{Limit: 50, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, e := range p.Effects {
			if seen[e.Key] || e.ID >= last || e.Status != effect.StatusDead {
				t.Fatalf("page %d: %s (id %d after %d) seen twice, out of order or not dead", pages, e.Key, e.ID, last)
			}
			seen[e.Key], last = true, e.ID
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	if len(seen) != 120 || pages != 3 {
		t.Fatalf("walked %d effects in %d pages", len(seen), pages)
	}
	// A prefix is a prefix: LIKE's wildcards in it are literal.
	if p, err := svc.Effects(ctx, viv, admin.EffectFilter{KeyPrefix: "k_"}, admin.Page{}); err != nil || len(p.Effects) != 0 {
		t.Fatalf("prefix k_ matched %d effects, %v", len(p.Effects), err)
	}
	if _, err := svc.Effects(ctx, viv, admin.EffectFilter{}, admin.Page{Cursor: "bogus"}); !errors.Is(err, admin.ErrInvalid) {
		t.Fatalf("bad cursor: %v", err)
	}
}

func TestRetryResolveAndTheirRefusals(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "u", 3, effect.StatusUnknown)
	seed(t, pool, "d", 1, effect.StatusDelivered)

	if _, err := svc.RetryEffect(ctx, alice, "acme", "d0", "why not"); !errors.Is(err, admin.ErrWrongState) {
		t.Fatalf("retry of a delivered effect: %v", err)
	}
	if _, err := svc.RetryEffect(ctx, alice, "acme", "nope", "x"); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("retry of a missing effect: %v", err)
	}
	if _, err := svc.RetryEffect(ctx, alice, "acme", "u0", ""); !errors.Is(err, admin.ErrInvalid) {
		t.Fatalf("retry without a reason: %v", err)
	}
	if _, err := svc.ResolveEffect(ctx, viv, "acme", "u0", "failed", "x"); !errors.Is(err, admin.ErrForbidden) {
		t.Fatalf("a viewer resolving: %v", err)
	}
	e, err := svc.ResolveEffect(ctx, alice, "", "u0", admin.ResolveFailed, "the receiver has no record of it")
	if err != nil || e.Status != effect.StatusFailed || e.Resolution.As != "failed" || e.Resolution.By != "alice" {
		t.Fatalf("resolve failed: %+v %v", e, err)
	}
	e, err = svc.ResolveEffect(ctx, alice, "acme", "u1", admin.ResolveResend, "send it again")
	if err != nil || e.Status != effect.StatusPending || e.Resolution.As != "resend" {
		t.Fatalf("resolve resend: %+v %v", e, err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox WHERE effect_id = $1", e.ID); n != 1 {
		t.Fatalf("a resend left %d outbox rows", n)
	}
	if _, err := svc.ResolveEffect(ctx, alice, "acme", "u1", admin.ResolveDelivered, "again"); !errors.Is(err, admin.ErrWrongState) {
		t.Fatalf("resolving a pending effect: %v", err)
	}
	log, err := svc.AuditLog(ctx, viv, admin.AuditFilter{}, admin.Page{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range log.Entries {
		got = append(got, fmt.Sprintf("%s %s %s %s", a.Actor, a.Action, a.Target, a.Outcome))
	}
	want := []string{"alice effect.resolve acme/u1 done", "alice effect.resolve acme/u0 done", "viv effect.resolve u0 denied"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("audit log:\n got %q\nwant %q", got, want)
	}
}

// A filter by an action no entry can have is a mistake to say, not an empty page: `--action efect.retry`
// would otherwise read as "nobody retried anything".
func TestAuditLogRefusesAnActionItDoesNotRecord(t *testing.T) {
	t.Parallel()
	svc, _ := newService(t)
	ctx := context.Background()
	_, err := svc.AuditLog(ctx, viv, admin.AuditFilter{Action: "efect.retry"}, admin.Page{})
	if !errors.Is(err, admin.ErrInvalid) || !strings.Contains(err.Error(), "effect.retry-matching") {
		t.Fatalf("an unknown action: %v", err)
	}
	for _, action := range admin.AuditActions {
		if _, err := svc.AuditLog(ctx, viv, admin.AuditFilter{Action: action}, admin.Page{}); err != nil {
			t.Fatalf("%s: %v", action, err)
		}
	}
	// The docs list every action the log records.
	doc, err := os.ReadFile("../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, action := range admin.AuditActions {
		if !strings.Contains(string(doc), "`"+action+"`") {
			t.Errorf("docs/cli.md does not name the audited action %s", action)
		}
	}
}

func TestAuditLogIsAppendOnly(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "d", 1, effect.StatusDelivered) // a type is one that something knows
	if err := svc.PauseType(ctx, alice, "hook", "maintenance"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"UPDATE oncegate_audit SET reason = 'nothing'", "DELETE FROM oncegate_audit",
		"TRUNCATE oncegate_audit"} {
		if _, err := pool.Exec(ctx, q); err == nil {
			t.Fatalf("%s went through", q)
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_audit WHERE reason = 'maintenance'"); n != 1 {
		t.Fatalf("audit entries: %d", n)
	}
}

// A paused type's rows are not claimed by any dispatcher, and wait uncharged; resumed, they are.
func TestPausedTypeIsNotClaimed(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	store := dedup.NewStore(pool)
	if _, _, err := store.Create(ctx, dedup.NewEffect{Tenant: "acme", Key: "k1", Type: "hook",
		Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := svc.PauseType(ctx, alice, "hook", "receiver is migrating"); err != nil {
		t.Fatal(err)
	}
	if err := svc.PauseType(ctx, alice, "hook", "twice"); !errors.Is(err, admin.ErrWrongState) {
		t.Fatalf("pausing twice: %v", err)
	}
	claim := dedup.ClaimParams{Type: "hook", Limit: 10, Owner: "gw", Lease: time.Minute}
	if rows, err := store.ClaimLeases(ctx, claim); err != nil || len(rows) != 0 {
		t.Fatalf("claimed %d rows of a paused type, %v", len(rows), err)
	}
	if err := svc.ResumeType(ctx, alice, "hook", "done"); err != nil {
		t.Fatal(err)
	}
	rows, err := store.ClaimLeases(ctx, claim)
	if err != nil || len(rows) != 1 || rows[0].Attempts != 0 {
		t.Fatalf("after resume claimed %+v, %v", rows, err)
	}
}

// A bulk retry goes in audited batches, and counts first.
func TestBulkRetryInAuditedBatches(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "dead", admin.BulkBatch*2+7, effect.StatusDead)
	seed(t, pool, "ok", 5, effect.StatusDelivered)
	f := admin.EffectFilter{Status: effect.StatusDead, Type: "hook"}
	if n, err := svc.CountRetryable(ctx, viv, f); err != nil || n != admin.BulkBatch*2+7 {
		t.Fatalf("dry run: %d %v", n, err)
	}
	var calls int
	res, err := svc.RetryEffects(ctx, alice, f, "receiver fixed", func(admin.BulkResult) { calls++ })
	if err != nil || res.Applied != admin.BulkBatch*2+7 || res.Batches != 3 || calls != 3 {
		t.Fatalf("bulk retry: %+v %v (%d progress calls)", res, err, calls)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox"); n != admin.BulkBatch*2+7 {
		t.Fatalf("outbox rows: %d", n)
	}
	if n := pgtest.Count(t, pool, "SELECT sum(count) FROM oncegate_audit WHERE action = 'effect.retry-matching' "+
		"AND filter = '{\"type\": \"hook\", \"status\": \"dead\"}'::jsonb"); n != admin.BulkBatch*2+7 {
		t.Fatalf("audited: %d", n)
	}
	if _, err := svc.RetryEffects(ctx, alice, admin.EffectFilter{Status: effect.StatusDelivered}, "x", nil); !errors.Is(err, admin.ErrWrongState) {
		t.Fatalf("bulk retry of delivered effects: %v", err)
	}
}

// A bulk retry with no filter at all would resend every failed, dead and unknown effect of every tenant
// (the console's "Retry all matching…" once sent exactly that): the service refuses it, for every face, and
// a status no retry applies to is a wrong state in the dry run too, not "0 match".
func TestBulkRetryNeedsAFilter(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "dead", 3, effect.StatusDead)
	var ie *admin.InvalidError
	if _, err := svc.RetryEffects(ctx, alice, admin.EffectFilter{}, "oops", nil); !errors.As(err, &ie) || ie.Field != "filter" {
		t.Fatalf("a bulk retry without a filter: %v", err)
	}
	if _, err := svc.CountRetryable(ctx, alice, admin.EffectFilter{}); !errors.Is(err, admin.ErrInvalid) {
		t.Fatalf("its dry run: %v", err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'dead'"); n != 3 {
		t.Fatalf("%d of 3 dead effects left dead", n)
	}
	if _, err := svc.CountRetryable(ctx, alice, admin.EffectFilter{Status: effect.StatusDelivered}); !errors.Is(err, admin.ErrWrongState) {
		t.Fatalf("the dry run of a retry of delivered effects: %v", err)
	}
	if res, err := svc.RetryEffects(ctx, alice, admin.EffectFilter{Status: effect.StatusDead}, "fixed", nil); err != nil || res.Applied != 3 {
		t.Fatalf("with a filter: %+v %v", res, err)
	}
}

// Replays gathered by a gateway's ReplayLog show on the effect, with the epoch of the last.
func TestReplaysAreCountedInBatches(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	store := dedup.NewStore(pool)
	e, _, err := store.Create(ctx, dedup.NewEffect{Tenant: "acme", Key: "k", Type: "hook", Payload: json.RawMessage(`{}`),
		JobID: "job-9", JobEpoch: 3})
	if err != nil {
		t.Fatal(err)
	}
	log := dedup.NewReplayLog(pool, time.Hour, nil)
	t0 := time.Now()
	log.Add(e.ID, 3, t0)
	log.Add(e.ID, 5, t0.Add(time.Millisecond))
	log.Add(e.ID, 4, t0) // arrived out of order: counted, but not the last
	if err := log.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	log.Add(e.ID, 0, t0.Add(time.Second)) // no job named
	if err := log.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := svc.Effect(ctx, viv, "acme", "k")
	if err != nil {
		t.Fatal(err)
	}
	if d.Replays != 4 || d.LastReplayEpoch != nil || *d.JobID != "job-9" || *d.JobEpoch != 3 {
		t.Fatalf("replays %d, last epoch %v, job %v@%v", d.Replays, d.LastReplayEpoch, *d.JobID, *d.JobEpoch)
	}
	p, err := svc.Effects(ctx, viv, admin.EffectFilter{JobID: "job-9"}, admin.Page{})
	if err != nil || len(p.Effects) != 1 {
		t.Fatalf("effects of job-9: %v %v", p, err)
	}
}

// The trace id of the creating request is kept on the effect, unbatched and batched, and links to Jaeger.
func TestTraceIDOfTheCreatingRequest(t *testing.T) {
	t.Parallel()
	_, pool := newService(t)
	svc := admin.New(admin.Config{DB: pool, JaegerURL: "http://jaeger:16686/"})
	ctx := context.Background()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	tctx := trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid,
		TraceFlags: trace.FlagsSampled}))
	for i, store := range []*dedup.Store{dedup.NewStore(pool), dedup.NewStore(pool).WithGroupCommit(dedup.DefaultGroupCommit)} {
		key := fmt.Sprintf("t%d", i)
		if _, _, err := store.Create(tctx, dedup.NewEffect{Tenant: "acme", Key: key, Type: "hook",
			Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		d, err := svc.Effect(ctx, viv, "acme", key)
		if err != nil || d.TraceID == nil || *d.TraceID != tid.String() || d.TraceURL != "http://jaeger:16686/trace/"+tid.String() {
			t.Fatalf("%s: trace %v, url %q, %v", key, d.TraceID, d.TraceURL, err)
		}
	}
}

// A pending effect whose outbox row a dispatcher leased is delivering (a claim does not rewrite the effect's
// row): the operator's listing, its filters by status and their counts say so, and so do the effects stored as
// delivering (by the dedup proxy, or by gateways before the claim stopped writing it).
func TestALeasedPendingEffectIsListedAsDelivering(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "leased", 2, effect.StatusPending)
	seed(t, pool, "waiting", 3, effect.StatusPending)
	seed(t, pool, "stored", 1, effect.StatusDelivering)
	seed(t, pool, "done", 1, effect.StatusDelivered)
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_outbox (effect_id, type, lease_token, lease_owner, lease_expires_at)
		SELECT id, type, CASE WHEN key LIKE 'waiting%' THEN NULL ELSE gen_random_uuid() END,
		       CASE WHEN key LIKE 'waiting%' THEN NULL ELSE 'gw' END,
		       CASE WHEN key LIKE 'waiting%' THEN NULL ELSE now() + interval '1 minute' END
		FROM oncegate_effects WHERE status <> 'delivered'`); err != nil {
		t.Fatal(err)
	}
	want := map[effect.Status][]string{
		effect.StatusDelivering: {"stored0", "leased1", "leased0"},
		effect.StatusPending:    {"waiting2", "waiting1", "waiting0"},
		effect.StatusDelivered:  {"done0"},
	}
	for status, keys := range want {
		p, err := svc.Effects(ctx, viv, admin.EffectFilter{Status: status}, admin.Page{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range p.Effects {
			got = append(got, e.Key)
			if e.Status != status {
				t.Errorf("%s listed under %s as %s", e.Key, status, e.Status)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(keys) {
			t.Errorf("effects %s: %v, want %v", status, got, keys)
		}
		if n, err := svc.CountEffects(ctx, viv, admin.EffectFilter{Status: status}); err != nil || n != int64(len(keys)) {
			t.Errorf("count of %s: %d (%v), want %d", status, n, err, len(keys))
		}
	}
	e, err := svc.Effect(ctx, viv, "acme", "leased0")
	if err != nil || e.Status != effect.StatusDelivering {
		t.Fatalf("leased0: %+v (%v), want delivering", e, err)
	}
	// Which gateway delivers it, and until when (on-call could not tell; oncegate_outbox had both).
	if e.LeaseOwner == nil || *e.LeaseOwner != "gw" || e.LeaseExpiresAt == nil || time.Until(*e.LeaseExpiresAt) < 30*time.Second {
		t.Fatalf("leased0's lease: owner %v until %v", e.LeaseOwner, e.LeaseExpiresAt)
	}
	if w, err := svc.Effect(ctx, viv, "acme", "waiting0"); err != nil || w.LeaseOwner != nil || w.LeaseExpiresAt != nil {
		t.Fatalf("waiting0 holds no lease: %+v %v", w, err)
	}
}

// An effect's history keeps every series of attempts: a retry or a resolution writes who and why into the
// attempt log and starts a new series, numbered from 1, after the old one (an on-call engineer saw attempts
// 1, 2, 3, 1 with nothing between, and no word of who retried or why).
func TestAttemptHistoryKeepsEverySeries(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "h", 1, effect.StatusDead)
	attempt := func(n int, outcome string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome)
			SELECT id, $1, clock_timestamp(), 'gw-1', $2 FROM oncegate_effects WHERE key = 'h0'`, n, outcome); err != nil {
			t.Fatal(err)
		}
	}
	attempt(1, "retry")
	attempt(2, "failed")
	if _, err := svc.RetryEffect(ctx, alice, "acme", "h0", "smtp relay fixed, INC-7"); err != nil {
		t.Fatal(err)
	}
	attempt(1, "interrupted")
	if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET status = 'unknown' WHERE key = 'h0'`); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.ResolveEffect(ctx, alice, "acme", "h0", admin.ResolveDelivered, "the receiver logged it"); err != nil {
		t.Fatal(err)
	}
	d, err := svc.Effect(ctx, viv, "acme", "h0")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range d.AttemptLog {
		got = append(got, fmt.Sprintf("%d.%d %s %s %s", a.Series, a.Attempt, a.Outcome, a.By, strPtr(a.Error)))
	}
	want := []string{"1.1 retry  ", "1.2 failed  ", "2.0 retried operator alice smtp relay fixed, INC-7",
		"2.1 interrupted  ", "3.0 resolved delivered operator alice the receiver logged it"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("attempt log:\n got %q\nwant %q", got, want)
	}
	if d.DeliveredAt != nil {
		t.Fatalf("a resolution is not a delivery: delivered_at %v", d.DeliveredAt)
	}
}

func strPtr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// The attempt log is in time partitions (migration 00019): an effect whose attempts lie in three of them
// shows them all, in order, and its listing counts the interrupted ones across them.
func TestAttemptHistoryAcrossPartitions(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "p", 1, effect.StatusDead)
	// Now, and two and three days on: the migration's first partition (or today's), and the days' created
	// ahead of them.
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome)
		SELECT id, a, now() + (a - 1) * interval '1 day', 'gw-1',
			CASE WHEN a = 3 THEN 'failed' ELSE 'interrupted' END
		FROM oncegate_effects, (VALUES (1), (3), (4)) AS v (a) WHERE key = 'p0'`); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(DISTINCT tableoid) FROM oncegate_effect_attempts"); n != 3 {
		t.Fatalf("the attempts are in %d partitions, want 3", n)
	}
	d, err := svc.Effect(ctx, viv, "acme", "p0")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range d.AttemptLog {
		got = append(got, fmt.Sprintf("%d %s", a.Attempt, a.Outcome))
	}
	if want := []string{"1 interrupted", "3 failed", "4 interrupted"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("attempt log %q, want %q", got, want)
	}
	if d.Interrupted != 2 {
		t.Fatalf("interrupted %d, want 2", d.Interrupted)
	}
}

// A gateway that stood still past its lease and came back records what its call got after another gateway
// rescued the row and logged that attempt as interrupted, under the same lease token: the history shows the
// late record, saying so, not both (an outside test saw "1 interrupted" and "1 delivered" side by side), and
// the effect counts no interrupted attempt.
func TestALateRecordOfARescuedAttemptReplacesItsInterruptedRow(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "s", 1, effect.StatusDelivered)
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway,
			lease_token, outcome, latency_ms)
		SELECT id, a, now() + s * interval '1 second', g, l::uuid, o, CASE WHEN o <> 'interrupted' THEN 5 END
		FROM oncegate_effects, (VALUES
			(1, 0, 'gw-1', '00000000-0000-0000-0000-00000000000a', 'interrupted'),
			(1, 1, 'gw-1', '00000000-0000-0000-0000-00000000000a', 'delivered'),
			(2, 2, 'gw-2', '00000000-0000-0000-0000-00000000000b', 'delivered')) AS v (a, s, g, l, o)
		WHERE key = 's0'`); err != nil {
		t.Fatal(err)
	}
	d, err := svc.Effect(ctx, viv, "acme", "s0")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range d.AttemptLog {
		got = append(got, fmt.Sprintf("%d %s %s", a.Attempt, a.Outcome, strPtr(a.Error)))
	}
	want := []string{"1 delivered recorded after its lease had run out: another gateway had rescued the row", "2 delivered "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("attempt log %q, want %q", got, want)
	}
	if d.Interrupted != 0 {
		t.Fatalf("interrupted %d, want 0: the attempt's own record came", d.Interrupted)
	}
}

// Effects whose body expired (retention.payloads) cannot be sent again: a bulk retry leaves them out of its
// count as well as its changes, so a run that changed everything it counted is complete (not a partial
// result that automation would run again forever). An adversary's finding: "matched 5, applied 4", exit 5.
func TestBulkRetryLeavesOutEffectsWhoseBodyExpired(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "dead", 5, effect.StatusDead)
	if _, err := pool.Exec(ctx, `UPDATE oncegate_effects SET payload = NULL, legacy_payload = NULL
		WHERE id IN (SELECT id FROM oncegate_effects ORDER BY id LIMIT 2)`); err != nil {
		t.Fatal(err)
	}
	f := admin.EffectFilter{Type: "hook"}
	// A listing says which bodies expired, as effect show does.
	page, err := svc.Effects(ctx, viv, f, admin.Page{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	expired := 0
	for _, e := range page.Effects {
		if e.BodyExpired {
			expired++
		}
	}
	if len(page.Effects) != 5 || expired != 2 {
		t.Fatalf("listed %d effects, %d with their body expired; want 5 and 2", len(page.Effects), expired)
	}
	if n, err := svc.CountRetryable(ctx, viv, f); err != nil || n != 3 {
		t.Fatalf("dry run: %d %v, want the 3 with their payload", n, err)
	}
	res, err := svc.RetryEffects(ctx, alice, f, "receiver fixed", nil)
	if err != nil || res.Matched != 3 || res.Applied != 3 {
		t.Fatalf("bulk retry: %+v %v", res, err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'dead'"); n != 2 {
		t.Fatalf("%d effects left dead, want the 2 whose body expired", n)
	}
}
