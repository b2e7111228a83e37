package client

import (
	"context"

	"github.com/oncegate/oncegate/queue"
)

// JobEffects performs the effects of one queue job. Create one per handler run with Client.ForJob.
type JobEffects struct {
	c   *Client
	job *queue.Job
}

// ForJob scopes effects to job: each effect's key is "<name>:<job ID>", the same on every run of the job, and
// each request carries the job's ID and lease epoch for fencing.
func (c *Client) ForJob(job *queue.Job) *JobEffects { return &JobEffects{c: c, job: job} }

// Key returns the idempotency key of the job's effect called name.
func (j *JobEffects) Key(name string) string { return name + ":" + j.job.ID }

// Perform performs the job's effect called name ("welcome-email") with the effect type typ. Build payload
// from the job's data alone (no clock, no random): a re-run must send the same payload.
func (j *JobEffects) Perform(ctx context.Context, name, typ string, payload any, opts *PerformOptions) (*Effect, error) {
	var o PerformOptions
	if opts != nil {
		o = *opts
	}
	o.JobID, o.JobEpoch = j.job.ID, j.job.Epoch
	return j.c.Perform(ctx, j.Key(name), typ, payload, &o)
}
