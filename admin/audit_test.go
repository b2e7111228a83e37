package admin_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
)

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
	// The target as asked, tenant included: a key two tenants use says whose was tried.
	if one.Outcome != "denied" || one.Reason != "viewer tries" || one.Target != "acme/k0" || one.Count != 0 {
		t.Errorf("the denied retry's entry: %+v", one)
	}
	if bulk.Outcome != "denied" || bulk.Reason != "viewer bulk" || !strings.Contains(strings.ReplaceAll(string(bulk.Filter), " ", ""), `"status":"dead"`) {
		t.Errorf("the denied bulk retry's entry: %+v (filter %s)", bulk, bulk.Filter)
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

	// A database that answers but has no audit log (one no gateway migrated): an outside tester's `dead
	// requeue` changed Redis there, then failed for want of the table.
	_, bare := newService(t)
	if _, err := bare.Exec(ctx, "DROP TABLE oncegate_audit"); err != nil {
		t.Fatal(err)
	}
	svc = admin.New(admin.Config{DB: bare, Redis: rdb, QueueRegistry: reg})
	if err := svc.ResumeQueue(ctx, alice, q.Name(), "no audit log"); !errors.Is(err, admin.ErrUnavailable) ||
		!strings.Contains(err.Error(), "gateway migrate") {
		t.Fatalf("resume with no audit log: %v", err)
	}
	if paused, _, err := q.Paused(ctx); err != nil || !paused {
		t.Fatalf("the queue was resumed with no audit log: paused %v, %v", paused, err)
	}
}
