package partitions_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/testkit/leaktest"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/partitions"
)

func TestMain(m *testing.M) {
	if proctest.Role() == "detach" {
		os.Exit(detachProcess())
	}
	leaktest.Main(m)
}

// events is a table partitioned as the attempt log is, without a Keep query: the manager's own behaviour.
var events = partitions.Table{Name: "events"}

// eventsDB is a database of the test's own with an empty events table, and partitions made for [from,
// from + 4 minutes) in one-minute intervals.
func eventsDB(t *testing.T, from time.Time) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	if _, err := pool.Exec(ctx, `CREATE TABLE events (id bigint GENERATED ALWAYS AS IDENTITY, at timestamptz NOT NULL,
		v int) PARTITION BY RANGE (at); CREATE INDEX events_v ON events (v)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := partitions.Ensure(ctx, conn, events, time.Minute, 3, from); err != nil {
		t.Fatal(err)
	}
	return url, pool
}

type part struct {
	name         string
	pending      bool
	lower, upper *time.Time
}

func list(t *testing.T, pool *pgxpool.Pool, table string) []part {
	t.Helper()
	return listBounds(t, pool, table, false)
}

// listBounds lists a table's partitions, oldest first; byID: its bounds are effect ids, read as the times
// they tell.
func listBounds(t *testing.T, pool *pgxpool.Pool, table string, byID bool) []part {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname::text, i.inhdetachpending,
		CASE WHEN $2 THEN to_timestamp(1735689600 + (lo::bigint >> 22)) ELSE lo::timestamptz END,
		CASE WHEN $2 THEN to_timestamp(1735689600 + (hi::bigint >> 22)) ELSE hi::timestamptz END AS upper
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		CROSS JOIN LATERAL (SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1],
			(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]) AS b (lo, hi)
		WHERE i.inhparent = $1::regclass ORDER BY upper`, table, byID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ps []part
	for rows.Next() {
		var p part
		if err := rows.Scan(&p.name, &p.pending, &p.lower, &p.upper); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

func manager(t *testing.T, url string, cfg partitions.Config) *partitions.Manager {
	t.Helper()
	// A database_url's pool settings are not sent to the server.
	cfg.ConnString = url + map[bool]string{true: "&", false: "?"}[strings.Contains(url, "?")] + "pool_max_conns=4"
	if cfg.Tables == nil {
		cfg.Tables = []partitions.Table{events}
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Retention == 0 {
		cfg.Retention = 3 * time.Minute
	}
	m, err := partitions.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// A pass creates the partitions that cover the present and Ahead intervals past it (Ahead+1 in the second
// half of an interval), contiguous, each one interval long on whole minutes; the gap since the newest
// partition's end is one partition. Another pass
// creates nothing.
func TestPartitionsAreCreatedAhead(t *testing.T) {
	t.Parallel()
	now := time.Now().Truncate(time.Minute).Add(10 * time.Second) // in the first half of its minute
	url, pool := eventsDB(t, now.Add(-30*time.Minute))
	m := manager(t, url, partitions.Config{Ahead: 3, Retention: time.Hour, Now: func() time.Time { return now }})
	rep, err := m.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ps := list(t, pool, "events")
	floor := now.UTC().Truncate(time.Minute)
	if last := ps[len(ps)-1]; !last.upper.Equal(floor.Add(4 * time.Minute)) {
		t.Fatalf("the newest partition ends at %v, want %v (the present minute and 3 ahead)", last.upper, floor.Add(4*time.Minute))
	}
	for i := 1; i < len(ps); i++ {
		if !ps[i].lower.Equal(*ps[i-1].upper) {
			t.Fatalf("partitions %s and %s are not contiguous", ps[i-1].name, ps[i].name)
		}
		if ps[i].lower.Before(floor) && !ps[i].upper.Equal(floor) && !(ps[i].upper.Sub(*ps[i].lower) == time.Minute) {
			t.Fatalf("partition %s: %v to %v", ps[i].name, ps[i].lower, ps[i].upper)
		}
	}
	if len(rep.Created) != 5 || len(rep.Short) != 0 { // the gap, the present minute, 3 ahead
		t.Fatalf("created %v, short %v", rep.Created, rep.Short)
	}
	if _, err := pool.Exec(context.Background(), "INSERT INTO events (at, v) VALUES ($1, 1), ($1::timestamptz + interval '3 minutes', 2)", now); err != nil {
		t.Fatalf("insert into the present and 3 minutes ahead: %v", err)
	}
	rep, err = m.Pass(context.Background())
	if err != nil || len(rep.Created) != 0 {
		t.Fatalf("second pass: created %v, %v", rep.Created, err)
	}
	// In the second half of the minute the next partition ahead is made, half a minute early: away from the
	// retirements, which come at a minute's start, so that the two waves of plans made again do not meet.
	now = now.Add(30 * time.Second)
	rep, err = m.Pass(context.Background())
	if err != nil || len(rep.Created) != 1 {
		t.Fatalf("a pass half a minute later: created %v, %v; want one partition", rep.Created, err)
	}
	if ps := list(t, pool, "events"); !ps[len(ps)-1].upper.Equal(floor.Add(5 * time.Minute)) {
		t.Fatalf("half a minute later the newest partition ends at %v, want %v", ps[len(ps)-1].upper, floor.Add(5*time.Minute))
	}
}

// Partitions whose whole range is past retention are detached and dropped while rows go on being inserted
// into the live ones, from eight connections: no insert fails, and every row inserted is there after.
func TestOldPartitionsAreDroppedUnderConcurrentInserts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now()
	url, pool := eventsDB(t, now.Add(-10*time.Minute))
	if _, err := pool.Exec(ctx, "INSERT INTO events (at, v) SELECT $1::timestamptz + i * interval '1 second', -1 FROM generate_series(0, 239) i",
		now.Add(-10*time.Minute).Truncate(time.Minute)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := partitions.Ensure(ctx, conn, events, time.Minute, 3, now); err != nil {
		t.Fatal(err)
	}
	old := list(t, pool, "events")
	m := manager(t, url, partitions.Config{})

	var inserted, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Reads of the parent too: each holds locks on every partition while it runs.
				if _, err := pool.Exec(ctx, "INSERT INTO events (at, v) VALUES (now(), 1)"); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				inserted.Add(1)
				var n int
				_ = pool.QueryRow(ctx, "SELECT count(*) FROM events WHERE v = 7").Scan(&n)
			}
		})
	}
	testenv.Eventually(t, 10*time.Second, "inserts run", func() bool { return inserted.Load() > 50 })
	rep, err := m.Pass(ctx)
	for inserted.Load() < 2*50 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if failed.Load() > 0 {
		t.Fatalf("%d inserts failed during the pass, the first: %v", failed.Load(), firstErr.Load())
	}
	horizon := now.Add(-3 * time.Minute)
	var want []string
	for _, p := range old {
		if !p.upper.After(horizon) {
			want = append(want, p.name)
		}
	}
	if len(want) == 0 || !slices.Equal(rep.Dropped, want) {
		t.Fatalf("dropped %v, want %v (of %d partitions)", rep.Dropped, want, len(old))
	}
	for _, name := range want {
		if pgtest.Count(t, pool, "SELECT count(*) FROM pg_class WHERE relname = $1", name) != 0 {
			t.Fatalf("%s is still there", name)
		}
	}
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM events WHERE v = 1"); int64(got) != inserted.Load() {
		t.Fatalf("%d rows in the live partitions, %d inserted", got, inserted.Load())
	}
	if got := pgtest.Count(t, pool, "SELECT count(*) FROM events WHERE v = -1"); got != 0 {
		t.Fatalf("%d old rows left", got)
	}
}

// Two managers at once: only the one holding the lock works; when it stops, the other takes over.
func TestOneManagerAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := eventsDB(t, time.Now())
	a := manager(t, url, partitions.Config{})
	b := manager(t, url, partitions.Config{})
	if _, err := a.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Pass(ctx); !errors.Is(err, partitions.ErrNotHeld) {
		t.Fatalf("a second manager's pass: %v, want ErrNotHeld", err)
	}
	if _, err := a.Pass(ctx); err != nil {
		t.Fatalf("the first one's next pass: %v", err)
	}
	a.Close()
	// Postgres lets go of a closed session's lock once its backend has ended, a moment after.
	var err error
	testenv.Eventually(t, 10*time.Second, "the second one takes over", func() bool {
		_, err = b.Pass(ctx)
		return err == nil
	})
}

// A manager SIGKILLed while its DETACH ... CONCURRENTLY waits for a reader of the table leaves the partition
// pending detach; once the reader is done, the next pass finishes the detach and drops the partition.
func TestADetachKilledMidwayIsFinishedByTheNextPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now()
	url, pool := eventsDB(t, now.Add(-10*time.Minute))
	oldest := list(t, pool, "events")[0].name

	// A reader holds the table: the detach's second transaction waits for it.
	reader, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx) //nolint:errcheck
	var n int
	if err := reader.QueryRow(ctx, "SELECT count(*) FROM events").Scan(&n); err != nil {
		t.Fatal(err)
	}
	// The child's backend notices its client is gone while it waits (as a server with the setting does), so
	// the kill leaves the detach pending rather than finished by an orphaned backend.
	child := proctest.ReExec(t, "detach", "DETACH_DB="+url+"&options=-c%20client_connection_check_interval%3D50&application_name=detach")
	child.WaitLine("ready", 30*time.Second)
	testenv.Eventually(t, 30*time.Second, "the detach is pending", func() bool {
		ps := list(t, pool, "events")
		return len(ps) > 0 && ps[0].name == oldest && ps[0].pending
	})
	child.Kill()
	_ = child.Wait(30 * time.Second)
	testenv.Eventually(t, 10*time.Second, "the killed process's backend ends", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'detach'`) == 0
	})
	if ps := list(t, pool, "events"); ps[0].name != oldest || !ps[0].pending {
		t.Fatalf("after the kill, the oldest partition is %s pending %v; want %s pending", ps[0].name, ps[0].pending, oldest)
	}
	if err := reader.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := manager(t, url, partitions.Config{}).Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Finalized, oldest) || !slices.Contains(rep.Dropped, oldest) {
		t.Fatalf("next pass: finalized %v, dropped %v; want %s in both", rep.Finalized, rep.Dropped, oldest)
	}
	if pgtest.Count(t, pool, "SELECT count(*) FROM pg_class WHERE relname = $1", oldest) != 0 {
		t.Fatalf("%s is still there", oldest)
	}
}

// detachProcess is a manager in a process of its own, which waits as long as it takes for its locks: of the
// events table, or of the gateway's tables when DETACH_TABLES is "effects".
func detachProcess() int {
	url := os.Getenv("DETACH_DB")
	if !strings.Contains(url, "?") {
		url = strings.Replace(url, "&", "?", 1)
	}
	tables := []partitions.Table{events}
	if os.Getenv("DETACH_TABLES") == "effects" {
		tables = partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, 0)
	}
	m, err := partitions.New(partitions.Config{ConnString: url, Tables: tables,
		Interval: time.Minute, Retention: 3 * time.Minute, LockTimeout: 10 * time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	_, err = m.Pass(context.Background())
	fmt.Fprintln(os.Stderr, "pass ended:", err)
	return 0
}

// A partition of the attempt log past retention is kept while an attempt in it is of an effect still
// stored (one still retrying, or finished less than retention ago), and dropped once the purge has deleted
// that effect: the attempts of an effect stay as long as it does.
func TestAttemptsOfAStoredEffectKeepTheirPartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	var effect int64
	if err := pool.QueryRow(ctx, `INSERT INTO oncegate_effects (tenant, key, type, payload, fingerprint, status)
		VALUES ('t', 'k', 'typ', '{}', '\x00', 'pending') RETURNING id`).Scan(&effect); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome)
		VALUES ($1, 1, now(), 'g', 'retry'), ($1 + 1000, 1, now(), 'g', 'delivered')`, effect); err != nil {
		t.Fatal(err)
	}
	var oldest string // the migration's, up to the day after tomorrow, or today's when the template is older
	if err := pool.QueryRow(ctx, "SELECT tableoid::regclass::text FROM oncegate_effect_attempts WHERE effect_id = $1",
		effect).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	// A week on, with a day of retention: every partition there is now is past it.
	later := time.Now().Add(7 * 24 * time.Hour)
	m := manager(t, url, partitions.Config{Tables: []partitions.Table{partitions.Attempts}, Interval: 24 * time.Hour,
		Retention: 24 * time.Hour, Now: func() time.Time { return later }})
	rep, err := m.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Kept, oldest) || slices.Contains(rep.Dropped, oldest) {
		t.Fatalf("kept %v, dropped %v: want %s kept", rep.Kept, rep.Dropped, oldest)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM oncegate_effects WHERE id = $1", effect); err != nil {
		t.Fatal(err)
	}
	if rep, err = m.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Dropped, oldest) {
		t.Fatalf("after the purge: kept %v, dropped %v: want %s dropped", rep.Kept, rep.Dropped, oldest)
	}
}

// A manager runs passes only with the fleet's partition settings: a gateway started with another interval
// (an outside tester's, with the default day, beside a fleet of minutes, made a partition of 15 hours that
// the fleet then filled) makes and retires nothing while a gateway alive runs with the fleet's, and takes
// them over once none does: a rolling change of settings takes effect when the last old gateway is gone.
func TestAManagerWithOtherSettingsLeavesPartitionsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	if _, err := pool.Exec(ctx, `CREATE TABLE events (at timestamptz NOT NULL) PARTITION BY RANGE (at)`); err != nil {
		t.Fatal(err)
	}
	beat := func(id, settings string, ago time.Duration) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO oncegate_gateways (id, started_at, last_seen, partition_settings)
			VALUES ($1, now(), now() - make_interval(secs => $3), $2)
			ON CONFLICT (id) DO UPDATE SET last_seen = EXCLUDED.last_seen, partition_settings = EXCLUDED.partition_settings`,
			id, settings, ago.Seconds()); err != nil {
			t.Fatal(err)
		}
	}
	minutes := partitions.Config{Interval: time.Minute, Fleet: true, Owner: "gw-1"}
	days := partitions.Config{Interval: 24 * time.Hour, Retention: 72 * time.Hour, Fleet: true, Owner: "gw-2"}
	m1, m2 := manager(t, url, minutes), manager(t, url, days)
	if _, err := passAfter(t, m1); err != nil {
		t.Fatal(err)
	}
	m1.Close()
	made := list(t, pool, "events")
	beat("gw-1", m1.Settings(), 0)
	beat("gw-2", m2.Settings(), 0)

	rep, err := passAfter(t, m2)
	m2.Close()
	if !errors.Is(err, partitions.ErrOtherSettings) || len(rep.Created)+len(rep.Dropped) > 0 {
		t.Fatalf("a manager with a day's interval beside a live gateway with minutes: %v, created %v", err, rep.Created)
	}
	if after := list(t, pool, "events"); len(after) != len(made) {
		t.Fatalf("the other manager changed the partitions: %d, then %d", len(made), len(after))
	}
	// gw-1 is gone (its heartbeat older than LiveWithin): the days take over, and the minutes' manager, should
	// it come back with gw-2 alive, defers to them.
	beat("gw-1", m1.Settings(), time.Minute)
	if _, err := passAfter(t, m2); !errors.Is(err, partitions.ErrOtherSettings) {
		t.Fatalf("settings recorded a moment ago, their gateway's heartbeat perhaps not yet written: %v, want ErrOtherSettings", err)
	}
	m2.Close()
	if _, err := pool.Exec(ctx, `UPDATE oncegate_partition_settings SET set_at = now() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	if _, err := passAfter(t, m2); err != nil {
		t.Fatalf("with no gateway alive on the fleet's settings: %v", err)
	}
	m2.Close()
	if _, err := passAfter(t, m1); !errors.Is(err, partitions.ErrOtherSettings) {
		t.Fatalf("the minutes' manager after the change: %v, want ErrOtherSettings", err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_partition_settings WHERE set_by = 'gw-2'`); n != 1 {
		t.Fatal("the fleet's settings are not gw-2's")
	}
}

// passAfter runs m's pass once the lock is free: a manager closed a moment before may still hold it, until
// Postgres has ended its session (a CI run under -race met that).
func passAfter(t *testing.T, m *partitions.Manager) (partitions.Report, error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, err := m.Pass(context.Background())
		if !errors.Is(err, partitions.ErrNotHeld) || time.Now().After(deadline) {
			return rep, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A takeover that shortens a retention keeps what was stored under the longer one for as long as it promised.
// An outside tester SIGKILLed the last gateway running with the fleet's 3 minutes; a canary with 1 minute took
// the settings over 20 s later and, in the same pass, dropped partitions of effects delivered 85 to 95 s
// before, which the fleet had promised to keep for 3 minutes (and the restarted gateway could not take the
// settings back). Now the old settings' retentions stay a floor until the longest of them has passed since
// the takeover.
func TestATakeoverThatShortensRetentionKeepsWhatWasPromised(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := eventsDB(t, time.Now().Add(-10*time.Minute))
	made := list(t, pool, "events")
	long := manager(t, url, partitions.Config{Retention: time.Hour, Fleet: true, Owner: "gw-1"})
	if _, err := passAfter(t, long); err != nil {
		t.Fatal(err)
	}
	long.Close()
	// gw-1 is gone (no heartbeat), and the settings were recorded long enough ago to be taken over.
	if _, err := pool.Exec(ctx, `UPDATE oncegate_partition_settings SET set_at = now() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	short := manager(t, url, partitions.Config{Retention: 3 * time.Minute, Fleet: true, Owner: "gw-2"})
	rep, err := passAfter(t, short)
	short.Close()
	if err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_partition_settings WHERE set_by = 'gw-2'`); n != 1 {
		t.Fatal("gw-2 did not take the fleet's settings over")
	}
	if len(rep.Dropped) > 0 || len(list(t, pool, "events")) < len(made) {
		t.Fatalf("the takeover's pass dropped %v: stored under an hour's retention, 6 to 10 minutes old", rep.Dropped)
	}
	// A second takeover within the first's hour keeps the hour: a canary restarted twice cut a fleet's 2
	// minutes to 90 s (an outside test).
	if _, err := pool.Exec(ctx, `UPDATE oncegate_partition_settings SET set_at = now() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	shorter := manager(t, url, partitions.Config{Retention: 2 * time.Minute, Fleet: true, Owner: "gw-3"})
	rep, err = passAfter(t, shorter)
	shorter.Close()
	if err != nil || len(rep.Dropped) > 0 || pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_partition_settings WHERE set_by = 'gw-3'`) != 1 {
		t.Fatalf("a second takeover within the first's hour: dropped %v, %v", rep.Dropped, err)
	}
	// Every gateway's requests hold a key the hour after its effect finished, meanwhile.
	if r, ok, err := partitions.Fleet(ctx, pool); err != nil || !ok || r.Keys != 2*time.Minute || r.Hold != time.Hour {
		t.Fatalf("the fleet's retentions after the takeovers: %+v %v %v; want keys 2m, held an hour after finish", r, ok, err)
	}
	// An hour after the takeover, the fleet's 2 minutes are the whole rule.
	if _, err := pool.Exec(ctx, `UPDATE oncegate_partition_settings SET set_at = now() - interval '61 minutes'`); err != nil {
		t.Fatal(err)
	}
	if rep, err = passAfter(t, shorter); err != nil || len(rep.Dropped) == 0 {
		t.Fatalf("an hour after the takeover: dropped %v, %v; want the partitions past 2 minutes", rep.Dropped, err)
	}
	if r, _, err := partitions.Fleet(ctx, pool); err != nil || r.Hold != 2*time.Minute {
		t.Fatalf("the fleet's retentions an hour on: %+v %v; want held 2m after finish", r, err)
	}
}
