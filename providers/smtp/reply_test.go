package smtp

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"

	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/providers"
)

// replies is a backend that answers one stage (MAIL, RCPT or DATA) with a chosen reply, and counts the
// messages it accepted.
type replies struct {
	stage    string
	reply    *gosmtp.SMTPError
	accepted atomic.Int32
}

func (b *replies) NewSession(*gosmtp.Conn) (gosmtp.Session, error) { return &replySession{b}, nil }

func (b *replies) at(stage string) error {
	if stage == b.stage {
		return b.reply
	}
	return nil
}

type replySession struct{ b *replies }

func (*replySession) Reset()                                   {}
func (*replySession) Logout() error                            { return nil }
func (s *replySession) Mail(string, *gosmtp.MailOptions) error { return s.b.at("MAIL") }
func (s *replySession) Rcpt(string, *gosmtp.RcptOptions) error { return s.b.at("RCPT") }
func (s *replySession) Data(r io.Reader) error {
	if _, err := io.ReadAll(r); err != nil {
		return err
	}
	if err := s.b.at("DATA"); err != nil {
		return err
	}
	s.b.accepted.Add(1)
	return nil
}

// serve runs be on loopback until the test ends; with tlsConfig set the server offers STARTTLS.
func serve(t *testing.T, be gosmtp.Backend, tlsConfig *tls.Config) string {
	return serveOn(t, "127.0.0.1", be, tlsConfig)
}

func serveOn(t *testing.T, host string, be gosmtp.Backend, tlsConfig *tls.Config) string {
	t.Helper()
	srv := gosmtp.NewServer(be)
	srv.Domain = "replies.invalid"
	srv.TLSConfig = tlsConfig
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// The reply code and the enhanced status code decide together: a refusal is final only when both call it
// permanent. The outcome's error carries the server's *smtp.SMTPError, enhanced code included.
func TestEnhancedStatusCodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		stage    string
		code     int
		enhanced gosmtp.EnhancedCode
		want     providers.OutcomeKind
		text     string
	}{
		{"RCPT", 550, gosmtp.EnhancedCode{5, 1, 1}, providers.KindFailed, "RCPT TO a@example.com: 550 5.1.1 no"},
		{"RCPT", 452, gosmtp.EnhancedCode{4, 2, 2}, providers.KindRetry, "452 4.2.2"},
		{"MAIL", 421, gosmtp.EnhancedCode{4, 4, 2}, providers.KindRetry, "MAIL FROM: 421 4.4.2"},
		{"DATA", 552, gosmtp.EnhancedCode{5, 2, 2}, providers.KindFailed, "end of DATA: 552 5.2.2"},
		// A 5xx reply whose enhanced code says transient (a greylisting server, say) is retried.
		{"DATA", 554, gosmtp.EnhancedCode{4, 7, 1}, providers.KindRetry, "554 4.7.1"},
		// A 4xx reply stays transient whatever its enhanced code claims.
		{"RCPT", 450, gosmtp.EnhancedCode{5, 1, 1}, providers.KindRetry, "450 5.1.1"},
		// No enhanced code at all: the reply code decides alone.
		{"DATA", 554, gosmtp.NoEnhancedCode, providers.KindFailed, "end of DATA: 554 no"},
	} {
		be := &replies{stage: c.stage, reply: &gosmtp.SMTPError{Code: c.code, EnhancedCode: c.enhanced, Message: "no"}}
		p, err := New(Config{Addr: serve(t, be, nil), From: "a@acme.test"}, providers.Type{})
		if err != nil {
			t.Fatal(err)
		}
		o := p.Deliver(context.Background(), delivery("k", `{"to":["a@example.com"],"subject":"s","text":"t"}`))
		name := fmt.Sprintf("%s %d %v", c.stage, c.code, c.enhanced)
		if o.Kind != c.want || o.Err == nil || !strings.Contains(o.Err.Error(), c.text) {
			t.Errorf("%s: %v %v, want %v with %q", name, o.Kind, o.Err, c.want, c.text)
			continue
		}
		var reply *gosmtp.SMTPError
		if !errors.As(o.Err, &reply) || reply.Code != c.code {
			t.Errorf("%s: the error %v does not carry the server's reply", name, o.Err)
		} else if c.enhanced != gosmtp.NoEnhancedCode && reply.EnhancedCode != c.enhanced {
			t.Errorf("%s: enhanced code %v, want %v", name, reply.EnhancedCode, c.enhanced)
		}
		if o.Kind == providers.KindFailed && !o.DestinationUp {
			t.Errorf("%s: a refusal comes from a server that is up", name)
		}
		if be.accepted.Load() != 0 {
			t.Errorf("%s: the server accepted the message", name)
		}
	}
}

// The effect type's timeout reaches the SMTP client: an attempt without a deadline of its own still gives up
// on a server that never answers.
func TestEffectTypeTimeoutBoundsTheAttempt(t *testing.T) {
	t.Parallel()
	srv := smtptest.Start(t)
	srv.SetFault(smtptest.Hang)
	p, err := New(Config{Addr: srv.Addr, From: "a@acme.test"}, providers.Type{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	o := p.Deliver(context.Background(), delivery("k", `{"to":["a@example.com"],"subject":"s","text":"t"}`))
	if took := time.Since(start); took > 5*time.Second || o.Kind != providers.KindRetry {
		t.Fatalf("%v (%v) after %v, want a retry after about 300ms", o.Kind, o.Err, took)
	}
}

// A cancelled attempt (a dispatcher shutting down) ends at once, though its context has no deadline.
func TestCancelledAttemptEnds(t *testing.T) {
	t.Parallel()
	srv := smtptest.Start(t)
	srv.SetFault(smtptest.Hang)
	p := newProvider(t, srv, "")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	o := p.Deliver(ctx, delivery("k", `{"to":["a@example.com"],"subject":"s","text":"t"}`))
	if took := time.Since(start); took > 5*time.Second || o.Kind != providers.KindRetry {
		t.Fatalf("%v (%v) after %v, want a retry soon after the cancel", o.Kind, o.Err, took)
	}
}

// A server that offers STARTTLS gets TLS or nothing under "opportunistic": with a certificate the gateway
// does not trust, the attempt fails (to be retried) rather than falling back to plain text. "off" sends in
// plain text.
func TestStartTLSWhenOffered(t *testing.T) {
	t.Parallel()
	be := &replies{}
	addr := serve(t, be, selfSigned(t))
	body := `{"to":["a@example.com"],"subject":"s","text":"t"}`
	p, _ := New(Config{Addr: addr, From: "a@acme.test"}, providers.Type{})
	if o := p.Deliver(context.Background(), delivery("k", body)); o.Kind != providers.KindRetry ||
		!strings.Contains(o.Err.Error(), "certificate") || be.accepted.Load() != 0 {
		t.Fatalf("opportunistic against an untrusted certificate: %v %v, %d accepted", o.Kind, o.Err, be.accepted.Load())
	}
	p, _ = New(Config{Addr: addr, From: "a@acme.test", StartTLS: "off"}, providers.Type{})
	if o := p.Deliver(context.Background(), delivery("k", body)); o.Kind != providers.KindDelivered || be.accepted.Load() != 1 {
		t.Fatalf("starttls off: %v %v", o.Kind, o.Err)
	}
}

// AUTH PLAIN sends the password as it is: never in plain text to another machine.
func TestNoPasswordInPlainText(t *testing.T) {
	t.Parallel()
	be := &replies{}
	// A loopback address other than localhost's: the provider must treat it as another machine.
	p, _ := New(Config{Addr: serveOn(t, "127.0.0.2", be, nil), From: "a@acme.test", Username: "u", Password: "secret-pw"}, providers.Type{})
	o := p.Deliver(context.Background(), delivery("k", `{"to":["a@example.com"],"subject":"s","text":"t"}`))
	if o.Kind == providers.KindDelivered || !strings.Contains(fmtErr(o.Err), "unencrypted") {
		t.Fatalf("%v %v", o.Kind, o.Err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func selfSigned(t *testing.T) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

// The delivery is done when the server answers the end of DATA: the attempt does not wait for the reply to
// QUIT, which is said in the background. Until the dispatcher records the delivery, a gateway killed resends
// the message, and QUIT's round trip would have widened that window (issue 34). The server still gets its
// QUIT.
func TestDeliveredAtTheReplyToTheEndOfData(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	quit := make(chan struct{})
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		r := bufio.NewReader(conn)
		say := func(s string) { _, _ = io.WriteString(conn, s+"\r\n") }
		say("220 slow-quit.invalid ESMTP")
		for data := false; ; {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\r\n")
			switch cmd := strings.ToUpper(strings.Fields(line + " x")[0]); {
			case data:
				if line == "." {
					data = false
					say("250 2.0.0 queued")
				}
			case cmd == "DATA":
				data = true
				say("354 go ahead")
			case cmd == "QUIT":
				close(quit)
				time.Sleep(2 * time.Second) // a server slow to say goodbye
				say("221 bye")
				return
			default:
				say("250 ok")
			}
		}
	}()
	p, err := New(Config{Addr: l.Addr().String(), From: "a@acme.test", StartTLS: "off"}, providers.Type{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	o := p.Deliver(context.Background(), delivery("k", `{"to":["a@example.com"],"subject":"s","text":"t"}`))
	took := time.Since(start)
	if o.Kind != providers.KindDelivered || took > time.Second {
		t.Fatalf("%v (%v) after %v, want delivered at the reply to the end of DATA, before QUIT's", o.Kind, o.Err, took)
	}
	select {
	case <-quit:
	case <-time.After(5 * time.Second):
		t.Fatal("the server never got QUIT")
	}
}
