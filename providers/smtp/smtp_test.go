package smtp

import (
	"context"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/providertest"
	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/providers"
)

type dest struct {
	srv *smtptest.Server
	p   *Provider
}

func (d dest) Provider() providers.Provider { return d.p }
func (d dest) Deliver(ctx context.Context, del providers.Delivery) providers.Outcome {
	return d.p.Deliver(ctx, del)
}
func (d dest) Set(b providertest.Behaviour) bool {
	d.srv.SetFault(map[providertest.Behaviour]smtptest.Fault{providertest.Succeed: smtptest.None,
		providertest.FailTransient: smtptest.Defer, providertest.FailPermanent: smtptest.Reject,
		providertest.Hang: smtptest.Hang}[b])
	return true
}
func (d dest) Received(del providers.Delivery) int { return d.srv.ByMessageID()[d.p.MessageID(del)] }
func (d dest) ValidPayload() json.RawMessage {
	return json.RawMessage(`{"to":["user6@example.com"],"subject":"Welcome","text":"Hi"}`)
}
func (d dest) InvalidPayloads() map[string]json.RawMessage {
	return map[string]json.RawMessage{
		"payload.to":                 json.RawMessage(`{"subject":"s","text":"t"}`),
		"payload.to[1]":              json.RawMessage(`{"to":["a@x.test","not an address"],"subject":"s","text":"t"}`),
		"payload.cc[0]":              json.RawMessage(`{"to":["a@x.test"],"cc":["b@x.test\r\nBcc: c@x.test"],"subject":"s","text":"t"}`),
		"payload.subject":            json.RawMessage(`{"to":["a@x.test"],"subject":"s\r\nBcc: evil@x.test","text":"t"}`),
		"payload.text":               json.RawMessage(`{"to":["a@x.test"],"subject":"s"}`),
		"payload.headers.X-Tag":      json.RawMessage(`{"to":["a@x.test"],"subject":"s","text":"t","headers":{"X-Tag":"a\nBcc: evil@x.test"}}`),
		"payload.headers.Message-ID": json.RawMessage(`{"to":["a@x.test"],"subject":"s","text":"t","headers":{"Message-ID":"<mine@x>"}}`),
		"payload.headers":            json.RawMessage(`{"to":["a@x.test"],"subject":"s","text":"t","headers":{"X-\u0001":"v"}}`),
		"payload.bcc[0]":             json.RawMessage(`{"to":["a@x.test"],"bcc":["\"a\tb\"@x.test"],"subject":"s","text":"t"}`),
	}
}

func newProvider(t *testing.T, srv *smtptest.Server, onCrash string) *Provider {
	t.Helper()
	p, err := New(Config{Addr: srv.Addr, From: "Acme <noreply@acme.test>"}, providers.Type{AtMostOnce: onCrash == "at_most_once"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newDest(t *testing.T) providertest.Destination {
	srv := smtptest.Start(t)
	return dest{srv, newProvider(t, srv, "")}
}

func TestConformance(t *testing.T) {
	providertest.Exercise(t, providertest.Capabilities{}, newDest)
}

func delivery(key, payload string) providers.Delivery {
	return providers.Delivery{Tenant: "acme", Key: key, StableID: effect.NewStableID("acme", key),
		Payload: json.RawMessage(payload), Attempt: 1, CreatedAt: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
}

// The message as the SMTP server received it: headers, encoded subject, both parts, and Bcc only in the
// envelope.
func TestMessageAsReceived(t *testing.T) {
	t.Parallel()
	srv := smtptest.Start(t)
	p := newProvider(t, srv, "")
	d := delivery("welcome-email:user_6", `{"to":["User Six <user6@example.com>"],"cc":["cc@example.com"],
		"bcc":["audit@acme.test"],"subject":"Bienvenue, Zoë","text":"Hi Zoë","html":"<p>Hi Zoë</p>",
		"headers":{"X-Campaign":"welcome"}}`)
	o := p.Deliver(context.Background(), d)
	if o.Kind != providers.KindDelivered || !strings.Contains(string(o.Result), p.MessageID(d)) {
		t.Fatalf("%v %v %s", o.Kind, o.Err, o.Result)
	}
	msgs := srv.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages", len(msgs))
	}
	m := msgs[0]
	if m.From != "noreply@acme.test" || strings.Join(m.To, ",") != "user6@example.com,cc@example.com,audit@acme.test" {
		t.Fatalf("envelope %s -> %v", m.From, m.To)
	}
	h := m.Header
	subject, _ := new(mime.WordDecoder).DecodeHeader(h.Get("Subject"))
	if subject != "Bienvenue, Zoë" || h.Get("Bcc") != "" || h.Get("X-Campaign") != "welcome" ||
		h.Get("Message-Id") != "<"+d.StableID+"@acme.test>" || h.Get("Date") != "Sun, 29 Nov 2026 12:00:00 +0000" {
		t.Fatalf("headers %v", h)
	}
	if to, _ := h.AddressList("To"); len(to) != 1 || to[0].Name != "User Six" {
		t.Fatalf("To %v", h.Get("To"))
	}
	msg, _ := mail.ReadMessage(strings.NewReader(string(m.Data)))
	_, params, _ := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	mr := multipart.NewReader(msg.Body, params["boundary"])
	var parts []string
	for {
		part, err := mr.NextPart()
		if err != nil {
			break
		}
		b, _ := io.ReadAll(part) // the multipart reader undoes quoted-printable
		parts = append(parts, part.Header.Get("Content-Type")+": "+string(b))
	}
	if len(parts) != 2 || !strings.Contains(parts[0], "text/plain; charset=utf-8: Hi Zoë") ||
		!strings.Contains(parts[1], "text/html; charset=utf-8: <p>Hi Zoë</p>") {
		t.Fatalf("parts %q", parts)
	}
}

// A mailbox named twice, in to and cc or in another case of its domain, is one RCPT: a relay delivers a
// copy for each (an outside tester's to: ["a@x.test","A@x.test","a@x.test"] went out as three). The headers
// keep what was asked.
func TestAMailboxNamedTwiceIsOneRecipient(t *testing.T) {
	t.Parallel()
	srv := smtptest.Start(t)
	p := newProvider(t, srv, "")
	d := delivery("twice", `{"to":["a@x.test","A@x.test","a@x.test"],"cc":["Ann <a@X.Test>"],"bcc":["b@x.test","b@x.test"],
		"subject":"s","text":"t"}`)
	if o := p.Deliver(context.Background(), d); o.Kind != providers.KindDelivered || !strings.Contains(string(o.Result), `"recipients":3`) {
		t.Fatalf("%v %v %s", o.Kind, o.Err, o.Result)
	}
	m := srv.Messages()[0]
	if strings.Join(m.To, ",") != "a@x.test,A@x.test,b@x.test" {
		t.Fatalf("envelope to %v", m.To)
	}
	if to, _ := m.Header.AddressList("To"); len(to) != 3 {
		t.Fatalf("To %v", m.Header.Get("To"))
	}
}

// An address the server refuses fails the effect for good.
func TestRefusedRecipientFails(t *testing.T) {
	t.Parallel()
	srv := smtptest.Start(t)
	srv.Refuse("gone@example.com")
	o := newProvider(t, srv, "").Deliver(context.Background(),
		delivery("k", `{"to":["ok@example.com","gone@example.com"],"subject":"s","text":"t"}`))
	if o.Kind != providers.KindFailed || !strings.Contains(o.Err.Error(), "550") || len(srv.Messages()) != 0 {
		t.Fatalf("%v %v, %d messages", o.Kind, o.Err, len(srv.Messages()))
	}
}

// The connection drops after the message was sent: the server may have it. at_least_once retries (the resend
// carries the same Message-ID), at_most_once leaves it in doubt.
func TestLostAnswerAfterDataFollowsOnCrash(t *testing.T) {
	t.Parallel()
	for onCrash, want := range map[string]providers.OutcomeKind{"at_least_once": providers.KindRetry, "at_most_once": providers.KindInDoubt} {
		srv := smtptest.Start(t)
		srv.SetFault(smtptest.DropAfterData)
		p := newProvider(t, srv, onCrash)
		d := delivery("k", `{"to":["a@example.com"],"subject":"s","text":"t"}`)
		if o := p.Deliver(context.Background(), d); o.Kind != want {
			t.Fatalf("%s: %v %v, want %v", onCrash, o.Kind, o.Err, want)
		}
		if srv.ByMessageID()[p.MessageID(d)] != 1 {
			t.Fatalf("%s: the server did not get the message", onCrash)
		}
	}
}

func TestConfigIsChecked(t *testing.T) {
	for _, c := range []Config{
		{Addr: "no-port", From: "a@b.test"},
		{Addr: "h:25", From: "not an address"},
		{Addr: "h:25", From: "a@b.test", StartTLS: "sometimes"},
		{Addr: "h:25", From: "a@b.test", Helo: "me\r\nRCPT TO:<x@y.test>"},
	} {
		if _, err := New(c, providers.Type{}); err == nil || c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	srv := smtptest.Start(t)
	p, _ := New(Config{Addr: srv.Addr, From: "a@b.test", StartTLS: "required"}, providers.Type{})
	if o := p.Deliver(context.Background(), delivery("k", `{"to":["x@y.test"],"subject":"s","text":"t"}`)); o.Kind != providers.KindFailed {
		t.Fatalf("starttls required against a server without it: %v %v", o.Kind, o.Err)
	}
}
