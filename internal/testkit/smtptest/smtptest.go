// Package smtptest runs a real SMTP server (github.com/emersion/go-smtp) on loopback for tests and for the
// crash demo: it records every message it accepts, with the envelope's command lines as they came over the
// wire, and can be told to misbehave the way mail servers do (refuse a recipient, defer with a 4xx, hang, or
// drop the connection after the message was sent).
//
// Every message it accepts is held to the standards by Check (RFC 5321/5322, MIME, RFC 2047): a server from
// Start fails its test, when the test ends, for each malformed message it received, so any test that sends
// mail through it checks what it sent without asking.
package smtptest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/mail"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-smtp"
)

// Message is a message the server accepted.
type Message struct {
	// From and To are the envelope's addresses as go-smtp parsed them (a quoted local part unquoted).
	From string
	To   []string
	// Envelope is the transaction's MAIL and RCPT command lines as the client sent them, CRLF removed.
	Envelope []string
	// SMTPUTF8 says whether MAIL FROM asked for SMTPUTF8 (RFC 6531).
	SMTPUTF8  bool
	Data      []byte
	MessageID string
	Header    mail.Header
	// Parts are the leaves of the message's MIME tree, decoded; Malformed is what Check found wrong.
	Parts     []Part
	Malformed error
	// Received is when the server had the whole message, before it answered the end of DATA.
	Received time.Time
	// Answered is when the server's 250 to the end of DATA was written to the connection: from then on the
	// client could know that the message was taken. Zero until then, and for a message refused.
	Answered time.Time
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
	malformed []error // what Check found, one per malformed message received
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
	s.srv.EnableSMTPUTF8 = true
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
		_ = s.srv.Serve(recordingListener{l})
	}()
	return s, nil
}

// TB is what Start needs of a test: testing.TB satisfies it. The package does not import testing itself,
// because the crash demo (cmd/killtest), a binary, runs this server, and no binary links package testing
// (internal/testkit/deptest checks it).
type TB interface {
	Helper()
	Fatal(args ...any)
	Errorf(format string, args ...any)
	Cleanup(func())
}

// Start runs a server on loopback until the test ends.
func Start(t TB) *Server {
	t.Helper()
	s, err := New("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		for _, err := range s.Malformed() {
			t.Errorf("smtptest: the server received a malformed message: %v", err)
		}
	})
	return s
}

// Malformed returns what Check found wrong with each malformed message received so far, whether the server
// accepted it or a fault refused it.
func (s *Server) Malformed() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.malformed...)
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
	utf8 bool
	to   []string
}

func (x *session) Reset()        { x.from, x.utf8, x.to = "", false, nil }
func (x *session) Logout() error { return nil }

func (x *session) Mail(from string, opts *smtp.MailOptions) error {
	x.from, x.utf8 = from, opts != nil && opts.UTF8
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
	// Every message is checked, the ones a fault refuses too: what a client sent is malformed or not
	// whatever the server answers.
	msg := Message{From: x.from, To: x.to, SMTPUTF8: x.utf8, Data: data, Received: time.Now()}
	if rc, ok := x.conn.Conn().(*recordingConn); ok {
		msg.Envelope = rc.envelope()
	}
	if m, err := mail.ReadMessage(bytes.NewReader(data)); err == nil {
		msg.Header = m.Header
		msg.MessageID = m.Header.Get("Message-Id")
	}
	msg.Parts, msg.Malformed = Check(data, x.utf8)
	x.s.mu.Lock()
	fault := x.s.fault
	if msg.Malformed != nil {
		x.s.malformed = append(x.s.malformed, fmt.Errorf("message %s (envelope %q): %w", msg.MessageID, msg.Envelope, msg.Malformed))
	}
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
	x.s.mu.Lock()
	x.s.messages = append(x.s.messages, msg)
	idx := len(x.s.messages) - 1
	on := x.s.onMessage
	x.s.mu.Unlock()
	if rc, ok := x.conn.Conn().(*recordingConn); ok {
		rc.answered(func(at time.Time) {
			x.s.mu.Lock()
			x.s.messages[idx].Answered = at
			x.s.mu.Unlock()
		})
	}
	if on != nil {
		on(msg)
	}
	if fault == DropAfterData {
		_ = x.conn.Conn().Close()
	}
	return nil
}

// recordingListener hands go-smtp connections that keep the client's command lines.
type recordingListener struct{ net.Listener }

func (l recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c}, nil
}

// recordingConn keeps the MAIL and RCPT lines of the current transaction as the client sent them, since go-smtp
// hands the session only what it parsed out of them (a quoted local part unquoted, parameters split off). It
// follows the client's lines as go-smtp reads them: a line "DATA" starts the message, a lone "." ends it.
type recordingConn struct {
	net.Conn
	mu       sync.Mutex
	partial  []byte
	inData   bool
	commands []string
	answer   func(at time.Time) // stamps the message whose reply is the next write
}

// answered has the next write, the server's reply to the end of the message's DATA, call stamp when done.
func (c *recordingConn) answered(stamp func(at time.Time)) {
	c.mu.Lock()
	c.answer = stamp
	c.mu.Unlock()
}

func (c *recordingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.mu.Lock()
	stamp := c.answer
	c.answer = nil
	c.mu.Unlock()
	if stamp != nil && err == nil {
		stamp(time.Now())
	}
	return n, err
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, b[:n]...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSuffix(string(c.partial[:i]), "\r")
		c.partial = c.partial[i+1:]
		if c.inData {
			c.inData = line != "."
			continue
		}
		switch verb := strings.ToUpper(line[:min(4, len(line))]); verb {
		case "MAIL":
			c.commands = []string{line}
		case "RCPT":
			c.commands = append(c.commands, line)
		case "DATA":
			c.inData = true
		case "RSET":
			c.commands = nil
		}
	}
	return n, err
}

func (c *recordingConn) envelope() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.commands...)
}
