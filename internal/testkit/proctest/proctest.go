// Package proctest runs child processes for crash tests: a test starts a real process, reads the events it
// prints on stdout, and stops it the way a crash or a deploy would (SIGKILL, SIGSTOP, SIGTERM). Goroutines
// cannot be killed mid-instruction; processes can, which is the point.
//
// A test binary usually runs itself as the child: ReExec starts os.Args[0] with an environment variable that
// the test's TestMain checks to run the child's code instead of the tests.
package proctest

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a running child process.
type Proc struct {
	t      testing.TB
	cmd    *exec.Cmd
	done   chan struct{}
	notify chan struct{} // rung when a line arrives or stdout closes
	mu     sync.Mutex
	lines  []string // every stdout line, kept whole so a chatty child never blocks on its stdout
	next   int      // the first line WaitLine has not looked at
	closed bool
	log    bytes.Buffer // stderr, shown when the test fails
	err    error
}

// ReExec starts the test binary itself with role in the environment variable PROCTEST_ROLE and env added.
func ReExec(t testing.TB, role string, env ...string) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "PROCTEST_ROLE="+role), env...)
	return Start(t, cmd)
}

// Role returns the role a re-executed test binary was given, or "" in the parent.
func Role() string { return os.Getenv("PROCTEST_ROLE") }

// Start starts cmd, collecting its stdout lines as events and its stderr as a log. The process is killed when
// the test ends, if it still runs.
func Start(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{t: t, cmd: cmd, done: make(chan struct{}), notify: make(chan struct{}, 1)}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = writerFunc(func(b []byte) (int, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.log.Write(b)
	})
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			p.ring()
		}
		p.err = cmd.Wait()
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.ring()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("stderr of pid %d:\n%s", cmd.Process.Pid, p.Log())
		}
	})
	return p
}

// Pid returns the child's process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Log returns what the child wrote to stderr so far.
func (p *Proc) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func (p *Proc) ring() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// WaitLine returns the next stdout line that starts with prefix, skipping others, or fails the test after d.
func (p *Proc) WaitLine(prefix string, d time.Duration) string {
	p.t.Helper()
	timeout := time.After(d)
	for {
		p.mu.Lock()
		for p.next < len(p.lines) {
			l := p.lines[p.next]
			p.next++
			if strings.HasPrefix(l, prefix) {
				p.mu.Unlock()
				return l
			}
		}
		closed := p.closed
		p.mu.Unlock()
		if closed {
			p.t.Fatalf("pid %d exited (%v) before printing %q; stderr:\n%s", p.Pid(), p.err, prefix, p.Log())
		}
		select {
		case <-p.notify:
		case <-timeout:
			p.t.Fatalf("pid %d printed no %q within %v; stderr:\n%s", p.Pid(), prefix, d, p.Log())
		}
	}
}

// Lines returns every stdout line the child printed so far, whatever WaitLine has read.
func (p *Proc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lines)
}

// Signal sends sig to the child.
func (p *Proc) Signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v to pid %d: %v", sig, p.Pid(), err)
	}
}

// Kill sends SIGKILL and waits until the process is gone.
func (p *Proc) Kill() {
	p.t.Helper()
	p.Signal(syscall.SIGKILL)
	p.Wait(10 * time.Second)
}

// Wait waits for the process to exit and returns its exit error (nil for exit status 0).
func (p *Proc) Wait(d time.Duration) error {
	p.t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.t.Fatalf("pid %d did not exit within %v", p.Pid(), d)
		return nil
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

var _ io.Writer = writerFunc(nil)
