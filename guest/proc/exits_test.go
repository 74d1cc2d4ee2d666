package proc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
)

// follow runs FollowExits until want exits came (or fails after a while)
// and returns them.
func follow(t *testing.T, tb *Table, want int) []guestapi.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var got []guestapi.Result
	err := tb.FollowExits(ctx, func(r guestapi.Result) error {
		got = append(got, r)
		return nil
	}, func() error {
		if len(got) >= want {
			cancel() // this batch is carried; the next wait ends
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || len(got) < want {
		t.Fatalf("follow exits: %v after %d of %d", err, len(got), want)
	}
	return got
}

func TestExitsOfBackgroundProcessesOnly(t *testing.T) {
	tb := newTable(t)
	// An exec's process reports its own exit: not on the exits stream.
	run(t, tb, sh("exit 1"))
	p, err := tb.StartBackground(sh("exit 7"))
	if err != nil {
		t.Fatal(err)
	}
	wait(t, p)
	got := follow(t, tb, 1)
	if len(got) != 1 || got[0].Pid != p.Pid() || got[0].ExitCode != 7 {
		t.Fatalf("exits: %+v", got)
	}
	if got[0].Stdout != nil || got[0].Stderr != nil {
		t.Fatalf("an exit carries no output: %+v", got[0])
	}

	// Carried once: a new stream starts after it, with the next exit as it happens.
	done := make(chan []guestapi.Result, 1)
	go func() { done <- follow(t, tb, 1) }()
	q, err := tb.StartBackground(sh("sleep 0.1; exit 2"))
	if err != nil {
		t.Fatal(err)
	}
	got = <-done
	if len(got) != 1 || got[0].Pid != q.Pid() || got[0].ExitCode != 2 {
		t.Fatalf("exits of the second stream: %+v", got)
	}
	// A program that never started has no exit to report: its start said it.
	if r, err := tb.StartBackground(guestapi.ProcessSpec{Args: []string{"/no/such/program"}}); err != nil || r.Pid() != 0 {
		t.Fatalf("start a missing program: %v %v", r, err)
	}
}

func TestExitsAreBounded(t *testing.T) {
	tb := newTable(t)
	tb.mu.Lock()
	for i := range guestapi.MaxExitsKept + 10 {
		tb.addExitLocked(guestapi.Result{Pid: i + 1})
	}
	tb.mu.Unlock()
	got := follow(t, tb, guestapi.MaxExitsKept)
	if len(got) != guestapi.MaxExitsKept || got[0].Pid != 11 || got[len(got)-1].Pid != guestapi.MaxExitsKept+10 {
		t.Fatalf("kept %d exits, from pid %d to %d", len(got), got[0].Pid, got[len(got)-1].Pid)
	}
	// What a stream failed to carry is carried by the next.
	tb.mu.Lock()
	tb.addExitLocked(guestapi.Result{Pid: 5000})
	tb.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	broken := errors.New("broken")
	if err := tb.FollowExits(ctx, func(guestapi.Result) error { return nil }, func() error { return broken }); !errors.Is(err, broken) {
		t.Fatal(err)
	}
	if got := follow(t, tb, 1); len(got) != 1 || got[0].Pid != 5000 {
		t.Fatalf("after a broken stream: %d exits, the first of pid %d", len(got), got[0].Pid)
	}
}
