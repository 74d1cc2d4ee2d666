package sandbox

import (
	"context"
	"slices"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// Bounds on what a sandbox's guest can make the daemon do through its exits
// stream: a sandbox may start and end processes in a loop, and its guest
// may send anything. Past the rate the daemon reads the stream more slowly
// (the guest keeps guestapi.MaxExitsKept and drops the oldest); nothing it
// sends blocks anything but its own follower.
const (
	exitsRate    = 200  // exits handled per second, sustained
	exitsBurst   = 1000 // and at once
	exitsBackoff = 10 * time.Second
)

// followExits starts, for a live sandbox whose guest has the exits stream,
// the goroutine that publishes each background process's exit as it
// happens (m.wg owns it; ls.endExits or the manager's Close stops it).
// Without the stream (an older guest) exits are published as before: when
// a wait, an output stream or a listing sees them.
func (m *Manager) followExits(id string, ls *liveSandbox) {
	if !slices.Contains(ls.features, guestapi.FeatureExits) {
		return
	}
	ctx, cancel := context.WithCancel(m.ctx)
	ls.stopExits = cancel
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.exitsLoop(ctx, id, ls)
	}()
}

// exitsLoop follows the guest's exits stream until ctx ends, opening it
// again after it breaks (a resumed or restored sandbox's guest closed its
// connections), waiting longer each time it breaks without a single exit.
func (m *Manager) exitsLoop(ctx context.Context, id string, ls *liveSandbox) {
	lim := tokenBucket{rate: exitsRate, burst: exitsBurst, tokens: exitsBurst, last: time.Now()}
	wait := 100 * time.Millisecond
	for {
		n, err := m.readExits(ctx, id, ls, &lim)
		if ctx.Err() != nil {
			return
		}
		if errdefs.ClassOf(err) == errdefs.NotImplemented {
			return // a guest without the route despite its hello
		}
		if n > 0 {
			wait = 100 * time.Millisecond
		}
		m.log.Debug("exits stream broke; opening it again", "sandbox", id, "err", err, "after", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, exitsBackoff)
	}
}

// readExits reads one exits stream to its end and publishes each exit the
// daemon has not published yet; it returns how many exits it read.
func (m *Manager) readExits(ctx context.Context, id string, ls *liveSandbox, lim *tokenBucket) (int, error) {
	st, err := ls.guest.Exits(ctx)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	n := 0
	for {
		r, err := st.Next()
		if err != nil {
			return n, err
		}
		n++
		if err := lim.take(ctx); err != nil {
			return n, err
		}
		res := resultToAPI(r)
		// After any StartProcess in flight has recorded its process, so
		// that a process that ends at once is published after its start
		// and with its OOM count.
		ls.starts.Lock()
		m.explainBackground(ctx, id, ls, res.Pid, &res)
		ls.starts.Unlock()
	}
}

// tokenBucket paces a loop to rate per second after a burst.
type tokenBucket struct {
	rate, burst, tokens float64
	last                time.Time
}

// take waits for a token, or until ctx ends.
func (b *tokenBucket) take(ctx context.Context) error {
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		d := time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		b.tokens, b.last = 1, time.Now()
	}
	b.tokens--
	return nil
}
