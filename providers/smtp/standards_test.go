package smtp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"mime"
	"net/mail"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/providers"
)

// send delivers payload to a fresh smtptest server (which holds what it receives to RFC 5322, MIME and
// RFC 2047) and returns the one message it received.
func send(t *testing.T, payload any) smtptest.Message {
	t.Helper()
	raw, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	srv := smtptest.Start(t)
	p := newProvider(t, srv, "")
	if o := p.Deliver(context.Background(), delivery("k", string(raw))); o.Kind != providers.KindDelivered {
		t.Fatalf("%v %v", o.Kind, o.Err)
	}
	msgs := srv.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages", len(msgs))
	}
	if msgs[0].Malformed != nil {
		t.Fatalf("malformed: %v", msgs[0].Malformed)
	}
	return msgs[0]
}

// field returns a header field of the message as RFC 5322 section 2.2.3 unfolds it: every CRLF removed and
// nothing else (net/textproto also squeezes the white space at a fold into one space).
func field(t *testing.T, data []byte, name string) string {
	t.Helper()
	head, _, _ := bytes.Cut(data, []byte("\r\n\r\n"))
	var out []string
	in := false
	for _, line := range strings.Split(string(head), "\r\n") {
		switch {
		case line[0] == ' ' || line[0] == '\t':
			if in {
				out[len(out)-1] += line
			}
		case strings.HasPrefix(strings.ToLower(line), strings.ToLower(name)+":"):
			in = true
			out = append(out, line[len(name)+1:])
		default:
			in = false
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d %s fields", len(out), name)
	}
	return strings.TrimPrefix(out[0], " ")
}

// longestLine is the length of the message's longest line, CRLF not counted.
func longestLine(data []byte) int {
	n := 0
	for _, line := range strings.Split(string(data), "\r\n") {
		n = max(n, len(line))
	}
	return n
}

// Finding 3 of issue 13: a quoted local part went out unquoted, so `"victim@evil.test> NOTIFY=SUCCESS
// ORCPT=rfc822;x"@example.test` became a recipient with DSN parameters. The envelope now carries each address
// as RFC 5321 writes it, and the server reads back one mailbox with no parameters.
func TestEnvelopeQuotesLocalParts(t *testing.T) {
	t.Parallel()
	m := send(t, map[string]any{"to": []string{`"victim@evil.test> NOTIFY=SUCCESS ORCPT=rfc822;x"@example.test`,
		`"a b"@example.test`, `"a\"b\\c"@example.test`, `"plain"@example.test`}, "subject": "s", "text": "t"})
	want := []string{"MAIL FROM:<noreply@acme.test> BODY=8BITMIME",
		`RCPT TO:<"victim@evil.test> NOTIFY=SUCCESS ORCPT=rfc822;x"@example.test>`,
		`RCPT TO:<"a b"@example.test>`, `RCPT TO:<"a\"b\\c"@example.test>`, `RCPT TO:<plain@example.test>`}
	if strings.Join(m.Envelope, "\n") != strings.Join(want, "\n") {
		t.Fatalf("envelope as sent:\n%s\nwant:\n%s", strings.Join(m.Envelope, "\n"), strings.Join(want, "\n"))
	}
	if got := strings.Join(m.To, "|"); got != `victim@evil.test> NOTIFY=SUCCESS ORCPT=rfc822;x@example.test|a b@example.test|a"b\c@example.test|plain@example.test` {
		t.Fatalf("the server read the recipients as %q", got)
	}
	to, err := mail.ParseAddressList(field(t, m.Data, "To"))
	if err != nil || len(to) != 4 || to[0].Address != `victim@evil.test> NOTIFY=SUCCESS ORCPT=rfc822;x@example.test` || to[2].Address != `a"b\c@example.test` {
		t.Fatalf("To %v: %v", to, err)
	}
}

// What RFC 5321 cannot carry is refused at request time, naming the field: a control character in a quoted
// local part, an IPv6 address literal (Go's [::1] is not RFC 5321's [IPv6:::1]), a path over 256 octets, a
// domain that is not host names; header names of anything but printable ASCII.
func TestUnsendableInputIsRefused(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Addr: "127.0.0.1:1", From: "a@acme.test"}, providers.Type{})
	if err != nil {
		t.Fatal(err)
	}
	base := func(m map[string]any) json.RawMessage {
		pl := map[string]any{"to": []string{"a@example.test"}, "subject": "s", "text": "t"}
		for k, v := range m {
			pl[k] = v
		}
		raw, _ := json.Marshal(pl)
		return raw
	}
	for field, payload := range map[string]json.RawMessage{
		"payload.to[0]":          base(map[string]any{"to": []string{"\"a\tb\"@example.test"}}),
		"payload.cc[0]":          base(map[string]any{"cc": []string{"a@[::1]"}}),
		"payload.bcc[0]":         base(map[string]any{"bcc": []string{strings.Repeat("a", 60) + "@" + strings.Repeat("b.", 100) + "test"}}),
		"payload.to[1]":          base(map[string]any{"to": []string{"a@example.test", "a@exa_mple.test"}}),
		"payload.headers":        base(map[string]any{"headers": map[string]string{"X-Tést": "v"}}),
		"payload.subject":        base(map[string]any{"subject": strings.Repeat("x", 998)}),
		"payload.headers.X-Long": base(map[string]any{"headers": map[string]string{"X-Long": strings.Repeat("x", 1000)}}),
		// Sent raw, an invisible character hides or reorders what a person reads (an outside tester's): a C1
		// control, a line separator, a bidi override, a zero-width space, in a local part or a domain.
		"payload.to[2]": base(map[string]any{"to": []string{"a@example.test", "b@example.test", "a\u0085b@example.test"}}),
		"payload.to[3]": base(map[string]any{"to": []string{"a@example.test", "b@example.test", "c@example.test", "\"a\u2028b\"@example.test"}}),
		"payload.to[4]": base(map[string]any{"to": []string{"a@example.test", "b@example.test", "c@example.test", "d@example.test", "a\u202eb@example.test"}}),
		"payload.cc[1]": base(map[string]any{"cc": []string{"a@example.test", "a@exa\u2028mple.test"}}),
		"payload.cc[2]": base(map[string]any{"cc": []string{"a@example.test", "b@example.test", "a@exa\u200bmple.test"}}),
		// A display name whose encoded word decodes to a line break.
		"payload.bcc[1]": base(map[string]any{"bcc": []string{"a@example.test", "=?utf-8?q?X=0D=0ABcc=3A_evil=40evil.test?= <a@example.test>"}}),
		"payload.bcc[2]": base(map[string]any{"bcc": []string{"a@example.test", "b@example.test", "Ann\u202e <a@example.test>"}}),
		"payload.bcc[3]": base(map[string]any{"bcc": []string{"a@example.test", "b@example.test", "c@example.test", "Ann\u00a0B\u202e <a@example.test>"}}),
		// Graphic and still invisible: a Hangul filler, a variation selector, a combining grapheme joiner; a
		// label that starts with a combining mark.
		"payload.to[5]":  base(map[string]any{"to": []string{"a@example.test", "b@example.test", "c@example.test", "d@example.test", "e@example.test", "a\u3164b@example.test"}}),
		"payload.cc[3]":  base(map[string]any{"cc": []string{"a@example.test", "b@example.test", "c@example.test", "a@exa\u034fmple.test"}}),
		"payload.cc[4]":  base(map[string]any{"cc": []string{"a@example.test", "b@example.test", "c@example.test", "d@example.test", "a@\u0301example.test"}}),
		"payload.bcc[4]": base(map[string]any{"bcc": []string{"a@example.test", "b@example.test", "c@example.test", "d@example.test", "X\ufe0fY <a@example.test>"}}),
		// Reply-To's names are held to the same rules (it took an encoded line break).
		"payload.headers.Reply-To": base(map[string]any{"headers": map[string]string{"Reply-To": "=?utf-8?b?WA0KQmNjOiBldmls?= <e@x.test>"}}),
	} {
		var fe *providers.FieldError
		if err := p.Validate(payload); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want a FieldError naming %s", payload, err, field)
		}
	}
	var fe *providers.FieldError
	if err := p.Validate(base(map[string]any{"headers": map[string]string{"X-(a)": "1", "x-(A)": "2"}})); !errors.As(err, &fe) || !strings.Contains(fe.Msg, "twice") {
		t.Errorf("a header given twice in different case: %v", err)
	}
	for _, name := range []string{"X\x01Y", "X Y", "X\x7fY", "X-\u00e9", "X:Y", ""} {
		var fe *providers.FieldError
		if err := p.Validate(base(map[string]any{"headers": map[string]string{name: "v"}})); !errors.As(err, &fe) || fe.Field != "payload.headers" {
			t.Errorf("header name %q: %v", name, err)
		}
	}
}

// An address with non-ASCII characters (RFC 6531) goes out with SMTPUTF8, which only such a message asks for;
// a server that does not offer it fails the effect for good, sending nothing.
func TestUTF8AddressesNeedSMTPUTF8(t *testing.T) {
	t.Parallel()
	m := send(t, map[string]any{"to": []string{"Zoë <zoë@exämple.test>"}, "subject": "s", "text": "t"})
	if !m.SMTPUTF8 || m.Envelope[1] != "RCPT TO:<zoë@exämple.test>" {
		t.Fatalf("envelope %q, SMTPUTF8 %v", m.Envelope, m.SMTPUTF8)
	}
	if to, err := mail.ParseAddress(field(t, m.Data, "To")); err != nil || to.Name != "Zoë" || to.Address != "zoë@exämple.test" {
		t.Fatalf("To %v: %v", to, err)
	}

	be := &replies{}
	p, _ := New(Config{Addr: serve(t, be, nil), From: "a@acme.test"}, providers.Type{})
	o := p.Deliver(context.Background(), delivery("k", `{"to":["zoë@example.test"],"subject":"s","text":"t"}`))
	if o.Kind != providers.KindFailed || !strings.Contains(fmtErr(o.Err), "SMTPUTF8") || be.accepted.Load() != 0 {
		t.Fatalf("%v %v", o.Kind, o.Err)
	}
	if o := p.Deliver(context.Background(), delivery("k", `{"to":["zoe@example.test"],"subject":"s","text":"t"}`)); o.Kind != providers.KindDelivered {
		t.Fatalf("an ASCII message to a server without SMTPUTF8: %v %v", o.Kind, o.Err)
	}
}

// Finding 4 of issue 13: a 990-byte subject gave a 999-byte line, custom header values had no limit, and a
// non-ASCII subject was one line of encoded words. Headers are now folded at white space to lines of at most
// 76 characters where the text allows, and text that needs encoding is sent as encoded words of at most 75
// characters, on lines of at most 76, none splitting a character; bodies are quoted-printable, lines of at
// most 76. Every value reads back exactly as sent.
func TestLongLinesAreFolded(t *testing.T) {
	t.Parallel()
	subject := strings.TrimSpace(strings.Repeat("word  ", 165))                  // 988 bytes
	tag := strings.TrimSpace(strings.Repeat("tag\tvalue ", 150))                 // 1,499 bytes
	utf := strings.Repeat("Zoë 🎉 — ", 60)                                        // 4-byte characters included
	name := strings.Repeat("Zoë Ünïcode, ", 12)                                  // a long display name to encode
	long := strings.Repeat("ä", 3000) + "\n" + strings.Repeat("b", 5000) + " \n" // long body lines, 8-bit
	m := send(t, map[string]any{"to": []string{`"` + name + `" <zoe@example.test>`, "plain@example.test"},
		"subject": subject, "text": long, "html": "<p>" + long + "</p>",
		"headers": map[string]string{"X-Tag": tag, "X-Utf": utf, "Reply-To": "Équipe Support <help@acme.test>",
			"X-Literal": "=?utf-8?q?Zo=C3=AB?= stays as typed"}})
	if n := longestLine(m.Data); n > 76 {
		t.Errorf("a line of %d characters:\n%s", n, m.Data)
	}
	dec := new(mime.WordDecoder)
	if got := field(t, m.Data, "Subject"); got != subject {
		t.Errorf("Subject reads back as %q", got)
	}
	if got := field(t, m.Data, "X-Tag"); got != tag {
		t.Errorf("X-Tag reads back as %q", got)
	}
	if got, err := dec.DecodeHeader(field(t, m.Data, "X-Utf")); err != nil || got != utf {
		t.Errorf("X-Utf reads back as %q: %v", got, err)
	}
	if got, err := dec.DecodeHeader(field(t, m.Data, "X-Literal")); err != nil || got != "=?utf-8?q?Zo=C3=AB?= stays as typed" {
		t.Errorf("X-Literal reads back as %q: %v", got, err)
	}
	to, err := mail.ParseAddressList(field(t, m.Data, "To"))
	if err != nil || len(to) != 2 || to[0].Name != name || to[1].Address != "plain@example.test" {
		t.Errorf("To reads back as %v: %v", to, err)
	}
	if rt, err := mail.ParseAddress(field(t, m.Data, "Reply-To")); err != nil || rt.Name != "Équipe Support" {
		t.Errorf("Reply-To reads back as %v: %v", rt, err)
	}
	crlf := strings.ReplaceAll(long, "\n", "\r\n")
	if len(m.Parts) != 2 || string(m.Parts[0].Body) != crlf || string(m.Parts[1].Body) != "<p>"+crlf+"</p>" {
		t.Errorf("%d parts; the text reads back as %d bytes, want %d", len(m.Parts), len(m.Parts[0].Body), len(crlf))
	}
}

// Finding 5 of issue 13: the boundary was "oncegate-" and the stable id, so a text that held it added a part.
// The boundary is now taken from a hash of the encoded parts and starts "=_", which quoted-printable cannot
// produce: neither the old boundary nor a guess at the new one, in the text, adds a part.
func TestTextCannotAddAPart(t *testing.T) {
	t.Parallel()
	d := delivery("k", "{}")
	old := "oncegate-" + d.StableID
	// A guess at the new scheme: the boundary of the message as it would be without the injected lines.
	plain := parsed{Payload: Payload{Text: "Hi", HTML: "<p>Hi</p>"}}
	guess := boundary(plain.parts())
	for _, b := range []string{old, guess} {
		text := "Hi\r\n--" + b + "\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<a href=https://evil.test>log in</a>\r\n--" + b + "--\r\n"
		m := send(t, map[string]any{"to": []string{"a@example.test"}, "subject": "s", "text": text, "html": "<p>Hi</p>"})
		if len(m.Parts) != 2 || string(m.Parts[0].Body) != text || string(m.Parts[1].Body) != "<p>Hi</p>" {
			t.Errorf("boundary %s in the text: %d parts %q", b, len(m.Parts), m.Parts)
		}
	}
}

// A resend is the same message, byte for byte: headers in one order whatever the payload's map gave, the
// same boundary, Date and Message-ID.
func TestResendIsByteIdentical(t *testing.T) {
	t.Parallel()
	srv := smtptest.Start(t)
	p := newProvider(t, srv, "")
	d := delivery("k", `{"to":["a@example.test"],"subject":"s","text":"Hi","html":"<p>Hi</p>",
		"headers":{"X-A":"1","X-B":"2","X-C":"3","X-D":"4","X-E":"5","X-F":"6","X-G":"7","X-H":"8","X-I":"9"}}`)
	for range 5 {
		if o := p.Deliver(context.Background(), d); o.Kind != providers.KindDelivered {
			t.Fatalf("%v %v", o.Kind, o.Err)
		}
	}
	msgs := srv.Messages()
	for _, m := range msgs[1:] {
		if !bytes.Equal(m.Data, msgs[0].Data) {
			t.Fatalf("a resend differs:\n%s\n---\n%s", msgs[0].Data, m.Data)
		}
	}
}
