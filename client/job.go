package client

import (
	"context"
	"fmt"
	"time"
)

// JobEffects performs the effects of one run of a queue job. Create one per handler run with Client.ForJob.
type JobEffects struct {
	c       *Client
	id      string
	epoch   int64
	queue   string
	created time.Time
}

// ForJob scopes effects to the run of the queue job id under lease epoch (a queue.Job's ID and Epoch): each
// effect's key is "<name>:<id>", the same on every run of the job, and each request carries the ID and epoch,
// so the gateway refuses new effects from a run whose lease was taken over.
func (c *Client) ForJob(id string, epoch int64) *JobEffects {
	return &JobEffects{c: c, id: id, epoch: epoch}
}

// InQueue names the job's queue, which the gateway stores with each effect (Oncegate-Job-Queue), so that an
// operator goes from an effect to its job without guessing the queue, and within which it fences the job: a
// job ID used by two queues is two jobs. It returns j.
func (j *JobEffects) InQueue(name string) *JobEffects {
	j.queue = name
	return j
}

// CreatedAt gives the time the job was enqueued (queue.Job.CreatedAt; Oncegate-Job-Created). The gateway
// fences a job by its creation, then its epoch: a job enqueued again under its ID (after the old one finished
// and was forgotten, its queue was destroyed, or Redis lost its record) starts its epochs again, and is
// refused for the old job's higher epochs unless the gateway can tell it is newer. It returns j.
func (j *JobEffects) CreatedAt(t time.Time) *JobEffects {
	j.created = t
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
	o.JobID, o.JobEpoch, o.JobQueue, o.JobCreated = j.id, j.epoch, j.queue, j.created
	key := j.Key(name)
	if err := checkKey(key); err != nil {
		// The key is made of the job's ID: say which part is at fault, rather than a byte of a key the
		// caller never wrote. The queue takes IDs (any UTF-8, up to 512 bytes) that no key can hold.
		for i := 0; i < len(j.id); i++ {
			if c := j.id[i]; c < 0x21 || c > 0x7e {
				return nil, &InvalidError{Field: "Oncegate-Job-Id", Reason: fmt.Sprintf("the job ID has byte %d "+
					"(0x%02x), and its effects' keys (<name>:<job id>) must be visible ASCII: give jobs whose "+
					"effects go through the gateway IDs of visible ASCII", i, c)}
			}
		}
		return nil, err
	}
	return j.c.Perform(ctx, key, typ, payload, &o)
}
