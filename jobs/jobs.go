// Package jobs holds the reference worker's job kinds and their handlers: each job performs its external
// effects through the gateway, never itself, so a job that runs twice performs them once. Payloads sent to
// the gateway are built from the job's data alone, so a re-run sends exactly the same request.
package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/oncegate/oncegate/client"
	"github.com/oncegate/oncegate/queue"
)

// Job kinds.
const (
	KindSignup  = "signup"  // a welcome email
	KindClick   = "click"   // an analytics event
	KindOrder   = "order"   // a signed webhook
	KindEffects = "effects" // any effects the payload lists
)

// Signup is the payload of a signup job.
type Signup struct {
	User  string `json:"user"`
	Email string `json:"email"`
}

// Click is the payload of a click job.
type Click struct {
	User string `json:"user"`
	Link string `json:"link"`
}

// Order is the payload of an order job.
type Order struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// Effect is one effect of an effects job: Name makes its key (Name:job ID), Type is the gateway's effect
// type, Payload goes to the gateway as it is.
type Effect struct {
	Name    string          `json:"name"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
}

// Effects is the payload of an effects job.
type Effects struct {
	Effects []Effect `json:"effects"`
}

// Config names the gateway's effect types that the job kinds use.
type Config struct {
	EmailType string // default "welcome-email"
	ClickType string // default "clicks"
	OrderType string // default "order-webhook"
	// Work is how long each job takes after its effects: the rest of its work. Default none.
	Work time.Duration
	// Wait asks the gateway to answer once each effect is terminal, up to this long. Default none: an
	// accepted effect is durable, and the job may complete.
	Wait time.Duration
	// Queue is the queue the handlers run for, stored with each effect (client.JobEffects.InQueue).
	Queue string
}

// Handlers returns a queue.Mux that runs the job kinds, performing effects through c.
func Handlers(c *client.Client, cfg Config) *queue.Mux {
	if cfg.EmailType == "" {
		cfg.EmailType = "welcome-email"
	}
	if cfg.ClickType == "" {
		cfg.ClickType = "clicks"
	}
	if cfg.OrderType == "" {
		cfg.OrderType = "order-webhook"
	}
	h := &handlers{c: c, cfg: cfg}
	m := queue.NewMux()
	m.RegisterFunc(KindSignup, h.signup)
	m.RegisterFunc(KindClick, h.click)
	m.RegisterFunc(KindOrder, h.order)
	m.RegisterFunc(KindEffects, h.effects)
	return m
}

type handlers struct {
	c   *client.Client
	cfg Config
}

func decode(job *queue.Job, v any) error {
	if err := json.Unmarshal(job.Payload, v); err != nil {
		return queue.Permanent(fmt.Errorf("job %s: payload: %w", job.ID, err))
	}
	return nil
}

// perform runs one effect of the job and turns the gateway's refusals into what the queue should do.
func (h *handlers) perform(ctx context.Context, job *queue.Job, name, typ string, payload any) error {
	_, err := h.c.ForJob(job.ID, job.Epoch).InQueue(h.cfg.Queue).CreatedAt(job.CreatedAt).Perform(ctx, name, typ, payload,
		&client.PerformOptions{Wait: h.cfg.Wait})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, client.ErrFenced):
		// Another worker holds the job now: stop; the queue refuses this worker's outcome anyway.
		return fmt.Errorf("%s: %w", name, err)
	case errors.Is(err, client.ErrKeyReused), errors.Is(err, client.ErrInvalid):
		return queue.Permanent(fmt.Errorf("%s: %w", name, err))
	default:
		return fmt.Errorf("%s: %w", name, err)
	}
}

func (h *handlers) rest(ctx context.Context) error {
	if h.cfg.Work <= 0 {
		return nil
	}
	select {
	case <-time.After(h.cfg.Work):
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (h *handlers) signup(ctx context.Context, job *queue.Job) error {
	var s Signup
	if err := decode(job, &s); err != nil {
		return err
	}
	if s.Email == "" {
		return queue.Permanent(fmt.Errorf("job %s: no email", job.ID))
	}
	err := h.perform(ctx, job, "welcome-email", h.cfg.EmailType, map[string]any{
		"to": []string{s.Email}, "subject": "Welcome", "text": "Hi " + s.User + ", welcome aboard.",
	})
	if err != nil {
		return err
	}
	return h.rest(ctx)
}

func (h *handlers) click(ctx context.Context, job *queue.Job) error {
	var c Click
	if err := decode(job, &c); err != nil {
		return err
	}
	if err := h.perform(ctx, job, "click-event", h.cfg.ClickType, map[string]any{
		"name": "click", "properties": map[string]string{"user": c.User, "link": c.Link},
	}); err != nil {
		return err
	}
	return h.rest(ctx)
}

func (h *handlers) order(ctx context.Context, job *queue.Job) error {
	var o Order
	if err := decode(job, &o); err != nil {
		return err
	}
	if err := h.perform(ctx, job, "order-webhook", h.cfg.OrderType, map[string]any{
		"event": "order.paid", "data": o,
	}); err != nil {
		return err
	}
	return h.rest(ctx)
}

func (h *handlers) effects(ctx context.Context, job *queue.Job) error {
	var e Effects
	if err := decode(job, &e); err != nil {
		return err
	}
	for i, eff := range e.Effects {
		if eff.Name == "" || eff.Type == "" {
			return queue.Permanent(fmt.Errorf("job %s: effect %d needs a name and a type", job.ID, i))
		}
		if err := h.perform(ctx, job, eff.Name, eff.Type, eff.Payload); err != nil {
			return err
		}
	}
	return h.rest(ctx)
}
