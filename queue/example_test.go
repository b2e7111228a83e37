package queue_test

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
)

// exampleRedis connects to the Redis the tests use (REDIS_URL).
func exampleRedis() *redis.Client {
	opts, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		panic(err)
	}
	return redis.NewClient(opts)
}

// The README's lease queue: enqueue a job, run a worker that performs it, close the worker gracefully.
func Example() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	// A queue name of the example's own, as tests share the Redis.
	q, _ := queue.New(rdb, "emails-"+rand.Text(), nil)
	defer q.Destroy(ctx)

	payload := []byte(`{"user":"user_6","email":"user_6@example.com"}`)
	res, _ := q.Enqueue(ctx, queue.NewJob{ID: "welcome-email:user_6", Kind: "signup", Payload: payload})
	fmt.Println("enqueued", res.Job.ID, "as", res.Job.State)
	// The job ID names the business action: enqueueing it again adds nothing.
	res, _ = q.Enqueue(ctx, queue.NewJob{ID: "welcome-email:user_6", Kind: "signup", Payload: payload})
	fmt.Println("enqueued again: duplicate =", res.Duplicate)

	runCtx, stop := context.WithCancel(ctx)
	w, _ := queue.NewWorker(q, queue.HandlerFunc(func(ctx context.Context, job *queue.Job) error {
		// job.ID and job.Epoch name this run, for idempotency keys and fencing.
		fmt.Printf("run %s, epoch %d, attempt %d: %s\n", job.ID, job.Epoch, job.Attempt, job.Payload)
		stop() // one job is enough here: a graceful close lets this run finish and complete
		return nil
	}), &queue.WorkerConfig{Concurrency: 50})
	if err := w.Run(runCtx); err != nil { // until runCtx ends, then a graceful close
		fmt.Println(err)
	}

	j, _ := q.Job(ctx, "welcome-email:user_6")
	fmt.Println("after the close:", j.State)
	// Output:
	// enqueued welcome-email:user_6 as ready
	// enqueued again: duplicate = true
	// run welcome-email:user_6, epoch 1, attempt 1: {"user":"user_6","email":"user_6@example.com"}
	// after the close: completed
}

// A handler says what should happen next through what it returns: nil completes the job, an error retries
// it after a backoff, queue.RetryAfter chooses the delay, and queue.Permanent buries it at once.
func ExampleRetryAfter() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, _ := queue.New(rdb, "limited-"+rand.Text(), nil)
	defer q.Destroy(ctx)
	_, _ = q.Enqueue(ctx, queue.NewJob{ID: "sync:acct_9"})

	runCtx, stop := context.WithCancel(ctx)
	w, _ := queue.NewWorker(q, queue.HandlerFunc(func(ctx context.Context, job *queue.Job) error {
		fmt.Printf("attempt %d (last error: %q)\n", job.Attempt, job.LastError)
		if job.Attempt == 1 {
			return queue.RetryAfter(0, fmt.Errorf("rate limited"))
		}
		stop()
		return nil
	}), nil)
	_ = w.Run(runCtx)

	j, _ := q.Job(ctx, "sync:acct_9")
	fmt.Println(j.State, "after", j.Failures, "failure")
	// Output:
	// attempt 1 (last error: "")
	// attempt 2 (last error: "retry after 0s: rate limited")
	// completed after 1 failure
}
