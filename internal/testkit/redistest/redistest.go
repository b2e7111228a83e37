// Package redistest gives a test Redis servers of its own, started from the redis-server binary: a single
// server or an n-node Redis Cluster, each on free loopback ports with its data in the test's temporary folder,
// killed when the test ends. The shared Redis of testenv serves most tests; this package is for the ones that
// inflict faults a shared server must not suffer: stopping it (Stop, Kill), restarting it on its own data
// (Start), freezing it (Stall), or losing one node of a cluster.
//
// A machine without redis-server fails the test rather than skipping it: scripts/test installs the binary, and
// a skipped fault test would hide that the fault was never tried.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Option changes how Start configures a server.
type Option func(*config)

type config struct {
	aof      bool
	debug    bool
	cluster  bool
	sentinel *sentinelConf // a Sentinel rather than a data server (sentinel.go)
	extra    []string
}

// WithoutAOF runs the server without its append-only file, so a restart starts empty. The default is AOF
// with appendfsync everysec, as production runs, because a restart that loses acknowledged writes is exactly
// what the outage tests look for.
func WithoutAOF() Option { return func(c *config) { c.aof = false } }

// WithDebugCommand allows the DEBUG command (--enable-debug-command yes), which Stall needs. Redis 7 refuses
// DEBUG by default, as production should.
func WithDebugCommand() Option { return func(c *config) { c.debug = true } }

// WithFastSync makes a primary start a replica's full sync at once instead of after 5 s spent waiting for
// more replicas to share it (--repl-diskless-sync-delay 0). Not the default: on Redis 7.0 a manual CLUSTER
// FAILOVER right after such a sync times out (TestWorkersFollowAClusterFailover saw it every time).
func WithFastSync() Option { return WithArgs("--repl-diskless-sync-delay", "0") }

// WithArgs appends raw redis-server arguments, such as "--maxmemory", "10mb". They come last, so they
// override the package's own.
func WithArgs(args ...string) Option {
	return func(c *config) { c.extra = append(c.extra, args...) }
}

// Server is a redis-server of the test's own.
type Server struct {
	t       testing.TB
	bin     string
	dir     string
	cfg     config
	port    int
	busPort int // the cluster bus port, 0 outside a cluster

	mu   sync.Mutex
	proc *process // nil while stopped
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status; read only after done is closed
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start starts a redis-server on a free 127.0.0.1 port, with a temporary folder of its own, and waits until
// it answers. It is killed when the test ends; if the test failed, its log is shown.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	cfg := config{aof: true}
	for _, o := range opts {
		o(&cfg)
	}
	return start(t, cfg)
}

var errPortTaken = errors.New("port taken")

func start(t testing.TB, cfg config) *Server {
	t.Helper()
	s := &Server{t: t, bin: binary(t), dir: t.TempDir(), cfg: cfg}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("log of redis-server %s (%s):\n%s", s.Addr(), s.dir, tail(s.Log(), 64<<10))
		}
	})
	// A free port can be taken by someone else between our probe and redis-server's bind: then try others.
	for attempt := 1; ; attempt++ {
		ports := freePorts(t, 1+boolInt(cfg.cluster))
		s.port = ports[0]
		if cfg.cluster {
			s.busPort = ports[1]
		}
		err := s.launch()
		if err == nil {
			return s
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			t.Fatalf("redistest: %v\nlog:\n%s", err, tail(s.Log(), 16<<10))
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// binary returns redis-server's path, failing the test when there is none or it is too old for this package.
func binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		binPath, binErr = exec.LookPath("redis-server")
		if binErr != nil {
			binErr = errors.New("redis-server is not on PATH: run scripts/test, which installs it, " +
				"or install it yourself (apt-get install redis-server)")
			return
		}
		out, err := exec.Command(binPath, "--version").Output()
		if err != nil {
			binErr = fmt.Errorf("%s --version: %v", binPath, err)
			return
		}
		// --enable-debug-command, --cluster-port and CLUSTER ADDSLOTSRANGE all came with Redis 7.0.
		m := regexp.MustCompile(`v=(\d+)\.`).FindSubmatch(out)
		if m == nil {
			binErr = fmt.Errorf("cannot read the version of %s from %q", binPath, out)
			return
		}
		if major, _ := strconv.Atoi(string(m[1])); major < 7 {
			binErr = fmt.Errorf("%s is too old (%s): redistest needs Redis 7.0 or later", binPath, bytes.TrimSpace(out))
		}
	})
	if binErr != nil {
		t.Fatalf("redistest: %v", binErr)
	}
	return binPath
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close() // held until all are chosen, so none is chosen twice
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

func (s *Server) args() []string {
	if s.cfg.sentinel != nil {
		return s.sentinelArgs()
	}
	a := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir, "--daemonize", "no",
		// No RDB snapshots: they fork, and the AOF is what a restart should be tested on.
		"--save", "",
		// A queue must refuse writes when full rather than lose keys, as production is configured.
		"--maxmemory-policy", "noeviction",
	}
	if s.cfg.aof {
		a = append(a, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		a = append(a, "--appendonly", "no")
	}
	if s.cfg.debug {
		a = append(a, "--enable-debug-command", "yes")
	}
	if s.cfg.cluster {
		a = append(a, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			// Its own bus port: the default, port+10000, may be taken or beyond 65535.
			"--cluster-port", strconv.Itoa(s.busPort),
			// Small, so a killed or stalled node is noticed by the others within a test's patience.
			"--cluster-node-timeout", "1000",
			// Announced, so the slot map names each node by its address from the start, not once a peer has told it.
			"--cluster-announce-ip", "127.0.0.1")
	}
	return append(a, s.cfg.extra...)
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "redis.log") }

// launch starts the process and waits until it is the one answering on its port with its data loaded.
func (s *Server) launch() error {
	before := len(s.Log())
	// The log is a plain file, not a pipe: a pipe held open by a forked AOF-rewrite child would keep
	// exec.Cmd.Wait from returning after the server itself is gone.
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	logf.Close()
	if err != nil {
		return fmt.Errorf("start %s: %v", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	if err := s.waitReady(p); err != nil {
		s.kill()
		if strings.Contains(s.Log()[before:], "Address already in use") {
			return fmt.Errorf("%w: %v", errPortTaken, err)
		}
		return err
	}
	return nil
}

// waitReady waits until INFO, on the server's port, names our process and no loading in progress. Asking
// for the pid matters: if the port was taken, another test's server may be the one answering.
func (s *Server) waitReady(p *process) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, PoolSize: 1,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	defer c.Close()
	want := "process_id:" + strconv.Itoa(p.cmd.Process.Pid) + "\r\n"
	sections := []string{"server", "persistence"}
	loaded := "loading:0\r\n"
	if s.cfg.sentinel != nil {
		sections, loaded = []string{"server"}, "" // a Sentinel has no data to load
	}
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for {
		if p.exited() {
			return fmt.Errorf("redis-server on %s exited while starting (%v)", s.Addr(), p.err)
		}
		// A plain dial first: go-redis logs every refused dial, and backs off after a few.
		conn, dialErr := net.DialTimeout("tcp", s.Addr(), time.Second)
		if dialErr == nil {
			conn.Close()
		}
		var info string
		var err error
		if dialErr == nil {
			info, err = c.Info(context.Background(), sections...).Result()
		}
		switch {
		case dialErr != nil:
			last = dialErr
		case err != nil:
			last = err
		case !strings.Contains(info, want):
			last = fmt.Errorf("another process answers on %s", s.Addr())
		case !strings.Contains(info, loaded):
			last = errors.New("still loading its data")
		default:
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready after 60s: %v", s.Addr(), last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's port, which stays the same across Stop and Start.
func (s *Server) Port() int { return s.port }

// URL returns the server's URL, database 0, for REDIS_URL.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Dir returns the server's data folder.
func (s *Server) Dir() string { return s.dir }

// Client returns a client of the server, closed when t ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Log returns what the server has logged since it was first started, restarts included.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logPath())
	return string(b)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "[…]" + s[len(s)-n:]
}

// running returns the running process, failing the test when there is none: a test that stops a server it
// never started, or one that died by itself, has a bug or found one.
func (s *Server) running(what string) *process {
	s.t.Helper()
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil {
		s.t.Fatalf("redistest: %s on %s, which is not running", what, s.Addr())
	}
	if p.exited() {
		s.t.Fatalf("redistest: %s on %s, which exited by itself (%v); log:\n%s", what, s.Addr(), p.err, tail(s.Log(), 16<<10))
	}
	return p
}

// Stop shuts the server down as an operator or an orchestrator would, with SIGTERM, and waits until it has
// exited: Redis first writes and fsyncs its AOF, so every write it acknowledged survives a Start. A stalled
// server handles the signal only when its stall ends.
func (s *Server) Stop() {
	s.t.Helper()
	p := s.running("Stop")
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		s.kill()
		s.t.Fatalf("redistest: redis-server on %s ignored SIGTERM for 60s; killed", s.Addr())
	}
	killGroup(p) // any child it forked and left behind
	s.mu.Lock()
	s.proc = nil
	s.mu.Unlock()
	if p.err != nil {
		s.t.Fatalf("redistest: redis-server on %s did not shut down cleanly (%v); log:\n%s", s.Addr(), p.err, tail(s.Log(), 16<<10))
	}
}

// Kill kills the server with SIGKILL, as a crash or the OOM killer would, and waits until it is gone. Writes
// of the last second may be lost with appendfsync everysec.
func (s *Server) Kill() {
	s.t.Helper()
	s.running("Kill")
	s.kill()
}

// kill kills the process group, if running, and waits for the server; it never fails the test, so cleanups
// can call it.
func (s *Server) kill() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	killGroup(p)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		s.t.Errorf("redistest: redis-server on %s (pid %d) still runs 30s after SIGKILL", s.Addr(), p.cmd.Process.Pid)
	}
}

// killGroup kills the server and every process it forked (an AOF rewrite), which share its process group.
func killGroup(p *process) {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	_ = p.cmd.Process.Kill()
}

// Start starts a stopped or killed server again, on the same port and data folder, and waits until it has
// loaded its data and answers.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		if !p.exited() {
			s.t.Fatalf("redistest: Start on %s, which is running", s.Addr())
		}
		s.t.Logf("redistest: redis-server on %s had exited by itself (%v); starting it again", s.Addr(), p.err)
	}
	if err := s.launch(); err != nil {
		s.t.Fatalf("redistest: restart: %v\nlog:\n%s", err, tail(s.Log(), 16<<10))
	}
}

// Stall freezes the server for d by sending DEBUG SLEEP on a connection of its own; it returns once the
// server has stopped answering, so what the test does next meets a frozen server. The returned channel is
// closed when the stall is over: the server answered DEBUG SLEEP, or it was killed meanwhile. The server must
// have been started WithDebugCommand (cluster nodes are).
func (s *Server) Stall(d time.Duration) <-chan struct{} {
	s.t.Helper()
	if !s.cfg.debug {
		s.t.Fatalf("redistest: Stall on %s needs DEBUG: start the server with redistest.WithDebugCommand()", s.Addr())
	}
	s.running("Stall")
	ctx := context.Background()
	sleeper := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 1, MaxRetries: -1, ReadTimeout: d + time.Minute})
	// How long a PING may go unanswered before the server counts as asleep: long enough for a loaded test
	// machine to answer an idle Redis, short enough to leave most of the stall to the test.
	patience := min(max(d/4, 5*time.Millisecond), 250*time.Millisecond)
	probe := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 1, MaxRetries: -1, ReadTimeout: patience})
	defer probe.Close()
	// Both connections are made before the stall, so neither dial is mistaken for it.
	for _, c := range []*redis.Client{sleeper, probe} {
		if err := c.Ping(ctx).Err(); err != nil {
			_ = sleeper.Close()
			s.t.Fatalf("redistest: Stall on %s: %v", s.Addr(), err)
		}
	}
	done := make(chan struct{})
	var stallErr error
	go func() {
		defer close(done)
		defer sleeper.Close()
		stallErr = sleeper.Do(ctx, "DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', -1, 64)).Err()
	}()
	for {
		err := probe.Ping(ctx).Err()
		select {
		case <-done: // over already (d shorter than the probe could see), or refused
			if stallErr != nil {
				s.t.Fatalf("redistest: DEBUG SLEEP on %s: %v", s.Addr(), stallErr)
			}
			return done
		default:
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return done
		}
		if err != nil {
			s.t.Fatalf("redistest: Stall on %s: PING: %v", s.Addr(), err)
		}
		time.Sleep(time.Millisecond) // DEBUG SLEEP not read yet
	}
}
