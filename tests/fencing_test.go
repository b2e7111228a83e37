package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/queue"
)

// A worker paused (SIGSTOP) mid-job loses the job to another worker, which finishes it under epoch 2. While
// paused it was also cut off from Redis, so when it resumes its heartbeat cannot tell it the lease is gone:
// it carries on with the job. The gateway refuses its next effect (409): a stale worker cannot start effects
// after its successor began, and the job's record is untouched.
func TestPausedWorkerIsFencedByTheGateway(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue + gateway", "Worker SIGSTOPped mid-job and cut off from Redis; its job finished elsewhere; SIGCONT", "The gateway refuses its next effect with 409; each effect delivered once")
	result("409 job-fenced; webhook 1x, audit 1x")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	hk := newHooks(t)
	hk.hold = make(chan struct{})
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  hook: { provider: webhook, timeout: 20s, webhook: { url: "%s", secret: "%s", allow_private_networks: true } }
  clicks: { provider: postgres }
dispatcher: { poll_interval: 100ms }
`, dbURL, apiKey, hk.srv.URL, whsec))
	_, base := startGateway(t, config)

	rdb := testenv.Redis(t)
	q, err := queue.New(rdb, testenv.Name(t, "q"), nil)
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
	if _, err := q.Enqueue(context.Background(), queue.NewJob{ID: "job-1", Kind: jobs.KindEffects, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	link := newTCPProxy(t, redisAddr(t))
	tap := newStatusTap(t, base) // what the gateway answers the first worker
	worker := func(gateway, redisURL string, extra ...string) *proctest.Proc {
		cmd := exec.Command(filepath.Join(bin, "worker"), append([]string{"run", "--queue", q.Name(), "--wait", "15s",
			"--gateway", gateway, "--api-key", apiKey, "--redis", redisURL, "--log-level", "debug"}, extra...)...)
		p := proctest.Start(t, cmd)
		p.WaitLine("worker ", 30*time.Second)
		return p
	}
	first := worker(tap.url, "redis://"+link.addr+"/0")
	select {
	case <-hk.arrived: // worker 1 is inside its first effect, waiting for the gateway's answer
	case <-time.After(20 * time.Second):
		t.Fatal("the first effect never reached the receiver")
	}
	first.Signal(syscall.SIGSTOP)
	link.cut()
	hk.mu.Lock()
	close(hk.hold)
	hk.hold = nil
	hk.mu.Unlock()

	metricsAddr := freeTCPAddr(t)
	second := worker(base, testenv.RedisURL(), "--metrics", metricsAddr)
	defer second.Signal(syscall.SIGTERM)
	var j *queue.Job
	testenv.Eventually(t, 30*time.Second, "worker 2 finishes the job under epoch 2", func() bool {
		j, err = q.Job(context.Background(), "job-1")
		return err == nil && j.State == queue.StateCompleted
	})
	if j.Epoch != 2 {
		t.Fatalf("job finished under epoch %d", j.Epoch)
	}

	first.Signal(syscall.SIGCONT)
	testenv.Eventually(t, 20*time.Second, "the resumed worker is refused by the gateway's fence (409)", func() bool {
		return tap.saw(409)
	})
	if got, _ := q.Job(context.Background(), "job-1"); got.State != queue.StateCompleted || got.Epoch != 2 || got.Failures != 0 {
		t.Fatalf("the resumed worker changed the job: %+v", got)
	}
	if n := len(hk.byID); n != 1 {
		t.Fatalf("the receiver saw %d effects", n)
	}
	for id, n := range hk.byID {
		if n != 1 {
			t.Fatalf("webhook %s delivered %d times", id, n)
		}
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events WHERE key = 'audit:job-1'"); n != 1 {
		t.Fatalf("audit event recorded %d times", n)
	}
	if n := pgtest.Count(t, pool, "SELECT epoch FROM oncegate_run_fences WHERE job_id = 'job-1'"); n != 2 {
		t.Fatalf("the job's fence is at %d", n)
	}

	// The second worker's metrics: the job it completed, the stall it reclaimed, the queue's state.
	m := scrape(t, "http://"+metricsAddr)
	for _, want := range []string{
		`oncegate_jobs_total{kind="effects",outcome="completed",queue="` + q.Name() + `"} 1`,
		`oncegate_stalls_total{queue="` + q.Name() + `"} 1`,
		`oncegate_queue_jobs{queue="` + q.Name() + `",state="completed"} 1`,
		`oncegate_queue_jobs{queue="` + q.Name() + `",state="dead"} 0`,
		`oncegate_queue_oldest_ready_seconds{queue="` + q.Name() + `"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("worker metrics lack %s", want)
		}
	}
}

// A job enqueued again under an ID its queue has forgotten starts its epochs again: in a queue destroyed and
// made again (or whose record Redis lost), and in a second queue that uses the same business ID. The
// gateway fenced by job ID alone, so each such job was refused (409) at every lease below the old job's
// epoch, and went dead without its effect (an outside test: 300 of 300 jobs). Real worker processes; the
// effects are counted where they land.
func TestAJobEnqueuedAgainIsNotFencedByTheOldJobsEpochs(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  clicks: { provider: postgres }
dispatcher: { poll_interval: 100ms }
`, dbURL, apiKey))
	_, base := startGateway(t, config)
	ctx := context.Background()
	rdb := testenv.Redis(t)
	name := testenv.Name(t, "q")
	open := func(name string) *queue.Queue {
		q, err := queue.New(rdb, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = q.Destroy(context.Background()) })
		return q
	}
	worker := func(q *queue.Queue) *proctest.Proc {
		p := proctest.Start(t, exec.Command(filepath.Join(bin, "worker"), "run", "--queue", q.Name(), "--wait", "15s",
			"--gateway", base, "--api-key", apiKey, "--redis", testenv.RedisURL()))
		p.WaitLine("worker ", 30*time.Second)
		return p
	}
	// run enqueues a job of one effect (its own name, so each run is a new effect) and waits for its end.
	run := func(q *queue.Queue, id, effect string) *queue.Job {
		t.Helper()
		payload, _ := json.Marshal(jobs.Effects{Effects: []jobs.Effect{
			{Name: effect, Type: "clicks", Payload: json.RawMessage(`{"name":"` + effect + `"}`)}}})
		if _, err := q.Enqueue(ctx, queue.NewJob{ID: id, Kind: jobs.KindEffects, Payload: payload, MaxAttempts: 2}); err != nil {
			t.Fatal(err)
		}
		var j *queue.Job
		testenv.Eventually(t, 30*time.Second, "job "+id+" of "+q.Name()+" ends", func() bool {
			var err error
			j, err = q.Job(ctx, id)
			return err == nil && (j.State == queue.StateCompleted || j.State == queue.StateDead)
		})
		if j.State != queue.StateCompleted {
			t.Fatalf("job %s of %s: %s (%s)", id, q.Name(), j.State, j.DeadReason)
		}
		return j
	}

	// Jobs one after the other raise the queue's epochs: each starts above the last one that completed.
	q := open(name)
	w := worker(q)
	for i := range 4 {
		run(q, fmt.Sprintf("warm-%d", i), fmt.Sprintf("warm-%d", i))
	}
	if j := run(q, "user_1", "welcome"); j.Epoch < 5 {
		t.Fatalf("user_1 ran under epoch %d, want the fifth job's", j.Epoch)
	}
	w.Signal(syscall.SIGTERM)
	_ = w.Wait(20 * time.Second)

	// The same ID in a second queue, then in the queue made again: epoch 1 each.
	other := open(name + "-crm")
	w = worker(other)
	if j := run(other, "user_1", "crm-sync"); j.Epoch != 1 {
		t.Fatalf("the second queue's job ran under epoch %d", j.Epoch)
	}
	w.Signal(syscall.SIGTERM)
	_ = w.Wait(20 * time.Second)
	if err := q.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	q = open(name)
	w = worker(q)
	defer w.Signal(syscall.SIGTERM)
	if j := run(q, "user_1", "reminder"); j.Epoch != 1 {
		t.Fatalf("the job enqueued again ran under epoch %d", j.Epoch)
	}
	for _, effect := range []string{"welcome", "crm-sync", "reminder"} {
		if n := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events WHERE key = $1", effect+":user_1"); n != 1 {
			t.Errorf("effect %s:user_1 recorded %d times, want once", effect, n)
		}
	}
}

// statusTap is an HTTP proxy in front of the gateway that records the status of every answer it passes on:
// the test's signal of what the gateway told a worker, read from the wire rather than from the worker's log.
type statusTap struct {
	url   string
	mu    sync.Mutex
	codes []int
}

func newStatusTap(t *testing.T, target string) *statusTap {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	tap := &statusTap{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(r *http.Response) error {
		tap.mu.Lock()
		defer tap.mu.Unlock()
		tap.codes = append(tap.codes, r.StatusCode)
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	tap.url = srv.URL
	return tap
}

// saw reports whether some answer had status code.
func (s *statusTap) saw(code int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.codes, code)
}

func freeTCPAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func redisAddr(t *testing.T) string {
	opts, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	return opts.Addr
}

// tcpProxy forwards connections to target until cut, which closes them all and refuses new ones: a network
// partition between one process and Redis.
type tcpProxy struct {
	addr  string
	mu    sync.Mutex
	conns []net.Conn
	down  bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{addr: l.Addr().String()}
	t.Cleanup(func() { l.Close(); p.cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.down {
				p.mu.Unlock()
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
