package sandbox

import (
	"strings"
	"testing"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime/fake"
)

// TestTerminalsNeedTheGuestFeature: a guest that does not announce
// terminals (runtime/fake's, like a guest older than them) gets no tty or
// open stdin it would silently ignore; exec takes neither.
func TestTerminalsNeedTheGuestFeature(t *testing.T) {
	m := newFakeWorld(t, fake.Capabilities(), Config{}).m
	ctx := t.Context()
	sb, err := m.Create(ctx, "", api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []api.ExecRequest{
		{Cmd: []string{"sh"}, TTY: &api.TTY{Rows: 24, Cols: 80}},
		{Cmd: []string{"cat"}, OpenStdin: true},
	} {
		if _, err := m.StartProcess(ctx, "", sb.ID, req); !errdefs.IsNotImplemented(err) || !strings.Contains(err.Error(), "predates terminals") {
			t.Fatalf("%+v: %v", req, err)
		}
	}
	if _, err := m.StartProcess(ctx, "", sb.ID, api.ExecRequest{Cmd: []string{"sh"}, TTY: &api.TTY{Rows: 0, Cols: 80}}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "tty.rows") {
		t.Fatalf("0 rows: %v", err)
	}
	if _, err := m.Exec(ctx, "", sb.ID, api.ExecRequest{Cmd: []string{"true"}, OpenStdin: true}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("exec with open_stdin: %v", err)
	}
}
