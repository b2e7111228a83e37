package smtp

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"mime/quotedprintable"
	"net/mail"
	"net/textproto"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncegate/oncegate/providers"
)

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

// addressHeaders are the headers a payload may set whose value is an address list, written as To is.
var addressHeaders = map[string]bool{"Reply-To": true}

// msgIDHeaders are the headers a payload may set whose value is a list of msg-ids (RFC 5322 section 3.6.4).
var msgIDHeaders = map[string]bool{"In-Reply-To": true, "References": true}

// routingHeaders name an address that mail about the message goes to (receipts, bounces, replies to a list),
// or hold addresses as trace or as a structured field the provider does not parse: a payload that set them
// could send that mail where it liked, or write a field a reader parses and finds malformed. Reply-To is the
// one address field a payload sets; Resent-* fields are refused by prefix.
var routingHeaders = map[string]string{
	"Return-Path":                 "is a trace field (RFC 5322 section 3.6.7) that the receiving system writes",
	"Received":                    "is a trace field (RFC 5322 section 3.6.7) that each relay writes",
	"Delivered-To":                "is a trace field that the receiving system writes",
	"Envelope-To":                 "is a trace field that the receiving system writes",
	"Apparently-To":               "is a trace field that the receiving system writes",
	"Sender":                      "is written by the gateway",
	"Errors-To":                   "would send bounces to an address of the payload's choosing",
	"Return-Receipt-To":           "would send read receipts to an address of the payload's choosing",
	"Disposition-Notification-To": "would send read receipts to an address of the payload's choosing (RFC 8098)",
	"Mail-Followup-To":            "is an address field: Reply-To is the one a payload may set",
	"Mail-Reply-To":               "is an address field: Reply-To is the one a payload may set",
	"Author":                      "is an address field (RFC 9057): Reply-To is the one a payload may set",
	"Original-From":               "is an address field (RFC 5703): Reply-To is the one a payload may set",
	"Original-Recipient":          "is an address field (RFC 3798): Reply-To is the one a payload may set",
	"Keywords":                    "is a structured field (RFC 5322 section 3.6.5, a list of phrases) the gateway does not parse",
	"X-Received":                  "is a trace field that each relay writes",
	"X-Original-To":               "is a trace field that the receiving system writes",
	"X-Envelope-To":               "is a trace field that the receiving system writes",
	"Received-Spf":                "is a trace field (RFC 7208 section 9.1) that the receiving system writes",
	"Authentication-Results":      "is written by the receiving system (RFC 8601): a sender's would forge its checks",
	"Arc-Authentication-Results":  "is written by the relays that sign a message's chain (RFC 8617)",
	"Arc-Message-Signature":       "is written by the relays that sign a message's chain (RFC 8617)",
	"Arc-Seal":                    "is written by the relays that sign a message's chain (RFC 8617)",
	"Dkim-Signature":              "is written by the signing system (RFC 6376), not by a payload",
	"Domainkey-Signature":         "is written by the signing system, not by a payload",
	"X-Confirm-Reading-To":        "would send read receipts to an address of the payload's choosing",
	"Bounces-To":                  "would send bounces to an address of the payload's choosing",
	"X-Apparently-To":             "is a trace field that the receiving system writes",
	"X-Forwarded-To":              "is a trace field that a forwarding system writes",
	"X-Original-Recipient":        "is a trace field that the receiving system writes",
	"X-Envelope-From":             "is a trace field that the receiving system writes",
	"X-Original-From":             "is an address field that a forwarding system writes: Reply-To is the one a payload may set",
	"X-Original-Sender":           "is an address field that a list or forwarding system writes",
	"X-Authenticated-Sender":      "is written by the submission server that authenticated the sender",
	"X-Sender":                    "is written by the submission server",
	"Original-Envelope-Id":        "is a delivery-status field (RFC 3464) the sending system writes",
	"Approved":                    "approves a moderated post to a mailing list (RFC 1036 usage): a payload may not",
}

// refused says why a payload may not set the header ck (in canonical form), or "" when it may.
func refused(ck string) string {
	lower := strings.ToLower(ck)
	switch {
	case ownHeaders[ck]:
		return "is written by the gateway"
	case strings.HasPrefix(lower, "content-"), strings.HasPrefix(lower, "mime-"):
		return "is a MIME field: the gateway alone writes the message's structure (RFC 2045, 2183)"
	case strings.HasPrefix(lower, "resent-"):
		return "is a resent field (RFC 5322 section 3.6.6): the gateway sends a message, it does not resend one"
	case strings.HasSuffix(lower, "authentication-results"), strings.HasSuffix(lower, "dkim-signature"),
		strings.HasPrefix(lower, "x-spam-"), strings.HasPrefix(lower, "x-virus-"), strings.HasPrefix(lower, "x-ms-exchange-"):
		// Their vendors' spellings too (X-Original-Authentication-Results, X-Google-DKIM-Signature): a
		// filter that reads one believes a check the sender wrote.
		return "is a receiving, signing or filtering system's verdict, which a sender's copy would forge"
	}
	return routingHeaders[ck]
}

// parsed is a payload checked and rendered as far as it can be before a delivery: everything that could
// refuse it is done here, at request time.
type parsed struct {
	Payload
	rcpts    []string // the envelope's recipients, to, cc and bcc, as RFC 5321 writes them
	nonASCII bool     // an address needs SMTPUTF8
	head     string   // To, Cc and Subject, folded, each with its CRLF
	extra    string   // the payload's headers, folded, sorted by name
}

// envelopeKey is a mailbox as RCPT compares it: the domain in lower case.
func envelopeKey(mailbox string) string {
	at := strings.LastIndexByte(mailbox, '@')
	return mailbox[:at+1] + strings.ToLower(mailbox[at+1:])
}

func parse(raw json.RawMessage) (parsed, error) {
	var p parsed
	if err := providers.DecodeStrict(raw, &p.Payload); err != nil {
		return p, err
	}
	if len(p.To) == 0 {
		return p, providers.Invalid("to", "at least one recipient is required")
	}
	if n := len(p.To) + len(p.Cc) + len(p.Bcc); n > 100 {
		return p, providers.Invalid("to", "%d recipients, at most 100", n)
	}
	var head strings.Builder
	// A mailbox named twice (in to and cc, say) is one RCPT: a relay delivers each RCPT, so two were two
	// copies. Domains compare without case (RFC 5321 §2.4); a local part is the receiver's to read, as sent.
	enveloped := map[string]bool{}
	for _, l := range []struct {
		field, header string
		in            []string
	}{{"to", "To", p.To}, {"cc", "Cc", p.Cc}, {"bcc", "", p.Bcc}} {
		as := make([]address, len(l.in))
		for i, s := range l.in {
			a, err := p.address(s)
			if err != nil {
				return p, providers.Invalid(fmt.Sprintf("%s[%d]", l.field, i), "%q %s", s, err)
			}
			as[i] = a
			if k := envelopeKey(a.mailbox); !enveloped[k] {
				enveloped[k] = true
				p.rcpts = append(p.rcpts, a.mailbox)
			}
		}
		if l.header == "" || len(as) == 0 {
			continue
		}
		f := newField(l.header)
		f.addresses(as)
		s, err := f.done()
		if err != nil {
			return p, providers.Invalid(l.field, "%v", err)
		}
		head.WriteString(s)
	}
	if strings.TrimSpace(p.Subject) == "" || len(p.Subject) > 998 || strings.ContainsAny(p.Subject, "\r\n\x00") {
		return p, providers.Invalid("subject", "is required: one line, at most 998 bytes")
	}
	f := newField("Subject")
	f.text(p.Subject)
	s, err := f.done()
	if err != nil {
		return p, providers.Invalid("subject", "%v", err)
	}
	head.WriteString(s)
	p.head = head.String()
	if p.Text == "" && p.HTML == "" {
		return p, providers.Invalid("text", "text or html is required")
	}
	return p, p.headers()
}

// address checks one address and renders its mailbox; the error completes a sentence that starts with the
// address.
func (p *parsed) address(s string) (address, error) {
	a, err := mail.ParseAddress(s)
	if err != nil || strings.ContainsAny(s, "\r\n") {
		return address{}, fmt.Errorf("is not an email address")
	}
	box, nonASCII, err := mailbox(a.Address)
	if err != nil {
		return address{}, fmt.Errorf("cannot be sent: %v", err)
	}
	if err := checkName(a.Name); err != nil {
		return address{}, err
	}
	p.nonASCII = p.nonASCII || nonASCII
	return address{name: a.Name, mailbox: box}, nil
}

// checkName checks a display name as net/mail decoded it: an encoded word can carry what the raw text may
// not (=0D=0A), and a reader that decodes it, then writes the header again, would write a line break of the
// payload's. Beyond ASCII, what a reader does not see as itself is refused as in an address (invisible), but
// for spaces: a no-break space in a name is a name's. To, Cc, Bcc and Reply-To alike.
func checkName(name string) error {
	for _, r := range name {
		if r < ' ' && r != '\t' || r == 0x7f || r >= utf8.RuneSelf && hidden(r) {
			return fmt.Errorf("has a display name that holds %U once decoded, a control, format, separator or "+
				"invisible character", r)
		}
	}
	return nil
}

// headers checks and renders the payload's headers, in the order of their names, so that every attempt
// writes the same bytes.
func (p *parsed) headers() error {
	names := make([]string, 0, len(p.Headers))
	for k := range p.Headers {
		names = append(names, k)
	}
	// Field names are case-insensitive (RFC 5322 section 1.2.2): sorted without case, two that differ only
	// in case meet, and are refused.
	slices.SortFunc(names, func(a, b string) int { return strings.Compare(strings.ToLower(a), strings.ToLower(b)) })
	var out strings.Builder
	for i, k := range names {
		v, ck := p.Headers[k], textproto.CanonicalMIMEHeaderKey(k)
		if !isFieldName(k) {
			return providers.Invalid("headers", "%q is not a header name: printable ASCII but ':' only", k)
		}
		if i > 0 && strings.EqualFold(names[i-1], k) {
			return providers.Invalid("headers."+k, "is given twice, as %q and %q", names[i-1], k)
		}
		if why := refused(ck); why != "" {
			return providers.Invalid("headers."+k, "%s", why)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return providers.Invalid("headers."+k, "has a line break or NUL: header injection is refused")
		}
		f := newField(ck)
		if addressHeaders[ck] {
			list, err := mail.ParseAddressList(v)
			if err != nil {
				return providers.Invalid("headers."+k, "%q is not a list of email addresses", v)
			}
			as := make([]address, len(list))
			for j, a := range list {
				box, nonASCII, err := mailbox(a.Address)
				if err != nil {
					return providers.Invalid("headers."+k, "%q cannot be sent: %v", a.Address, err)
				}
				if err := checkName(a.Name); err != nil {
					return providers.Invalid("headers."+k, "%q %v", a.Address, err)
				}
				p.nonASCII = p.nonASCII || nonASCII
				as[j] = address{name: a.Name, mailbox: box}
			}
			f.addresses(as)
		} else if msgIDHeaders[ck] {
			ids := strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == '\t' })
			if len(ids) == 0 {
				return providers.Invalid("headers."+k, "is empty: it takes one or more msg-ids, <id-left@id-right>")
			}
			for _, id := range ids {
				if !isMsgID(id) {
					return providers.Invalid("headers."+k, "%q is not a msg-id, <id-left@id-right> in printable ASCII (RFC 5322 section 3.6.4); ids are separated by white space", id)
				}
				f.token(" " + id)
			}
		} else {
			f.text(v)
		}
		s, err := f.done()
		if err != nil {
			return providers.Invalid("headers."+k, "%v", err)
		}
		out.WriteString(s)
	}
	p.extra = out.String()
	return nil
}

// isMsgID reports whether s is an RFC 5322 msg-id in printable ASCII: "<" dot-atom-text "@" (dot-atom-text /
// no-fold-literal) ">".
func isMsgID(s string) bool {
	inner, ok := strings.CutPrefix(s, "<")
	if inner, ok2 := strings.CutSuffix(inner, ">"); ok && ok2 {
		left, right, ok := strings.Cut(inner, "@")
		if !ok || !isDotAtomText(left) {
			return false
		}
		if lit, ok := strings.CutPrefix(right, "["); ok {
			lit, ok = strings.CutSuffix(lit, "]")
			return ok && !strings.ContainsFunc(lit, func(r rune) bool { return r <= ' ' || r > '~' || strings.ContainsRune("[]\\", r) })
		}
		return isDotAtomText(right)
	}
	return false
}

// isDotAtomText reports whether s is atoms of ASCII atext joined by single dots.
func isDotAtomText(s string) bool {
	return isASCII(s) && isDotString(s)
}

// isFieldName reports whether s is an RFC 5322 field name: printable ASCII but ':'.
func isFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 33 || s[i] > 126 || s[i] == ':' {
			return false
		}
	}
	return true
}

// parts renders the body's parts, text before html: each its Content-Type and Content-Transfer-Encoding,
// an empty line and the text quoted-printable, which keeps lines to 76 characters, encodes 8-bit bytes and
// sends every line break (LF, CR or CRLF) as CRLF.
func (p parsed) parts() [][]byte {
	var out [][]byte
	for _, part := range []struct{ ctype, body string }{{"text/plain", p.Text}, {"text/html", p.HTML}} {
		if part.body == "" {
			continue
		}
		var b bytes.Buffer
		fmt.Fprintf(&b, "Content-Type: %s; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n", part.ctype)
		w := quotedprintable.NewWriter(&b)
		_, _ = w.Write([]byte(part.body))
		_ = w.Close()
		out = append(out, b.Bytes())
	}
	return out
}

// boundary is the multipart boundary for parts: "=_" and 32 hex digits of SHA-256 of the parts. Quoted-
// printable never writes "=_" (its "=" comes before two hex digits or ends a line), so no line of a part can
// be a delimiter, whatever the text holds. Taken from the content alone, it is the same on every attempt and
// in every gateway, and no one can make a text hold it, since it changes with the text. Should a part hold
// it anyway, the hash of the hash is taken, and so on.
func boundary(parts [][]byte) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d\n", len(p))
		h.Write(p)
	}
	sum := h.Sum(nil)
	for {
		b := "=_" + hex.EncodeToString(sum[:16])
		if !slices.ContainsFunc(parts, func(p []byte) bool { return bytes.Contains(p, []byte("--"+b)) }) {
			return b
		}
		next := sha256.Sum256(sum)
		sum = next[:]
	}
}

// message renders an effect's email. Everything in it comes from the payload and the delivery's stable id
// and creation time, so every attempt sends the same bytes.
func (p *Provider) message(d providers.Delivery, pl parsed) []byte {
	var b bytes.Buffer
	b.WriteString(p.fromField)
	b.WriteString(pl.head)
	fmt.Fprintf(&b, "Date: %s\r\n", d.CreatedAt.UTC().Format(time.RFC1123Z))
	fmt.Fprintf(&b, "Message-ID: %s\r\n", p.MessageID(d))
	b.WriteString(pl.extra)
	b.WriteString("MIME-Version: 1.0\r\n")
	parts := pl.parts()
	if len(parts) == 1 {
		b.Write(parts[0])
		b.WriteString("\r\n")
		return b.Bytes()
	}
	bd := boundary(parts)
	fmt.Fprintf(&b, "Content-Type: multipart/alternative;\r\n boundary=\"%s\"\r\n\r\n", bd)
	for _, part := range parts {
		fmt.Fprintf(&b, "--%s\r\n", bd)
		b.Write(part)
		b.WriteString("\r\n")
	}
	fmt.Fprintf(&b, "--%s--\r\n", bd)
	return b.Bytes()
}
