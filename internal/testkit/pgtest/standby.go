package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Replication is how a primary waits for its standby when it commits: as Postgres's pg_stat_replication.sync_state
// names it.
type Replication string

const (
	// Async: a commit is acknowledged once it is on the primary's disk; what the standby has not received yet
	// is lost when the primary dies and the standby is promoted.
	Async Replication = "async"
	// Sync: a commit is acknowledged once the standby has it on disk too (synchronous_standby_names = '*').
	Sync Replication = "sync"
)

// StartStandby makes a streaming standby of c, as an operator would: a base backup of c (pg_basebackup -R, so
// that it follows c) into a new private cluster, started on a port of its own. With Sync, c is set to wait for
// it at every commit (synchronous_standby_names = '*'). It returns once c streams to the standby under the
// sync_state asked for. Create the test's databases on c before: the standby starts as a copy of c.
func (c *Cluster) StartStandby(r Replication) *Cluster {
	c.t.Helper()
	s := newCluster(c.t)
	out, err := s.cmd("pg_basebackup", "-D", s.data(), "-R", "-X", "stream", "-c", "fast", "-h", "127.0.0.1",
		"-p", strconv.Itoa(c.port), "-U", "postgres").CombinedOutput()
	if err != nil {
		c.t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	// The walreceiver introduces itself by cluster_name: the primary's pg_stat_replication names the standby so.
	name := fmt.Sprintf("standby_%d", s.port)
	f, err := os.OpenFile(filepath.Join(s.data(), "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = fmt.Fprintf(f, "cluster_name = '%s'\n", name)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		c.t.Fatal(err)
	}
	s.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		c.t.Fatalf("primary: %v", err)
	}
	defer conn.Close(ctx)
	names := ""
	if r == Sync {
		names = "*"
	}
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '"+names+"'"); err != nil {
		c.t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		c.t.Fatal(err)
	}
	for {
		var state, sync string
		err := conn.QueryRow(ctx, "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1",
			name).Scan(&state, &sync)
		if err == nil && state == "streaming" && sync == string(r) {
			return s
		}
		if ctx.Err() != nil {
			log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
			c.t.Fatalf("the primary does not stream to its standby as %s (state %q, sync_state %q, %v)\n%s", r, state,
				sync, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill SIGKILLs the cluster's postmaster, as a crash would (pg_ctl's immediate stop is an orderly shutdown by
// comparison: it tells the backends and the walsenders), and returns once it no longer accepts connections.
// Its backends notice on their own that the postmaster died and end, as on a crashed server.
func (c *Cluster) Kill() {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.data(), "postmaster.pid"))
	if err != nil {
		c.t.Fatalf("postmaster.pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		c.t.Fatalf("postmaster.pid: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		c.t.Fatalf("kill postmaster %d: %v", pid, err)
	}
	c.killed = true
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			c.t.Fatalf("postmaster %d still runs 10 s after SIGKILL", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether the process pid runs: it exists and is not a zombie waiting for its parent (pg_ctl
// left the postmaster to init, which may reap it late).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil // no /proc: ask the kernel
	}
	// The state follows the command's closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

// Promote makes a standby the primary (pg_ctl promote) and returns once it accepts writes.
func (c *Cluster) Promote() {
	c.t.Helper()
	if out, err := c.cmd("pg_ctl", "-D", c.data(), "-w", "-t", "60", "promote").CombinedOutput(); err != nil {
		c.t.Fatalf("pg_ctl promote: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		var recovering bool
		conn, err := pgx.Connect(ctx, c.URL())
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering)
			conn.Close(ctx)
		}
		if err == nil && !recovering {
			return
		}
		if ctx.Err() != nil {
			c.t.Fatalf("the standby is still in recovery 30 s after pg_ctl promote (%v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
