package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/queue"
)

// Queue is a queue with its counts, as `queue ls` shows it.
type Queue struct {
	Name string `json:"name"`
	// Counts per state: ready, delayed, active, completed, dead.
	Counts map[queue.JobState]int64 `json:"counts"`
	// OldestReadySeconds is how long the oldest ready job has waited, by Redis's clock.
	OldestReadySeconds float64 `json:"oldest_ready_seconds"`
	Workers            int64   `json:"workers"`
	Paused             bool    `json:"paused"`
	PausedReason       string  `json:"paused_reason,omitempty"`
}

func (s *Service) queue(name string) (*queue.Queue, error) {
	if err := s.needRedis(); err != nil {
		return nil, err
	}
	q, err := queue.New(s.rdb, name, &queue.Options{Registry: s.cfg.QueueRegistry})
	if err != nil {
		return nil, &InvalidError{Field: "queue", Reason: err.Error()}
	}
	return q, nil
}

// known reports whether name is in the registry, so that a typo is "not found", not an empty queue.
func (s *Service) known(ctx context.Context, name string) (*queue.Queue, error) {
	q, err := s.queue(name)
	if err != nil {
		return nil, err
	}
	names, err := queue.Queues(ctx, s.rdb, s.cfg.QueueRegistry)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	for _, n := range names {
		if n == name {
			return q, nil
		}
	}
	return nil, &NotFoundError{What: fmt.Sprintf("queue %q (not in the registry: no job was ever enqueued to it "+
		"and no worker started on it)", name)}
}

// Queues lists every registered queue with its counts per state, oldest ready age, live workers and pause.
// Each queue costs a few O(1) Redis commands; queues are read in parallel, eight at a time.
func (s *Service) Queues(ctx context.Context, a Actor) ([]Queue, error) {
	if err := s.allow(ctx, a, "queue.list", RoleViewer, ""); err != nil {
		return nil, err
	}
	if err := s.needRedis(); err != nil {
		return nil, err
	}
	names, err := queue.Queues(ctx, s.rdb, s.cfg.QueueRegistry)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	out := make([]Queue, len(names))
	errs := make([]error, len(names))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = s.queueSummary(ctx, name)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Service) queueSummary(ctx context.Context, name string) (Queue, error) {
	q, err := s.queue(name)
	if err != nil {
		return Queue{}, err
	}
	st, err := q.Stats(ctx)
	if err != nil {
		return Queue{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	paused, reason, err := q.Paused(ctx)
	if err != nil {
		return Queue{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return Queue{Name: name, Counts: st.Counts, OldestReadySeconds: st.OldestReady.Seconds(), Workers: st.Workers,
		Paused: paused, PausedReason: reason}, nil
}

// PauseQueue stops the queue's workers from leasing until ResumeQueue; running jobs finish.
func (s *Service) PauseQueue(ctx context.Context, a Actor, name, reason string) error {
	if err := s.prepareChange(ctx, a, "queue.pause", name, reason); err != nil {
		return err
	}
	q, err := s.known(ctx, name)
	if err != nil {
		return err
	}
	if err := s.needDBUp(ctx); err != nil {
		return err
	}
	paused, err := q.PauseOnce(ctx, fmt.Sprintf("%s by %s: %s", time.Now().UTC().Format(time.RFC3339), a.Name, reason))
	if err == nil && !paused {
		// As for a paused type: the first pause's reason and time stay, and saying it again is a slip.
		err = &StateError{Msg: fmt.Sprintf("queue %q is paused already", name)}
	}
	return s.auditAfter(ctx, a, Audit{Action: "queue.pause", Target: name, Count: 1, Reason: reason}, err)
}

// ResumeQueue lets the queue's workers lease again. Resuming a queue that is not paused is a wrong state.
func (s *Service) ResumeQueue(ctx context.Context, a Actor, name, reason string) error {
	if err := s.prepareChange(ctx, a, "queue.resume", name, reason); err != nil {
		return err
	}
	q, err := s.known(ctx, name)
	if err != nil {
		return err
	}
	if err := s.needDBUp(ctx); err != nil {
		return err
	}
	was, err := q.Resume(ctx)
	if err == nil && !was {
		err = &StateError{Msg: fmt.Sprintf("queue %q is not paused", name)}
	}
	return s.auditAfter(ctx, a, Audit{Action: "queue.resume", Target: name, Count: 1, Reason: reason}, err)
}

// Job is a queue job as an operator sees it.
type Job struct {
	ID    string         `json:"id"`
	Kind  string         `json:"kind"`
	State queue.JobState `json:"state"`
	Epoch int64          `json:"epoch"`
	// Runs counts its leases from 1 (queue.Job.Runs); the epoch is the fencing token, which starts above the
	// queue's finished jobs' epochs and so does not count runs.
	Runs        int               `json:"runs"`
	Attempt     int               `json:"attempt"`
	Failures    int               `json:"failures"`
	Stalls      int               `json:"stalls"`
	MaxAttempts int               `json:"max_attempts"`
	MaxStalls   int               `json:"max_stalls"`
	CreatedAt   *time.Time        `json:"created_at"`
	ReadyAt     *time.Time        `json:"ready_at"`
	RunAt       *time.Time        `json:"run_at"`
	LeasedAt    *time.Time        `json:"leased_at"`
	FinishedAt  *time.Time        `json:"finished_at"`
	Owner       string            `json:"owner"`
	LastError   string            `json:"last_error"`
	LastStall   string            `json:"last_stall"`
	DeadReason  string            `json:"dead_reason"`
	Trace       map[string]string `json:"trace"`
}

func toJob(j *queue.Job) Job {
	t := func(v time.Time) *time.Time {
		if v.IsZero() {
			return nil
		}
		return &v
	}
	return Job{ID: j.ID, Kind: j.Kind, State: j.State, Epoch: j.Epoch, Runs: j.Runs, Attempt: j.Attempt, Failures: j.Failures,
		Stalls: j.Stalls, MaxAttempts: j.MaxAttempts, MaxStalls: j.MaxStalls, CreatedAt: t(j.CreatedAt),
		ReadyAt: t(j.ReadyAt), RunAt: t(j.RunAt), LeasedAt: t(j.LeasedAt), FinishedAt: t(j.FinishedAt),
		Owner: j.Owner, LastError: j.LastError, LastStall: j.LastStall, DeadReason: j.DeadReason,
		Trace: j.TraceContext}
}

// JobPage is a page of a queue's jobs in one state.
type JobPage struct {
	Jobs       []Job  `json:"jobs"`
	NextCursor string `json:"next_cursor"`
}

func parseState(state string) (queue.JobState, error) {
	for _, s := range queue.JobStates() {
		if string(s) == state {
			return s, nil
		}
	}
	return "", &InvalidError{Field: "state", Reason: fmt.Sprintf("%q: want ready, delayed, active, completed or dead", state)}
}

// Jobs lists a page of a queue's jobs in state (see queue.Queue.Jobs for the order).
func (s *Service) Jobs(ctx context.Context, a Actor, name, state string, p Page) (*JobPage, error) {
	if err := s.allow(ctx, a, "job.list", RoleViewer, name); err != nil {
		return nil, err
	}
	st, err := parseState(state)
	if err != nil {
		return nil, err
	}
	limit, err := p.limit()
	if err != nil {
		return nil, err
	}
	off, err := decodeOffsetCursor(p.Cursor)
	if err != nil {
		return nil, err
	}
	q, err := s.known(ctx, name)
	if err != nil {
		return nil, err
	}
	jobs, err := q.Jobs(ctx, st, off, limit+1)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	page := &JobPage{Jobs: make([]Job, 0, len(jobs))}
	for _, j := range jobs {
		page.Jobs = append(page.Jobs, toJob(j))
	}
	if len(page.Jobs) > limit {
		page.Jobs = page.Jobs[:limit]
		page.NextCursor = encodeOffsetCursor(off + limit)
	}
	return page, nil
}

// JobDetail is a job with its lease and the effects it made.
type JobDetail struct {
	Job
	Queue         string     `json:"queue"`
	LeaseDeadline *time.Time `json:"lease_deadline"`
	// Payload is redacted to its shape (Redact) unless Revealed (RevealJob).
	Payload  string `json:"payload"`
	Revealed bool   `json:"revealed"`
	// Effects are the effects the gateway recorded for this job ID (Oncegate-Job-Id), oldest first, at most
	// 100; nil when the service has no database.
	Effects []*Effect `json:"effects"`
}

// Job returns a job with its lease deadline and the effects it made, its payload redacted to its shape
// (Redact); RevealJob shows it.
func (s *Service) Job(ctx context.Context, a Actor, name, id string) (*JobDetail, error) {
	if err := s.allow(ctx, a, "job.show", RoleViewer, name+"/"+id); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, &InvalidError{Field: "ID", Reason: "empty: name the job"}
	}
	d, err := s.job(ctx, name, id)
	if err != nil {
		return nil, err
	}
	d.Payload = string(Redact([]byte(d.Payload)))
	return d, nil
}

// RevealJob is Job with the payload as stored, for an operator; the reveal is audited (job.reveal), as an
// effect's is.
func (s *Service) RevealJob(ctx context.Context, a Actor, name, id string) (*JobDetail, error) {
	if err := s.allow(ctx, a, "job.reveal", RoleOperator, name+"/"+id); err != nil {
		return nil, err
	}
	if err := s.needDB(); err != nil {
		return nil, err
	}
	d, err := s.job(ctx, name, id)
	if err != nil {
		return nil, err
	}
	if _, err := s.audit(ctx, s.db, a, Audit{Action: "job.reveal", Target: name + "/" + id, Count: 1}); err != nil {
		return nil, err
	}
	d.Revealed = true
	return d, nil
}

// job reads a job whole, its payload as stored.
func (s *Service) job(ctx context.Context, name, id string) (*JobDetail, error) {
	q, err := s.known(ctx, name)
	if err != nil {
		return nil, err
	}
	j, err := q.Job(ctx, id)
	if errors.Is(err, queue.ErrNotFound) {
		return nil, &NotFoundError{What: fmt.Sprintf("job %q in queue %q", id, name)}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	d := &JobDetail{Job: toJob(j), Queue: name, Payload: string(j.Payload)}
	if j.State == queue.StateActive {
		dl, err := q.LeaseDeadline(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		if !dl.IsZero() {
			d.LeaseDeadline = &dl
		}
	}
	if s.db != nil {
		rows, err := s.db.Query(ctx, jobEffectsSQL, id, 100)
		if err != nil {
			return nil, dbError("read the job's effects", err)
		}
		d.Effects, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Effect, error) { return scanEffect(r) })
		if err != nil {
			return nil, dbError("read the job's effects", err)
		}
		if d.Effects == nil {
			d.Effects = []*Effect{}
		}
	}
	return d, nil
}

// RequeueDead sends dead jobs back to ready. It returns how many were dead and went back; ids that were not
// dead make it a partial result (*BulkError).
func (s *Service) RequeueDead(ctx context.Context, a Actor, name string, ids []string, reason string) (BulkResult, error) {
	return s.deadAction(ctx, a, "dead.requeue", RoleOperator, name, ids, reason, (*queue.Queue).RequeueDead)
}

// PurgeDead deletes dead jobs for good (admin role).
func (s *Service) PurgeDead(ctx context.Context, a Actor, name string, ids []string, reason string) (BulkResult, error) {
	return s.deadAction(ctx, a, "dead.purge", RoleAdmin, name, ids, reason, (*queue.Queue).PurgeDead)
}

func (s *Service) deadAction(ctx context.Context, a Actor, action string, needs Role, name string, ids []string,
	reason string, do func(*queue.Queue, context.Context, ...string) (int, error)) (BulkResult, error) {
	// A set of IDs, sorted for the audit: an ID named twice is one job (counted twice, it made a full requeue
	// read as partial, exit 5 and 207).
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	res := BulkResult{Matched: int64(len(ids))}
	named := mustJSON(map[string][]string{"ids": ids})
	if err := s.allowAudited(ctx, a, needs, Audit{Action: action, Target: name, Filter: named, Reason: reason}); err != nil {
		return res, err
	}
	if err := requireReason(reason); err != nil {
		return res, err
	}
	if err := s.needDB(); err != nil {
		return res, err
	}
	if len(ids) == 0 {
		return res, &InvalidError{Field: "ID", Reason: "name at least one dead job"}
	}
	if ids[0] == "" { // sorted: an empty ID comes first
		return res, &InvalidError{Field: "ID", Reason: "an empty ID names no job"}
	}
	q, err := s.known(ctx, name)
	if err != nil {
		return res, err
	}
	if err := s.needDBUp(ctx); err != nil {
		return res, err
	}
	n, err := do(q, ctx, ids...)
	res.Applied, res.Batches = int64(n), 1
	if err == nil && n == 0 {
		err = &StateError{Msg: fmt.Sprintf("none of the %d jobs named is dead in queue %q", len(ids), name)}
	}
	if aerr := s.auditAfter(ctx, a, Audit{Action: action, Target: name, Count: int64(n), Filter: named,
		Reason: reason}, err); aerr != nil {
		return res, aerr
	}
	if n < len(ids) {
		return res, &BulkError{Result: res}
	}
	return res, nil
}

// DeadJobs lists a page of a queue's dead jobs, most recently dead first.
func (s *Service) DeadJobs(ctx context.Context, a Actor, name string, p Page) (*JobPage, error) {
	return s.Jobs(ctx, a, name, string(queue.StateDead), p)
}

// Worker is a worker process of a queue.
type Worker struct {
	ID        string    `json:"id"`
	Alive     bool      `json:"alive"`
	SeenUntil time.Time `json:"seen_until"`
	Jobs      []string  `json:"jobs"`
}

// Workers lists a queue's worker processes and the jobs each holds.
func (s *Service) Workers(ctx context.Context, a Actor, name string) ([]Worker, error) {
	if err := s.allow(ctx, a, "worker.list", RoleViewer, name); err != nil {
		return nil, err
	}
	q, err := s.known(ctx, name)
	if err != nil {
		return nil, err
	}
	ws, err := q.Workers(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	out := make([]Worker, 0, len(ws))
	for _, w := range ws {
		out = append(out, Worker{ID: w.ID, Alive: w.Alive, SeenUntil: w.SeenUntil, Jobs: w.Jobs})
	}
	return out, nil
}
