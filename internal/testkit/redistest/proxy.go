package redistest

import (
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy in front of a server, so that a test can cut some of the server's peers off (those that
// reach it through the proxy: its replicas, its Sentinels) while others (producers with the server's own
// address) still reach it: a network partition on one machine.
type Proxy struct {
	t      testing.TB
	target string
	l      net.Listener

	slow atomic.Int64 // ns each chunk of the server's answers waits before it goes on

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards each connection to target. It is closed when the
// test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, target: target, l: l, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = l.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Port returns the proxy's port.
func (p *Proxy) Port() int { return p.l.Addr().(*net.TCPAddr).Port }

// Host returns the proxy's host, for --replicaof.
func (p *Proxy) Host() string { return "127.0.0.1" }

// PortString returns the proxy's port as a string.
func (p *Proxy) PortString() string { return strconv.Itoa(p.Port()) }

// Cut closes every connection through the proxy and refuses new ones (they are accepted and closed at once)
// until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// Slow holds each chunk of what the server sends back for d before passing it on (0: at once), so that every
// call through the proxy is out for at least d: a distant or overloaded server.
func (p *Proxy) Slow(d time.Duration) { p.slow.Store(int64(d)) }

// Heal lets connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		p.mu.Unlock()
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		if p.cut { // cut while dialling
			p.mu.Unlock()
			_ = in.Close()
			_ = out.Close()
			continue
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			if src == out {
				_, _ = io.Copy(dst, slowReader{src, &p.slow})
			} else {
				_, _ = io.Copy(dst, src)
			}
			_ = dst.Close()
			_ = src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pipe(out, in) })
		p.wg.Go(func() { pipe(in, out) })
	}
}

// slowReader holds each chunk it reads for the proxy's current delay.
type slowReader struct {
	r     io.Reader
	delay *atomic.Int64
}

func (s slowReader) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	if d := time.Duration(s.delay.Load()); d > 0 && n > 0 {
		time.Sleep(d)
	}
	return n, err
}
