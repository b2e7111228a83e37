package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a private Postgres server that a test starts, stops and starts again, for outage tests that
// must not disturb the shared server other tests use.
type Cluster struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	as   []string // "runuser -u postgres --" when the test runs as root, which Postgres refuses
	// killed is set once Kill SIGKILLed the postmaster.
	killed bool
}

// StartCluster initialises and starts a cluster on a free loopback port. It is stopped and removed when the
// test ends. A machine without the Postgres server binaries fails the test rather than skipping it: scripts/test
// installs them, and a skipped outage test would hide that the outage was never tried.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	c := newCluster(t)
	if out, err := c.cmd("initdb", "-D", c.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	c.Start()
	return c
}

// newCluster makes the folder of a cluster, not yet initialised, and arranges for its removal.
func newCluster(t testing.TB) *Cluster {
	t.Helper()
	bin := serverBin()
	if bin == "" {
		t.Fatal("no Postgres server binaries (initdb, pg_ctl) found: run scripts/test, which installs them, " +
			"or install them yourself (apt-get install postgresql)")
	}
	c := &Cluster{t: t, bin: bin, port: freePort(t)}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			t.Fatal("running as root without a postgres user to run a private cluster as (Postgres refuses root): " +
				"run scripts/test, which creates one, or install postgresql, whose package does")
		}
		c.as = []string{"runuser", "-u", "postgres", "--"}
	}
	dir, err := os.MkdirTemp(os.TempDir(), "oncegate-pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	if len(c.as) > 0 {
		if out, err := exec.Command("chown", "postgres", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v %s", err, out)
		}
	}
	t.Cleanup(func() {
		if !c.killed { // pg_ctl would wait for a dead postmaster to remove its pid file
			c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "stop")
		}
		_ = os.RemoveAll(dir)
	})
	return c
}

func serverBin() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			// The folder of the real binary, not of a link to it on PATH: pg_basebackup is there too.
			if real, err := filepath.EvalSymlinks(p); err == nil {
				p = real
			}
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) cmd(tool string, args ...string) *exec.Cmd {
	full := append(append([]string{}, c.as...), append([]string{filepath.Join(c.bin, tool)}, args...)...)
	return exec.Command(full[0], full[1:]...)
}

func (c *Cluster) run(tool string, args ...string) {
	_ = c.cmd(tool, args...).Run()
}

// Port returns the port the cluster listens on, at 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// URL returns the URL of the cluster's postgres database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Start starts the server (again) and waits until it accepts connections.
func (c *Cluster) Start() {
	c.t.Helper()
	out, err := c.cmd("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "-o",
		"-p "+strconv.Itoa(c.port)+" -c listen_addresses=127.0.0.1 -k "+c.dir, "start").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		c.t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.URL())
		if err == nil {
			conn.Close(ctx)
			return
		}
		if ctx.Err() != nil {
			c.t.Fatalf("cluster did not accept connections: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server at once, as a crash or an outage would, dropping every connection.
func (c *Cluster) Stop() {
	c.t.Helper()
	if out, err := c.cmd("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop").CombinedOutput(); err != nil {
		c.t.Fatalf("pg_ctl stop: %v\n%s", err, out)
	}
}
