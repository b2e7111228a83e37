package smtptest

import (
	"strings"
	"testing"

	"github.com/emersion/go-smtp"
)

const head = "Date: Sun, 29 Nov 2026 12:00:00 +0000\r\nFrom: Acme <noreply@acme.test>\r\nMessage-ID: <id@acme.test>\r\n"

const good = head + "To: a@example.test\r\nSubject: =?utf-8?q?Zo=C3=AB?=\r\nMIME-Version: 1.0\r\n" +
	"Content-Type: multipart/alternative; boundary=\"=_b\"\r\n\r\n" +
	"--=_b\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nHi Zo=C3=AB=\r\n!\r\n" +
	"--=_b\r\nContent-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n<p>Hi</p>\r\n" +
	"--=_b--\r\n"

// A well-formed message passes and its parts come back decoded.
func TestCheckReadsAWellFormedMessage(t *testing.T) {
	parts, err := Check([]byte(good), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 2 || string(parts[0].Body) != "Hi Zoë!" || string(parts[1].Body) != "<p>Hi</p>" {
		t.Fatalf("parts %+v", parts)
	}
}

// Each way a message can break the standards is reported, naming what is wrong.
func TestCheckFindsWhatIsMalformed(t *testing.T) {
	body := "\r\nhi\r\n"
	for _, c := range []struct{ name, data, want string }{
		{"bare LF", head + "Subject: s\n" + body, "bare LF"},
		{"bare CR", head + "Subject: s\rx\r\n" + body, "bare CR"},
		{"line over 998", head + "Subject: " + strings.Repeat("x", 990) + "\r\n" + body, "999 octets"},
		{"control byte in a field name", head + "X-\x01: v\r\n" + body, "not a header field"},
		{"8-bit field name", head + "X-Ä: v\r\n" + body, "8-bit"},
		{"8-bit value without SMTPUTF8", head + "Subject: Zoë\r\n" + body, "8-bit"},
		{"no Date", "From: a@b.test\r\n" + body, "0 Date fields"},
		{"two Subjects", head + "Subject: a\r\nSubject: b\r\n" + body, "2 Subject fields"},
		{"bad To", head + "To: a b@example.test\r\n" + body, "header: To"},
		{"bad Message-ID", strings.Replace(head, "<id@acme.test>", "<id @acme.test>", 1) + body, "Message-ID"},
		{"Message-ID without <", strings.Replace(head, "<id@acme.test>", "id@acme.test>", 1) + body, "Message-ID"},
		{"In-Reply-To not a msg-id", head + "In-Reply-To: garbage here\r\n" + body, "In-Reply-To"},
		{"References with junk", head + "References: <a@b>\r\n junk\r\n" + body, "References"},
		{"Resent-Date not a date", head + "Resent-Date: yesterday\r\n" + body, "Resent-Date"},
		{"fold of white space only", head + "Subject: a\r\n \r\n" + body, "white space only"},
		{"long encoded word", head + "Subject: =?utf-8?q?" + strings.Repeat("a", 70) + "?=\r\n" + body, "over 75"},
		{"encoded line over 76", head + "X-Long-Field-Name-Of-Some-Length: aaaaaaaaaaaaaaaaaaaaaa =?utf-8?q?Zo=C3=AB?=\r\n" + body, "over RFC 2047's 76"},
		{"split character", head + "Subject: =?utf-8?q?Zo=C3?= =?utf-8?q?=AB?=\r\n" + body, "splits a UTF-8 character"},
		{"phrase with a comma in Q", head + "To: =?utf-8?q?Zo=C3=AB,_A?= <a@example.test>\r\n" + body, "phrase"},
		{"8-bit 7bit body", head + "\r\nZoë\r\n", "8-bit bytes in a 7bit body"},
		{"qp line over 76", head + "MIME-Version: 1.0\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n" + strings.Repeat("a", 77) + "\r\n", "over 76"},
		{"qp bad escape", head + "MIME-Version: 1.0\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\na=ZZ\r\n", "not =XX"},
		{"qp trailing space", head + "MIME-Version: 1.0\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\na \r\n", "ends with white space"},
		{"no MIME-Version", head + "Content-Type: text/plain\r\n" + body, "without MIME-Version"},
		{"no close delimiter", strings.TrimSuffix(good, "--=_b--\r\n"), "no close delimiter"},
		{"boundary prefix in a part", strings.Replace(good, "<p>Hi</p>", "--=_bx", 1), "starts with the boundary"},
		{"qp multipart", strings.Replace(good, "MIME-Version: 1.0\r\n", "MIME-Version: 1.0\r\nContent-Transfer-Encoding: quoted-printable\r\n", 1), "6.4"},
		{"non-UTF-8 text", strings.Replace(good, "Hi Zo=C3=AB=\r\n!", "Hi =FF", 1), "not UTF-8"},
	} {
		if _, err := Check([]byte(c.data), false); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	if _, err := Check([]byte(head+"In-Reply-To: <a@b>\r\nReferences: <x.y@z>\r\n\t<a@[192.0.2.1]> <a@b>\r\n"+body), false); err != nil {
		t.Errorf("msg-id lists folded between ids: %v", err)
	}
	// SMTPUTF8 lets UTF-8 into the header (RFC 6532), and only UTF-8.
	if _, err := Check([]byte(head+"To: zoë@example.test\r\n"+body), true); err != nil {
		t.Errorf("UTF-8 address under SMTPUTF8: %v", err)
	}
	if _, err := Check([]byte(head+"Subject: \xff\r\n"+body), true); err == nil {
		t.Error("a header byte that is not UTF-8 passed under SMTPUTF8")
	}
}

// The server records the envelope's lines as the client sent them, quoting and parameters included, and
// marks a malformed message.
func TestServerRecordsTheEnvelopeAsSent(t *testing.T) {
	s, err := New("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := smtp.Dial(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Mail("a@acme.test", &smtp.MailOptions{UTF8: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt(`"a b"@example.test`, nil); err != nil {
		t.Fatal(err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write([]byte("Subject: no Date, no From\r\n\r\nhi\r\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.Quit()
	m := s.Messages()[0]
	if strings.Join(m.Envelope, "|") != `MAIL FROM:<a@acme.test> BODY=8BITMIME SMTPUTF8|RCPT TO:<"a b"@example.test>` ||
		m.To[0] != "a b@example.test" || !m.SMTPUTF8 {
		t.Fatalf("envelope %q, to %q, smtputf8 %v", m.Envelope, m.To, m.SMTPUTF8)
	}
	if m.Malformed == nil || len(s.Malformed()) != 1 {
		t.Fatalf("a message with no Date and no From passed: %v", m.Malformed)
	}

	// A message a fault refuses is checked all the same.
	s.SetFault(Defer)
	c, err = smtp.Dial(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Mail("a@acme.test", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("b@example.test", nil); err != nil {
		t.Fatal(err)
	}
	if w, err = c.Data(); err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write([]byte("Subject: no Date, no From\r\n\r\nhi\r\n"))
	if err := w.Close(); err == nil {
		t.Fatal("the Defer fault accepted the message")
	}
	if len(s.Messages()) != 1 || len(s.Malformed()) != 2 {
		t.Fatalf("%d messages, %d malformed", len(s.Messages()), len(s.Malformed()))
	}
}
