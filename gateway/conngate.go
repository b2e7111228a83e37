package gateway

// The connection gate: how many client connections the gateway holds, and which it closes to make room. A
// connection is counted before anyone knows whose it is, so a plain cap (accept nothing more once it is
// reached) lets whoever fills it, with idle connections or with requests that wait, keep every other tenant's
// first request in the kernel's accept queue. The gate tells the connections apart instead: those serving a
// request are kept, their number bounded per tenant where it can last (held.go); those that hold no request
// (opened and silent, idle between requests, or still sending their headers) share a smaller part of the cap,
// and past it the oldest of them are closed, so that a new connection is accepted at once. Only when every
// connection serves a request does the gate end a wait (of the tenant that holds the most) and, until
// something frees, leave new connections in the backlog.

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// newGrace is how long a new connection may stay silent before it may be closed to make room: a client
	// sends its request as soon as it has connected, so one silent this long is idle or an attacker's. It is
	// judged by when the server reads the request, not when it arrived: on a loaded machine a request can wait
	// in the socket for hundreds of milliseconds (CI, with the suite beside it, saw new connections of a
	// tenant closed at 250 ms), so the grace is a second.
	newGrace = time.Second
	// headerGrace is how long a connection may take sending its headers before it may be closed to make room.
	headerGrace = time.Second
	// gateRecheck is how often a gate that cannot accept looks again: connections age into being closable
	// without an event to wake it.
	gateRecheck = 50 * time.Millisecond
)

// connState is what a connection is doing, as far as the gate is concerned.
type connState int

const (
	connNew     connState = iota // accepted, nothing read yet
	connHeaders                  // a request's first bytes read, its handler not yet running
	connServing                  // a handler runs: never closed by the gate
	connIdle                     // between requests on a keep-alive connection
)

// gatedConn is one connection the gate counts.
type gatedConn struct {
	net.Conn
	state  connState
	since  time.Time
	closed bool // by the gate, or reported closed by the server
	// owner is the tenant whose key its last request carried, "" before one did.
	owner string
}

// connGate is a net.Listener that holds at most max connections, of which at most spare hold no request.
type connGate struct {
	net.Listener
	max, spare int
	// shed asks for a held wait to end (held.shedOne), false when there is none.
	shed func() bool
	// reaped counts the connections closed to make room, by what they were doing.
	reaped  *prometheus.CounterVec
	gauge   *prometheus.GaugeVec
	mu      sync.Mutex
	conns   map[net.Conn]*gatedConn
	serving int
	// owned counts the connections by owner ("" for those that have carried no valid key yet).
	owned   map[string]int
	changed chan struct{} // closed and replaced whenever a connection changes state or closes
	// lastShed is when a wait was last shed for room.
	lastShed time.Time
	// refused counts, per tenant, the requests refused for holding too many connections in the current
	// second (refusedIn), to spread their Retry-After (retryAfter).
	refused   map[string]int
	refusedIn time.Time
	// closed is set by Close: an Accept waiting for room goes on to the closed listener's error.
	closed bool
}

// Close closes the listener, and ends an Accept that waits for room.
func (g *connGate) Close() error {
	g.mu.Lock()
	g.closed = true
	g.signalLocked()
	g.mu.Unlock()
	return g.Listener.Close()
}

func newConnGate(l net.Listener, max int, shed func() bool, reaped *prometheus.CounterVec,
	gauge *prometheus.GaugeVec) *connGate {
	return &connGate{Listener: l, max: max, spare: spareConnections(max), shed: shed, reaped: reaped,
		gauge: gauge, conns: map[net.Conn]*gatedConn{}, owned: map[string]int{}, changed: make(chan struct{}),
		refused: map[string]int{}}
}

// spareConnections is the share of max that connections holding no request may take: a quarter, at least one.
func spareConnections(conns int) int { return max(1, conns/4) }

// Accept waits until the gate may hold one more connection, closing the oldest connections that hold no
// request when they are over their share or the gate is full, then accepts.
func (g *connGate) Accept() (net.Conn, error) {
	g.mu.Lock()
	for {
		g.reapLocked(time.Now())
		if len(g.conns) < g.max || g.closed {
			break
		}
		// Every connection serves a request: a wait can give its connection back at once, to a connection
		// that waits in the accept queue (none waits for Accept to be called). One at a time: the wait shed
		// answers, its connection turns idle and is closed above, and the gate looks again.
		now := time.Now()
		if now.Sub(g.lastShed) >= gateRecheck && backlogged(g.Listener) {
			g.lastShed = now
			g.shed()
		}
		changed := g.changed
		g.mu.Unlock()
		select {
		case <-changed:
		case <-time.After(gateRecheck):
		}
		g.mu.Lock()
	}
	g.mu.Unlock()
	c, err := g.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc := &gatedConn{Conn: c, state: connNew, since: time.Now()}
	g.mu.Lock()
	g.conns[gc] = gc
	g.owned[""]++
	g.publishLocked()
	g.mu.Unlock()
	return gc, nil
}

// reapLocked closes connections that hold no request while they are over their share or the gate is full:
// of those closable (idle, or silent past newGrace, or sending headers past headerGrace), one of the owner
// with the most connections, the oldest of its. A tenant's first keptConns connections are closed only when
// the gate is full and nothing else can be, now or later. So the connections of whoever opens many are closed before the
// few another tenant keeps alive between its requests, which then never go back to the accept queue, where
// they would wait behind every connection the first one opens.
func (g *connGate) reapLocked(now time.Time) {
	for len(g.conns)-g.serving > g.spare || len(g.conns) >= g.max {
		victim, later := g.victimLocked(now, false)
		if victim == nil && !later && len(g.conns) >= g.max {
			victim, _ = g.victimLocked(now, true)
		}
		if victim == nil {
			return
		}
		g.reaped.WithLabelValues(victim.state.String()).Inc()
		g.forgetLocked(victim)
		_ = victim.Conn.Close() // the server sees its read fail and reports the connection closed
	}
}

// keptConns is how many connections of each tenant the gate keeps while it can close others.
const keptConns = 8

// victimLocked is the connection to close, or nil; later is whether some connection that is not a kept one
// will be closable once it has aged or its request has ended, in which case the kept ones are left alone
// meanwhile: the gate waits for it rather than send a tenant that keeps a few connections back to the accept
// queue.
func (g *connGate) victimLocked(now time.Time, kept bool) (victim *gatedConn, later bool) {
	for _, c := range g.conns {
		isKept := c.owner != "" && g.owned[c.owner] <= keptConns
		if !kept && isKept {
			continue
		}
		if !c.closable(now) {
			later = true // it ages into closable, or its request ends (or its wait is shed) and it idles
			continue
		}
		if victim == nil || g.owned[c.owner] > g.owned[victim.owner] ||
			(g.owned[c.owner] == g.owned[victim.owner] && c.since.Before(victim.since)) {
			victim = c
		}
	}
	return victim, later
}

func (c *gatedConn) closable(now time.Time) bool {
	switch c.state {
	case connIdle:
		return true
	case connNew:
		return now.Sub(c.since) >= newGrace
	case connHeaders:
		return now.Sub(c.since) >= headerGrace
	}
	return false
}

func (s connState) String() string {
	return [...]string{"new", "headers", "serving", "idle"}[s]
}

func (g *connGate) forgetLocked(c *gatedConn) {
	if c.closed {
		return
	}
	c.closed = true
	if c.state == connServing {
		g.serving--
	}
	if g.owned[c.owner]--; g.owned[c.owner] == 0 {
		delete(g.owned, c.owner)
	}
	delete(g.conns, c)
	g.signalLocked()
	g.publishLocked()
}

func (g *connGate) setLocked(c *gatedConn, s connState) {
	if c.closed || c.state == s {
		return
	}
	if c.state == connServing {
		g.serving--
	}
	if s == connServing {
		g.serving++
	}
	c.state, c.since = s, time.Now()
	g.signalLocked()
	g.publishLocked()
}

func (g *connGate) signalLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *connGate) publishLocked() {
	if g.gauge == nil {
		return
	}
	var n [4]int
	for _, c := range g.conns {
		n[c.state]++
	}
	for s, v := range n {
		g.gauge.WithLabelValues(connState(s).String()).Set(float64(v))
	}
}

// connStateHook is http.Server.ConnState: it follows each connection from request to request.
func (g *connGate) connStateHook(c net.Conn, s http.ConnState) {
	gc, ok := c.(*gatedConn)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch s {
	case http.StateActive:
		g.setLocked(gc, connHeaders)
	case http.StateIdle:
		g.setLocked(gc, connIdle)
	case http.StateClosed, http.StateHijacked:
		g.forgetLocked(gc)
	}
}

type gatedConnKey struct{}

// connContext is http.Server.ConnContext: it gives each request its connection, for serve.
func (g *connGate) connContext(ctx context.Context, c net.Conn) context.Context {
	if gc, ok := c.(*gatedConn); ok {
		return context.WithValue(ctx, gatedConnKey{}, gc)
	}
	return ctx
}

// serve marks the request's connection serving while next runs, so the gate never closes it under a request.
func (g *connGate) serve(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gc, ok := r.Context().Value(gatedConnKey{}).(*gatedConn); ok {
			g.mu.Lock()
			g.setLocked(gc, connServing)
			g.mu.Unlock()
			// The server reports the connection idle (or closed) once the answer is written.
		}
		next.ServeHTTP(w, r)
	})
}

// claim records that the request's connection carried tenant's valid key (authenticateBy), so that the gate
// counts it as the tenant's when it chooses which connection to close. It returns false when the gate is
// pressed (three quarters full) and the tenant owns more than a quarter of its connections: the request is
// then refused at once, with no database work, and its connection closed. Under pressure the gateway can
// answer only as fast as it works, and every connection in the accept queue waits for those ahead of it: a
// tenant that keeps thousands there must not have each of them cost more than a refusal.
func (g *connGate) claim(r *http.Request, tenant string) bool {
	gc, ok := r.Context().Value(gatedConnKey{}).(*gatedConn)
	if !ok {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !gc.closed && gc.owner != tenant {
		if g.owned[gc.owner]--; g.owned[gc.owner] == 0 {
			delete(g.owned, gc.owner)
		}
		gc.owner = tenant
		g.owned[tenant]++
	}
	return len(g.conns) < g.max*3/4 || g.owned[tenant] <= heldCeiling(g.max)
}

// maxRetryAfter bounds the Retry-After of a refused request, in seconds.
const maxRetryAfter = 30

// retryAfter is the Retry-After, in seconds, of a request of tenant that claim refused: the first refusals
// of a second are told 1, and each further share of the tenant's ceiling one second more, up to
// maxRetryAfter. A tenant whose clients all come back after the same second reconnects all at once, and
// every new connection, another tenant's first request among them, waits behind those in the kernel's
// accept queue (issue 33: 2,000 waits of one tenant refused with "Retry-After: 1" came back 1,300 times a
// second, and another tenant's request on a new connection took up to 1.1 s); spread, as many come back each
// second as the tenant may hold.
func (g *connGate) retryAfter(tenant string, now time.Time) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now.Sub(g.refusedIn) >= time.Second {
		clear(g.refused)
		g.refusedIn = now
	}
	n := g.refused[tenant]
	g.refused[tenant]++
	return min(maxRetryAfter, 1+n/heldCeiling(g.max))
}
