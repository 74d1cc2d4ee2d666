package sandbox

import (
	"context"
	"sync"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/guestclient"
)

// Terminals and interactive input: a background process started with a
// TTY or OpenStdin takes input later, through WriteStdin or an
// attachment, and any number of attachments follow its output (the guest
// keeps a terminal's recent output for one made later).

// WriteStdin writes data to a process's input and, with close, closes it.
func (m *Manager) WriteStdin(ctx context.Context, tenant, id string, pid int, data []byte, close bool) error {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return err
	}
	ls.lastActive.Store(m.cfg.Now().UnixNano())
	return m.gone(id, ls.guest.WriteStdin(ctx, pid, data, close))
}

// Attach attaches to a process: while the attachment is open the sandbox
// is active for its idle timeout.
func (m *Manager) Attach(ctx context.Context, tenant, id string, pid int) (api.Attachment, error) {
	ls, err := m.guest(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	// The attachment outlives ctx (the WebSocket's handshake request).
	a, err := ls.guest.Attach(context.WithoutCancel(ctx), pid)
	if err != nil {
		return nil, m.gone(id, err)
	}
	return &attachment{m: m, id: id, pid: pid, ls: ls, a: a, done: m.streaming(ls)}, nil
}

// attachment is the manager's api.Attachment over the guest's.
type attachment struct {
	m    *Manager
	id   string
	pid  int
	ls   *liveSandbox
	a    *guestclient.Attachment
	once sync.Once
	done func()
}

func (at *attachment) Next() (string, []byte, *api.ExecResult, error) {
	kind, data, res, err := at.a.Next()
	if err != nil {
		return "", nil, nil, at.m.gone(at.id, err)
	}
	switch kind {
	case guestapi.FrameStdout:
		return api.EventStdout, data, nil, nil
	case guestapi.FrameStderr:
		return api.EventStderr, data, nil, nil
	case guestapi.FrameExit:
		r := resultToAPI(*res)
		r.Stdout, r.Stderr = []byte{}, []byte{}
		at.m.explainBackground(context.Background(), at.id, at.ls, at.pid, &r)
		return "", nil, &r, nil
	}
	return "", nil, nil, errdefs.New(errdefs.Unavailable, "sandbox %s: the guest sent frame type %d on an attachment", at.id, kind)
}

func (at *attachment) Stdin(data []byte) error {
	at.ls.lastActive.Store(at.m.cfg.Now().UnixNano())
	return at.m.gone(at.id, at.a.Stdin(data))
}

func (at *attachment) Resize(rows, cols int) error {
	if rows < 1 || rows > api.MaxTTY || cols < 1 || cols > api.MaxTTY {
		return errdefs.New(errdefs.InvalidArgument, "resize: rows %d, cols %d; each must be 1 to %d", rows, cols, api.MaxTTY)
	}
	return at.m.gone(at.id, at.a.Resize(uint16(rows), uint16(cols)))
}

func (at *attachment) CloseStdin() error { return at.m.gone(at.id, at.a.CloseStdin()) }

func (at *attachment) Close() error {
	at.once.Do(at.done)
	return at.a.Close()
}
