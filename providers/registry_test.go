package providers_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/oncegate/oncegate/providers"
)

type closer struct{ closed int }

func (*closer) Validate(json.RawMessage) error { return nil }
func (*closer) Deliver(context.Context, providers.Delivery) providers.Outcome {
	return providers.Delivered(nil)
}
func (c *closer) Close() error { c.closed++; return errors.New("closed") }

type plain struct{ closer }

func (plain) Close() {} // not an io.Closer: no error result

func TestRegistry(t *testing.T) {
	a, b := &closer{}, &plain{}
	r, err := providers.NewRegistry(map[string]providers.Provider{"b": b, "a": a})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := r.Get("a"); !ok || p != a {
		t.Fatalf("Get(a) = %v, %v", p, ok)
	}
	if _, ok := r.Get("c"); ok {
		t.Fatal("Get(c) found a provider")
	}
	if got := r.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Names() = %v", got)
	}
	// Close closes each closer once, however often it is called, and reports which provider failed.
	for range 2 {
		if err := r.Close(); err == nil || err.Error() != "provider a: closed" {
			t.Fatalf("Close() = %v", err)
		}
	}
	if a.closed != 1 || b.closed != 0 {
		t.Fatalf("closed a %d times, b %d times", a.closed, b.closed)
	}
	if _, err := providers.NewRegistry(map[string]providers.Provider{"x": nil}); err == nil {
		t.Fatal("a nil provider was registered")
	}
}
