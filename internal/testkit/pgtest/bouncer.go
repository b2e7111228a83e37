package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bouncer is a private PgBouncer, in transaction pooling mode, that a test starts in front of a Postgres
// server: a test that PAUSEs or restarts a pooler must not do it to the shared one (PGBOUNCER_URL), which
// other tests use at the same time.
type Bouncer struct {
	t    testing.TB
	port int
	user string
	dir  string // its configuration and log
	cmd  *exec.Cmd
}

// StartPgBouncer starts a PgBouncer in transaction mode in front of the server of dbURL, on a free loopback
// port, with the URL's user as its admin (SHOW, PAUSE, RESUME). It is stopped when the test ends.
func StartPgBouncer(t testing.TB, dbURL string) *Bouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			t.Fatal("no pgbouncer binary: run scripts/services, which installs it, or apt-get install pgbouncer")
		}
		bin = "/usr/sbin/pgbouncer"
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	if user == "" {
		user = "postgres"
	}
	host, pgport := u.Hostname(), u.Port()
	if pgport == "" {
		pgport = "5432"
	}
	dir, err := os.MkdirTemp("", "oncegate-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	b := &Bouncer{t: t, port: freePort(t), user: user}
	b.dir = dir
	pass, _ := u.User.Password()
	b.write("users.txt", fmt.Sprintf("%q %q\n", user, pass))
	b.writeIni(host, pgport)
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	// PgBouncer refuses to run as root.
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chown", "-R", "postgres", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v %s", err, out)
		}
		args = append([]string{"-u", "postgres"}, args...)
	}
	b.cmd = exec.Command(bin, args...)
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, b.adminURL())
		if err == nil {
			conn.Close(ctx)
			return b
		}
		if ctx.Err() != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer did not answer: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL returns dbURL as reached through this PgBouncer.
func (b *Bouncer) URL(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		b.t.Fatal(err)
	}
	u.Host = "127.0.0.1:" + strconv.Itoa(b.port)
	return u.String()
}

func (b *Bouncer) adminURL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/pgbouncer?sslmode=disable&default_query_exec_mode=simple_protocol",
		url.User(b.user).String(), b.port)
}

// Admin runs a command of PgBouncer's admin console (PAUSE, RESUME, ...). PAUSE returns once every server
// connection is released: from then on, clients' queries wait in PgBouncer until RESUME.
func (b *Bouncer) Admin(command string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.adminURL())
	if err != nil {
		b.t.Fatalf("pgbouncer admin: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, command); err != nil {
		b.t.Fatalf("pgbouncer %s: %v", command, err)
	}
}

func (b *Bouncer) write(name, body string) {
	b.t.Helper()
	if err := os.WriteFile(filepath.Join(b.dir, name), []byte(body), 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// writeIni writes the configuration, with every database on the server at host:port.
func (b *Bouncer) writeIni(host, port string) {
	b.t.Helper()
	b.write("pgbouncer.ini", strings.Join([]string{"[databases]", fmt.Sprintf("* = host=%s port=%s", host, port), "",
		"[pgbouncer]", "listen_addr = 127.0.0.1", "listen_port = " + strconv.Itoa(b.port), "unix_socket_dir =",
		"auth_type = trust", "auth_file = " + filepath.Join(b.dir, "users.txt"), "pool_mode = transaction",
		"admin_users = " + b.user, "max_client_conn = 500", "default_pool_size = 20", "server_login_retry = 1",
		"log_connections = 0", "log_disconnections = 0", "logfile = " + filepath.Join(b.dir, "pgbouncer.log"), ""},
		"\n"))
}

// Repoint sends every database to the server of dbURL from now on, as a failover tool does after a promotion:
// it rewrites the configuration and has PgBouncer RELOAD it, which closes the server connections to the old
// server as they come free.
func (b *Bouncer) Repoint(dbURL string) {
	b.t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		b.t.Fatal(err)
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	b.writeIni(u.Hostname(), port)
	b.Admin("RELOAD")
}
