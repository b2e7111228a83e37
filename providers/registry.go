package providers

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"
)

// Type is what a provider is told of the effect type it serves. The effect type owns these knobs (its
// on_crash and timeout in the gateway's configuration); a provider that needs them reads them from here
// instead of keeping settings of its own that could disagree.
type Type struct {
	Name string
	// Timeout bounds one attempt. Deliver's ctx carries it as a deadline as well; a provider whose client has
	// timeouts of its own (an SMTP client's per-command timeout, say) sets them from this.
	Timeout time.Duration
	// AtMostOnce is set when an interrupted delivery must not be sent again (on_crash: at_most_once): a
	// provider that lost its destination's answer returns KindInDoubt rather than KindRetry.
	AtMostOnce bool
}

// Registry holds the providers of a gateway's effect types by name. It is built once from configuration and
// shared by the HTTP API (which validates payloads with it) and the dispatcher (which delivers with it), so
// both always speak to the same provider. It is not changed after it is built.
type Registry struct {
	byName    map[string]Provider
	names     []string
	closeOnce sync.Once
	closeErr  error
}

// NewRegistry returns a registry of the given providers, by effect type name.
func NewRegistry(byName map[string]Provider) (*Registry, error) {
	r := &Registry{byName: make(map[string]Provider, len(byName))}
	for name, p := range byName {
		if name == "" || p == nil {
			return nil, fmt.Errorf("providers: effect type %q has no name or no provider", name)
		}
		r.byName[name] = p
		r.names = append(r.names, name)
	}
	sort.Strings(r.names)
	return r, nil
}

// Get returns the provider of the effect type name.
func (r *Registry) Get(name string) (Provider, bool) {
	p, ok := r.byName[name]
	return p, ok
}

// Names lists the effect types, sorted.
func (r *Registry) Names() []string { return append([]string(nil), r.names...) }

// Close closes every provider that holds resources (an io.Closer), once; later calls return the first
// call's result. Deliveries must have stopped.
func (r *Registry) Close() error {
	r.closeOnce.Do(func() {
		var errs []error
		for _, name := range r.names {
			if c, ok := r.byName[name].(io.Closer); ok {
				if err := c.Close(); err != nil {
					errs = append(errs, fmt.Errorf("provider %s: %w", name, err))
				}
			}
		}
		r.closeErr = errors.Join(errs...)
	})
	return r.closeErr
}
