package providertest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// Resetting is an HTTP/1.1 server on a real socket that answers the first request of each connection with
// 201 and keeps the connection open, and resets the connection after it has read the second request of a
// connection, without a byte of answer: an upstream that crashed mid-request, or a load balancer that dropped
// it. Go's Transport retries such a request on its own when it takes it for idempotent (an Idempotency-Key
// header is enough), so a provider that let it would reach the destination twice for one attempt.
type Resetting struct {
	URL      string
	requests atomic.Int64
}

// NewResetting starts a Resetting server, closed when the test ends.
func NewResetting(t testing.TB) *Resetting {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Resetting{URL: "http://" + l.Addr().String()}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s
}

// Requests is how many requests the server read, answered or not.
func (s *Resetting) Requests() int64 { return s.requests.Load() }

func (s *Resetting) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for n := 1; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		s.requests.Add(1)
		if n >= 2 {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close with a reset, not a FIN
			}
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
	}
}
