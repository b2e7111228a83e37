// Package smtptest runs a real SMTP server (github.com/emersion/go-smtp) on loopback for tests and for the
// crash demo: it records every message it accepts, and can be told to misbehave the way mail servers do
// (refuse a recipient, defer with a 4xx, hang, or drop the connection after the message was sent).
package smtptest

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/mail"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

// Message is a message the server accepted.
type Message struct {
	From      string
	To        []string
	Data      []byte
	MessageID string
	Header    mail.Header
}

// Fault makes the server misbehave.
type Fault int

const (
	None Fault = iota
	// Defer answers DATA with 451: try again later.
	Defer
	// Reject answers DATA with 554: refused for good.
	Reject
	// Hang never answers DATA.
	Hang
	// DropAfterData reads the message, then closes the connection without answering: the client cannot
	// know whether it was accepted. The message is recorded as accepted.
	DropAfterData
)

// Server is a running SMTP server.
type Server struct {
	Addr string

	mu        sync.Mutex
	messages  []Message
	fault     Fault
	refuse    map[string]bool // recipients answered 550
	onMessage func(Message)
	srv       *smtp.Server
	l         net.Listener
	closeOnce sync.Once
	closed    chan struct{} // closed by Close: a hung DATA returns
	served    chan struct{} // closed when Serve has returned
}

// New starts a server on addr ("127.0.0.1:0" for any free port). Close stops it.
func New(addr string) (*Server, error) {
	s := &Server{refuse: map[string]bool{}, closed: make(chan struct{}), served: make(chan struct{})}
	s.srv = smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &session{s: s, conn: c}, nil
	}))
	s.srv.Domain = "smtptest.invalid"
	s.srv.AllowInsecureAuth = true
	s.srv.ReadTimeout = 30 * time.Second
	s.srv.WriteTimeout = 30 * time.Second
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s.Addr, s.l = l.Addr().String(), l
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(l)
	}()
	return s, nil
}

// Start runs a server on loopback until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Close stops the server and waits until it no longer accepts. It closes the listener itself, since go-smtp
// closes only the listeners Serve has registered, and a Close that comes before Serve's goroutine first runs
// would leave it accepting for ever.
func (s *Server) Close() error {
	err := s.srv.Close()
	s.closeOnce.Do(func() {
		close(s.closed)
		_ = s.l.Close()
		<-s.served
	})
	return err
}

// OnMessage sets a function called with every message the server accepts, as it accepts it.
func (s *Server) OnMessage(f func(Message)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onMessage = f
}

// SetFault sets how the server answers from now on.
func (s *Server) SetFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
}

// Refuse makes RCPT TO for addr fail with 550.
func (s *Server) Refuse(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse[strings.ToLower(addr)] = true
}

// Messages returns the messages accepted so far.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

// ByMessageID counts the accepted messages per Message-ID.
func (s *Server) ByMessageID() map[string]int {
	out := map[string]int{}
	for _, m := range s.Messages() {
		out[m.MessageID]++
	}
	return out
}

type session struct {
	s    *Server
	conn *smtp.Conn
	from string
	to   []string
}

func (x *session) Reset()        { x.from, x.to = "", nil }
func (x *session) Logout() error { return nil }

func (x *session) Mail(from string, _ *smtp.MailOptions) error {
	x.from = from
	return nil
}

func (x *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	x.s.mu.Lock()
	refused := x.s.refuse[strings.ToLower(to)]
	x.s.mu.Unlock()
	if refused {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user: " + to}
	}
	x.to = append(x.to, to)
	return nil
}

func (x *session) Data(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	x.s.mu.Lock()
	fault := x.s.fault
	x.s.mu.Unlock()
	switch fault {
	case Defer:
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
	case Reject:
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "message refused"}
	case Hang:
		select { // hang until the client gives up or the server closes
		case <-time.After(time.Minute):
		case <-x.s.closed:
		}
		return errors.New("hung")
	}
	msg := Message{From: x.from, To: x.to, Data: data}
	if m, err := mail.ReadMessage(bytes.NewReader(data)); err == nil {
		msg.Header = m.Header
		msg.MessageID = m.Header.Get("Message-Id")
	}
	x.s.mu.Lock()
	x.s.messages = append(x.s.messages, msg)
	on := x.s.onMessage
	x.s.mu.Unlock()
	if on != nil {
		on(msg)
	}
	if fault == DropAfterData {
		_ = x.conn.Conn().Close()
	}
	return nil
}
