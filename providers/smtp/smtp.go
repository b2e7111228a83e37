// Package smtp is the email provider: a real SMTP client (STARTTLS when offered, AUTH when configured) that
// sends each effect as one message whose Message-ID is derived from tenant and key. Replies in 4xx are
// retried, 5xx (and an invalid address) fail for good.
//
// What remains possible: a crash (or a lost connection) after the server accepted the message and before the
// gateway recorded it. With OnCrash at_least_once (the default) the message is sent again, with the same
// Message-ID, which mail systems and clients use to spot the duplicate; with at_most_once it is not resent and
// the effect becomes "unknown" for an operator.
package smtp

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/smtp"
	"net/textproto"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/providers"
)

// Config configures the provider for one effect type.
type Config struct {
	// Addr is the SMTP server, host:port.
	Addr string `yaml:"addr"`
	// From is the sender, as "Acme <noreply@acme.test>". Its domain names the Message-IDs.
	From string `yaml:"from"`
	// Username and Password turn on AUTH PLAIN, which Go's client only sends over TLS or to localhost.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// StartTLS is "opportunistic" (the default: when the server offers it), "required" or "off".
	StartTLS string `yaml:"starttls"`
	// Helo is the name sent in EHLO. Defaults to "localhost".
	Helo string `yaml:"helo"`
	// OnCrash: at_least_once (default) or at_most_once, for deliveries interrupted after the message was sent.
	OnCrash string `yaml:"on_crash"`
	// Timeout bounds one attempt; the gateway reads it as the effect type's timeout.
	Timeout time.Duration `yaml:"timeout"`
}

// Provider sends email.
type Provider struct {
	cfg    Config
	host   string
	from   *mail.Address
	domain string
}

// New checks the configuration and returns a provider.
func New(c Config) (*Provider, error) {
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return nil, fmt.Errorf("smtp: addr %q: want host:port", c.Addr)
	}
	from, err := mail.ParseAddress(c.From)
	if err != nil {
		return nil, fmt.Errorf("smtp: from %q: %w", c.From, err)
	}
	switch c.StartTLS {
	case "":
		c.StartTLS = "opportunistic"
	case "opportunistic", "required", "off":
	default:
		return nil, fmt.Errorf("smtp: starttls %q: want opportunistic, required or off", c.StartTLS)
	}
	switch c.OnCrash {
	case "", "at_least_once", "at_most_once":
	default:
		return nil, fmt.Errorf("smtp: on_crash %q: want at_least_once or at_most_once", c.OnCrash)
	}
	if c.Helo == "" {
		c.Helo = "localhost"
	}
	return &Provider{cfg: c, host: host, from: from, domain: from.Address[strings.LastIndex(from.Address, "@")+1:]}, nil
}

// Payload is an email.
type Payload struct {
	To      []string          `json:"to"`
	Cc      []string          `json:"cc,omitempty"`
	Bcc     []string          `json:"bcc,omitempty"`
	Subject string            `json:"subject"`
	Text    string            `json:"text,omitempty"`
	HTML    string            `json:"html,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// Headers that the provider writes itself.
var ownHeaders = map[string]bool{"From": true, "To": true, "Cc": true, "Bcc": true, "Subject": true, "Date": true,
	"Message-Id": true, "Mime-Version": true, "Content-Type": true, "Content-Transfer-Encoding": true, "Sender": true}

type parsed struct {
	Payload
	to, cc, bcc []*mail.Address
}

func parse(raw json.RawMessage) (parsed, error) {
	var p parsed
	if err := providers.DecodeStrict(raw, &p.Payload); err != nil {
		return p, err
	}
	list := func(field string, in []string) ([]*mail.Address, error) {
		out := make([]*mail.Address, 0, len(in))
		for i, s := range in {
			a, err := mail.ParseAddress(s)
			if err != nil || strings.ContainsAny(s, "\r\n") {
				return nil, providers.Invalid(fmt.Sprintf("%s[%d]", field, i), "%q is not an email address", s)
			}
			out = append(out, a)
		}
		return out, nil
	}
	var err error
	if len(p.To) == 0 {
		return p, providers.Invalid("to", "at least one recipient is required")
	}
	if p.to, err = list("to", p.To); err != nil {
		return p, err
	}
	if p.cc, err = list("cc", p.Cc); err != nil {
		return p, err
	}
	if p.bcc, err = list("bcc", p.Bcc); err != nil {
		return p, err
	}
	if n := len(p.to) + len(p.cc) + len(p.bcc); n > 100 {
		return p, providers.Invalid("to", "%d recipients, at most 100", n)
	}
	if strings.TrimSpace(p.Subject) == "" || len(p.Subject) > 998 || strings.ContainsAny(p.Subject, "\r\n") {
		return p, providers.Invalid("subject", "is required: one line, at most 998 bytes")
	}
	if p.Text == "" && p.HTML == "" {
		return p, providers.Invalid("text", "text or html is required")
	}
	for k, v := range p.Headers {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if k == "" || strings.ContainsAny(k, " \t\r\n:\x00") {
			return p, providers.Invalid("headers", "%q is not a header name", k)
		}
		if ownHeaders[ck] {
			return p, providers.Invalid("headers."+k, "is written by the gateway")
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return p, providers.Invalid("headers."+k, "has a line break or NUL: header injection is refused")
		}
	}
	return p, nil
}

func (*Provider) Validate(payload json.RawMessage) error {
	_, err := parse(payload)
	return err
}

// MessageID is the Message-ID of an effect's message: its stable ID at the sender's domain.
func (p *Provider) MessageID(d providers.Delivery) string {
	return "<" + d.StableID + "@" + p.domain + ">"
}

func (p *Provider) message(d providers.Delivery, pl parsed) []byte {
	var b bytes.Buffer
	addrs := func(as []*mail.Address) string {
		s := make([]string, len(as))
		for i, a := range as {
			s[i] = a.String()
		}
		return strings.Join(s, ", ")
	}
	fmt.Fprintf(&b, "From: %s\r\n", p.from.String())
	fmt.Fprintf(&b, "To: %s\r\n", addrs(pl.to))
	if len(pl.cc) > 0 {
		fmt.Fprintf(&b, "Cc: %s\r\n", addrs(pl.cc))
	}
	fmt.Fprintf(&b, "Subject: %s\r\n", mime.QEncoding.Encode("utf-8", pl.Subject))
	// The same Date and Message-ID on every attempt: a resend is the same message.
	fmt.Fprintf(&b, "Date: %s\r\n", d.CreatedAt.UTC().Format(time.RFC1123Z))
	fmt.Fprintf(&b, "Message-ID: %s\r\n", p.MessageID(d))
	for k, v := range pl.Headers {
		fmt.Fprintf(&b, "%s: %s\r\n", textproto.CanonicalMIMEHeaderKey(k), mime.QEncoding.Encode("utf-8", v))
	}
	b.WriteString("MIME-Version: 1.0\r\n")
	part := func(ctype, body string) {
		fmt.Fprintf(&b, "Content-Type: %s; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n", ctype)
		w := quotedprintable.NewWriter(&b)
		_, _ = w.Write([]byte(body))
		_ = w.Close()
		b.WriteString("\r\n")
	}
	switch {
	case pl.Text != "" && pl.HTML != "":
		boundary := "oncegate-" + d.StableID
		fmt.Fprintf(&b, "Content-Type: multipart/alternative; boundary=%q\r\n\r\n", boundary)
		fmt.Fprintf(&b, "--%s\r\n", boundary)
		part("text/plain", pl.Text)
		fmt.Fprintf(&b, "--%s\r\n", boundary)
		part("text/html", pl.HTML)
		fmt.Fprintf(&b, "--%s--\r\n", boundary)
	case pl.HTML != "":
		part("text/html", pl.HTML)
	default:
		part("text/plain", pl.Text)
	}
	return b.Bytes()
}

// replyOutcome classifies an SMTP reply error: 4xx retry, 5xx failed for good from a server that is up.
func replyOutcome(stage string, err error) (providers.Outcome, bool) {
	var te *textproto.Error
	if !errors.As(err, &te) {
		return providers.Outcome{}, false
	}
	e := fmt.Errorf("%s: %d %s", stage, te.Code, te.Msg)
	if te.Code >= 500 {
		return providers.Failed(e, true), true
	}
	return providers.Retry(e), true
}

var tracer = otel.Tracer("github.com/oncegate/oncegate/providers/smtp")

func (p *Provider) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	ctx, span := tracer.Start(ctx, "smtp.send", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("server.address", p.host), attribute.String("smtp.message_id", p.MessageID(d))))
	defer span.End()
	o := p.deliver(ctx, d)
	span.SetAttributes(attribute.String("effect.outcome", o.Kind.String()))
	if o.Err != nil {
		span.RecordError(o.Err)
		span.SetStatus(codes.Error, o.Err.Error())
	}
	return o
}

func (p *Provider) deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	pl, err := parse(d.Payload)
	if err != nil {
		return providers.Failed(err, true)
	}
	msg := p.message(d, pl)
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", p.cfg.Addr)
	if err != nil {
		return providers.Retry(fmt.Errorf("connect: %w", err))
	}
	// Every read and write ends at the effect type's timeout.
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	c, err := smtp.NewClient(conn, p.host)
	if err != nil {
		_ = conn.Close()
		if o, ok := replyOutcome("greeting", err); ok {
			return o
		}
		return providers.Retry(fmt.Errorf("greeting: %w", err))
	}
	defer c.Close()
	step := func(stage string, err error) (providers.Outcome, bool) {
		if err == nil {
			return providers.Outcome{}, false
		}
		if o, ok := replyOutcome(stage, err); ok {
			return o, true
		}
		return providers.Retry(fmt.Errorf("%s: %w", stage, err)), true
	}
	if o, failed := step("EHLO", c.Hello(p.cfg.Helo)); failed {
		return o
	}
	if ok, _ := c.Extension("STARTTLS"); ok && p.cfg.StartTLS != "off" {
		if o, failed := step("STARTTLS", c.StartTLS(&tls.Config{ServerName: p.host, MinVersion: tls.VersionTLS12})); failed {
			return o
		}
	} else if p.cfg.StartTLS == "required" {
		return providers.Failed(errors.New("the server does not offer STARTTLS, which starttls: required demands"), true)
	}
	if p.cfg.Username != "" {
		if o, failed := step("AUTH", c.Auth(smtp.PlainAuth("", p.cfg.Username, p.cfg.Password, p.host))); failed {
			return o
		}
	}
	if o, failed := step("MAIL FROM", c.Mail(p.from.Address)); failed {
		return o
	}
	n := 0
	for _, list := range [][]*mail.Address{pl.to, pl.cc, pl.bcc} {
		for _, a := range list {
			if o, failed := step("RCPT TO "+a.Address, c.Rcpt(a.Address)); failed {
				return o
			}
			n++
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
		if p.cfg.OnCrash == "at_most_once" {
			return providers.InDoubt(err)
		}
		return providers.Retry(err)
	}
	_ = c.Quit()
	return providers.Delivered(map[string]any{"message_id": p.MessageID(d), "recipients": n})
}
