package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterName is the name the Sentinels of StartSentinels monitor their primary under.
const MasterName = "oncegate"

type sentinelConf struct {
	host   string
	port   int
	quorum int
}

// StartReplica starts a server that replicates the one at primary (host:port, which may be a Proxy's
// address) and returns once its link is up and it has loaded the primary's data. opts apply as to Start.
func StartReplica(t testing.TB, primary string, opts ...Option) *Server {
	t.Helper()
	host, port, ok := strings.Cut(primary, ":")
	if !ok {
		t.Fatalf("redistest: StartReplica: %q is not host:port", primary)
	}
	r := Start(t, append(opts, WithArgs("--replicaof", host, port))...)
	r.WaitLinkUp(30 * time.Second)
	waitOnline(t, primary, r.Addr(), 30*time.Second)
	return r
}

// waitOnline waits until the primary counts the replica at addr as online and a WAIT for every online
// replica returns in time. The replica's link is up before that: after a diskless sync the primary puts it
// online at its first REPLCONF ACK, sent once a second, and until then a WAIT counts it out (a CI run's first
// enqueue after StartReplica waited its 300 ms for 0 of 1 replicas).
func waitOnline(t testing.TB, primary, addr string, d time.Duration) {
	t.Helper()
	_, port, _ := strings.Cut(addr, ":")
	c := redis.NewClient(&redis.Options{Addr: primary, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	deadline := time.Now().Add(d)
	for {
		info, _ := c.Info(ctx, "replication").Result()
		online, ours := 0, false
		for _, line := range strings.Split(info, "\n") {
			if strings.HasPrefix(line, "slave") && strings.Contains(line, "state=online") {
				online++
				ours = ours || strings.Contains(line, ",port="+port+",")
			}
		}
		if ours {
			n, err := c.Do(ctx, "WAIT", online, 1000).Int()
			if err == nil && n >= online {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: primary %s does not count replica %s online and acknowledging after %v:\n%s",
				primary, addr, d, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitLinkUp waits until the server is a replica whose link to its primary is up.
func (s *Server) WaitLinkUp(d time.Duration) {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(d)
	for {
		info, _ := c.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") && strings.Contains(info, "master_sync_in_progress:0") {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: replica %s not in sync after %v:\n%s", s.Addr(), d, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Role returns the server's role as INFO replication says: "master", "slave", or the error.
func (s *Server) Role() string {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(context.Background(), "replication").Result()
	if err != nil {
		return err.Error()
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			return v
		}
	}
	return "unknown"
}

// StartSentinels starts n Sentinels that monitor the primary at primary (host:port, which may be a Proxy's
// address) as MasterName with the given quorum, and returns once each has found the others and the primary's
// replicas. They judge a primary down after 1 s without an answer and give a failover 3 s, so a test sees a
// failover within a few seconds.
func StartSentinels(t testing.TB, n, quorum int, primary string, replicas int) []*Server {
	t.Helper()
	host, port, ok := strings.Cut(primary, ":")
	if !ok {
		t.Fatalf("redistest: StartSentinels: %q is not host:port", primary)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("redistest: StartSentinels: %q: %v", primary, err)
	}
	var ss []*Server
	for range n {
		ss = append(ss, start(t, config{sentinel: &sentinelConf{host: host, port: p, quorum: quorum}}))
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range ss {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		for {
			m, err := c.Master(context.Background(), MasterName).Result()
			if err == nil && m["num-other-sentinels"] == strconv.Itoa(n-1) && m["num-slaves"] == strconv.Itoa(replicas) {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				t.Fatalf("redistest: Sentinel %s did not find %d others and %d replicas in 30s: %v %v", s.Addr(),
					n-1, replicas, m, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return ss
}

// SentinelAddrs returns the Sentinels' host:port addresses, for redis.FailoverOptions.
func SentinelAddrs(ss []*Server) []string {
	a := make([]string, len(ss))
	for i, s := range ss {
		a[i] = s.Addr()
	}
	return a
}

// WaitFailover waits until a Sentinel names a primary other than old (host:port) and that server answers
// as a master, and returns its address.
func WaitFailover(t testing.TB, ss []*Server, old string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, s := range ss {
			c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
			addr, err := c.GetMasterAddrByName(context.Background(), MasterName).Result()
			_ = c.Close()
			if err != nil || len(addr) != 2 || addr[0]+":"+addr[1] == old {
				continue
			}
			m := redis.NewClient(&redis.Options{Addr: addr[0] + ":" + addr[1], MaxRetries: -1})
			info, _ := m.Info(context.Background(), "replication").Result()
			_ = m.Close()
			if strings.Contains(info, "role:master") {
				return addr[0] + ":" + addr[1]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no failover away from %s within %v", old, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sentinelArgs writes the Sentinel's config file, which Sentinel rewrites as it learns, once, and runs
// redis-server in Sentinel mode on it.
func (s *Server) sentinelArgs() []string {
	conf := filepath.Join(s.dir, "sentinel.conf")
	sc := s.cfg.sentinel
	text := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
daemonize no
sentinel monitor %s %s %d %d
sentinel down-after-milliseconds %[3]s 1000
sentinel failover-timeout %[3]s 3000
sentinel parallel-syncs %[3]s 1
`, s.port, s.dir, MasterName, sc.host, sc.port, sc.quorum)
	if _, err := os.Stat(conf); err != nil {
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			s.t.Fatalf("redistest: %v", err)
		}
	}
	return []string{conf, "--sentinel"}
}

// Freeze stops the server with SIGSTOP, as a stuck host would: its connections stay open and nothing
// answers. Thaw resumes it.
func (s *Server) Freeze() {
	s.t.Helper()
	p := s.running("Freeze")
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("redistest: SIGSTOP %s: %v", s.Addr(), err)
	}
}

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw() {
	s.t.Helper()
	p := s.running("Thaw")
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("redistest: SIGCONT %s: %v", s.Addr(), err)
	}
}
