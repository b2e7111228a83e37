package admin_test

// Tests for an outside tester's findings on the operator's tools (issue 15's review).

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/queue"
)

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

// Text Postgres cannot hold (a NUL, bytes that are not UTF-8) is bad input naming its field, never an
// internal error carrying the database's message.
func TestTextPostgresCannotHoldIsInvalid(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "k", 1, effect.StatusDead)
	field := func(err error) string {
		var ie *admin.InvalidError
		if errors.As(err, &ie) {
			return ie.Field
		}
		return "not invalid: " + errOrNil(err)
	}
	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"tenant NUL": {err2(svc.Effects(ctx, viv, admin.EffectFilter{Tenant: "\x00"}, admin.Page{})), "tenant"},
		"prefix bad UTF-8": {err2(svc.Effects(ctx, viv, admin.EffectFilter{KeyPrefix: "\xff"}, admin.Page{})),
			"key-prefix"},
		"job NUL":        {err2(svc.Effects(ctx, viv, admin.EffectFilter{JobID: "j\x00"}, admin.Page{})), "job"},
		"key bad UTF-8":  {err2(svc.Effect(ctx, viv, "acme", "\xff")), "key"},
		"tenant of show": {err2(svc.Effect(ctx, viv, "a\x00", "k0")), "tenant"},
		"reason NUL":     {err2(svc.RetryEffect(ctx, alice, "acme", "k0", "x\x00")), "reason"},
		"operator NUL": {err2(svc.RetryEffect(ctx, admin.Actor{Name: "ev\x00", Role: admin.RoleOperator}, "acme",
			"k0", "x")), "operator"},
		"blank operator": {err2(svc.RetryEffect(ctx, admin.Actor{Name: "   ", Role: admin.RoleOperator}, "acme",
			"k0", "x")), "operator"},
		"audit actor": {err2(svc.AuditLog(ctx, viv, admin.AuditFilter{Actor: "\x00"}, admin.Page{})), "actor"},
		"trace id":    {err2(svc.EffectsByTrace(ctx, viv, "\xff", 10)), "trace_id"},
	} {
		if got := field(tc.err); got != tc.want {
			t.Errorf("%s: field %q, want %q", name, got, tc.want)
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'dead'"); n != 1 {
		t.Fatalf("a refused retry changed the effect")
	}
}

func err2[T any](_ T, err error) error { return err }

func errOrNil(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// A database that stops answering, is not there, or holds a lock the call needs: the call ends within the
// service's bounds with ErrUnavailable (the CLI's error, the console's 503), never a hang or a 500.
func TestADatabaseThatDoesNotAnswerIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Accepts connections and never says a word.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	t.Cleanup(func() {
		_ = silent.Close()
		for {
			select {
			case c := <-accepted:
				_ = c.Close()
			default:
				return
			}
		}
	})
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- c:
			default:
				_ = c.Close()
			}
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	_ = closed.Close()
	for name, addr := range map[string]string{"silent": silent.Addr().String(), "closed": closedAddr} {
		pool, err := admin.Connect(ctx, "postgres://postgres@"+addr+"/x")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = admin.New(admin.Config{DB: pool}).Effects(ctx, viv, admin.EffectFilter{}, admin.Page{})
		pool.Close()
		if !errors.Is(err, admin.ErrUnavailable) || time.Since(start) > admin.ConnectTimeout+5*time.Second {
			t.Errorf("%s: after %s: %v, want ErrUnavailable within the connect timeout", name, time.Since(start), err)
		}
	}

	svc, pool := newService(t)
	seed(t, pool, "k", 1, effect.StatusDead)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE oncegate_effects IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = svc.Effects(ctx, viv, admin.EffectFilter{}, admin.Page{})
	if !errors.Is(err, admin.ErrUnavailable) || !strings.Contains(err.Error(), "locked") ||
		time.Since(start) > admin.LockTimeout+5*time.Second {
		t.Fatalf("behind a lock, after %s: %v", time.Since(start), err)
	}
}

// A refused change is audited with what it asked for: its reason and its filter, as a done one is.
func TestDeniedChangesAreAuditedWhole(t *testing.T) {
	t.Parallel()
	svc, pool := newService(t)
	ctx := context.Background()
	seed(t, pool, "k", 1, effect.StatusDead)
	if _, err := svc.RetryEffect(ctx, viv, "acme", "k0", "viewer tries"); !errors.Is(err, admin.ErrForbidden) {
		t.Fatalf("a viewer's retry: %v", err)
	}
	if _, err := svc.RetryEffects(ctx, viv, admin.EffectFilter{Status: effect.StatusDead}, "viewer bulk", nil); !errors.Is(err, admin.ErrForbidden) {
		t.Fatalf("a viewer's bulk retry: %v", err)
	}
	page, err := svc.AuditLog(ctx, alice, admin.AuditFilter{Actor: "viv"}, admin.Page{})
	if err != nil || len(page.Entries) != 2 {
		t.Fatalf("audit: %+v %v", page, err)
	}
	bulk, one := page.Entries[0], page.Entries[1]
	if one.Outcome != "denied" || one.Reason != "viewer tries" || one.Target != "k0" || one.Count != 0 {
		t.Errorf("the denied retry's entry: %+v", one)
	}
	if bulk.Outcome != "denied" || bulk.Reason != "viewer bulk" || !strings.Contains(strings.ReplaceAll(string(bulk.Filter), " ", ""), `"status":"dead"`) {
		t.Errorf("the denied bulk retry's entry: %+v (filter %s)", bulk, bulk.Filter)
	}
}

// Every field docs/cli.md lists for `breaker ls` is there, an absent one as null.
func TestBreakerJSONHasEveryDocumentedField(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(admin.Breaker{Gateway: "gw", BreakerState: outbox.BreakerState{Type: "hook", State: "closed"}})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"gateway", "gateway_alive", "type", "tenant", "destination", "state", "open_until",
		"last_used", "in_flight"} {
		if _, ok := m[f]; !ok {
			t.Errorf("%s is missing: %s", f, b)
		}
	}
	if m["open_until"] != nil || m["in_flight"] != float64(0) {
		t.Errorf("a closed, idle breaker: %s", b)
	}
}

// A change made in Redis is audited in Postgres: with the database unreachable it is not made at all (an
// outside tester resumed a queue with no audit entry to show for it).
func TestARedisChangeNeedsTheAuditLogFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	reg := testenv.Name(t, "registry")
	q, err := queue.New(rdb, testenv.Name(t, "q"), &queue.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Destroy(context.Background()); rdb.Del(context.Background(), reg) })
	if _, err := q.Enqueue(ctx, queue.NewJob{ID: "j"}); err != nil {
		t.Fatal(err)
	}
	if err := q.Pause(ctx, "incident"); err != nil {
		t.Fatal(err)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := closed.Addr().String()
	_ = closed.Close()
	pool, err := admin.Connect(ctx, "postgres://postgres@"+addr+"/x")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	svc := admin.New(admin.Config{DB: pool, Redis: rdb, QueueRegistry: reg})
	if err := svc.ResumeQueue(ctx, alice, q.Name(), "db down"); !errors.Is(err, admin.ErrUnavailable) {
		t.Fatalf("resume with the database down: %v", err)
	}
	if paused, _, err := q.Paused(ctx); err != nil || !paused {
		t.Fatalf("the queue was resumed with no audit entry: paused %v, %v", paused, err)
	}
	if _, err := svc.RequeueDead(ctx, alice, q.Name(), []string{"j"}, "db down"); !errors.Is(err, admin.ErrUnavailable) {
		t.Fatalf("requeue with the database down: %v", err)
	}
}
