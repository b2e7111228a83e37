// Command crashdemo runs the seeds' sign-up experiment on the lease queue alone: 20 sign-ups, a worker process
// that sends each welcome "email" (a push to a Redis list standing in for the mail server) and is SIGKILLed
// right after the one for user_6, then a second worker process that takes over.
//
// It shows what the queue guarantees and what it cannot: every user is emailed (nothing is lost, and the crash
// is noticed within seconds), but user_6 is emailed twice, because the killed worker sent the email before it
// could complete the job. The oncegate gateway exists to remove that duplicate.
//
//	go run ./examples/crashdemo        (scripts/demo brings up Redis first)
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/queue"
)

const users = 20

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(worker(os.Args[2]))
	}
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "crashdemo:", err)
		os.Exit(1)
	}
}

func redisClient() (*redis.Client, error) {
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	return redis.NewClient(opts), nil
}

func sentKey(name string) string { return "{q:" + name + "}:demo-sent" }

// worker is the worker process: one job at a time, each "email" pushed to the list before the job completes.
func worker(name string) int {
	rdb, err := redisClient()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	q, err := queue.New(rdb, name, &queue.Options{Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	w, err := queue.NewWorker(q, queue.HandlerFunc(func(ctx context.Context, j *queue.Job) error {
		user := strings.TrimPrefix(j.ID, "welcome-email:")
		if err := rdb.RPush(ctx, sentKey(name), user).Err(); err != nil {
			return err
		}
		fmt.Printf("sent %s epoch=%d\n", user, j.Epoch)
		time.Sleep(100 * time.Millisecond) // the rest of the job, after the email went out
		return nil
	}), &queue.WorkerConfig{Concurrency: 1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func startWorker(name string, lines chan<- string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "worker", name)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func(r io.Reader) {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}(out)
	return cmd, nil
}

func run() error {
	ctx := context.Background()
	rdb, err := redisClient()
	if err != nil {
		return err
	}
	name := fmt.Sprintf("crashdemo-%d", time.Now().UnixNano())
	q, err := queue.New(rdb, name, nil)
	if err != nil {
		return err
	}
	defer func() {
		_ = q.Destroy(ctx)
		_ = rdb.Del(ctx, sentKey(name)).Err()
	}()
	for i := 1; i <= users; i++ {
		if _, err := q.Enqueue(ctx, queue.NewJob{ID: fmt.Sprintf("welcome-email:user_%d", i), Kind: "signup"}); err != nil {
			return err
		}
	}
	fmt.Printf("enqueued %d sign-ups on queue %s\n", users, name)

	lines := make(chan string, 100)
	first, err := startWorker(name, lines)
	if err != nil {
		return err
	}
	var killedAt time.Time
	for killedAt.IsZero() {
		select {
		case l := <-lines:
			fmt.Println("worker 1:", l)
			if strings.HasPrefix(l, "sent user_6 ") {
				_ = first.Process.Signal(syscall.SIGKILL)
				_ = first.Wait()
				killedAt = time.Now()
				fmt.Println("worker 1: SIGKILLed right after the email for user_6 went out, before its job completed")
			}
		case <-time.After(30 * time.Second):
			return fmt.Errorf("worker 1 sent nothing for 30s")
		}
	}
	second, err := startWorker(name, lines)
	if err != nil {
		return err
	}
	defer func() { _ = second.Process.Signal(syscall.SIGTERM); _ = second.Wait() }()

	var recovered time.Duration
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l := <-lines:
			if strings.HasPrefix(l, "sent user_6 ") {
				recovered = time.Since(killedAt)
			}
			fmt.Println("worker 2:", l)
			continue
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			return fmt.Errorf("jobs still unfinished 60s after the kill")
		}
		s, err := q.Stats(ctx)
		if err != nil {
			return err
		}
		if s.Counts[queue.StateCompleted] == users {
			break
		}
	}

	sent, err := rdb.LRange(ctx, sentKey(name), 0, -1).Result()
	if err != nil {
		return err
	}
	count := map[string]int{}
	for _, u := range sent {
		count[u]++
	}
	dups := 0
	var twice []string
	for u, n := range count {
		if n > 1 {
			dups += n - 1
			twice = append(twice, u)
		}
	}
	fmt.Printf("\nuser_6's job ran again %.1fs after the kill (liveness TTL %v + sweep every %v)\n\n",
		recovered.Seconds(), queue.DefaultLivenessTTL, queue.DefaultSweepInterval)
	fmt.Println("| strategy                                   | users emailed | users never emailed | duplicate emails |")
	fmt.Println("|--------------------------------------------|---------------|---------------------|------------------|")
	fmt.Printf("| lease queue, worker sends the email itself | %13d | %19d | %16d |\n", len(count), users-len(count), dups)
	fmt.Printf("\nemailed twice: %v: the worker died after sending and before completing, so the job ran again.\n", twice)
	fmt.Println("Nothing was lost; the duplicate is what the oncegate gateway removes.")
	return nil
}
