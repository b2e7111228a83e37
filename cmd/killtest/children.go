package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/smtp"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/queue"
)

// rest is the work a job does after its email: the window in which the kill lands.
const rest = 100 * time.Millisecond

func sendWelcome(addr string, s jobs.Signup) error {
	msg := fmt.Sprintf("From: noreply@acme.test\r\nTo: %s\r\nSubject: Welcome\r\n\r\nHi %s, welcome aboard.\r\n", s.Email, s.User)
	return smtp.SendMail(addr, nil, "noreply@acme.test", []string{s.Email}, []byte(msg))
}

// Child runs a child role of the demo ("memory" or "direct") and returns the exit code.
func Child(args []string) int {
	if len(args) < 1 {
		return 2
	}
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	addr := fs.String("smtp", "", "SMTP server")
	users := fs.Int("users", 0, "memory: jobs the process starts with")
	queueName := fs.String("queue", "", "direct: queue name")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	switch args[0] {
	case "memory":
		// The job list exists only in this process.
		var pending []jobs.Signup
		for i := 1; i <= *users; i++ {
			u := fmt.Sprintf("user_%d", i)
			pending = append(pending, jobs.Signup{User: u, Email: email(u)})
		}
		for len(pending) > 0 {
			if err := sendWelcome(*addr, pending[0]); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			time.Sleep(rest)
			pending = pending[1:]
		}
		return 0
	case "direct":
		rdb, err := queue.OpenRedis(os.Getenv("REDIS_URL"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		q, err := queue.New(rdb, *queueName, &queue.Options{Logger: quiet()})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		w, err := queue.NewWorker(q, queue.HandlerFunc(func(ctx context.Context, j *queue.Job) error {
			var s jobs.Signup
			if err := json.Unmarshal(j.Payload, &s); err != nil {
				return queue.Permanent(err)
			}
			if err := sendWelcome(*addr, s); err != nil {
				return err
			}
			time.Sleep(rest)
			return nil
		}), &queue.WorkerConfig{Concurrency: 1, Logger: quiet()})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		_ = w.Run(ctx)
		return 0
	}
	return 2
}
