package client_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/client"
	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/smtptest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers/smtp"
	"github.com/oncegate/oncegate/queue"
)

type Signup struct {
	User  string `json:"user"`
	Email string `json:"email"`
}

// The README's handler: a job's welcome email goes through the gateway under a key derived from the job, so
// a job that runs twice sends one email. Here the first run fails after the email went out, as a worker
// killed at that moment would; the job runs again, and its effect is a replay.
func ExampleClient_ForJob() {
	ctx := context.Background()
	gatewayURL, apiKey, mail, stopGateway := startGateway()
	defer stopGateway()
	rdb, q := exampleQueue()
	defer rdb.Close()
	defer q.Destroy(ctx)

	gw, _ := client.New(gatewayURL, apiKey, nil)
	handler := queue.HandlerFunc(func(ctx context.Context, job *queue.Job) error {
		var s Signup
		json.Unmarshal(job.Payload, &s)
		// Key "welcome-email:<job id>": the same on every run of this job, so a re-run is a replay.
		effects := gw.ForJob(job.ID, job.Epoch).InQueue(q.Name()).CreatedAt(job.CreatedAt)
		e, err := effects.Perform(ctx, "welcome-email", "welcome-email", map[string]any{
			"to": []string{s.Email}, "subject": "Welcome", "text": "Hi " + s.User,
		}, nil)
		if err == nil {
			fmt.Printf("run %d: %s, replayed: %v\n", job.Epoch, e.Key, e.Replayed)
		}
		return err
	})

	runCtx, stop := context.WithCancel(ctx)
	w, _ := queue.NewWorker(q, queue.HandlerFunc(func(ctx context.Context, job *queue.Job) error {
		if err := handler.Handle(ctx, job); err != nil {
			return err
		}
		if job.Attempt == 1 {
			return queue.RetryAfter(0, errors.New("the worker died after the email"))
		}
		stop()
		return nil
	}), nil)
	_, _ = q.Enqueue(ctx, queue.NewJob{ID: "signup:user_6", Kind: "signup",
		Payload: []byte(`{"user":"user_6","email":"user_6@example.com"}`)})
	_ = w.Run(runCtx)

	e, err := gw.Get(ctx, "welcome-email:signup:user_6", 10*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("effect", e.Status+";", "emails received:", len(mail.Messages()))
	// Output:
	// run 1: welcome-email:signup:user_6, replayed: false
	// run 2: welcome-email:signup:user_6, replayed: true
	// effect delivered; emails received: 1
}

// exampleQueue returns a queue of the example's own on the tests' Redis (REDIS_URL).
func exampleQueue() (*redis.Client, *queue.Queue) {
	opts, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opts)
	q, err := queue.New(rdb, "example-"+rand.Text(), &queue.Options{Logger: discard})
	if err != nil {
		panic(err)
	}
	return rdb, q
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// startGateway runs a real gateway in this process, on a database of its own (dropped by stop) on the tests'
// Postgres (DATABASE_URL), with the effect type welcome-email sent to a real SMTP server on loopback.
func startGateway() (url, apiKey string, mail *smtptest.Server, stop func()) {
	ctx := context.Background()
	mail, err := smtptest.New("127.0.0.1:0")
	check(err)
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	check(err)
	defer admin.Close(ctx)
	db := pgx.Identifier{"og_example_" + strings.ToLower(rand.Text())}.Sanitize()
	_, err = admin.Exec(ctx, "CREATE DATABASE "+db)
	check(err)

	apiKey = "example-api-key-7e1c4a9b2d6f8e3a5c0b"
	cfg := &gateway.Config{
		DatabaseURL: pgtest.WithDatabase(pgtest.AdminURL(), strings.Trim(db, `"`)),
		Tenants:     map[string]gateway.Tenant{"acme": {APIKeys: []string{apiKey}}},
		EffectTypes: map[string]gateway.EffectType{"welcome-email": {Provider: "smtp",
			SMTP: &smtp.Config{Addr: mail.Addr, From: "Acme <noreply@acme.test>"}}},
	}
	g, err := gateway.New(cfg, gateway.Options{Logger: discard})
	check(err)
	check(g.Migrate(ctx))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	serveCtx, cancel := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { _ = g.Serve(serveCtx, l); close(served) }()
	return "http://" + l.Addr().String(), apiKey, mail, func() {
		cancel()
		<-served
		g.Close()
		_ = mail.Close()
		check(errors.Join(mail.Malformed()...)) // every message held to RFC 5322 and MIME
		c, err := pgx.Connect(ctx, pgtest.AdminURL())
		check(err)
		defer c.Close(ctx)
		_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		check(err)
	}
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
