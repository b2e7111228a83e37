package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/queue"
)

// oncegateCLI runs the oncegate binary with the environment env (and nothing else from the test's, but PATH
// and HOME) and returns its stdout, stderr and exit code.
func oncegateCLI(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "oncegate"), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("oncegate %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// cliJSON runs a command with -o json, wants exit 0, and decodes its output into v.
func cliJSON(t *testing.T, env []string, v any, args ...string) {
	t.Helper()
	out, errOut, code := oncegateCLI(t, env, append(args, "-o", "json")...)
	if code != 0 {
		t.Fatalf("oncegate %v: exit %d: %s", args, code, errOut)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("oncegate %v: %v in %s", args, err, out)
	}
}

// The operator's view of what really happened, read with the CLI binary: a job run by the worker asks the
// gateway for two effects; the gateway delivering them is SIGKILLed with the webhook in flight; the worker is
// SIGKILLed before it completes the job, so a second worker re-runs it and its requests are replays. Then
// `oncegate … -o json` must show the attempts (the interrupted one named after the killed gateway), the job
// and epoch that created each effect, the replays and the epoch they came from, and an operator's resolution
// of the effect left unknown (on_crash: at_most_once), in the audit log too.
func TestOperatorSeesWhatHappened(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.Database(t)
	hk := newHooks(t)
	hk.hold = make(chan struct{})
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  hook:
    provider: webhook
    timeout: 2s
    on_crash: at_most_once
    webhook: { url: "%s", secret: "%s", allow_private_networks: true }
  clicks: { provider: postgres }
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, dbURL, apiKey, hk.srv.URL, whsec))
	// The worker talks to gateway api, which records effects and delivers none; gateway a delivers them.
	api := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config, "--no-dispatch"))
	apiBase := gatewayBase(t, api)
	a, _ := startGateway(t, config)

	rdb := testenv.Redis(t)
	registry := testenv.Name(t, "registry")
	t.Cleanup(func() { rdb.Del(context.Background(), registry) })
	q, err := queue.New(rdb, testenv.Name(t, "q"), &queue.Options{Registry: registry})
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: it runs after the cleanups that stop the worker processes started below, which
	// would otherwise write the queue's keys again once it is gone.
	t.Cleanup(func() { _ = q.Destroy(context.Background()) })
	payload, _ := json.Marshal(jobs.Effects{Effects: []jobs.Effect{
		{Name: "notify", Type: "hook", Payload: json.RawMessage(`{"event":"job.done","data":1}`)},
		{Name: "audit", Type: "clicks", Payload: json.RawMessage(`{"name":"audit"}`)},
	}})
	if _, err := q.Enqueue(ctx, queue.NewJob{ID: "job-1", Kind: jobs.KindEffects, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	worker := func(extra ...string) *proctest.Proc {
		cmd := exec.Command(filepath.Join(bin, "worker"), append([]string{"run", "--queue", q.Name(), "--registry", registry,
			"--gateway", apiBase, "--api-key", apiKey, "--redis", testenv.RedisURL()}, extra...)...)
		p := proctest.Start(t, cmd)
		p.WaitLine("worker ", 30*time.Second)
		return p
	}
	// The first worker asks for both effects, then spends a minute on "the rest of its work".
	first := worker("--work", "60s")
	select {
	case <-hk.arrived: // gateway a is inside the webhook's delivery
	case <-time.After(20 * time.Second):
		t.Fatal("the webhook never reached the receiver")
	}
	env := []string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + testenv.RedisURL(), "ONCEGATE_QUEUE_REGISTRY=" + registry,
		"ONCEGATE_OPERATOR=alice", "ONCEGATE_JAEGER_URL=http://jaeger.test:16686"}
	var audit admin.EffectDetail
	testenv.Eventually(t, 20*time.Second, "gateway a delivers the analytics effect and logs the attempt", func() bool {
		// The webhook can reach the receiver before the worker has asked for the second effect: until then
		// the CLI finds no such effect (exit 3), and the wait goes on.
		if _, _, code := oncegateCLI(t, env, "effect", "show", "audit:job-1"); code == 3 {
			return false
		}
		cliJSON(t, env, &audit, "effect", "show", "audit:job-1")
		return audit.Status == "delivered" && len(audit.AttemptLog) == 1
	})
	a.Kill()     // with the webhook in flight
	first.Kill() // before it completes job-1: the job is re-run, and its two requests are replays
	second := worker()
	defer second.Signal(syscall.SIGTERM)
	testenv.Eventually(t, 30*time.Second, "the second worker completes job-1 under epoch 2", func() bool {
		j, err := q.Job(ctx, "job-1")
		return err == nil && j.State == queue.StateCompleted && j.Epoch == 2
	})
	hk.mu.Lock()
	close(hk.hold)
	hk.hold = nil
	hk.mu.Unlock()
	// Gateway c rescues the webhook whose gateway died: at_most_once, so it is not resent but left unknown.
	c, cBase := startGateway(t, config)
	defer c.Signal(syscall.SIGTERM)
	var notify admin.EffectDetail
	testenv.Eventually(t, 30*time.Second, "the rescued webhook is unknown and both replays are counted", func() bool {
		cliJSON(t, env, &notify, "effect", "show", "notify:job-1", "--tenant", "acme")
		cliJSON(t, env, &audit, "effect", "show", "audit:job-1")
		return notify.Status == "unknown" && len(notify.AttemptLog) == 1 && notify.Replays == 1 && audit.Replays == 1
	})

	var gws struct{ Gateways []admin.Gateway }
	cliJSON(t, env, &gws, "gateway", "ls")
	if len(gws.Gateways) != 3 {
		t.Fatalf("gateway ls: %+v", gws.Gateways)
	}
	ids := []string{}
	for _, g := range gws.Gateways {
		ids = append(ids, g.ID)
	}
	for _, e := range []*admin.EffectDetail{&notify, &audit} {
		if e.JobID == nil || *e.JobID != "job-1" || e.JobEpoch == nil || *e.JobEpoch != 1 || e.JobQueue == nil ||
			*e.JobQueue != q.Name() {
			t.Errorf("%s: job %v epoch %v queue %v, want job-1 epoch 1 in %s", e.Key, e.JobID, e.JobEpoch, e.JobQueue, q.Name())
		}
		if e.LastReplayEpoch == nil || *e.LastReplayEpoch != 2 || e.LastReplayAt == nil {
			t.Errorf("%s: last replay epoch %v at %v, want epoch 2", e.Key, e.LastReplayEpoch, e.LastReplayAt)
		}
		if e.TraceID != nil && !strings.HasSuffix(e.TraceURL, "/trace/"+*e.TraceID) {
			t.Errorf("%s: trace %v, link %q", e.Key, *e.TraceID, e.TraceURL)
		}
	}
	// The analytics insert: one attempt, delivered by gateway a, timed.
	if len(audit.AttemptLog) != 1 || audit.AttemptLog[0].Outcome != "delivered" || audit.AttemptLog[0].LatencyMS == nil ||
		audit.AttemptLog[0].LeaseToken == nil || !slices.Contains(ids, audit.AttemptLog[0].Gateway) {
		t.Fatalf("audit:job-1 attempts: %+v (gateways %v)", audit.AttemptLog, ids)
	}
	if d := audit.AttemptLog[0].Destination; d == nil || *d != "analytics_events" {
		t.Errorf("audit:job-1's attempt names destination %v, want the analytics table", d)
	}
	killed := audit.AttemptLog[0].Gateway
	// The webhook: one attempt, interrupted, in the name of the killed gateway and under its lease.
	if len(notify.AttemptLog) != 1 || notify.AttemptLog[0].Outcome != "interrupted" || notify.AttemptLog[0].Gateway != killed ||
		notify.AttemptLog[0].LeaseToken == nil || notify.AttemptLog[0].LatencyMS != nil {
		t.Fatalf("notify:job-1 attempts: %+v, want one interrupted by %s", notify.AttemptLog, killed)
	}
	for _, g := range gws.Gateways {
		if g.ID == killed && g.Alive {
			// Seen within three heartbeats; it may still count as alive. Nothing to check yet.
			t.Logf("the killed gateway %s still counts as alive (last seen %v)", g.ID, g.LastSeen)
		}
	}

	// The session as an operator sees it, in tables (README's on-call section shows one).
	session := func(args ...string) {
		out, errOut, code := oncegateCLI(t, env, args...)
		t.Logf("$ oncegate %s\n%s%s(exit %d)", strings.Join(args, " "), out, errOut, code)
	}
	session("effect", "ls", "--job", "job-1")
	session("effect", "show", "notify:job-1")
	session("job", "show", q.Name(), "job-1")
	session("gateway", "ls")

	// Retrying a delivered effect is a wrong state: exit 4, one line naming why.
	if _, errOut, code := oncegateCLI(t, env, "effect", "retry", "audit:job-1", "--reason", "check"); code != 4 ||
		strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "delivered") {
		t.Fatalf("retry of a delivered effect: exit %d, %q", code, errOut)
	}
	// Resolving without a reason is a usage error naming the flag.
	if _, errOut, code := oncegateCLI(t, env, "effect", "resolve", "notify:job-1", "--as", "delivered"); code != 2 ||
		!strings.Contains(errOut, "--reason") {
		t.Fatalf("resolve without reason: exit %d, %q", code, errOut)
	}
	if _, _, code := oncegateCLI(t, env, "effect", "show", "nope:job-1"); code != 3 {
		t.Fatalf("show of a missing effect: exit %d", code)
	}
	var resolved struct {
		Action string
		Effect admin.Effect
	}
	resolveArgs := []string{"effect", "resolve", "notify:job-1", "--as", "delivered", "--reason",
		"the receiver's log has webhook " + notify.StableID}
	out, errOut, code := oncegateCLI(t, env, append(resolveArgs, "-o", "json")...)
	t.Logf("$ oncegate %s -o json\n%s%s(exit %d)", strings.Join(resolveArgs, " "), out, errOut, code)
	if err := json.Unmarshal([]byte(out), &resolved); err != nil || code != 0 {
		t.Fatalf("resolve: exit %d, %v: %s", code, err, errOut)
	}
	if resolved.Effect.Status != "delivered" || resolved.Effect.Resolution == nil ||
		resolved.Effect.Resolution.As != "delivered" || resolved.Effect.Resolution.By != "alice" {
		t.Fatalf("resolve: %+v", resolved)
	}
	cliJSON(t, env, &notify, "effect", "show", "notify:job-1")
	// Nobody saw it delivered: delivered_at stays null, and the attempt log says who resolved it and why.
	last := notify.AttemptLog[len(notify.AttemptLog)-1]
	if notify.Status != "delivered" || notify.Resolution == nil || notify.DeliveredAt != nil ||
		last.Outcome != "resolved delivered" || last.By != "operator alice" || last.Series != 2 {
		t.Fatalf("after resolve: %+v, last attempt row %+v", notify.Effect, last)
	}
	if n := hk.count(notify.StableID); n != 1 {
		t.Fatalf("the receiver got the webhook %d times; resolving must send nothing", n)
	}

	// The job shows both effects it made; the queue shows the job completed.
	var job admin.JobDetail
	cliJSON(t, env, &job, "job", "show", q.Name(), "job-1")
	if job.Epoch != 2 || job.State != queue.StateCompleted || len(job.Effects) != 2 {
		t.Fatalf("job show: %+v", job)
	}
	var qs struct{ Queues []admin.Queue }
	cliJSON(t, env, &qs, "queue", "ls")
	if len(qs.Queues) != 1 || qs.Queues[0].Name != q.Name() || qs.Queues[0].Counts[queue.StateCompleted] != 1 {
		t.Fatalf("queue ls: %+v", qs.Queues)
	}
	var log admin.AuditPage
	cliJSON(t, env, &log, "audit", "ls")
	if len(log.Entries) != 1 || log.Entries[0].Action != "effect.resolve" || log.Entries[0].Actor != "alice" ||
		log.Entries[0].Target != "acme/notify:job-1" || log.Entries[0].Count != 1 ||
		!strings.Contains(log.Entries[0].Reason, notify.StableID) {
		t.Fatalf("audit ls: %+v", log.Entries)
	}
	// Gateway c delivers an effect of its own; its heartbeat then carries that destination's breaker.
	if code, _, _ := postJSON(t, cBase, "later:1", `{"type":"clicks","payload":{"name":"later"}}`); code != 202 {
		t.Fatalf("POST to gateway c: %d", code)
	}
	var bs struct{ Breakers []admin.Breaker }
	testenv.Eventually(t, 20*time.Second, "breaker ls shows gateway c's breaker for clicks", func() bool {
		cliJSON(t, env, &bs, "breaker", "ls")
		for _, b := range bs.Breakers {
			if b.Type == "clicks" && b.Tenant == "acme" && b.State == "closed" && b.GatewayAlive {
				return b.Gateway != killed
			}
		}
		return false
	})
	session("breaker", "ls")

	session("effect", "retry", "audit:job-1", "--reason", "check")
	session("effect", "show", "notify:job-1")
	session("queue", "ls")
	session("audit", "ls")
}

// The queue commands through the binary: a queue paused leases nothing to a running worker until resumed;
// dead letters are listed, requeued (they die again) and purged by an admin only; workers show with the
// jobs they hold.
func TestOncegateQueueCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.Database(t)
	rdb := testenv.Redis(t)
	registry := testenv.Name(t, "registry")
	t.Cleanup(func() { rdb.Del(context.Background(), registry) })
	q, err := queue.New(rdb, testenv.Name(t, "q"), &queue.Options{Registry: registry})
	if err != nil {
		t.Fatal(err)
	}
	// A cleanup, not a defer: it runs after the cleanups that stop the worker processes started below, which
	// would otherwise write the queue's keys again once it is gone.
	t.Cleanup(func() { _ = q.Destroy(context.Background()) })
	env := []string{"DATABASE_URL=" + dbURL, "REDIS_URL=" + testenv.RedisURL(), "ONCEGATE_QUEUE_REGISTRY=" + registry,
		"ONCEGATE_OPERATOR=bob"}
	// A signup job without an email fails for good: dead at its first run.
	if _, err := q.Enqueue(ctx, queue.NewJob{ID: "bad-1", Kind: jobs.KindSignup, Payload: []byte(`{"user":"u"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, _, code := oncegateCLI(t, env, "queue", "pause", q.Name()); code != 2 {
		t.Fatalf("pause without a reason: exit %d", code)
	}
	var paused struct{ Action, Target string }
	cliJSON(t, env, &paused, "queue", "pause", q.Name(), "--reason", "deploying the new receiver")
	if _, _, code := oncegateCLI(t, env, "queue", "pause", q.Name(), "--reason", "again"); code != 4 {
		t.Fatalf("pause of a paused queue: exit %d", code)
	}
	w := proctest.Start(t, exec.Command(filepath.Join(bin, "worker"), "run", "--queue", q.Name(), "--registry", registry,
		"--gateway", "http://127.0.0.1:1", "--api-key", apiKey, "--redis", testenv.RedisURL()))
	w.WaitLine("worker ", 30*time.Second)
	defer w.Signal(syscall.SIGTERM)
	var ws struct{ Workers []admin.Worker }
	testenv.Eventually(t, 10*time.Second, "worker ls shows the running worker", func() bool {
		cliJSON(t, env, &ws, "worker", "ls", q.Name())
		return len(ws.Workers) == 1 && ws.Workers[0].Alive
	})
	var qs struct{ Queues []admin.Queue }
	cliJSON(t, env, &qs, "queue", "ls")
	if len(qs.Queues) != 1 || !qs.Queues[0].Paused || qs.Queues[0].Counts[queue.StateReady] != 1 ||
		!strings.Contains(qs.Queues[0].PausedReason, "deploying the new receiver") {
		t.Fatalf("queue ls while paused: %+v", qs.Queues)
	}
	// The worker is running and idle; a lease script that honours the flag leaves the job ready.
	var job admin.JobDetail
	cliJSON(t, env, &job, "job", "show", q.Name(), "bad-1")
	if job.State != queue.StateReady || job.Epoch != 0 {
		t.Fatalf("paused queue's job: %+v", job.Job)
	}
	cliJSON(t, env, &paused, "queue", "resume", q.Name(), "--reason", "receiver is up")
	if _, _, code := oncegateCLI(t, env, "queue", "resume", q.Name(), "--reason", "again"); code != 4 {
		t.Fatalf("resume of a running queue: exit %d", code)
	}
	var dead admin.JobPage
	testenv.Eventually(t, 10*time.Second, "the job runs once resumed, and dies", func() bool {
		cliJSON(t, env, &dead, "dead", "ls", q.Name())
		return len(dead.Jobs) == 1 && dead.Jobs[0].ID == "bad-1"
	})
	var res struct{ Applied, Matched int64 }
	// Named twice, it is one job, all requeued: not a partial result (an outside tester saw exit 5).
	cliJSON(t, env, &res, "dead", "requeue", q.Name(), "bad-1", "bad-1", "--reason", "one more try")
	if res.Applied != 1 || res.Matched != 1 {
		t.Fatalf("requeue: %+v", res)
	}
	testenv.Eventually(t, 10*time.Second, "the requeued job dies again", func() bool {
		cliJSON(t, env, &job, "job", "show", q.Name(), "bad-1")
		return job.State == queue.StateDead && job.Epoch == 2
	})
	if _, errOut, code := oncegateCLI(t, env, "dead", "purge", q.Name(), "bad-1", "--reason", "spam"); code != 1 ||
		!strings.Contains(errOut, "admin") {
		t.Fatalf("purge as operator: exit %d, %s", code, errOut)
	}
	if _, _, code := oncegateCLI(t, env, "dead", "purge", q.Name(), "bad-1", "nope", "--reason", "spam",
		"--role", "admin"); code != 5 {
		t.Fatalf("purge of one dead job and one unknown id: exit %d, want 5 (partly applied)", code)
	}
	if _, _, code := oncegateCLI(t, env, "job", "show", q.Name(), "bad-1"); code != 3 {
		t.Fatalf("show of a purged job: exit %d", code)
	}
	if _, _, code := oncegateCLI(t, env, "job", "ls", "no-such-queue", "--state", "ready"); code != 3 {
		t.Fatalf("a queue not in the registry: exit %d", code)
	}
	var log admin.AuditPage
	cliJSON(t, env, &log, "audit", "ls")
	var got []string
	for _, e := range log.Entries {
		got = append(got, e.Action+" "+e.Outcome)
	}
	want := []string{"dead.purge done", "dead.purge denied", "dead.requeue done", "queue.resume failed: queue \"" +
		q.Name() + "\" is not paused", "queue.resume done", "queue.pause failed: queue \"" + q.Name() +
		"\" is paused already", "queue.pause done"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("audit:\n got %q\nwant %q", got, want)
	}
}
