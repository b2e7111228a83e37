package client

import "context"

// JobEffects performs the effects of one run of a queue job. Create one per handler run with Client.ForJob.
type JobEffects struct {
	c     *Client
	id    string
	epoch int64
	queue string
}

// ForJob scopes effects to the run of the queue job id under lease epoch (a queue.Job's ID and Epoch): each
// effect's key is "<name>:<id>", the same on every run of the job, and each request carries the ID and epoch,
// so the gateway refuses new effects from a run whose lease was taken over.
func (c *Client) ForJob(id string, epoch int64) *JobEffects {
	return &JobEffects{c: c, id: id, epoch: epoch}
}

// InQueue names the job's queue, which the gateway stores with each effect (Oncegate-Job-Queue), so that an
// operator goes from an effect to its job without guessing the queue. It returns j.
func (j *JobEffects) InQueue(name string) *JobEffects {
	j.queue = name
	return j
}

// Key returns the idempotency key of the job's effect called name.
func (j *JobEffects) Key(name string) string { return name + ":" + j.id }

// Perform performs the job's effect called name ("welcome-email") with the effect type typ. Build payload
// from the job's data alone (no clock, no random): a re-run must send the same payload.
func (j *JobEffects) Perform(ctx context.Context, name, typ string, payload any, opts *PerformOptions) (*Effect, error) {
	var o PerformOptions
	if opts != nil {
		o = *opts
	}
	o.JobID, o.JobEpoch, o.JobQueue = j.id, j.epoch, j.queue
	return j.c.Perform(ctx, j.Key(name), typ, payload, &o)
}
