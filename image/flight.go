package image

import (
	"context"
	"sync"
)

// flights runs one call per key at a time; callers that come while it runs
// wait for it and share its result. The call runs under a context of its
// own that ends only when every caller waiting for it has gone, so one
// client giving up does not fail the pull that others wait for.
type flights struct {
	mu    sync.Mutex
	calls map[string]*flight
}

type flight struct {
	done    chan struct{}
	err     error
	waiters int
	cancel  context.CancelFunc
}

// do runs fn for key, or waits for the run in progress. It returns fn's
// error, or ctx's when ctx ends first (the last waiter to go returns once
// fn has returned).
func (f *flights) do(ctx context.Context, key string, fn func(context.Context) error) error {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[string]*flight{}
	}
	c, ok := f.calls[key]
	if !ok {
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c = &flight{done: make(chan struct{}), cancel: cancel}
		f.calls[key] = c
		go func() {
			defer cancel()
			c.err = fn(cctx)
			f.mu.Lock()
			delete(f.calls, key)
			f.mu.Unlock()
			close(c.done)
		}()
	}
	c.waiters++
	f.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		f.mu.Lock()
		c.waiters--
		last := c.waiters == 0
		if last {
			c.cancel()
		}
		f.mu.Unlock()
		if last {
			// The call ends with its last waiter: wait for it to clean up,
			// so that what returns leaves nothing half-made behind.
			<-c.done
		}
		return ctx.Err()
	}
}
