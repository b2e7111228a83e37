// Package smtp is the email provider: an SMTP client (github.com/emersion/go-smtp; STARTTLS when offered,
// AUTH when configured) that sends each effect as one message whose Message-ID is derived from the effect's
// stable id. The server's reply decides the outcome: 4xx is retried, 5xx (and an invalid address) fails for
// good, and an enhanced status code (RFC 3463) that calls a 5xx reply transient makes it a retry too.
//
// The message is exact, so that no payload can change its shape: the envelope writes each address as
// RFC 5321 does (a local part that is not a dot-string quoted, '"' and '\' escaped), and refuses at request
// time what it cannot carry; header fields are folded at white space to lines of 76 characters where the text
// allows and never over RFC 5322's 998, text that is not printable ASCII goes as RFC 2047 encoded words
// (at most 75 characters, on lines of at most 76, never splitting a character), bodies are quoted-printable,
// and the multipart boundary is a hash of the parts that quoted-printable cannot write. Every attempt sends
// the same bytes.
//
// What remains possible: a crash (or a lost connection) after the server accepted the message and before the
// gateway recorded it. With the effect type's on_crash at_least_once (the default) the message is sent again,
// with the same Message-ID, which mail systems and clients use to spot the duplicate; with at_most_once it is
// not resent and the effect becomes "unknown" for an operator.
package smtp

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/mail"
	"strings"
	"time"

	"github.com/emersion/go-sasl"
	gosmtp "github.com/emersion/go-smtp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/internal/stall"
	"github.com/oncegate/oncegate/providers"
)

// Config configures the provider for one effect type. The attempt's timeout and what an interrupted delivery
// does are the effect type's (its timeout and on_crash), handed to New as a providers.Type.
type Config struct {
	// Addr is the SMTP server, host:port.
	Addr string `yaml:"addr"`
	// From is the sender, as "Acme <noreply@acme.test>". Its domain names the Message-IDs.
	From string `yaml:"from"`
	// Username and Password turn on AUTH PLAIN, which is only sent over TLS or to localhost.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// StartTLS is "opportunistic" (when the server offers it), "required" or "off". Defaults to
	// DefaultStartTLS.
	StartTLS string `yaml:"starttls"`
	// Helo is the name sent in EHLO. Defaults to DefaultHelo.
	Helo string `yaml:"helo"`
}

// Defaults of Config.
const (
	DefaultStartTLS = "opportunistic"
	DefaultHelo     = "localhost"
)

// Provider sends email.
type Provider struct {
	cfg          Config
	typ          providers.Type
	host         string
	fromBox      string // the envelope's sender, as RFC 5321 writes it
	fromField    string // the From field, folded, with its CRLF
	fromNonASCII bool   // the sender needs SMTPUTF8
	domain       string
}

// Validate reports the first setting that New would refuse, without building a provider.
func (c Config) Validate() error {
	_, err := c.resolve()
	return err
}

// resolve checks the configuration and fills its defaults.
func (c Config) resolve() (*Provider, error) {
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		// Not quoted: a mistaken addr may hold what was meant as credentials ("user:pass@host:25").
		return nil, errors.New("smtp: addr: want host:port")
	}
	from, err := mail.ParseAddress(c.From)
	if err != nil {
		return nil, fmt.Errorf("smtp: from %q: %w", c.From, err)
	}
	box, nonASCII, err := mailbox(from.Address)
	if err != nil {
		return nil, fmt.Errorf("smtp: from %q cannot be sent: %w", c.From, err)
	}
	f := newField("From")
	f.addresses([]address{{name: from.Name, mailbox: box}})
	field, err := f.done()
	if err != nil {
		return nil, fmt.Errorf("smtp: from %q: %w", c.From, err)
	}
	switch c.StartTLS {
	case "":
		c.StartTLS = DefaultStartTLS
	case "opportunistic", "required", "off":
	default:
		return nil, fmt.Errorf("smtp: starttls %q: want opportunistic, required or off", c.StartTLS)
	}
	if c.Helo == "" {
		c.Helo = DefaultHelo
	}
	if strings.ContainsAny(c.Helo, " \t\r\n") {
		return nil, fmt.Errorf("smtp: helo %q: want one host name", c.Helo)
	}
	return &Provider{cfg: c, host: host, fromBox: box, fromField: field, fromNonASCII: nonASCII,
		domain: box[strings.LastIndexByte(box, '@')+1:]}, nil
}

// New checks the configuration and returns a provider for the effect type t.
func New(c Config, t providers.Type) (*Provider, error) {
	p, err := c.resolve()
	if err != nil {
		return nil, err
	}
	p.typ = t
	return p, nil
}

func (*Provider) Validate(payload json.RawMessage) error {
	_, err := parse(payload)
	return err
}

// Recipients is every address the message goes to (to, cc and bcc): an operator finds the email by any of
// them (providers.Addressee).
func (*Provider) Recipients(payload json.RawMessage) []string {
	p, err := parse(payload)
	if err != nil {
		return nil
	}
	return p.rcpts
}

// Destination is the configured server, host:port: every message of the effect type goes there.
func (p *Provider) Destination(json.RawMessage) string { return p.cfg.Addr }

// MessageID is the Message-ID of an effect's message: its stable ID at the sender's domain.
func (p *Provider) MessageID(d providers.Delivery) string {
	return "<" + d.StableID + "@" + p.domain + ">"
}

// ReplyError is an SMTP server's refusal at one stage of a delivery. It wraps the client's *smtp.SMTPError, so
// errors.As finds the reply code and the enhanced status code.
type ReplyError struct {
	Stage string
	Reply *gosmtp.SMTPError
}

func (e *ReplyError) Error() string {
	code := ""
	if ec := e.Reply.EnhancedCode; ec != (gosmtp.EnhancedCode{}) && ec != gosmtp.NoEnhancedCode {
		code = fmt.Sprintf(" %d.%d.%d", ec[0], ec[1], ec[2])
	}
	return fmt.Sprintf("%s: %d%s %s", e.Stage, e.Reply.Code, code, e.Reply.Message)
}

func (e *ReplyError) Unwrap() error { return e.Reply }

// Permanent reports whether the reply refuses for good: a 5xx reply whose enhanced status code, when it
// has one, does not say class 4 (transient). Failing for good is final, so it takes both codes to agree; a
// server that contradicts itself gets another attempt, which max_attempts bounds.
func (e *ReplyError) Permanent() bool {
	return e.Reply.Code >= 500 && e.Reply.EnhancedCode[0] != 4
}

// replyOutcome classifies an error that carries a server reply: failed for good by a server that is up when
// the reply is permanent, retried otherwise. ok is false for any other error (a connection that broke, a
// timeout).
func replyOutcome(stage string, err error) (o providers.Outcome, ok bool) {
	var reply *gosmtp.SMTPError
	if !errors.As(err, &reply) {
		return providers.Outcome{}, false
	}
	re := &ReplyError{Stage: stage, Reply: reply}
	if re.Permanent() {
		return providers.Failed(re, true), true
	}
	return providers.Retry(re), true
}

// step turns the error of one protocol step into its outcome; ok is false when there was no error.
func step(stage string, err error) (providers.Outcome, bool) {
	if err == nil {
		return providers.Outcome{}, false
	}
	if o, ok := replyOutcome(stage, err); ok {
		return o, true
	}
	return providers.Retry(fmt.Errorf("%s: %w", stage, err)), true
}

var tracer = otel.Tracer("github.com/oncegate/oncegate/providers/smtp")

func (p *Provider) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	ctx, span := tracer.Start(ctx, "smtp.send", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("server.address", p.host), attribute.String("smtp.message_id", p.MessageID(d))))
	defer span.End()
	if _, ok := ctx.Deadline(); !ok && p.typ.Timeout > 0 {
		// The effect type's timeout bounds an attempt whatever its caller gave, counted as the dispatcher
		// counts it: the time the process ran (boundConn).
		var cancel context.CancelFunc
		ctx, cancel = stall.Default().WithTimeout(ctx, p.typ.Timeout)
		defer cancel()
	}
	o := p.deliver(ctx, d)
	span.SetAttributes(attribute.String("effect.outcome", o.Kind.String()))
	if o.Err != nil {
		var re *ReplyError
		if errors.As(o.Err, &re) {
			ec := re.Reply.EnhancedCode
			span.SetAttributes(attribute.Int("smtp.reply_code", re.Reply.Code),
				attribute.String("smtp.enhanced_code", fmt.Sprintf("%d.%d.%d", ec[0], ec[1], ec[2])))
		}
		span.RecordError(o.Err)
		span.SetStatus(codes.Error, o.Err.Error())
	}
	return o
}

// boundConn caps every deadline the SMTP client sets at the attempt's own. go-smtp sets a deadline around
// each command from its CommandTimeout, and clears it afterwards, which would otherwise let a command outlive
// the effect type's timeout, and leave the message's writes with no deadline at all.
//
// An attempt whose context has no deadline (the dispatcher's: its timeout counts the time the gateway ran,
// package stall) sets none on the socket, and drops go-smtp's: a socket deadline is the wall clock's, and
// runs out while the gateway stands still, so that a 250 waiting in the socket when it resumed was read as a
// timeout and the message sent again (an outside test: 6 of 6 after a 3 s SIGSTOP). The context's end
// closes the connection instead (dial).
type boundConn struct {
	net.Conn
	limit time.Time // zero: the attempt has no deadline
}

func (c boundConn) bound(t time.Time) time.Time {
	if c.limit.IsZero() {
		return time.Time{}
	}
	if t.IsZero() || t.After(c.limit) {
		return c.limit
	}
	return t
}

func (c boundConn) SetDeadline(t time.Time) error      { return c.Conn.SetDeadline(c.bound(t)) }
func (c boundConn) SetReadDeadline(t time.Time) error  { return c.Conn.SetReadDeadline(c.bound(t)) }
func (c boundConn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.bound(t)) }

// dial connects to the server for one attempt: every read and write ends at ctx's deadline, and the
// connection is closed when ctx is cancelled (a dispatcher that shuts down).
func (p *Provider) dial(ctx context.Context) (net.Conn, attemptConn, error) {
	var dialer net.Dialer
	raw, err := dialer.DialContext(ctx, "tcp", p.cfg.Addr)
	if err != nil {
		return nil, attemptConn{}, err
	}
	conn := boundConn{Conn: raw}
	if dl, ok := ctx.Deadline(); ok {
		conn.limit = dl
		_ = raw.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	return conn, attemptConn{raw: raw, stop: stop}, nil
}

// attemptConn is the connection of one attempt, closed when the attempt's context ends.
type attemptConn struct {
	raw  net.Conn
	stop func() bool
}

func (a attemptConn) close() { a.stop(); _ = a.raw.Close() }

// detach keeps the end of the attempt's context from closing the connection, whose user then closes it
// (its deadline still bounds it); false when that end has come already.
func (a attemptConn) detach() bool { return a.stop() }

func (p *Provider) newClient(conn net.Conn) *gosmtp.Client {
	c := gosmtp.NewClient(conn)
	p.setTimeouts(c)
	return c
}

func (p *Provider) setTimeouts(c *gosmtp.Client) {
	// go-smtp's own defaults are RFC 5321's minutes; one attempt has the effect type's timeout in all.
	if p.typ.Timeout > 0 {
		c.CommandTimeout, c.SubmissionTimeout = p.typ.Timeout, p.typ.Timeout
	}
}

// connect opens a session ready for MAIL FROM: greeting, EHLO, STARTTLS when wanted and offered, EHLO again
// over TLS. go-smtp deliberately offers STARTTLS only as a way to open a client (a server must forget
// whatever was said before TLS), so the server's offer is read on one connection and TLS started on a second.
func (p *Provider) connect(ctx context.Context) (*gosmtp.Client, attemptConn, providers.Outcome, bool) {
	conn, closeConn, err := p.dial(ctx)
	if err != nil {
		return nil, attemptConn{}, providers.Retry(fmt.Errorf("connect: %w", err)), false
	}
	c := p.newClient(conn)
	if o, failed := step("greeting/EHLO", c.Hello(p.cfg.Helo)); failed {
		closeConn.close()
		return nil, attemptConn{}, o, false
	}
	offered, _ := c.Extension("STARTTLS")
	switch {
	case !offered && p.cfg.StartTLS == "required":
		closeConn.close()
		return nil, attemptConn{}, providers.Failed(errors.New("the server does not offer STARTTLS, which starttls: required demands"), true), false
	case !offered || p.cfg.StartTLS == "off":
		return c, closeConn, providers.Outcome{}, true
	}
	_ = c.Quit()
	closeConn.close()

	if conn, closeConn, err = p.dial(ctx); err != nil {
		return nil, attemptConn{}, providers.Retry(fmt.Errorf("connect: %w", err)), false
	}
	c, err = gosmtp.NewClientStartTLS(conn, &tls.Config{ServerName: p.host, MinVersion: tls.VersionTLS12})
	if o, failed := step("STARTTLS", err); failed {
		closeConn.close()
		return nil, attemptConn{}, o, false
	}
	p.setTimeouts(c)
	if o, failed := step("EHLO", c.Hello(p.cfg.Helo)); failed {
		closeConn.close()
		return nil, attemptConn{}, o, false
	}
	return c, closeConn, providers.Outcome{}, true
}

func (p *Provider) deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	pl, err := parse(d.Payload)
	if err != nil {
		return providers.Failed(err, true)
	}
	msg := p.message(d, pl)
	c, closeConn, o, ok := p.connect(ctx)
	if !ok {
		return o
	}
	quitLater := false
	defer func() {
		if !quitLater {
			closeConn.close()
			return
		}
		go func() { _ = c.Quit(); closeConn.close() }()
	}()
	if p.cfg.Username != "" {
		if o, failed := step("AUTH", p.auth(c)); failed {
			return o
		}
	}
	// SMTPUTF8 only for a message that needs it (a non-ASCII address): a relay further on that cannot pass
	// SMTPUTF8 on must bounce a message that asked for it (RFC 6531 section 3.4), needed or not.
	utf8 := pl.nonASCII || p.fromNonASCII
	if offered, _ := c.Extension("SMTPUTF8"); utf8 && !offered {
		return providers.Failed(errors.New("an address is not ASCII, which needs SMTPUTF8 (RFC 6531), and the server does not offer it"), true)
	}
	if o, failed := step("MAIL FROM", c.Mail(p.fromBox, &gosmtp.MailOptions{UTF8: utf8})); failed {
		return o
	}
	for _, r := range pl.rcpts {
		if o, failed := step("RCPT TO "+r, c.Rcpt(r, nil)); failed {
			return o
		}
	}
	w, err := c.Data()
	if o, failed := step("DATA", err); failed {
		return o
	}
	if _, err := w.Write(msg); err != nil {
		return providers.Retry(fmt.Errorf("sending the message: %w", err))
	}
	if err := w.Close(); err != nil {
		if o, ok := replyOutcome("end of DATA", err); ok {
			return o
		}
		// The message went out and no answer came back: the server may have accepted it.
		err = fmt.Errorf("no answer after the message was sent (the server may have accepted it): %w", err)
		if p.typ.AtMostOnce {
			return providers.InDoubt(err)
		}
		return providers.Retry(err)
	}
	// The server took the message with its reply to the end of DATA: the delivery is done. QUIT's round trip
	// is said off the delivery's path, on the attempt's deadline, so that the commit recording the delivery
	// does not wait for it: a gateway killed before that commit resends the message (issue 34).
	quitLater = closeConn.detach()
	return providers.Delivered(map[string]any{"message_id": p.MessageID(d), "recipients": len(pl.rcpts)})
}

// auth runs AUTH PLAIN, which sends the password as it is: only over TLS, or to this machine.
func (p *Provider) auth(c *gosmtp.Client) error {
	if _, isTLS := c.TLSConnectionState(); !isTLS && p.host != "localhost" && p.host != "127.0.0.1" && p.host != "::1" {
		return errors.New("unencrypted connection: AUTH PLAIN is sent only over TLS or to localhost")
	}
	return c.Auth(sasl.NewPlainClient("", p.cfg.Username, p.cfg.Password))
}
