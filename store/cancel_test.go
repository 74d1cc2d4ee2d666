package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestCanceledReadsLeaveNoStaleSnapshot: reads cut off by their context's
// end (a client that hangs up mid-exec) must not leave a read connection
// inside an old snapshot: a row committed afterwards is seen by every later
// read, on whichever pooled connection it lands. modernc.org/sqlite v1.40.0
// failed this (an exec after a burst of canceled execs found its new
// sandbox "not found"); v1.62.0 passes.
func TestCanceledReadsLeaveNoStaleSnapshot(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	for i := range 50 {
		if err := s.CreateSandbox(ctx, sample(fmt.Sprintf("sb-old-%d", i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 300 {
				c, cancel := context.WithTimeout(ctx, time.Duration((g*300+i)%50)*time.Microsecond)
				id := fmt.Sprintf("sb-old-%d", i%50)
				if i%2 == 0 {
					s.GetStatus(c, id) // the prepared statement
				} else {
					s.GetSandbox(c, id) // a read transaction
				}
				cancel()
			}
		})
	}
	wg.Wait()
	for i := range 20 {
		id := fmt.Sprintf("sb-new-%d", i)
		if err := s.CreateSandbox(ctx, sample(id, nil)); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 16)
		for g := range 16 {
			wg.Go(func() { _, errs[g] = s.GetStatus(ctx, id) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("a row committed after canceled reads: %v", err)
			}
		}
	}
}
