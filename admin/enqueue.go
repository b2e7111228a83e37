package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncegate/oncegate/queue"
)

// MaxJobPayload bounds the payload of a job an operator enqueues by hand: a test job or a replay, typed or
// pasted, not a bulk load. Producers that need more use the queue package, which takes up to queue.MaxPayload.
const MaxJobPayload = 1 << 20

// NewJob is a job an operator enqueues (`oncegate job enqueue`, the console's queue page).
type NewJob struct {
	// ID names the job; empty means a random one. A job with this ID that exists, or completed within the
	// queue's dedup window, makes the enqueue a duplicate that adds nothing, as for any producer.
	ID   string `json:"id,omitempty"`
	Kind string `json:"kind"`
	// Payload is the handler's input, JSON as the reference worker reads it.
	Payload json.RawMessage `json:"payload"`
	// Delay makes the job ready only after this long.
	Delay time.Duration `json:"-"`
	// MaxAttempts overrides the queue's default when positive.
	MaxAttempts int `json:"max_attempts,omitempty"`
}

// Enqueued is what an operator's enqueue did.
type Enqueued struct {
	Queue     string         `json:"queue"`
	ID        string         `json:"id"`
	Kind      string         `json:"kind"`
	State     queue.JobState `json:"state"`
	Duplicate bool           `json:"duplicate"`
}

// EnqueueJob adds a job to a queue that a producer or a worker has used (a misspelt name is not found rather
// than a new queue nobody works on), audited as job.enqueue with the job's ID and kind. The audit entry is
// written after the job is in Redis, as for every change made there; with the database down nothing is
// enqueued. A duplicate is not an error: its result says so, with the state of the job that holds the ID.
func (s *Service) EnqueueJob(ctx context.Context, a Actor, name string, nj NewJob, reason string) (*Enqueued, error) {
	e := Audit{Action: "job.enqueue", Target: name, Reason: reason,
		Filter: mustJSON(map[string]string{"id": nj.ID, "kind": nj.Kind})}
	if err := s.prepareAudited(ctx, a, e); err != nil {
		return nil, err
	}
	if err := checkNewJob(nj); err != nil {
		return nil, err
	}
	q, err := s.known(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := s.needDBUp(ctx); err != nil {
		return nil, err
	}
	res, err := q.Enqueue(ctx, queue.NewJob{ID: nj.ID, Kind: nj.Kind, Payload: nj.Payload, Delay: nj.Delay,
		MaxAttempts: nj.MaxAttempts})
	if err != nil {
		err = fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	var out *Enqueued
	if res != nil {
		out = &Enqueued{Queue: name, ID: res.Job.ID, Kind: res.Job.Kind, State: res.Job.State, Duplicate: res.Duplicate}
		// The entry names the job enqueued, the random ID included, and whether it was a duplicate.
		e.Filter = mustJSON(map[string]any{"id": out.ID, "kind": nj.Kind, "duplicate": out.Duplicate})
		if !res.Duplicate {
			e.Count = 1
		}
	}
	if aerr := s.auditAfter(ctx, a, e, err); aerr != nil {
		return out, aerr
	}
	return out, nil
}

func checkNewJob(nj NewJob) error {
	if strings.TrimSpace(nj.Kind) == "" {
		return &InvalidError{Field: "kind", Reason: "required: the handler's kind, as the worker registers it"}
	}
	if err := checkTexts("kind", nj.Kind, "id", nj.ID); err != nil {
		return err
	}
	if len(nj.ID) > 512 {
		return &InvalidError{Field: "id", Reason: fmt.Sprintf("%d bytes, at most 512", len(nj.ID))}
	}
	switch {
	case len(nj.Payload) == 0:
		return &InvalidError{Field: "payload", Reason: "required: the job's input as JSON ({} for none)"}
	case len(nj.Payload) > MaxJobPayload:
		return &InvalidError{Field: "payload", Reason: fmt.Sprintf("%d bytes, over the %d an operator may enqueue",
			len(nj.Payload), MaxJobPayload)}
	case !utf8.Valid(nj.Payload) || !json.Valid(nj.Payload):
		var v any
		err := json.NewDecoder(bytes.NewReader(nj.Payload)).Decode(&v)
		return &InvalidError{Field: "payload", Reason: fmt.Sprintf("not JSON: %v", err)}
	}
	if nj.Delay < 0 {
		return &InvalidError{Field: "delay", Reason: "negative"}
	}
	if nj.MaxAttempts < 0 {
		return &InvalidError{Field: "max_attempts", Reason: "negative"}
	}
	return nil
}
