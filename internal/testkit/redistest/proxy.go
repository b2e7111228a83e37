package redistest

import (
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a server, so that a test can cut some of the server's peers off (those that
// reach it through the proxy: its replicas, its Sentinels) while others (producers with the server's own
// address) still reach it: a network partition on one machine.
type Proxy struct {
	t      testing.TB
	target string
	l      net.Listener

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
			_, _ = io.Copy(dst, src)
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
