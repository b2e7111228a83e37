package http

import (
	"bytes"
	"io"
)

// Masks reports whether an answer's body may be changed in length by masking: a pass-through answer then
// cannot keep the upstream's Content-Length.
func (p *Provider) Masks() bool { return len(p.secrets) > 0 }

// MaskStream returns r with every configured header value masked as in a stored answer (redact), for a body
// that is streamed rather than read whole: a value split across reads is masked all the same, because the
// longest value less one byte is held back until the next read shows how it goes on.
func (p *Provider) MaskStream(r io.Reader) io.Reader {
	if !p.Masks() {
		return r
	}
	hold := 0
	for _, s := range p.secrets {
		hold = max(hold, len(s)-1)
	}
	return &maskReader{r: r, secrets: p.secrets, hold: hold}
}

type maskReader struct {
	r       io.Reader
	secrets []string
	hold    int
	in      []byte // read, not yet masked
	out     []byte // masked, not yet returned
	err     error  // the underlying reader's, returned once in and out are drained
}

func (m *maskReader) Read(b []byte) (int, error) {
	for len(m.out) == 0 {
		if m.err != nil {
			if len(m.in) == 0 {
				return 0, m.err
			}
			m.mask(true)
			continue
		}
		buf := make([]byte, 32<<10)
		n, err := m.r.Read(buf)
		m.in = append(m.in, buf[:n]...)
		m.err = err
		m.mask(false)
	}
	n := copy(b, m.out)
	m.out = m.out[n:]
	return n, nil
}

// mask moves what of in can be decided to out: up to the earliest whole secret (masked), and, without one,
// all but the tail that may be the start of one (all of it at the end).
func (m *maskReader) mask(end bool) {
	for {
		at, length := -1, 0
		for _, s := range m.secrets {
			if i := bytes.Index(m.in, []byte(s)); i >= 0 && (at < 0 || i < at || (i == at && len(s) > length)) {
				at, length = i, len(s)
			}
		}
		if at < 0 {
			break
		}
		// A longer secret starting at the same place may not be whole yet: wait for it.
		if !end && m.longerMayFollow(at, length) {
			m.out = append(m.out, m.in[:at]...)
			m.in = append([]byte(nil), m.in[at:]...)
			return
		}
		m.out = append(append(m.out, m.in[:at]...), redacted...)
		m.in = m.in[at+length:]
	}
	keep := m.hold
	if end {
		keep = 0
	}
	if len(m.in) > keep {
		cut := len(m.in) - keep
		m.out = append(m.out, m.in[:cut]...)
		m.in = append([]byte(nil), m.in[cut:]...)
	}
}

// longerMayFollow reports whether a secret longer than length could start at in[at:], which holds only its
// beginning so far.
func (m *maskReader) longerMayFollow(at, length int) bool {
	rest := m.in[at:]
	for _, s := range m.secrets {
		if len(s) > length && len(s) > len(rest) && bytes.HasPrefix([]byte(s), rest) {
			return true
		}
	}
	return false
}
