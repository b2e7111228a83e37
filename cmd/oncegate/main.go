// Command oncegate is the operator's CLI over the gateway's database (DATABASE_URL) and the queues' Redis
// (REDIS_URL): `oncegate <noun> <verb>`, as `oncegate help` lists, every command in package cli's one table,
// the web console's (`oncegate console`) and its tokens' too. Everything it does is package admin's;
// docs/cli.md documents the commands, their JSON and their exit codes.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/admin/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	redis.SetLogger(cli.Quiet{})
	code := cli.Main(ctx, os.Args[1:], cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin, Getenv: os.Getenv,
		Terminal: cli.IsTerminal(os.Stderr)})
	stop()
	os.Exit(code)
}
