package proc

import (
	"context"

	"github.com/berthsh/berth/api/guestapi"
)

// exitLog keeps the last exits of background processes for the daemon's
// exits stream (guestapi.PathExits). Each exit has a sequence number; sent
// is the highest that a stream has written out, so a new stream (the
// daemon restarted, or its stream broke) carries only what no stream
// carried before. Its fields are under Table.mu.
type exitLog struct {
	recs    []guestapi.Result // oldest first, at most guestapi.MaxExitsKept
	first   uint64            // sequence number of recs[0]; numbers start at 1
	sent    uint64            // highest sequence number a stream has written
	changed chan struct{}     // closed and replaced when an exit is added
}

// addExitLocked records a background process's exit; t.mu is held.
func (t *Table) addExitLocked(r guestapi.Result) {
	l := &t.exits
	if l.first == 0 {
		l.first = 1
	}
	l.recs = append(l.recs, r)
	if len(l.recs) > guestapi.MaxExitsKept {
		drop := len(l.recs) - guestapi.MaxExitsKept
		l.recs = append(l.recs[:0:0], l.recs[drop:]...)
		l.first += uint64(drop)
	}
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// FollowExits hands send each exit of a background process that no stream
// has carried yet, oldest first, then each exit as it happens, until ctx
// ends or send or flush fails. After each batch it calls flush; once flush
// succeeds the batch counts as carried.
func (t *Table) FollowExits(ctx context.Context, send func(guestapi.Result) error, flush func() error) error {
	var next uint64 // 0: start after what was carried
	for {
		t.mu.Lock()
		l := &t.exits
		if next == 0 {
			next = l.sent + 1
		}
		if l.first > 0 && next < l.first {
			next = l.first // the older ones were dropped
		}
		var batch []guestapi.Result
		if l.first > 0 && next < l.first+uint64(len(l.recs)) {
			batch = append(batch, l.recs[next-l.first:]...)
		}
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		changed := l.changed
		t.mu.Unlock()
		if len(batch) > 0 {
			for _, r := range batch {
				if err := send(r); err != nil {
					return err
				}
			}
			if err := flush(); err != nil {
				return err
			}
			next += uint64(len(batch))
			t.mu.Lock()
			t.exits.sent = max(t.exits.sent, next-1)
			t.mu.Unlock()
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}
