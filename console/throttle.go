package console

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Failed logins and bearer tokens are throttled per client address. Tokens are 256-bit secrets, so the
// throttle is not what stops guessing: it bounds what guessing costs, a database lookup per try and an
// audit row per failed login (an outside tester filled the log at will), and makes a script with a stale
// token stop rather than hammer. A few free tries forgive typos; then each failure locks the address out
// for twice as long as the last, up to throttleMax, and a success or throttleForget without a failure
// clears it.
const (
	throttleFree   = 5
	throttleBase   = time.Second
	throttleMax    = 5 * time.Minute
	throttleForget = 15 * time.Minute
	// throttleKeep bounds the addresses remembered, so that a flood from many addresses costs memory once.
	throttleKeep = 100_000
)

type throttle struct {
	mu    sync.Mutex
	addrs map[string]*strikes
	now   func() time.Time
}

type strikes struct {
	n     int
	last  time.Time
	until time.Time
}

func newThrottle() *throttle {
	return &throttle{addrs: map[string]*strikes{}, now: time.Now}
}

// clientAddr is the address a request came from, without its port. The console is meant to sit on loopback
// or behind its operators' own proxy; a proxy's clients share its address, and so its lockouts.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// wait says how long addr must wait before its next try counts; 0 means go ahead.
func (t *throttle) wait(addr string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.addrs[addr]
	if s == nil {
		return 0
	}
	now := t.now()
	if now.Sub(s.last) > throttleForget {
		delete(t.addrs, addr)
		return 0
	}
	return max(s.until.Sub(now), 0)
}

// fail records a failed try from addr.
func (t *throttle) fail(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	s := t.addrs[addr]
	if s == nil || now.Sub(s.last) > throttleForget {
		if len(t.addrs) >= throttleKeep {
			t.pruneLocked(now)
		}
		s = &strikes{}
		t.addrs[addr] = s
	}
	s.n++
	s.last = now
	if over := s.n - throttleFree; over > 0 {
		d := time.Duration(float64(throttleBase) * math.Pow(2, float64(min(over-1, 20))))
		s.until = now.Add(min(d, throttleMax))
	}
}

// ok clears addr after a success.
func (t *throttle) ok(addr string) {
	t.mu.Lock()
	delete(t.addrs, addr)
	t.mu.Unlock()
}

func (t *throttle) pruneLocked(now time.Time) {
	for a, s := range t.addrs {
		if now.Sub(s.last) > throttleForget || now.After(s.until) {
			delete(t.addrs, a)
		}
	}
	// Still full: a flood of addresses each locked out. Forget half at random (map order) rather than grow.
	for a := range t.addrs {
		if len(t.addrs) < throttleKeep/2 {
			break
		}
		delete(t.addrs, a)
	}
}

// throttledError is a try refused unread because its address failed too often.
type throttledError struct{ wait time.Duration }

func (e *throttledError) Error() string {
	return fmt.Sprintf("too many failed logins or tokens from this address: try again in %s", e.retryAfter()+"s")
}

func (e *throttledError) retryAfter() string {
	return strconv.Itoa(int(math.Ceil(e.wait.Seconds())))
}
