// The demo itself: the three strategies, each against its own database, queue and SMTP server, with the
// worker process SIGKILLed the moment the SMTP server has received the welcome email for user_6. The counts
// come from what the SMTP server received.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/queue"
)

// Users is how many users sign up.
const Users = 20

// KillAfter is the user whose email, once received, gets the worker killed.
const KillAfter = "user_6"

// Row is one strategy's result.
type Row struct {
	Strategy          string `json:"strategy"`
	UsersEmailed      int    `json:"users_emailed"`
	UsersNeverEmailed int    `json:"users_never_emailed"`
	DuplicateEmails   int    `json:"duplicate_emails"`
	// TakeoverSeconds is how long after the kill the new worker ran its first job (lease strategies).
	TakeoverSeconds float64 `json:"takeover_seconds,omitempty"`
}

// Env is what the demo runs against and with.
type Env struct {
	RedisURL    string
	DatabaseURL string // a server where the demo may create (and drop) a database of its own
	// Self is this program, re-executed for the child roles; Gateway and Worker are the binaries.
	Self, Gateway, Worker string
	Log                   io.Writer // the children's stderr
	// Dir holds the gateways' config files; the run removes it at its end.
	Dir string
	// GatewayLogLevel is the gateways' --log-level: warn, or debug to see each outcome's handoff (with -v).
	GatewayLogLevel string
}

func count(srv *smtptest.Server) map[string]int {
	out := map[string]int{}
	for _, m := range srv.Messages() {
		for _, to := range m.To {
			out[strings.TrimSuffix(to, "@example.com")]++
		}
	}
	return out
}

func row(name string, srv *smtptest.Server) Row {
	c := count(srv)
	r := Row{Strategy: name, UsersEmailed: len(c), UsersNeverEmailed: Users - len(c)}
	for _, n := range c {
		r.DuplicateEmails += n - 1
	}
	return r
}

func email(user string) string { return user + "@example.com" }

// proc is a child process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func start(env Env, name string, args []string, extraEnv ...string) (*proc, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), extraEnv...)
	cmd.Stdout, cmd.Stderr = env.Log, env.Log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.kill()
	}
}

// killOnEmail returns a channel closed when the SMTP server has received the email for KillAfter, having
// SIGKILLed *victim first.
func killOnEmail(srv *smtptest.Server, victim func() *proc) (<-chan time.Time, func()) {
	killed := make(chan time.Time, 1)
	var once sync.Once
	srv.OnMessage(func(m smtptest.Message) {
		for _, to := range m.To {
			if to == email(KillAfter) {
				once.Do(func() {
					victim().kill()
					killed <- time.Now()
				})
			}
		}
	})
	return killed, func() { srv.OnMessage(nil) }
}

// InMemory: the job list lives in the worker process. Killed, it takes the unsent jobs with it; the new
// process starts with an empty list.
func InMemory(ctx context.Context, env Env) (Row, error) {
	srv, err := smtptest.New("127.0.0.1:0")
	if err != nil {
		return Row{}, err
	}
	defer srv.Close()
	var first *proc
	killed, unhook := killOnEmail(srv, func() *proc { return first })
	defer unhook()
	first, err = start(env, env.Self, []string{"child", "memory", "--smtp", srv.Addr, "--users", fmt.Sprint(Users)})
	if err != nil {
		return Row{}, err
	}
	select {
	case <-killed:
	case <-first.done:
		// Our own kill ends the process too, just before it is reported.
		select {
		case <-killed:
		case <-time.After(2 * time.Second):
			return Row{}, errors.New("in-memory worker exited before the kill")
		}
	case <-time.After(60 * time.Second):
		first.kill()
		return Row{}, errors.New("in-memory worker sent no email for user_6 within 60s")
	case <-ctx.Done():
		first.kill()
		return Row{}, ctx.Err()
	}
	// The restarted process has no jobs: the list died with the old one.
	second, err := start(env, env.Self, []string{"child", "memory", "--smtp", srv.Addr, "--users", "0"})
	if err != nil {
		return Row{}, err
	}
	select {
	case <-second.done:
	case <-time.After(10 * time.Second):
		second.kill()
	case <-ctx.Done():
		second.kill()
		return Row{}, ctx.Err()
	}
	return row("in-memory queue", srv), nil
}

// redisClient takes any REDIS_URL form queue.OpenRedis does: one server, Sentinel or Cluster.
func redisClient(env Env) (redis.UniversalClient, error) {
	rdb, err := queue.OpenRedis(env.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	return rdb, nil
}

func enqueueSignups(ctx context.Context, q *queue.Queue) error {
	for i := 1; i <= Users; i++ {
		user := fmt.Sprintf("user_%d", i)
		payload, _ := json.Marshal(jobs.Signup{User: user, Email: email(user)})
		if _, err := q.Enqueue(ctx, queue.NewJob{ID: "signup:" + user, Kind: jobs.KindSignup, Payload: payload}); err != nil {
			return err
		}
	}
	return nil
}

// leaseRun runs a lease-queue strategy: start a worker, SIGKILL it on user_6's email, start another, and wait
// until every job completed.
func leaseRun(ctx context.Context, name string, srv *smtptest.Server, q *queue.Queue, startWorker func() (*proc, error)) (Row, error) {
	if err := enqueueSignups(ctx, q); err != nil {
		return Row{}, err
	}
	var first *proc
	killed, unhook := killOnEmail(srv, func() *proc { return first })
	defer unhook()
	var err error
	if first, err = startWorker(); err != nil {
		return Row{}, err
	}
	var killedAt time.Time
	select {
	case killedAt = <-killed:
	case <-time.After(60 * time.Second):
		first.kill()
		return Row{}, errors.New("no email for user_6 within 60s")
	case <-ctx.Done():
		first.kill()
		return Row{}, ctx.Err()
	}
	// The killed run's epoch: the re-run is the next lease, whatever epoch the job started from (a job ID
	// used before starts above its earlier job's epochs, so "epoch 2" is no re-run).
	var killedEpoch int64
	if j, err := q.Job(ctx, "signup:"+KillAfter); err == nil {
		killedEpoch = j.Epoch
	}
	second, err := startWorker()
	if err != nil {
		return Row{}, err
	}
	defer second.stop()
	var takeover time.Duration
	deadline := time.Now().Add(2 * time.Minute)
	for {
		s, err := q.Stats(ctx)
		if err != nil {
			return Row{}, err
		}
		if takeover == 0 {
			if j, err := q.Job(ctx, "signup:"+KillAfter); err == nil && killedEpoch > 0 && j.Epoch > killedEpoch {
				takeover = time.Since(killedAt)
			}
		}
		if s.Counts[queue.StateCompleted] == Users {
			break
		}
		if s.Counts[queue.StateDead] > 0 {
			return Row{}, fmt.Errorf("%d jobs died", s.Counts[queue.StateDead])
		}
		if time.Now().After(deadline) {
			return Row{}, fmt.Errorf("jobs unfinished 2 minutes after the kill: %v", s.Counts)
		}
		if err := pause(ctx, 50*time.Millisecond); err != nil {
			return Row{}, err
		}
	}
	settle(ctx, srv)
	r := row(name, srv)
	r.TakeoverSeconds = takeover.Round(10 * time.Millisecond).Seconds()
	return r, nil
}

// settle waits for the emails still on their way when the last job completed: the gateway answers a job
// once the email is recorded, and sends it after, so on a loaded machine the last few can trail the jobs by
// seconds (a CI run counted 5 of 20 as never emailed). It waits until every user has one, or no email has
// come for 3 s, at most 30 s; a lost email is still counted as never emailed.
func settle(ctx context.Context, srv *smtptest.Server) {
	deadline := time.Now().Add(30 * time.Second)
	last, quietSince := len(count(srv)), time.Now()
	for last < Users && time.Now().Before(deadline) && time.Since(quietSince) < 3*time.Second {
		if pause(ctx, 50*time.Millisecond) != nil {
			return
		}
		if n := len(count(srv)); n != last {
			last, quietSince = n, time.Now()
		}
	}
}

// stage brings up what a lease strategy needs: an SMTP server that counts the emails, and a queue of its own
// on the Redis at env.RedisURL. cleanup removes both.
func stage(env Env, name string) (*smtptest.Server, *queue.Queue, func(), error) {
	srv, err := smtptest.New("127.0.0.1:0")
	if err != nil {
		return nil, nil, nil, err
	}
	rdb, err := redisClient(env)
	if err != nil {
		srv.Close()
		return nil, nil, nil, err
	}
	q, err := queue.New(rdb, fmt.Sprintf("killtest-%s-%d", name, time.Now().UnixNano()), &queue.Options{Logger: quiet()})
	if err != nil {
		srv.Close()
		rdb.Close()
		return nil, nil, nil, err
	}
	return srv, q, func() {
		_ = q.Destroy(context.Background())
		_ = rdb.Close()
		_ = srv.Close()
	}, nil
}

// LeaseDirect: jobs in the Redis lease queue; the worker sends the email itself, then completes the job.
func LeaseDirect(ctx context.Context, env Env) (Row, error) {
	srv, q, cleanup, err := stage(env, "direct")
	if err != nil {
		return Row{}, err
	}
	defer cleanup()
	return leaseRun(ctx, "lease queue, worker sends the email itself", srv, q, func() (*proc, error) {
		return start(env, env.Self, []string{"child", "direct", "--smtp", srv.Addr, "--queue", q.Name()},
			"REDIS_URL="+env.RedisURL)
	})
}

// Oncegate: jobs in the lease queue; the reference worker asks the gateway for the email under the key
// welcome-email:<job id>; the re-run of user_6's job is a replay.
func Oncegate(ctx context.Context, env Env) (Row, error) {
	srv, q, cleanup, err := stage(env, "oncegate")
	if err != nil {
		return Row{}, err
	}
	defer cleanup()

	dbURL, drop, err := createDatabase(ctx, env.DatabaseURL)
	if err != nil {
		return Row{}, err
	}
	defer drop()
	_, base, stopGateway, err := StartGateway(env, dbURL, "127.0.0.1:0", map[string]string{"welcome-email": fmt.Sprintf(
		`{provider: smtp, on_crash: at_least_once, smtp: {addr: "%s", from: "Acme <noreply@acme.test>"}}`, srv.Addr)})
	if err != nil {
		return Row{}, err
	}
	defer stopGateway()
	return leaseRun(ctx, "lease queue + oncegate", srv, q, func() (*proc, error) {
		return start(env, env.Worker, []string{"run", "--queue", q.Name(), "--concurrency", "1", "--work", "300ms",
			"--log-level", "warn"}, "REDIS_URL="+env.RedisURL, "GATEWAY_URL="+base, "GATEWAY_API_KEY="+APIKey)
	})
}

// APIKey is the demo tenant's key.
const APIKey = "killtest-api-key-8b3e5d1f7a9c2e4b6d0f"

// StartGateway runs the gateway binary on dbURL with the given effect types (name -> YAML flow mapping),
// listening on listen ("127.0.0.1:0" for any port), and returns it, its base URL and a stop function.
func StartGateway(env Env, dbURL, listen string, types map[string]string) (*proc, string, func(), error) {
	dir, err := os.MkdirTemp(env.Dir, "gateway-")
	if err != nil {
		return nil, "", nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\ndatabase_url: %s\ntenants: { demo: { api_keys: [%s] } }\neffect_types:\n", listen, dbURL, APIKey)
	for name, t := range types {
		fmt.Fprintf(&b, "  %s: %s\n", name, t)
	}
	b.WriteString("dispatcher: { poll_interval: 200ms, lease_margin: 2s }\n")
	cfg := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		return nil, "", nil, err
	}
	level := env.GatewayLogLevel
	if level == "" {
		level = "warn"
	}
	cmd := exec.Command(env.Gateway, "serve", "--config", cfg, "--log-level", level)
	cmd.Stderr = env.Log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		buf := make([]byte, 256)
		n, _ := out.Read(buf)
		addr <- strings.TrimSpace(strings.TrimPrefix(string(buf[:n]), "listening "))
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	select {
	case a := <-addr:
		if a == "" {
			<-p.done
			return nil, "", nil, errors.New("the gateway exited at start (run with -v for its log)")
		}
		return p, "http://" + a, func() { p.stop(); _ = os.RemoveAll(dir) }, nil
	case <-p.done:
		return nil, "", nil, errors.New("the gateway exited at start; see its log")
	case <-time.After(60 * time.Second):
		p.kill()
		return nil, "", nil, errors.New("the gateway did not start within 60s")
	}
}

func createDatabase(ctx context.Context, adminURL string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to postgres: %w", err)
	}
	name := fmt.Sprintf("oncegate_killtest_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), func() {
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		conn.Close(context.Background())
	}, nil
}

// pause sleeps for d, or returns ctx's error as soon as the run is interrupted.
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Table formats rows as the seeds' table.
func Table(rows []Row) string {
	var b strings.Builder
	b.WriteString("| strategy                                   | users emailed | users never emailed | duplicate emails |\n")
	b.WriteString("|--------------------------------------------|---------------|---------------------|------------------|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %-42s | %13d | %19d | %16d |\n", r.Strategy, r.UsersEmailed, r.UsersNeverEmailed, r.DuplicateEmails)
	}
	return b.String()
}
