package e2e

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
)

func TestEventsStream(t *testing.T) {
	d := startDaemon(t, "")
	ctx := t.Context()
	sb, err := d.client.CreateSandbox(ctx, api.CreateSandboxRequest{Limits: api.Limits{MemoryBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.client.Events(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got := make(chan api.SandboxEvent, 64)
	go func() {
		defer close(got)
		for {
			ev, err := st.Next()
			if err != nil {
				return
			}
			got <- ev
		}
	}()
	r, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", allocGiB}})
	if err != nil || !r.OOMKilled {
		t.Fatalf("exec: %+v %v", r, err)
	}
	if _, err := d.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"sleep", "5"}, TimeoutMs: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StopSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.StartSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := d.client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var types []string
	var oom *api.SandboxEvent
	timeout := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case ev, ok := <-got:
			if !ok {
				done = true
				break
			}
			types = append(types, ev.Type)
			if ev.Type == api.ProcessOOM {
				oom = &ev
			}
			if ev.Sandbox != sb.ID || ev.Time.IsZero() {
				t.Errorf("event %+v", ev)
			}
		case <-timeout:
			t.Fatalf("stream did not end after delete; got %v", types)
		}
	}
	want := "process_started process_exited oom process_started process_exited timed_out stopped started deleted"
	if strings.Join(types, " ") != want {
		t.Fatalf("events:\n got  %s\n want %s", strings.Join(types, " "), want)
	}
	if oom == nil || oom.Result == nil || !oom.Result.OOMKilled || oom.Pid == 0 {
		t.Fatalf("oom event: %+v", oom)
	}
	if _, err := st.Next(); err != io.EOF {
		t.Fatalf("after deleted: %v", err)
	}
}
