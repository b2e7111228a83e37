package notifier

import (
	"context"
	"crypto/rand"
	"fmt"
)

// Check proves that notifications reach this notifier: it sends one on TopicSelfCheck through db (the pool the
// gateways send theirs through) and waits for it to arrive. It fails when no LISTEN connection runs, or when
// the notification has not arrived by the time ctx ends: behind PgBouncer in transaction pooling mode a
// LISTEN lands on a pooled server connection, and every notification is then lost without an error anywhere.
// Checks run alongside the other subscribers; each knows its own notification by a random token.
func (n *Notifier) Check(ctx context.Context, db Execer) error {
	n.mu.Lock()
	up := n.up
	n.mu.Unlock()
	select {
	case <-up:
	case <-ctx.Done():
		return fmt.Errorf("notifier: no LISTEN connection (%w)", ctx.Err())
	}
	token := rand.Text()
	arrived := make(chan struct{})
	n.mu.Lock()
	n.checks[token] = arrived
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.checks, token)
		n.mu.Unlock()
	}()
	if err := Send(ctx, db, TopicSelfCheck, token); err != nil {
		return err
	}
	select {
	case <-arrived:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("notifier: a notification sent through the pool did not arrive on the LISTEN connection (%w)", ctx.Err())
	}
}

// checked is the notifier's own subscriber of TopicSelfCheck: it tells the Check that sent the token.
func (n *Notifier) checked(nt Notification) {
	if nt.Resync {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if ch, ok := n.checks[nt.Payload]; ok {
		close(ch)
		delete(n.checks, nt.Payload)
	}
}
