package partitions_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/partitions"
)

// effects writes effects made at a past moment straight into the tables, as the gateway would have: the
// effect (its id telling that moment), its key, and a replay counter.
type effects struct {
	t    *testing.T
	pool *pgxpool.Pool
	seq  atomic.Int64
}

type seeded struct {
	at       time.Time
	finished *time.Time // nil: not terminal, with an outbox row
	expires  time.Time  // the key's
}

func (e *effects) add(key string, s seeded) int64 {
	e.t.Helper()
	id := partitions.EffectID(s.at) + e.seq.Add(1)
	status := "delivered"
	if s.finished == nil {
		status = "pending"
	}
	if _, err := e.pool.Exec(context.Background(), `
		WITH e AS (
			INSERT INTO oncegate_effects (id, tenant, key, type, fingerprint, payload, status, created_at, finished_at)
			VALUES ($1, 't', $2, 'typ', '\x00', '{}', $3, $4, $5) RETURNING id
		), k AS (
			INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint, expires_at) VALUES ('t', $2, $1, '\x00', $6)
			ON CONFLICT (tenant, key) DO UPDATE SET effect_id = EXCLUDED.effect_id, expires_at = EXCLUDED.expires_at
		), r AS (
			INSERT INTO oncegate_effect_replays (effect_id, replays, last_replay_at) VALUES ($1, 1, $4)
		)
		INSERT INTO oncegate_outbox (effect_id, type, tenant) SELECT id, 'typ', 't' FROM e WHERE $5::timestamptz IS NULL`,
		id, key, status, s.at, s.finished, s.expires); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// minuteEffects is a database of the test's own whose effects and replays are in minute partitions from ten
// minutes ago, and the moment that was counted from.
func minuteEffects(t *testing.T) (string, *pgxpool.Pool, *effects, time.Time) {
	t.Helper()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	now := time.Now()
	pgtest.Repartition(t, url, time.Minute, now.Add(-10*time.Minute))
	return url, pool, &effects{t: t, pool: pool}, now
}

func partitionOf(t *testing.T, pool *pgxpool.Pool, table string, id int64) string {
	t.Helper()
	var name string
	col := map[bool]string{true: "id", false: "effect_id"}[table == "oncegate_effects"]
	if err := pool.QueryRow(context.Background(), fmt.Sprintf("SELECT tableoid::regclass::text FROM %s WHERE %s = $1",
		table, col), id).Scan(&name); err != nil {
		t.Fatalf("the partition of %s %d: %v", table, id, err)
	}
	return name
}

func exists(t *testing.T, pool *pgxpool.Pool, table string) bool {
	return pgtest.Count(t, pool, "SELECT count(*) FROM pg_class WHERE relname = $1", table) == 1
}

// A partition of effects past retention goes, with its replays' partition, once every effect in it is
// terminal and finished retention ago, and with it the keys that still point at its effects: those keys are
// free. A key claimed again since (pointing at a newer effect) stays. A partition holding an effect still on
// its way (an outbox row), one finished less than retention ago, or one whose key has not expired (a retention
// made shorter since) is kept; it goes at a later pass, once that has changed. Nothing outside the retired
// partitions is touched.
func TestEffectPartitionsGoWithTheirKeysOnceEveryEffectIsPast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	ago := func(d time.Duration) *time.Time { at := now.Add(-d); return &at }

	var gone []int64
	for i := range 20 {
		gone = append(gone, e.add(fmt.Sprintf("gone-%d", i), seeded{at: *ago(9 * time.Minute),
			finished: ago(9 * time.Minute), expires: *ago(6 * time.Minute)}))
	}
	reclaimedOld := e.add("reclaimed", seeded{at: *ago(9 * time.Minute), finished: ago(9 * time.Minute),
		expires: *ago(6 * time.Minute)})
	reclaimedNew := e.add("reclaimed", seeded{at: now, finished: &now, expires: now.Add(3 * time.Minute)})
	straggler := e.add("straggler", seeded{at: *ago(8 * time.Minute), expires: *ago(5 * time.Minute)})
	recent := e.add("recent", seeded{at: *ago(7 * time.Minute), finished: ago(time.Minute), expires: *ago(4 * time.Minute)})
	held := e.add("held", seeded{at: *ago(6 * time.Minute), finished: ago(6 * time.Minute), expires: now.Add(time.Hour)})
	live := e.add("live", seeded{at: now, finished: &now, expires: now.Add(3 * time.Minute)})

	gonePart := partitionOf(t, pool, "oncegate_effects", gone[0])
	goneReplays := partitionOf(t, pool, "oncegate_effect_replays", gone[0])
	if partitionOf(t, pool, "oncegate_effects", reclaimedOld) != gonePart {
		t.Fatal("the seed is wrong: the re-claimed key's old effect is not beside the others")
	}
	kept := map[string]int64{}
	for _, id := range []int64{straggler, recent, held} {
		p := partitionOf(t, pool, "oncegate_effects", id)
		if p == gonePart {
			t.Fatal("the seed is wrong: a kept effect shares the retired partition")
		}
		kept[p] = id
	}
	livePart := partitionOf(t, pool, "oncegate_effects", live)
	effectsBefore := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects")

	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, 0), Interval: time.Minute,
		Retention: 3 * time.Minute})
	rep, err := m.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Dropped, gonePart) || !slices.Contains(rep.Dropped, goneReplays) {
		t.Fatalf("dropped %v: want %s and %s", rep.Dropped, gonePart, goneReplays)
	}
	if exists(t, pool, gonePart) || exists(t, pool, goneReplays) {
		t.Fatalf("%s or %s is still there", gonePart, goneReplays)
	}
	for p := range kept {
		if !slices.Contains(rep.Kept, p) || !exists(t, pool, p) {
			t.Errorf("%s (effect %d) was not kept: kept %v, dropped %v", p, kept[p], rep.Kept, rep.Dropped)
		}
	}
	if exists(t, pool, livePart) == false || slices.Contains(rep.Dropped, livePart) {
		t.Fatalf("the live partition %s went", livePart)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_keys WHERE key LIKE 'gone-%'"); n != 0 {
		t.Fatalf("%d keys of retired effects left", n)
	}
	if rep.Freed != 20 {
		t.Fatalf("freed %d keys, want 20", rep.Freed)
	}
	var points int64
	if err := pool.QueryRow(ctx, "SELECT effect_id FROM oncegate_keys WHERE key = 'reclaimed'").Scan(&points); err != nil ||
		points != reclaimedNew {
		t.Fatalf("the re-claimed key points at %d (%v), want its new effect %d", points, err, reclaimedNew)
	}
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects"); got != effectsBefore-21 {
		t.Fatalf("%d effects left of %d: want the 21 of the retired partition gone, no other", got, effectsBefore)
	}
	for _, k := range []string{"straggler", "recent", "held", "live"} {
		if pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_keys k JOIN oncegate_effects e ON e.id = k.effect_id WHERE k.key = $1", k) != 1 {
			t.Fatalf("the key %s lost its effect", k)
		}
	}

	// The straggler ends, and the held key is re-claimed: their partitions go at the next pass.
	if _, err := pool.Exec(ctx, `WITH o AS (DELETE FROM oncegate_outbox WHERE effect_id = $1)
		UPDATE oncegate_effects SET status = 'delivered', finished_at = now() - interval '4 minutes' WHERE id = $1`,
		straggler); err != nil {
		t.Fatal(err)
	}
	e.add("held", seeded{at: now, finished: &now, expires: now.Add(3 * time.Minute)})
	if rep, err = m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	for p, id := range kept {
		if want := id != recent; slices.Contains(rep.Dropped, p) != want {
			t.Errorf("second pass: %s (effect %d) dropped %v, want %v: dropped %v, kept %v", p, id, !want, want,
				rep.Dropped, rep.Kept)
		}
	}
}

// A manager SIGKILLed while its DETACH ... CONCURRENTLY of a partition of effects waits for a reader leaves
// the partition pending detach, its keys already freed; the next pass finishes the detach, finds no effect
// of it taken up again, and drops it. Every other effect is still there.
func TestAnEffectsDetachKilledMidwayIsFinishedByTheNextPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	at := now.Add(-11 * time.Minute) // the oldest partition's: the first the pass retires
	old := e.add("old", seeded{at: at, finished: &at, expires: at.Add(3 * time.Minute)})
	live := e.add("live", seeded{at: now, finished: &now, expires: now.Add(3 * time.Minute)})
	target := partitionOf(t, pool, "oncegate_effects", old)

	reader, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx) //nolint:errcheck
	var n int
	if err := reader.QueryRow(ctx, "SELECT count(*) FROM oncegate_effects").Scan(&n); err != nil {
		t.Fatal(err)
	}
	child := proctest.ReExec(t, "detach", "DETACH_TABLES=effects",
		"DETACH_DB="+url+"&options=-c%20client_connection_check_interval%3D50&application_name=detach")
	child.WaitLine("ready", 30*time.Second)
	testenv.Eventually(t, 30*time.Second, "the detach is pending", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_inherits WHERE inhrelid = $1::regclass AND inhdetachpending`,
			target) == 1
	})
	child.Kill()
	_ = child.Wait(30 * time.Second)
	testenv.Eventually(t, 10*time.Second, "the killed process's backend ends", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'detach'`) == 0
	})
	if pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_keys WHERE key = 'old'") != 0 {
		t.Fatal("the keys were not freed before the detach")
	}
	if err := reader.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, 0),
		Interval: time.Minute, Retention: 3 * time.Minute}).Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Finalized, target) || !slices.Contains(rep.Dropped, target) || exists(t, pool, target) {
		t.Fatalf("next pass: finalized %v, dropped %v; want %s in both, and gone", rep.Finalized, rep.Dropped, target)
	}
	if pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE id = $1", live) != 1 {
		t.Fatal("the live effect went")
	}
}

// A reader that holds the effects table for longer than a pass makes the pass's detach time out (and a
// later pass's FINALIZE of it), yet the pass still makes the partitions ahead, of every table: inserts need
// them, and retiring can wait for the reader.
func TestAReaderHoldingTheEffectsDoesNotStopPartitionsAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	at := now.Add(-9 * time.Minute)
	e.add("old", seeded{at: at, finished: &at, expires: at.Add(time.Minute)})

	pgtest.Reader(t, pool, "oncegate_effects")
	// Ten minutes on: every table needs new partitions, and old ones are past retention.
	later := now.Add(10 * time.Minute)
	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, 0), Interval: time.Minute,
		Retention: 3 * time.Minute, Retries: 1, Now: func() time.Time { return later }})
	for pass := range 2 { // the second, five minutes on, meets the first's pending detach
		rep, err := m.Pass(ctx)
		later = later.Add(5 * time.Minute)
		if err == nil {
			t.Fatalf("pass %d: the detach did not wait for the reader", pass)
		}
		// Its second transaction timed out waiting for the reader, and the partition is pending detach: a
		// retry of DETACH ... CONCURRENTLY is refused as "already pending detach", which is FINALIZE's to
		// finish (an outside tester saw that error, not the lock's).
		if strings.Contains(err.Error(), "already pending detach") {
			t.Fatalf("pass %d: %v; the retry of a pending detach is its FINALIZE", pass, err)
		}
		{
			for _, tbl := range []partitions.Table{partitions.Effects, partitions.Replays} { // repartitioned by the minute
				if !slices.ContainsFunc(rep.Created, func(n string) bool { return strings.HasPrefix(n, tbl.Name+"_p") }) {
					t.Fatalf("pass %d made no partition ahead of %s: created %v (%v)", pass, tbl.Name, rep.Created, err)
				}
			}
		}
		if len(rep.Short) > 0 {
			t.Fatalf("pass %d left %v short of partitions", pass, rep.Short)
		}
	}
}

// The keys of a partition being retired stay, and keep the partition, when their effect is in use again: an
// operator retried it (an outbox row), or it was retried and delivered less than retention ago. A request
// under such a key must find its effect, not make a new one.
func TestKeysOfEffectsInUseAgainAreNotFreed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	at := now.Add(-9 * time.Minute)
	retried := e.add("retried", seeded{at: at, expires: at.Add(time.Minute)}) // an outbox row
	delivered := e.add("delivered-again", seeded{at: at, finished: &now, expires: at.Add(time.Minute)})
	part := partitionOf(t, pool, "oncegate_effects", retried)
	if partitionOf(t, pool, "oncegate_effects", delivered) != part {
		t.Fatal("the seed is wrong")
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, held, err := dedup.FreePartitionKeys(ctx, conn, part, 3*time.Minute)
	if err != nil || !held {
		t.Fatalf("freeing the keys: held %v, %v; want held", held, err)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_keys WHERE key IN ('retried', 'delivered-again')"); n != 2 {
		t.Fatalf("%d of the 2 keys in use left", n)
	}
}

// A partition of effects detached and not dropped (the manager killed between the two) in which an effect is
// on its way again is attached back into the gap it left by the next pass, not dropped.
func TestADetachedPartitionWithAnEffectInUseIsAttachedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	at := now.Add(-9 * time.Minute)
	id := e.add("retried", seeded{at: at, expires: at.Add(time.Minute)}) // an outbox row
	part := partitionOf(t, pool, "oncegate_effects", id)
	if _, err := pool.Exec(ctx, "ALTER TABLE oncegate_effects DETACH PARTITION "+part); err != nil {
		t.Fatal(err)
	}
	rep, err := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, 0),
		Interval: time.Minute, Retention: 3 * time.Minute}).Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(rep.Dropped, part) || !slices.Contains(rep.Kept, part) {
		t.Fatalf("dropped %v, kept %v: want %s kept", rep.Dropped, rep.Kept, part)
	}
	if pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE id = $1", id) != 1 {
		t.Fatal("the effect on its way is not readable through its table")
	}
}

// Keys are freed without a lock taken first (a lock was half the WAL of a freed key): a key re-claimed by a
// create while its partition's keys are being freed, its transaction open when the delete comes, stays,
// pointing at its new effect. The delete waits for the create, finds the key's newer version, whose expiry
// is ahead, and leaves it. The other keys of the partition are freed.
func TestAKeyReclaimedWhileItsPartitionsKeysAreFreedStays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	at := now.Add(-9 * time.Minute)
	for i := range 20 {
		e.add(fmt.Sprint("old-", i), seeded{at: at, finished: &at, expires: at.Add(time.Minute)})
	}
	old := e.add("reclaimed", seeded{at: at, finished: &at, expires: at.Add(time.Minute)})
	part := partitionOf(t, pool, "oncegate_effects", old)

	create, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer create.Rollback(ctx) //nolint:errcheck
	newID := partitions.EffectID(now) + 1_000_000
	if _, err := create.Exec(ctx, `UPDATE oncegate_keys SET effect_id = $1, expires_at = now() + interval '3 minutes'
		WHERE tenant = 't' AND key = 'reclaimed'`, newID); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	type freed struct {
		n    int64
		held bool
		err  error
	}
	done := make(chan freed, 1)
	go func() {
		n, held, err := dedup.FreePartitionKeys(ctx, conn, part, 3*time.Minute)
		done <- freed{n, held, err}
	}()
	testenv.Eventually(t, 10*time.Second, "the delete waits for the create", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND datname = current_database()`) > 0
	})
	if err := create.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.n != 20 {
		t.Fatalf("freed %d (held %v, %v); want the 20 others", r.n, r.held, r.err)
	}
	var points int64
	if err := pool.QueryRow(ctx, "SELECT effect_id FROM oncegate_keys WHERE tenant = 't' AND key = 'reclaimed'").Scan(&points); err != nil || points != newID {
		t.Fatalf("the re-claimed key: %d, %v; want it kept, pointing at %d", points, err, newID)
	}
}

// An effect retried after its partition's keys were freed (an operator's bulk retry picks effects, not keys,
// and can land while a day of keys is being freed) gets its key back when the partition is kept for it: a
// request under the key then finds the effect on its way, not a free key that would make a second one. A key
// taken by a new effect meanwhile stays the new one's.
func TestKeysOfEffectsRetriedAfterTheirKeysWereFreedArePutBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	at := now.Add(-9 * time.Minute)
	retried := e.add("retried", seeded{at: at, finished: &at, expires: at.Add(time.Minute)})
	e.add("taken", seeded{at: at, finished: &at, expires: at.Add(time.Minute)})
	takenOld := partitions.EffectID(at) + e.seq.Load()
	part := partitionOf(t, pool, "oncegate_effects", retried)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if n, held, err := dedup.FreePartitionKeys(ctx, conn, part, 3*time.Minute); err != nil || held || n != 2 {
		t.Fatalf("freeing the keys: %d, held %v, %v", n, held, err)
	}
	// Both effects retried by an operator (by id); one key taken by a new request meanwhile.
	if _, err := pool.Exec(ctx, `WITH o AS (INSERT INTO oncegate_outbox (effect_id, type, tenant) VALUES ($1, 'typ', 't'), ($2, 'typ', 't'))
		UPDATE oncegate_effects SET status = 'pending', finished_at = NULL WHERE id IN ($1, $2)`, retried, takenOld); err != nil {
		t.Fatal(err)
	}
	newer := e.add("taken", seeded{at: now, finished: &now, expires: now.Add(3 * time.Minute)})

	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, 0),
		Interval: time.Minute, Retention: 3 * time.Minute})
	rep, err := m.Pass(ctx)
	if err != nil || !slices.Contains(rep.Kept, part) {
		t.Fatalf("kept %v (%v): want %s", rep.Kept, err, part)
	}
	for key, want := range map[string]int64{"retried": retried, "taken": newer} {
		var got int64
		if err := pool.QueryRow(ctx, "SELECT effect_id FROM oncegate_keys WHERE tenant = 't' AND key = $1", key).Scan(&got); err != nil || got != want {
			t.Fatalf("key %s points at %d (%v), want %d", key, got, err, want)
		}
	}
	store := dedup.NewStore(pool)
	got, replayed, err := store.Create(ctx, dedup.NewEffect{Tenant: "t", Key: "retried", Type: "typ", Payload: []byte(`{}`)})
	if err == nil && !replayed {
		t.Fatalf("a request under the retried effect's key made a new effect %d", got.ID)
	}
	if err == nil && got.ID != retried {
		t.Fatalf("a request under the retried effect's key found %d, want %d", got.ID, retried)
	}
}

// A pass attaches the partitions it makes ahead, for every table, in one transaction. Each ATTACH makes
// every connection plan again each statement that reads its table (a generic plan names every partition):
// 2 to 10 ms of Postgres's CPU a statement, and accepts whose bind took 15 to 50 ms in `scripts/bench
// retention`. Four tables attached one after the other sent four such waves a pass, a few ms apart; one
// commit sends one.
func TestAPassAttachesEveryTablesPartitionsAheadInOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, _, now := minuteEffects(t)
	later := now.Add(5 * time.Minute)
	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, time.Minute),
		Interval: time.Minute, Retention: time.Hour, Now: func() time.Time { return later }})
	rep, err := m.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string]bool{}
	for _, n := range rep.Created {
		tables[n[:strings.LastIndex(n, "_p")]] = true
	}
	if len(tables) < 3 {
		t.Fatalf("the pass made partitions of %v only; the test wants three tables at least", rep.Created)
	}
	if n := pgtest.Count(t, pool, "SELECT count(DISTINCT xmin::text) FROM pg_class WHERE relname = ANY ($1)", rep.Created); n != 1 {
		t.Fatalf("the %d partitions made ahead (%v) were attached by %d transactions, not one", len(rep.Created), rep.Created, n)
	}
}

// One table whose partitions cannot be made must not leave the others without theirs: an insert into them
// needs them. A table in the way of a name the replays' partitions need fails that table's creates; the
// effects' and the bodies' are made all the same, and the error names the replays'.
func TestATableWhosePartitionsCannotBeMadeLeavesTheOthersTheirs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, _, now := minuteEffects(t)
	later := now.Add(5 * time.Minute)
	inTheWay := newestAhead("oncegate_effect_replays", later)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{inTheWay}.Sanitize()+" (x int)"); err != nil {
		t.Fatal(err)
	}
	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, time.Minute),
		Interval: time.Minute, Retention: time.Hour, Retries: 1, Now: func() time.Time { return later }})
	rep, err := m.Pass(ctx)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("the pass's error: %v; want the replays' partition that could not be made", err)
	}
	madeAhead(t, rep, later, "oncegate_effects", "oncegate_effect_bodies")
	// The replays' newest partition ends before the present (the clock moved five minutes on): said, so that
	// the gateway logs it as an error, not only the pass's failure, every pass.
	if !slices.Equal(rep.Short, []string{"oncegate_effect_replays"}) {
		t.Errorf("short of partitions: %v; want the replays", rep.Short)
	}
}

// A table is taken for a partition the manager detached and did not drop only by a name it gives its
// partitions (table_pYYYYMMDDtHHMMSS): an outside tester's backups, `oncegate_effects_pre_upgrade` (a copy
// of the effects) and `oncegate_effect_replays_pg_backup`, were dropped within seconds by a pass that took
// every unattached table named like `table_p%` for its own.
func TestTablesNamedLikePartitionsAreNotDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	at := now.Add(-2 * time.Minute)
	e.add("copied", seeded{at: at, finished: &at, expires: at.Add(time.Minute)})
	theirs := []string{"oncegate_effects_pre_upgrade", "oncegate_effect_replays_pg_backup", "oncegate_effect_bodies_p",
		"oncegate_effect_attempts_p2026", "oncegate_effects_p20261206t113400_copy",
		"oncegate_effects_p20260101t000000.5", "oncegate_effects_p20260101t000000,5"} // a second tester's
	for _, n := range theirs {
		if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{n}.Sanitize()+" AS SELECT 1 AS x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "DROP TABLE oncegate_effects_pre_upgrade; CREATE TABLE oncegate_effects_pre_upgrade AS SELECT * FROM oncegate_effects"); err != nil {
		t.Fatal(err)
	}
	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, time.Minute),
		Interval: time.Minute, Retention: time.Hour, Now: func() time.Time { return now }})
	rep, err := m.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range theirs {
		if !exists(t, pool, n) {
			t.Errorf("%s, not a name the manager gives, was dropped (dropped: %v)", n, rep.Dropped)
		}
	}
}

// A lock held on one table (an operator's, an index build) holds back that table's partitions ahead, not the
// others': the pass's one transaction is tried once, and each table's own then waits for its lock with the
// retries. With the retries in the one transaction, an outside tester's lock on the replays held back the
// effects' partitions 9.5 s a pass, and accepts failed once the newest ended.
func TestALockOnOneTableHoldsBackOnlyItsPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, _, now := minuteEffects(t)
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, "LOCK TABLE oncegate_effect_replays IN SHARE UPDATE EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	later := now.Add(5 * time.Minute)
	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, time.Minute),
		Interval: time.Minute, Retention: time.Hour, Retries: 8, Now: func() time.Time { return later }})
	rep, err := m.Pass(ctx)
	if err == nil || !strings.Contains(err.Error(), "lock timeout") {
		t.Fatalf("the pass's error: %v; want the replays' lock timeout", err)
	}
	var creates []partitions.Step
	for _, st := range rep.Steps {
		if st.Kind == "create" {
			creates = append(creates, st)
		}
	}
	if len(creates) < 2 || !strings.Contains(creates[0].Table, ",") || creates[1].Table != "oncegate_effects" {
		t.Fatalf("create steps %+v: want the one transaction of every table, then the effects' alone", creates)
	}
	// Eight retries with backoff take over 4 s; one try, a lock_timeout (100 ms).
	if creates[0].Took > 2*time.Second {
		t.Errorf("the one transaction of every table took %v: it waited for the lock with the retries", creates[0].Took)
	}
	madeAhead(t, rep, later, "oncegate_effects", "oncegate_effect_bodies")
}

// A table whose partitions ahead cannot be made does not hold off retirement: a second outside tester's view
// in the way of a bodies partition's name stopped every table's retirement, and the effects and their keys
// past retention stayed, while only the error log said why.
func TestPartitionsThatCannotBeMadeAheadDoNotHoldOffRetirement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	at := now.Add(-9 * time.Minute)
	old := e.add("old", seeded{at: at, finished: &at, expires: at.Add(time.Minute)})
	part := partitionOf(t, pool, "oncegate_effects", old)
	later := now.Add(5 * time.Minute)
	if _, err := pool.Exec(ctx, "CREATE VIEW "+pgx.Identifier{newestAhead("oncegate_effect_bodies", later)}.Sanitize()+" AS SELECT 1 AS a"); err != nil {
		t.Fatal(err)
	}
	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, time.Minute),
		Interval: time.Minute, Retention: 3 * time.Minute, Now: func() time.Time { return later }})
	rep, err := m.Pass(ctx)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("the pass's error: %v; want the bodies' partition that could not be made", err)
	}
	if !slices.Contains(rep.Dropped, part) || exists(t, pool, part) {
		t.Fatalf("%s, past retention, was not retired (dropped %v)", part, rep.Dropped)
	}
}

// newestAhead is the name of table's partition that a pass at now makes last, three minutes ahead.
func newestAhead(table string, now time.Time) string {
	return table + "_p" + now.UTC().Truncate(time.Minute).Add(3*time.Minute).Format("20060102t150405")
}

// madeAhead fails the test unless the pass at now made each table's partitions up to three minutes ahead.
func madeAhead(t *testing.T, rep partitions.Report, now time.Time, tables ...string) {
	t.Helper()
	for _, tbl := range tables {
		if !slices.Contains(rep.Created, newestAhead(tbl, now)) {
			t.Errorf("%s has no partition up to three minutes ahead: created %v", tbl, rep.Created)
		}
	}
}

// The replays' and attempts' partitions of a range wait while its effects' partition could not be retired:
// their Keep asks whether an effect of the range is stored, and an effects' partition pending detach is
// invisible to that question, though its effects are still there (and go back if one is retried). An outside
// tester saw a pass whose FINALIZE timed out behind a reader drop the replays' partition of that very range.
// The pass reports as finalized only a detach it finished.
func TestTablesAfterAnEffectsPartitionThatCouldNotGoWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool, e, now := minuteEffects(t)
	// The effect's partition is [base-7m, base-6m); a first pass whose horizon is its lower bound retires every
	// partition before it, so that it is the oldest when the reader holds the table.
	base := now.Truncate(time.Minute)
	at := base.Add(-7*time.Minute + time.Second)
	id := e.add("old", seeded{at: at, finished: &at, expires: at.Add(time.Minute)})
	replays := partitionOf(t, pool, "oncegate_effect_replays", id)
	later := base.Add(-4 * time.Minute)
	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, 0),
		Interval: time.Minute, Retention: 3 * time.Minute, Retries: 1, Now: func() time.Time { return later }})
	if _, err := m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if !exists(t, pool, partitionOf(t, pool, "oncegate_effects", id)) || !exists(t, pool, replays) {
		t.Fatal("the first pass retired the effect's partitions")
	}

	reader := pgtest.Reader(t, pool, "oncegate_effects")
	later = now.Add(10 * time.Minute)
	for pass := range 2 {
		rep, err := m.Pass(ctx)
		later = later.Add(5 * time.Minute)
		if err == nil {
			t.Fatalf("pass %d: the detach did not wait for the reader", pass)
		}
		if !exists(t, pool, replays) {
			t.Fatalf("pass %d dropped %s while its effects' partition was pending detach (dropped %v)", pass,
				replays, rep.Dropped)
		}
		if len(rep.Finalized) > 0 {
			t.Fatalf("pass %d reports %v finalized; its FINALIZE timed out", pass, rep.Finalized)
		}
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := m.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if exists(t, pool, replays) {
		t.Fatalf("once the reader was gone, the pass kept %s (dropped %v)", replays, rep.Dropped)
	}
}

// A new database's first partitions are the migrations', which run to the start of the day after tomorrow
// whatever the interval (an outside tester could not rehearse minute partitions and retention on a database
// of their own for two days). A manager gives each table that holds no row yet partitions of its interval at
// once, from the interval before the present one; a table with a row keeps its partitions, which end in their
// time. Rows go into the new partitions.
func TestAnEmptyTableTakesTheIntervalAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	now := time.Now()
	e := &effects{t: t, pool: pool}
	written := e.add("written", seeded{at: now, finished: &now, expires: now.Add(time.Hour)}) // effects and replays
	holds := partitionOf(t, pool, partitions.Effects.Name, written)
	m := manager(t, url, partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys,
		dedup.RestorePartitionKeys, time.Minute), Interval: time.Minute, Retention: 3 * time.Minute,
		Now: func() time.Time { return now }})
	if _, err := m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	// The partition holding the row is the migration's still, longer than any interval: its bounds depend on
	// when the template database was migrated (its upper bound is the day after that day's tomorrow), not on
	// now, so they are not compared with now (a run after midnight found less than a day left).
	kept := false
	for _, b := range bounds(t, pool, partitions.Effects) {
		kept = kept || b.name == holds && (b.lower == nil || b.upper.Sub(*b.lower) > time.Hour)
	}
	if p := partitionOf(t, pool, partitions.Effects.Name, written); p != holds || !kept {
		t.Errorf("the effects, which hold a row, were given other partitions: %v", bounds(t, pool, partitions.Effects))
	}
	floor := now.UTC().Truncate(time.Minute)
	for _, table := range []partitions.Table{partitions.Bodies, partitions.Attempts} {
		ps := bounds(t, pool, table)
		if len(ps) < 3 || ps[0].lower == nil || !ps[0].lower.Equal(floor.Add(-time.Minute)) ||
			ps[len(ps)-1].upper.Before(floor.Add(3*time.Minute)) {
			t.Fatalf("%s, empty, has %d partitions from %v to %v; want minutes from %v to 3 minutes ahead at least",
				table.Name, len(ps), ps[0].lower, ps[len(ps)-1].upper, floor.Add(-time.Minute))
		}
		for _, p := range ps {
			if p.upper.Sub(*p.lower) != time.Minute {
				t.Errorf("%s: partition %s runs from %v to %v", table.Name, p.name, p.lower, p.upper)
			}
		}
	}
	id := partitions.EffectID(now) + 1000
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_effect_bodies (effect_id, tenant, payload) VALUES ($1, 't', '{}')`, id); err != nil {
		t.Fatalf("a body of the present: %v", err)
	}
	if p := partitionOf(t, pool, partitions.Bodies.Name, id); p != partitions.Bodies.Name+"_p"+floor.Format("20060102t150405") {
		t.Errorf("the body went into %s", p)
	}
	// The next pass leaves a table with a row as it is, though its partition is still longer than the interval.
	bodies := fmt.Sprint(bounds(t, pool, partitions.Bodies))
	rep, err := m.Pass(ctx)
	if err != nil || len(rep.Dropped) != 0 || bodies != fmt.Sprint(bounds(t, pool, partitions.Bodies)) {
		t.Fatalf("second pass: dropped %v, %v; the bodies' partitions went from %v to %v", rep.Dropped, err,
			bodies, bounds(t, pool, partitions.Bodies))
	}
}

// bounds lists a table's partitions as list does, reading an effect id's bound as the time it tells.
func bounds(t *testing.T, pool *pgxpool.Pool, table partitions.Table) []part {
	t.Helper()
	return listBounds(t, pool, table.Name, table.ByEffectID)
}

func (p part) String() string {
	at := func(t *time.Time) string {
		if t == nil {
			return "unbounded"
		}
		return t.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%s [%s, %s) pending %v", p.name, at(p.lower), at(p.upper), p.pending)
}
