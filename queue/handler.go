package queue

import (
	"context"
	"fmt"
)

// Handler runs a job. Returning nil completes it; an error fails the attempt, which is retried after a backoff
// unless it is Permanent or attempts are used up (see RetryAfter for a delay of the handler's choosing).
//
// ctx is cancelled when the worker loses the job's lease (cause ErrLeaseLost) or when a graceful close runs out
// of drain time: a handler should stop then, since another worker may already run the job.
type Handler interface {
	Handle(ctx context.Context, job *Job) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, job *Job) error

func (f HandlerFunc) Handle(ctx context.Context, job *Job) error { return f(ctx, job) }

// Mux routes jobs to handlers by Job.Kind. A job of a kind with no handler fails permanently.
type Mux struct{ byKind map[string]Handler }

func NewMux() *Mux { return &Mux{byKind: map[string]Handler{}} }

// Register sets the handler of a kind. It is not safe to call while a worker uses the Mux.
func (m *Mux) Register(kind string, h Handler) { m.byKind[kind] = h }

// RegisterFunc sets a function as the handler of a kind.
func (m *Mux) RegisterFunc(kind string, f func(context.Context, *Job) error) {
	m.Register(kind, HandlerFunc(f))
}

func (m *Mux) Handle(ctx context.Context, job *Job) error {
	h, ok := m.byKind[job.Kind]
	if !ok {
		return Permanent(fmt.Errorf("no handler for job kind %q", job.Kind))
	}
	return h.Handle(ctx, job)
}
