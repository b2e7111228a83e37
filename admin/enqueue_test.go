package admin_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
)

// An operator enqueues a job as a producer would (an on-call engineer needed a 40-line Go producer to try a
// worker): the job is in Redis with its kind and payload, the audit log names it, an ID in use adds nothing,
// and what is refused (a viewer, a queue nothing knows, a payload that is not JSON) adds nothing either.
func TestOperatorEnqueuesAJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	pool, err := admin.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rdb := testenv.Redis(t)
	reg := testenv.Name(t, "registry")
	q, err := queue.New(rdb, testenv.Name(t, "signups"), &queue.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Destroy(context.Background()); rdb.Del(context.Background(), reg) })
	if _, err := q.Enqueue(ctx, queue.NewJob{ID: "first", Kind: "signup"}); err != nil { // registers the queue
		t.Fatal(err)
	}
	svc := admin.New(admin.Config{DB: pool, Redis: rdb, QueueRegistry: reg})

	res, err := svc.EnqueueJob(ctx, alice, q.Name(), admin.NewJob{Kind: "signup", Payload: []byte(`{"user":"carol"}`)},
		"try the worker")
	if err != nil || res.ID == "" || res.Duplicate || res.State != queue.StateReady {
		t.Fatalf("enqueue: %+v %v", res, err)
	}
	job, err := q.Job(ctx, res.ID)
	if err != nil || job.Kind != "signup" || string(job.Payload) != `{"user":"carol"}` {
		t.Fatalf("the job in Redis: %+v %v", job, err)
	}
	page, err := svc.AuditLog(ctx, alice, admin.AuditFilter{Action: "job.enqueue"}, admin.Page{})
	if err != nil || len(page.Entries) != 1 {
		t.Fatalf("audit: %+v %v", page, err)
	}
	if e := page.Entries[0]; e.Target != q.Name() || e.Count != 1 || e.Reason != "try the worker" ||
		!strings.Contains(string(e.Filter), res.ID) {
		t.Errorf("the audit entry: %+v (filter %s)", e, e.Filter)
	}

	dup, err := svc.EnqueueJob(ctx, alice, q.Name(), admin.NewJob{ID: "first", Kind: "signup", Payload: []byte(`{}`)},
		"again")
	if err != nil || !dup.Duplicate || dup.ID != "first" {
		t.Fatalf("an ID in use: %+v %v", dup, err)
	}

	for name, c := range map[string]struct {
		a       admin.Actor
		queue   string
		job     admin.NewJob
		reason  string
		want    error
		wantMsg string
	}{
		"viewer":     {viv, q.Name(), admin.NewJob{Kind: "signup", Payload: []byte(`{}`)}, "r", admin.ErrForbidden, ""},
		"no reason":  {alice, q.Name(), admin.NewJob{Kind: "signup", Payload: []byte(`{}`)}, "", admin.ErrInvalid, "reason"},
		"typo queue": {alice, q.Name() + "x", admin.NewJob{Kind: "signup", Payload: []byte(`{}`)}, "r", admin.ErrNotFound, "registry"},
		"no kind":    {alice, q.Name(), admin.NewJob{Payload: []byte(`{}`)}, "r", admin.ErrInvalid, "kind"},
		"not JSON":   {alice, q.Name(), admin.NewJob{Kind: "signup", Payload: []byte(`{user: carol}`)}, "r", admin.ErrInvalid, "not JSON"},
		"no payload": {alice, q.Name(), admin.NewJob{Kind: "signup"}, "r", admin.ErrInvalid, "payload"},
		"too big": {alice, q.Name(), admin.NewJob{Kind: "signup",
			Payload: []byte(`"` + strings.Repeat("a", admin.MaxJobPayload) + `"`)}, "r", admin.ErrInvalid, "payload"},
	} {
		_, err := svc.EnqueueJob(ctx, c.a, c.queue, c.job, c.reason)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.wantMsg) {
			t.Errorf("%s: %v, want %v naming %q", name, err, c.want, c.wantMsg)
		}
	}
	st, err := q.Stats(ctx)
	if err != nil || st.Counts[queue.StateReady] != 2 {
		t.Fatalf("ready jobs after the refusals: %v %v, want 2", st.Counts, err)
	}
}
