package queue

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrLeaseLost is returned when a worker acts on a job whose lease it no longer holds: the lease expired,
	// its process was declared lost, or another worker leased the job since. Nothing was changed. It is also
	// the cause of a handler's context when a heartbeat finds the lease gone.
	ErrLeaseLost = errors.New("queue: lease lost")

	// ErrNotFound is returned for a job ID that the queue does not hold.
	ErrNotFound = errors.New("queue: job not found")
)

// PermanentError marks a handler's error as one that retrying will not fix: the job goes straight to dead.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the job is not retried.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &PermanentError{Err: err}
}

// RetryAfterError asks for the next attempt after Delay instead of the backoff policy's delay. The attempt
// still counts against MaxAttempts.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string { return fmt.Sprintf("retry after %v: %v", e.Delay, e.Err) }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter wraps err so that the job is retried after d.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry requested")
	}
	return &RetryAfterError{Delay: d, Err: err}
}
