// Command oncegate is the operator's CLI over the gateway's database (DATABASE_URL) and the queues' Redis
// (REDIS_URL): `oncegate <noun> <verb>`, as `oncegate help` lists. Everything it does is package admin's;
// docs/cli.md documents the commands, their JSON and their exit codes.
package main

import (
	"context"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/admin/cli"
	"github.com/oncegate/oncegate/console"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	if len(os.Args) > 1 && slices.Contains(console.Commands, os.Args[1]) { // the web console and its tokens
		code := console.Main(ctx, os.Args[1:], console.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv})
		stop()
		os.Exit(code)
	}
	redis.SetLogger(cli.Quiet{})
	code := cli.Main(ctx, os.Args[1:], cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
		Terminal: cli.IsTerminal(os.Stderr)})
	stop()
	os.Exit(code)
}
