package smtp

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/mail"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/providers"
)

// validate runs Validate on a minimal payload with the given headers.
func validate(t *testing.T, headers map[string]string) error {
	t.Helper()
	p, err := New(Config{Addr: "127.0.0.1:1", From: "a@acme.test"}, providers.Type{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]any{"to": []string{"a@example.test"}, "subject": "s", "text": "t", "headers": headers})
	return p.Validate(raw)
}

// Issue 15: a payload's headers could set MIME fields (Content-Disposition: attachment turned the body into
// an attachment), trace and resent fields (some malformed: an address encoded whole into one word), and
// fields that route receipts and bounces to an address of the payload's choosing. Each is refused at request
// time, naming the field, under any spelling.
func TestHeadersCannotChangeShapeOrRouting(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{
		"Content-Disposition":         `attachment; filename="invoice.pdf.exe"`,
		"Content-ID":                  "<x@y>",
		"content-language":            "en",
		"Content-Description":         "d",
		"MIME-Version":                "1.0",
		"Mime-Foo":                    "x",
		"Return-Path":                 "<bounce@evil.test>",
		"Received":                    "x",
		"Resent-To":                   "Jörg <evil@evil.test>",
		"Resent-From":                 "not an address",
		"Resent-Date":                 "yesterday",
		"Resent-Message-ID":           "<a@b>",
		"resent-cc":                   "a@evil.test",
		"Disposition-Notification-To": "spy@evil.test",
		"Return-Receipt-To":           "spy@evil.test",
		"Errors-To":                   "spy@evil.test",
		"Sender":                      "spy@evil.test",
		"Mail-Followup-To":            "spy@evil.test",
		"Mail-Reply-To":               "spy@evil.test",
		"Apparently-To":               "spy@evil.test",
		"Delivered-To":                "spy@evil.test",
		"Envelope-To":                 "spy@evil.test",
		"Author":                      "spy@evil.test",
		"Original-From":               "spy@evil.test",
		"Original-Recipient":          "rfc822;spy@evil.test",
		"Keywords":                    "a, b",
		// Written by the receiving or signing systems (an outside tester forged Authentication-Results).
		"Authentication-Results":     "mx.example.test; dkim=pass",
		"ARC-Seal":                   "i=1; a=rsa-sha256",
		"ARC-Message-Signature":      "i=1",
		"ARC-Authentication-Results": "i=1; mx; spf=pass",
		"DKIM-Signature":             "v=1; a=rsa-sha256",
		"DomainKey-Signature":        "a=rsa-sha1",
		"Received-SPF":               "pass",
		"X-Received":                 "by 10.0.0.1",
		"X-Original-To":              "spy@evil.test",
		"X-Envelope-To":              "spy@evil.test",
		"X-Confirm-Reading-To":       "spy@evil.test",
		"Bounces-To":                 "spy@evil.test",
		// Vendors' spellings of verdicts, and more trace and identity fields (a third round's).
		"X-Original-Authentication-Results": "mx; dkim=pass",
		"X-Google-DKIM-Signature":           "v=1",
		"X-Spam-Status":                     "No",
		"X-Virus-Scanned":                   "clean",
		"X-MS-Exchange-Organization-AuthAs": "Internal",
		"X-Authenticated-Sender":            "boss@acme.test",
		"X-Original-From":                   "boss@acme.test",
		"Approved":                          "moderator@list.test",
		"Original-Envelope-Id":              "x",
	} {
		var fe *providers.FieldError
		if err := validate(t, map[string]string{name: value}); !errors.As(err, &fe) || fe.Field != "payload.headers."+name {
			t.Errorf("%s: %q: %v, want a FieldError naming payload.headers.%s", name, value, err, name)
		}
	}
}

// In-Reply-To and References are lists of msg-ids (RFC 5322 section 3.6.4): anything else is refused; a list
// is sent one id after another, folded between them, and reads back as the same ids.
func TestThreadingHeadersAreMsgIDs(t *testing.T) {
	t.Parallel()
	for name, value := range map[string]string{
		"In-Reply-To": "garbage here",
		"References":  "<a@b> junk",
		"in-reply-to": "<a@b",
		"References ": "",
	} {
		name = strings.TrimSpace(name)
		var fe *providers.FieldError
		if err := validate(t, map[string]string{name: value}); !errors.As(err, &fe) || fe.Field != "payload.headers."+name {
			t.Errorf("%s: %q: %v, want a FieldError naming payload.headers.%s", name, value, err, name)
		}
	}
	for _, v := range []string{"<a b@c>", "<a@b c>", "<@b>", "<a@>", "<a@b><c@d>x", "<zoë@exämple.test>", "<a@[1.2.3.4]> <a@[x\\y]>", "<a..b@c>"} {
		if err := validate(t, map[string]string{"References": v}); err == nil {
			t.Errorf("References %q accepted", v)
		}
	}
	var ids []string
	for i := range 40 {
		ids = append(ids, "<thread."+strings.Repeat("x", i+1)+"@mail.example.test>")
	}
	m := send(t, map[string]any{"to": []string{"a@example.test"}, "subject": "s", "text": "t",
		"headers": map[string]string{"In-Reply-To": "<a.b@[192.0.2.1]>", "References": "  " + strings.Join(ids, " \t ") + " "}})
	if n := longestLine(m.Data); n > 76 {
		t.Errorf("a line of %d characters:\n%s", n, m.Data)
	}
	if got := strings.Fields(field(t, m.Data, "References")); strings.Join(got, " ") != strings.Join(ids, " ") {
		t.Errorf("References reads back as %q", got)
	}
	if got := field(t, m.Data, "In-Reply-To"); got != "<a.b@[192.0.2.1]>" {
		t.Errorf("In-Reply-To reads back as %q", got)
	}
}

// The headers a sender of bulk or automatic mail needs still go out as given.
func TestCustomHeadersStillGoOut(t *testing.T) {
	t.Parallel()
	h := map[string]string{
		"List-Unsubscribe":      "<https://acme.test/u?id=1>, <mailto:unsub@acme.test?subject=u>",
		"List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
		"List-Id":               "Acme news <news.acme.test>",
		"X-Campaign":            "spring",
		"Auto-Submitted":        "auto-generated",
		"Precedence":            "bulk",
		"Comments":              "Zoë",
	}
	m := send(t, map[string]any{"to": []string{"a@example.test"}, "subject": "s", "text": "t", "headers": h})
	for k, v := range h {
		if got := unfolded(t, m.Data, k); got != v {
			t.Errorf("%s reads back as %q, want %q", k, got, v)
		}
	}
}

// Issue 15: a quoted display name with spaces was refused as having "no white space" once it passed 998
// characters. RFC 5322 lets folding white space into a quoted-string, so it is folded at its single spaces
// and reads back, to smtptest.Check and to net/mail, as the same name.
func TestLongQuotedDisplayNameIsFolded(t *testing.T) {
	t.Parallel()
	name := strings.TrimSpace(strings.Repeat("Na.me ", 250))
	odd := strings.TrimSpace(strings.Repeat(`Do\e, "J." `, 120)) // escapes and commas, 1,300 characters
	m := send(t, map[string]any{"to": []string{`"` + name + `" <a@example.test>`, `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(odd) + `" <b@example.test>`},
		"subject": "s", "text": "t", "headers": map[string]string{"Reply-To": `"` + name + `" <r@example.test>`}})
	if n := longestLine(m.Data); n > 76 {
		t.Errorf("a line of %d characters:\n%s", n, m.Data)
	}
	to, err := mail.ParseAddressList(field(t, m.Data, "To"))
	if err != nil || len(to) != 2 || to[0].Name != name || to[1].Name != odd {
		t.Fatalf("To reads back as %v: %v", to, err)
	}
	msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
	if err != nil {
		t.Fatal(err)
	}
	if to, err := msg.Header.AddressList("To"); err != nil || len(to) != 2 || to[0].Name != name || to[1].Name != odd {
		t.Fatalf("net/mail reads To as %v: %v", to, err)
	}
	if rt, err := msg.Header.AddressList("Reply-To"); err != nil || len(rt) != 1 || rt[0].Name != name {
		t.Fatalf("net/mail reads Reply-To as %v: %v", rt, err)
	}
	// Where no single space lies between words there is no fold that gives the name back: refused, saying so.
	var fe *providers.FieldError
	p, _ := New(Config{Addr: "127.0.0.1:1", From: "a@acme.test"}, providers.Type{})
	raw, _ := json.Marshal(map[string]any{"to": []string{`"` + strings.Repeat("Na.me  ", 200) + `" <a@example.test>`}, "subject": "s", "text": "t"})
	if err := p.Validate(raw); !errors.As(err, &fe) || fe.Field != "payload.to" || strings.Contains(fe.Msg, "no white space") {
		t.Errorf("a name of double spaces: %v", err)
	}
}
