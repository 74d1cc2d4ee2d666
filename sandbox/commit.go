package sandbox

import (
	"context"
	"io"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
)

// Commit writes what stopped sandbox id changed over its image to w as
// an OCI layer tar, without the files berth wrote into it (its hostname,
// hosts and resolver files, and its trust files while they still end with
// its own CA). entries is 0 when it changed nothing.
func (m *Manager) Commit(ctx context.Context, tenant, id string, w io.Writer) (entries int, err error) {
	unlock := m.ops.lock(id)
	defer unlock()
	rec, err := m.record(ctx, tenant, id)
	if err != nil {
		return 0, err
	}
	if rec.State != api.StateStopped {
		return 0, errdefs.New(errdefs.Conflict, "sandbox %s is %s; stop it first (its files must be still while they are read)", id, rec.State)
	}
	t, err := m.tier(rec.Runtime)
	if err != nil {
		return 0, err
	}
	d, ok := t.rt.(runtime.Differ)
	if !ok {
		return 0, t.lacks("diff", "read what a sandbox changed")
	}
	return d.Diff(ctx, id, m.cfg.IDMap.Range(rec.IDRange), m.berthFiles(ctx, id), w)
}

// berthFiles names the files berth wrote into sandbox id's writable layer,
// which a commit, snapshot or diff leaves out: its hostname, hosts and
// resolver files, and its trust files while they still end with its own
// CA (the PEM trustFiles wrote).
func (m *Manager) berthFiles(ctx context.Context, id string) map[string][]byte {
	skip := map[string][]byte{"/etc/hostname": nil, "/etc/hosts": nil, resolvConf: nil}
	if cert, _, err := m.store.GetCA(ctx, id); err == nil {
		skip[trustBundle], skip[caFile] = cert, cert
	}
	return skip
}
