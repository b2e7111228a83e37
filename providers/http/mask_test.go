package http

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// The streamed masking gives what the stored masking gives, however the body is cut into reads.
func TestMaskStreamMatchesRedact(t *testing.T) {
	p, err := New(Config{BaseURL: "https://api.example", Headers: map[string]string{
		"Authorization": "Bearer sk_live_secret_1", "X-Key": "APIKEYSECRET"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"", "nothing here", "auth=Bearer sk_live_secret_1 key=APIKEYSECRET end",
		"sk_live_secret_1sk_live_secret_1", "Bearer sk_live_secret_", "xxAPIKEYSECRE", "APIKEYSECRETAPIKEYSECRET"} {
		want := p.redact.Replace(body)
		for _, r := range []io.Reader{strings.NewReader(body), iotest.OneByteReader(strings.NewReader(body)),
			iotest.HalfReader(strings.NewReader(body))} {
			got, err := io.ReadAll(p.MaskStream(r))
			if err != nil || string(got) != want {
				t.Fatalf("%q: got %q, want %q (%v)", body, got, want, err)
			}
		}
	}
}
