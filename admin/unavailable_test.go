package admin_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/effect"
)

// A database that stops answering, is not there, or holds a lock the call needs: the call ends within the
// service's bounds with ErrUnavailable (the CLI's error, the console's 503), never a hang or a 500.
func TestADatabaseThatDoesNotAnswerIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Accepts connections and never says a word.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	t.Cleanup(func() {
		_ = silent.Close()
		for {
			select {
			case c := <-accepted:
				_ = c.Close()
			default:
				return
			}
		}
	})
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- c:
			default:
				_ = c.Close()
			}
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	_ = closed.Close()
	for name, addr := range map[string]string{"silent": silent.Addr().String(), "closed": closedAddr} {
		pool, err := admin.Connect(ctx, "postgres://postgres@"+addr+"/x")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = admin.New(admin.Config{DB: pool}).Effects(ctx, viv, admin.EffectFilter{}, admin.Page{})
		pool.Close()
		if !errors.Is(err, admin.ErrUnavailable) || time.Since(start) > admin.ConnectTimeout+5*time.Second {
			t.Errorf("%s: after %s: %v, want ErrUnavailable within the connect timeout", name, time.Since(start), err)
		}
	}

	svc, pool := newService(t)
	seed(t, pool, "k", 1, effect.StatusDead)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE oncegate_effects IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = svc.Effects(ctx, viv, admin.EffectFilter{}, admin.Page{})
	if !errors.Is(err, admin.ErrUnavailable) || !strings.Contains(err.Error(), "locked") ||
		time.Since(start) > admin.LockTimeout+5*time.Second {
		t.Fatalf("behind a lock, after %s: %v", time.Since(start), err)
	}
}
