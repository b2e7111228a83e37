package gateway

import (
	"sync"

	"github.com/oncegate/oncegate/internal/notifier"
)

// waiters are requests waiting for effects to become terminal.
type waiters struct {
	mu sync.Mutex
	m  map[int64][]chan struct{}
}

func newWaiters() *waiters { return &waiters{m: map[int64][]chan struct{}{}} }

// notified wakes the waiters of the effects another gateway finished (notifier.TopicEffectDone), or every
// waiter after the notifier reconnected, since the notifications sent meanwhile are lost.
func (w *waiters) notified(n notifier.Notification) {
	if n.Resync {
		w.wakeAll()
		return
	}
	for _, id := range notifier.SplitIDs(n.Payload) {
		w.wake(id)
	}
}

// add returns a channel closed when effect id may have changed, and a function that forgets it.
func (w *waiters) add(id int64) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	w.m[id] = append(w.m[id], ch)
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.m[id]
		for i, c := range list {
			if c == ch {
				w.m[id] = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(w.m[id]) == 0 {
			delete(w.m, id)
		}
	}
}

func (w *waiters) wake(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[id] {
		close(ch)
	}
	delete(w.m, id)
}

func (w *waiters) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, list := range w.m {
		for _, ch := range list {
			close(ch)
		}
		delete(w.m, id)
	}
}
