package smtp

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/mail"
	"net/textproto"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/providers"
)

// Every payload Validate accepts renders a message that smtptest.Check finds well-formed (RFC 5322 lines and
// fields, MIME, RFC 2047 words), whose subject, header and display name read back exactly as given (the name
// to net/mail too), and whose text part is the only text part: what a tenant writes can neither break the
// format nor add to it.
func FuzzMessageConforms(f *testing.F) {
	f.Add("Bienvenue, Zoë", "X-Tag", "a  b\tc", "Hi\n--=_x\r\n", "<p>Hi</p>", "User <a@example.test>")
	f.Add(strings.Repeat("word ", 190), "X-Long-"+strings.Repeat("n", 60), strings.Repeat("é", 400), "t", "", `"a b"@example.test`)
	f.Add("=?utf-8?q?x?= \x1b[31m", "Reply-To", `"Doe, J." <j@example.test>, Zoë <z@exämple.test>`, strings.Repeat("x", 2000), "h", `"\"q\\"@[192.0.2.1]`)
	f.Add("s", "References", "<a@b>\t <c.d@[192.0.2.1]> ", "t", "", `"`+strings.Repeat("Na.me ", 250)+`" <a@example.test>`)
	f.Add("s", "X-Q", "v", "t", "", `" a  b \" c\\ " <a@example.test>`)
	f.Add(" lead and trail ", "X-E", "🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉", ".\r\n.\r\n", ".", "a@b.test")
	p, err := New(Config{Addr: "127.0.0.1:1", From: "Équipe <noreply@acme.test>"}, providers.Type{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, subject, name, value, text, html, to string) {
		raw, _ := json.Marshal(map[string]any{"to": []string{to}, "subject": subject, "text": text, "html": html,
			"headers": map[string]string{name: value}})
		pl, err := parse(raw)
		if err != nil {
			return
		}
		data := p.message(delivery("k", string(raw)), pl)
		parts, err := smtptest.Check(data, pl.nonASCII)
		if err != nil {
			t.Fatalf("%v\n%s", err, data)
		}
		want := 0
		for _, s := range []string{pl.Text, pl.HTML} {
			if s != "" {
				want++
			}
		}
		if len(parts) != want {
			t.Fatalf("%d parts, want %d\n%s", len(parts), want, data)
		}
		if want, _ := mail.ParseAddress(to); want != nil {
			got, err := mail.ParseAddress(field(t, data, "To"))
			if err != nil || got.Name != want.Name {
				t.Fatalf("To reads back as %v, want the name %q: %v\n%s", got, want.Name, err, data)
			}
			if m, err := mail.ReadMessage(bytes.NewReader(data)); err != nil {
				t.Fatal(err)
			} else if got, err := m.Header.AddressList("To"); err != nil || len(got) != 1 || got[0].Name != want.Name {
				t.Fatalf("net/mail reads To as %v, want the name %q: %v\n%s", got, want.Name, err, data)
			}
		}
		if got := unfolded(t, data, "Subject"); got != pl.Subject {
			t.Fatalf("Subject reads back as %q, want %q\n%s", got, pl.Subject, data)
		}
		for k, v := range pl.Headers {
			ck := textproto.CanonicalMIMEHeaderKey(k)
			if addressHeaders[ck] {
				continue
			}
			if msgIDHeaders[ck] {
				if got := strings.Fields(unfolded(t, data, ck)); strings.Join(got, " ") != strings.Join(strings.Fields(v), " ") {
					t.Fatalf("%s reads back as %q, want the ids of %q\n%s", k, got, v, data)
				}
				continue
			}
			if got := unfolded(t, data, textproto.CanonicalMIMEHeaderKey(k)); got != v {
				t.Fatalf("%s reads back as %q, want %q\n%s", k, got, v, data)
			}
		}
	})
}

// unfolded is a field's text as a reader gets it back: unfolded, then its encoded words decoded.
func unfolded(t *testing.T, data []byte, name string) string {
	t.Helper()
	got, err := new(mime.WordDecoder).DecodeHeader(field(t, data, name))
	if err != nil {
		t.Fatal(err)
	}
	return got
}
