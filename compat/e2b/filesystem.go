package e2b

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/e2b/envd/filesystem"
	"github.com/berthsh/berth/api/e2b/envd/filesystem/filesystemconnect"
	"github.com/berthsh/berth/errdefs"
)

// filesystemService is envd's filesystem.Filesystem over the manager's
// file operations.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	g *Group
}

// fileCall is one envd file request: its sandbox, and who acts where.
type fileCall struct {
	envdRequest
	where api.Where
}

// call resolves a request's paths (see resolve) for its user.
func (s *filesystemService) call(ctx context.Context, paths ...*string) (fileCall, error) {
	e := envdOf(ctx)
	w, err := s.g.resolve(ctx, e, e.user, paths...)
	return fileCall{envdRequest: e, where: w}, err
}

// resolve rewrites paths for the guest (which resolves them, inside the
// sandbox) and returns who acts and where relative paths start. envd
// starts them, and "~", at the acting user's home. The default user's are
// left to start at the sandbox's workdir (its home unless the image says
// otherwise); root's home is known, and another user's is read from the
// sandbox's /etc/passwd, as that user, only when a path is relative.
func (g *Group) resolve(ctx context.Context, e envdRequest, user string, paths ...*string) (api.Where, error) {
	w := api.Where{User: user}
	relative := false
	for _, p := range paths {
		rel, err := envdPath(p)
		if err != nil {
			return w, err
		}
		relative = relative || rel
	}
	if !relative || user == "" {
		return w, nil
	}
	home, err := g.home(ctx, e, user)
	w.Cwd = home
	return w, err
}

// envdPath rewrites "~" and "~/..." to paths relative to the home, and
// says whether *p is relative.
func envdPath(p *string) (relative bool, err error) {
	switch {
	case *p == "~":
		*p = "."
	case strings.HasPrefix(*p, "~/"):
		*p = "." + (*p)[1:]
	case strings.HasPrefix(*p, "~"):
		return false, errdefs.New(errdefs.InvalidArgument, "path %q: another user's home (~name) is not expanded; give the path", *p)
	}
	return *p != "" && !path.IsAbs(*p), nil
}

// home is user's home directory in the sandbox, or "" when its
// /etc/passwd does not say (the guest then refuses a name it does not
// know, and starts a uid's relative paths at the sandbox's workdir).
func (g *Group) home(ctx context.Context, e envdRequest, user string) (string, error) {
	if user == "root" {
		return "/root", nil
	}
	rc, err := g.m.Download(ctx, e.tenant, e.id, api.Where{User: user}, "/etc/passwd", func(int64) {})
	if err != nil {
		return "", err
	}
	defer rc.Close()
	uid, _, _ := strings.Cut(user, ":")
	numeric := uid != "" && strings.Trim(uid, "0123456789") == ""
	sc := bufio.NewScanner(io.LimitReader(rc, 4<<20))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 {
			continue
		}
		if (f[0] == user || numeric && f[2] == uid) && path.IsAbs(f[5]) {
			return path.Clean(f[5]), nil
		}
	}
	return "", nil
}

// stat describes p, following a final symlink unless noFollow.
func (s *filesystemService) stat(ctx context.Context, c fileCall, p string, noFollow bool) (api.FileInfo, error) {
	res, err := s.g.m.FS(ctx, c.tenant, c.id, api.OpStat, api.StatRequest{Where: c.where, Path: p, NoFollow: noFollow})
	if err != nil {
		return api.FileInfo{}, err
	}
	return res.(api.FileInfo), nil
}

// entry is envd's EntryInfo of fi (stat again through a symlink: envd
// gives a link its target's type and permission bits).
func (s *filesystemService) entry(ctx context.Context, c fileCall, fi api.FileInfo) (*filesystem.EntryInfo, error) {
	es, err := s.entries(ctx, c, []api.FileInfo{fi})
	if err != nil {
		return nil, err
	}
	return es[0], nil
}

// entries converts fis, following their symlinks a few at a time.
func (s *filesystemService) entries(ctx context.Context, c fileCall, fis []api.FileInfo) ([]*filesystem.EntryInfo, error) {
	out := make([]*filesystem.EntryInfo, len(fis))
	var eg errgroup.Group
	eg.SetLimit(16)
	for i, fi := range fis {
		if fi.Type != api.TypeSymlink {
			out[i] = entryOf(fi, nil)
			continue
		}
		eg.Go(func() error {
			t, err := s.stat(ctx, c, fi.Path, false)
			switch {
			case err == nil:
				out[i] = entryOf(fi, &t)
			case errdefs.IsNotFound(err), errdefs.IsInvalidArgument(err), errdefs.IsPermissionDenied(err):
				out[i] = entryOf(fi, nil) // dangling, a loop, or into /proc
			default:
				return err
			}
			return nil
		})
	}
	return out, eg.Wait()
}

// entryOf is envd's EntryInfo of fi; target is where a symlink leads (nil
// when it leads nowhere the guest may stat). Like envd, a symlink has its
// target's type and permission bits, its own size and mode string, and the
// path it points at; one that leads nowhere has no type.
func entryOf(fi api.FileInfo, target *api.FileInfo) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{
		Name:        fi.Name,
		Type:        fileType(fi.Type),
		Path:        fi.Path,
		Size:        fi.Size,
		Mode:        fi.Mode & 0o777,
		Permissions: fileMode(fi).String(),
		Owner:       fi.Owner,
		Group:       fi.Group,
	}
	// envd names an owner it cannot look up by number.
	if e.Owner == "" {
		e.Owner = strconv.FormatUint(uint64(fi.UID), 10)
	}
	if e.Group == "" {
		e.Group = strconv.FormatUint(uint64(fi.GID), 10)
	}
	if !fi.ModifiedAt.IsZero() {
		e.ModifiedTime = timestamppb.New(fi.ModifiedAt)
	}
	if fi.Type == api.TypeSymlink {
		// envd reports the link resolved; the guest gives it as stored,
		// resolved here one level, against the link's directory.
		to := fi.Target
		if !path.IsAbs(to) {
			to = path.Join(path.Dir(fi.Path), to)
		}
		to = path.Clean(to)
		e.SymlinkTarget = &to
		e.Type, e.Mode = filesystem.FileType_FILE_TYPE_UNSPECIFIED, 0
		if target != nil {
			e.Type, e.Mode = fileType(target.Type), target.Mode&0o777
		}
	}
	return e
}

// fileType is envd's type of a berth file type: envd has no name for
// fifos, sockets and devices (and the SDKs leave such entries out).
func fileType(t string) filesystem.FileType {
	switch t {
	case api.TypeFile:
		return filesystem.FileType_FILE_TYPE_FILE
	case api.TypeDir:
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	case api.TypeSymlink:
		return filesystem.FileType_FILE_TYPE_SYMLINK
	}
	return filesystem.FileType_FILE_TYPE_UNSPECIFIED
}

// fileMode is fi's mode as Go's fs.FileMode, whose String is envd's
// permissions ("-rw-r--r--", "drwxr-xr-x", "Lrwxrwxrwx").
func fileMode(fi api.FileInfo) fs.FileMode {
	m := fs.FileMode(fi.Mode & 0o777)
	switch fi.Type {
	case api.TypeDir:
		m |= fs.ModeDir
	case api.TypeSymlink:
		m |= fs.ModeSymlink
	case api.TypeFIFO:
		m |= fs.ModeNamedPipe
	case api.TypeSocket:
		m |= fs.ModeSocket
	case api.TypeCharDevice:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case api.TypeBlockDevice:
		m |= fs.ModeDevice
	}
	if fi.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if fi.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if fi.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// Stat describes a path; a final symlink as envd does (see entryOf).
func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	p := orHere(req.Msg.GetPath())
	c, err := s.call(ctx, &p)
	if err != nil {
		return nil, err
	}
	fi, err := s.stat(ctx, c, p, true)
	if err != nil {
		return nil, err
	}
	e, err := s.entry(ctx, c, fi)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

// orHere is envd's empty path: the directory relative paths start at.
// Only requests that change nothing take it; a remove or move of ""
// stays the guest's invalid_argument.
func orHere(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// ListDir lists a directory (through a symlink) to a depth: 0 and 1 are
// its entries, 2 theirs too, and so on, in envd's order (depth first,
// names sorted). A path that is no directory is invalid_argument.
func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	p := orHere(req.Msg.GetPath())
	c, err := s.call(ctx, &p)
	if err != nil {
		return nil, err
	}
	depth := max(int(req.Msg.GetDepth()), 1)
	res, err := s.g.m.FS(ctx, c.tenant, c.id, api.OpList, api.ListRequest{Where: c.where, Path: p, Depth: depth})
	if err != nil {
		return nil, err
	}
	list := res.(api.ListResult)
	if list.Truncated {
		return nil, errdefs.New(errdefs.ResourceExhausted, "list %s: more than %d entries; list less deep", p, len(list.Entries))
	}
	// berth sorts by path; envd walks, so "a/x" comes before "a-b".
	slices.SortFunc(list.Entries, func(a, b api.FileInfo) int { return walkOrder(a.Path, b.Path) })
	es, err := s.entries(ctx, c, list.Entries)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: es}), nil
}

// walkOrder compares paths as a walk meets them: component by component,
// which is bytewise with "/" below every other byte.
func walkOrder(a, b string) int {
	for i := range min(len(a), len(b)) {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x == '/' {
			return -1
		}
		if y == '/' {
			return 1
		}
		return int(x) - int(y)
	}
	return len(a) - len(b)
}

// MakeDir makes a directory and its missing parents. An existing
// directory is already_exists (the SDKs answer false); an existing other
// file is invalid_argument.
func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	p := req.Msg.GetPath()
	c, err := s.call(ctx, &p)
	if err != nil {
		return nil, err
	}
	// Without parents first, so that an existing directory is an error.
	res, err := s.g.m.FS(ctx, c.tenant, c.id, api.OpMkdir, api.MkdirRequest{Where: c.where, Path: p})
	switch {
	case errdefs.IsNotFound(err):
		res, err = s.g.m.FS(ctx, c.tenant, c.id, api.OpMkdir, api.MkdirRequest{Where: c.where, Path: p, Parents: true})
	case errdefs.IsAlreadyExists(err):
		fi, serr := s.stat(ctx, c, p, false)
		if serr == nil && fi.Type != api.TypeDir {
			return nil, errdefs.New(errdefs.InvalidArgument, "%s: exists and is not a directory", fi.Path)
		}
		return nil, err
	}
	e, err := s.changed(ctx, c, res, err)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, replacing a file there and making
// destination's missing parents, as envd does. A missing source is
// not_found.
func (s *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	from, to := req.Msg.GetSource(), req.Msg.GetDestination()
	c, err := s.call(ctx, &from, &to)
	if err != nil {
		return nil, err
	}
	move := func() (any, error) {
		return s.g.m.FS(ctx, c.tenant, c.id, api.OpMove, api.MoveRequest{Where: c.where, From: from, To: to, Overwrite: true})
	}
	res, err := move()
	if errdefs.IsNotFound(err) {
		// Either end may be missing: make destination's parents only
		// when the source is there.
		if _, serr := s.stat(ctx, c, from, true); serr != nil {
			return nil, serr
		}
		if dir := path.Dir(to); dir != "." && dir != "/" {
			if _, merr := s.g.m.FS(ctx, c.tenant, c.id, api.OpMkdir, api.MkdirRequest{Where: c.where, Path: dir, Parents: true}); merr != nil {
				return nil, merr
			}
		}
		res, err = move()
	}
	e, err := s.changed(ctx, c, res, err)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// changed ends a call that changed the sandbox's files and answered res
// (an api.FileInfo) or err: the watchers hear of it, and the answer is
// envd's entry of res.
func (s *filesystemService) changed(ctx context.Context, c fileCall, res any, err error) (*filesystem.EntryInfo, error) {
	if err != nil {
		return nil, err
	}
	s.g.watchers.changed(c.tenant, c.id)
	return s.entry(ctx, c, res.(api.FileInfo))
}

// Remove removes a file, a symlink or a whole tree. Like envd (and the
// SDKs' tests), a path that is not there is removed already.
func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	p := req.Msg.GetPath()
	c, err := s.call(ctx, &p)
	if err != nil {
		return nil, err
	}
	if _, err := s.g.m.FS(ctx, c.tenant, c.id, api.OpRemove, api.RemoveRequest{Where: c.where, Path: p, Recursive: true, Force: true}); err != nil {
		return nil, err
	}
	s.g.watchers.changed(c.tenant, c.id)
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// watchable checks that p is a directory to watch and returns its
// absolute path, which the guest's events are named under.
func (s *filesystemService) watchable(ctx context.Context, c fileCall, p string) (string, error) {
	fi, err := s.stat(ctx, c, p, false)
	if err != nil {
		return "", err
	}
	if fi.Type != api.TypeDir {
		return "", errdefs.WithReason(errdefs.New(errdefs.InvalidArgument, "watch %s: not a directory", fi.Path), errdefs.NotDirectory)
	}
	return fi.Path, nil
}

// keepaliveHeader is the SDKs' keepalive interval for streams, in seconds.
const keepaliveHeader = "Keepalive-Ping-Interval"

// keepaliveEvery is the interval a stream's keepalives go at: the
// header's, or envd's default.
func keepaliveEvery(h interface{ Get(string) string }) time.Duration {
	if n, err := strconv.Atoi(h.Get(keepaliveHeader)); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 90 * time.Second
}

// WatchDir streams a directory's changes: a start event once the watch is
// on, then an event per change, and keepalives between. The stream ends
// when the client goes, or cleanly when the directory does.
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	p := orHere(req.Msg.GetPath())
	c, err := s.call(ctx, &p)
	if err != nil {
		return err
	}
	dir, err := s.watchable(ctx, c, p)
	if err != nil {
		return err
	}
	var mu sync.Mutex // keepalives go from a goroutine of their own
	send := func(r *filesystem.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	kctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	started := false
	ready := func() error {
		if err := send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
			return err
		}
		started = true
		every := keepaliveEvery(req.Header())
		wg.Go(func() {
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-kctx.Done():
					return
				case <-t.C:
					if send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}) != nil {
						return // the client is gone, and with it ctx
					}
				}
			}
		})
		return nil
	}
	tr := &translator{s: s, c: c, dir: dir, entries: req.Msg.GetIncludeEntry()}
	err = s.g.m.Watch(ctx, c.tenant, c.id, c.where, dir, req.Msg.GetRecursive(), ready, func(ev api.WatchEvent) error {
		evs, err := tr.events(ctx, ev)
		for _, fe := range evs {
			if err := send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
				return err
			}
		}
		return err
	})
	if started && ctx.Err() == nil && (errdefs.IsNotFound(err) || errdefs.IsConflict(err)) {
		// The sandbox went away under the watch: envd's stream would break,
		// which the SDKs read as unavailable and check /health.
		return connect.NewError(connect.CodeUnavailable, errors.New(errdefs.Message(err)))
	}
	return err
}

// CreateWatcher starts a watcher that GetWatcherEvents polls. It answers
// once the watch is on, so that every change after it is seen.
func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	p := orHere(req.Msg.GetPath())
	c, err := s.call(ctx, &p)
	if err != nil {
		return nil, err
	}
	dir, err := s.watchable(ctx, c, p)
	if err != nil {
		return nil, err
	}
	recursive := req.Msg.GetRecursive()
	tr := &translator{s: s, c: c, dir: dir, entries: req.Msg.GetIncludeEntry()}
	id, err := s.g.watchers.start(ctx, c.tenant, c.id, func(ctx context.Context, ready func() error, add func([]*filesystem.FilesystemEvent) error) error {
		return s.g.m.Watch(ctx, c.tenant, c.id, c.where, dir, recursive, ready, func(ev api.WatchEvent) error {
			evs, err := tr.events(ctx, ev)
			if len(evs) > 0 {
				if err := add(evs); err != nil {
					return err
				}
			}
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents drains what a watcher saw since it was last polled, or
// answers the error that stopped it.
func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	e := envdOf(ctx)
	evs, err := s.g.watchers.drain(ctx, e.tenant, e.id, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

// RemoveWatcher stops a watcher and forgets it.
func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	e := envdOf(ctx)
	if err := s.g.watchers.remove(e.tenant, e.id, req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

// translator turns one watch's berth events into envd's.
type translator struct {
	s       *filesystemService
	c       fileCall
	dir     string // the watched directory, absolute
	entries bool   // include_entry
	uploads uploadFold
}

// events are envd's events for ev. An overflow of the sandbox's event
// queue ends the watch: envd cannot say that events were lost, and a
// watcher that silently missed some would mislead.
func (t *translator) events(ctx context.Context, ev api.WatchEvent) ([]*filesystem.FilesystemEvent, error) {
	if ev.Type == api.WatchOverflow {
		return nil, errdefs.New(errdefs.ResourceExhausted, "watch %s: the sandbox's event queue overflowed and events were lost; watch again", t.dir)
	}
	var out []*filesystem.FilesystemEvent
	for _, ev := range t.uploads.add(ev) {
		typ := eventType(ev.Type)
		if typ == filesystem.EventType_EVENT_TYPE_UNSPECIFIED {
			continue
		}
		fe := &filesystem.FilesystemEvent{Name: t.name(ev.Path), Type: typ}
		// Like envd, only an entry that should still be there, best effort.
		if t.entries && (typ == filesystem.EventType_EVENT_TYPE_CREATE || typ == filesystem.EventType_EVENT_TYPE_WRITE || typ == filesystem.EventType_EVENT_TYPE_CHMOD) {
			if fi, err := t.s.stat(ctx, t.c, ev.Path, true); err == nil {
				fe.Entry, _ = t.s.entry(ctx, t.c, fi)
			}
		}
		out = append(out, fe)
	}
	return out, nil
}

// name is p relative to the watched directory, as envd names events.
func (t *translator) name(p string) string {
	if p == t.dir {
		return "."
	}
	if t.dir == "/" {
		return strings.TrimPrefix(p, "/")
	}
	return strings.TrimPrefix(p, t.dir+"/")
}

func eventType(t string) filesystem.EventType {
	switch t {
	case api.WatchCreate:
		return filesystem.EventType_EVENT_TYPE_CREATE
	case api.WatchWrite:
		return filesystem.EventType_EVENT_TYPE_WRITE
	case api.WatchRemove:
		return filesystem.EventType_EVENT_TYPE_REMOVE
	case api.WatchRename:
		return filesystem.EventType_EVENT_TYPE_RENAME
	case api.WatchChmod:
		return filesystem.EventType_EVENT_TYPE_CHMOD
	}
	return filesystem.EventType_EVENT_TYPE_UNSPECIFIED
}

// uploadFold shows berth's uploads as envd's. The guest writes an upload
// to a temporary file beside its path, ".berth-<12 hex>-NAME", and renames
// it over NAME; envd writes NAME in place. The temporary file's create,
// chmod and write are held until its rename and then reported as NAME's,
// in envd's order; the rename itself, and a failed upload's temporary
// file, are not reported. So an upload of a new file is the three events
// envd's SDKs count.
type uploadFold struct {
	held map[string][]string // a temporary file -> its event types, once each
	// renamed is the temporary file whose rename away was the last event;
	// the next is its other half, NAME.
	renamed string
}

// maxHeld bounds the temporary files held at once; beyond it they are
// reported as they are.
const maxHeld = 256

func (f *uploadFold) add(ev api.WatchEvent) []api.WatchEvent {
	if tmp := f.renamed; tmp != "" {
		f.renamed = ""
		types := f.held[tmp]
		delete(f.held, tmp)
		if ev.Type == api.WatchRename && path.Dir(ev.Path) == path.Dir(tmp) && !ev.IsDir {
			var out []api.WatchEvent
			for _, t := range []string{api.WatchCreate, api.WatchChmod, api.WatchWrite} {
				if slices.Contains(types, t) {
					out = append(out, api.WatchEvent{Type: t, Path: ev.Path, Time: ev.Time})
				}
			}
			return out
		}
		// Not the other half after all: report what was held as it was.
		var out []api.WatchEvent
		for _, t := range types {
			out = append(out, api.WatchEvent{Type: t, Path: tmp, Time: ev.Time})
		}
		out = append(out, api.WatchEvent{Type: api.WatchRename, Path: tmp, Time: ev.Time})
		return append(out, f.add(ev)...)
	}
	if ev.IsDir || !isUploadTemp(path.Base(ev.Path)) {
		return []api.WatchEvent{ev}
	}
	types, held := f.held[ev.Path]
	switch ev.Type {
	case api.WatchCreate, api.WatchWrite, api.WatchChmod:
		if !held && len(f.held) >= maxHeld {
			break
		}
		if f.held == nil {
			f.held = map[string][]string{}
		}
		if !slices.Contains(types, ev.Type) {
			types = append(types, ev.Type)
		}
		f.held[ev.Path] = types
		return nil
	case api.WatchRename:
		if held {
			f.renamed = ev.Path
			return nil
		}
	case api.WatchRemove:
		if held {
			delete(f.held, ev.Path)
			return nil
		}
	}
	return []api.WatchEvent{ev}
}

// isUploadTemp says whether name is the guest's temporary upload file.
func isUploadTemp(name string) bool {
	rest, ok := strings.CutPrefix(name, ".berth-")
	if !ok || len(rest) < 14 || rest[12] != '-' {
		return false
	}
	return strings.Trim(rest[:12], "0123456789abcdef") == ""
}

// Bounds of the polled watchers.
const (
	// maxWatcherEvents is what a watcher buffers between polls; beyond it
	// the watcher stops, and its polls answer resource_exhausted until it
	// is removed (envd's protocol cannot say that events were lost).
	maxWatcherEvents = 16384
	// maxWatchers bounds one sandbox's watchers.
	maxWatchers = 128
	// watcherIdle is how long a watcher that nobody polls lives: a watch
	// keeps its sandbox busy (and inotify's resources in use).
	watcherIdle = time.Hour
	reapEvery   = time.Minute
	// settle is how long a poll waits for the events of a change made
	// through envd just before it. envd sees its own changes at once; here
	// they travel from the sandbox's kernel through its guest, which
	// shares the sandbox's CPU quota, and a throttled guest is late by up
	// to a scheduling period or two.
	settle = 250 * time.Millisecond
)

// watchers are the polled watchers of CreateWatcher: each runs one
// manager watch in a goroutine of its own, buffering what it reports
// until GetWatcherEvents drains it. RemoveWatcher stops one, closeAll
// stops all, and a reaper stops those nobody polled for watcherIdle.
type watchers struct {
	now func() time.Time

	mu     sync.Mutex
	byID   map[string]*watcher
	closed bool

	stop chan struct{} // ends the reaper
	wg   sync.WaitGroup
}

// watcher is one polled watch.
type watcher struct {
	tenant, sandbox string
	cancel          context.CancelFunc
	done            chan struct{} // closed when its goroutine ends

	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
	err    error // what stopped it, answered to every poll
	polled time.Time
	// changed is when envd last changed files in the sandbox, arrived
	// when events last did; more is closed (and replaced) as they do.
	changed, arrived time.Time
	more             chan struct{}
}

func newWatchers(now func() time.Time) *watchers {
	ws := &watchers{now: now, byID: map[string]*watcher{}, stop: make(chan struct{})}
	ws.wg.Go(ws.reap)
	return ws
}

// watchFunc runs a watch until ctx ends, calling ready once it is on and
// add with its events.
type watchFunc func(ctx context.Context, ready func() error, add func([]*filesystem.FilesystemEvent) error) error

// start runs watch as a new watcher of a sandbox and returns its id once
// the watch is on.
func (ws *watchers) start(ctx context.Context, tenant, sandbox string, watch watchFunc) (string, error) {
	id := "w" + rand.Text()
	// The watch outlives the request that made it.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &watcher{tenant: tenant, sandbox: sandbox, cancel: cancel, done: make(chan struct{}), polled: ws.now(), more: make(chan struct{})}
	ws.mu.Lock()
	if ws.closed {
		ws.mu.Unlock()
		cancel()
		return "", errdefs.New(errdefs.Unavailable, "envd is shutting down")
	}
	n := 0
	for _, o := range ws.byID {
		if o.tenant == tenant && o.sandbox == sandbox {
			n++
		}
	}
	if n >= maxWatchers {
		ws.mu.Unlock()
		cancel()
		return "", errdefs.New(errdefs.ResourceExhausted, "sandbox %s has %d watchers, the most it may; remove one", sandbox, n)
	}
	ws.byID[id] = w
	ready := make(chan struct{})
	ws.wg.Go(func() {
		defer close(w.done)
		err := watch(wctx, func() error { close(ready); return nil }, w.add)
		w.mu.Lock()
		if err != nil && wctx.Err() == nil && w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
	})
	ws.mu.Unlock()

	select {
	case <-ready:
		return id, nil
	case <-w.done:
		select {
		case <-ready: // on, and already over (the directory went)
			return id, nil
		default:
		}
		ws.forget(id)
		if w.err == nil {
			w.err = errdefs.New(errdefs.Unavailable, "watch ended before it started")
		}
		return "", w.err
	case <-ctx.Done():
		ws.forget(id)
		w.stop()
		return "", ctx.Err()
	}
}

// add buffers events; past the bound it fails, which ends the watch.
func (w *watcher) add(evs []*filesystem.FilesystemEvent) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events)+len(evs) > maxWatcherEvents {
		w.events = nil
		w.err = errdefs.New(errdefs.ResourceExhausted, "watcher: more than %d events waited for a poll and some were lost; remove it and watch again", maxWatcherEvents)
		return w.err
	}
	w.events = append(w.events, evs...)
	w.arrived = time.Now()
	close(w.more)
	w.more = make(chan struct{})
	return nil
}

// stop ends w's watch and waits for its goroutine.
func (w *watcher) stop() {
	w.cancel()
	<-w.done
}

// lookup finds a watcher of a sandbox; another sandbox's is not found.
func (ws *watchers) lookup(tenant, sandbox, id string) (*watcher, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.byID[id]
	if !ok || w.tenant != tenant || w.sandbox != sandbox {
		return nil, errdefs.New(errdefs.NotFound, "watcher %q not found", id)
	}
	return w, nil
}

func (ws *watchers) forget(id string) {
	ws.mu.Lock()
	delete(ws.byID, id)
	ws.mu.Unlock()
}

// changed notes that envd changed files in a sandbox, for its watchers'
// next polls (see settle).
func (ws *watchers) changed(tenant, sandbox string) {
	now := time.Now()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, w := range ws.byID {
		if w.tenant == tenant && w.sandbox == sandbox {
			w.mu.Lock()
			w.changed = now
			w.mu.Unlock()
		}
	}
}

// drain hands over a watcher's events, or the error that stopped it.
// When envd changed files since the last events arrived, it first waits
// (until settle after the change) for some to arrive.
func (ws *watchers) drain(ctx context.Context, tenant, sandbox, id string) ([]*filesystem.FilesystemEvent, error) {
	w, err := ws.lookup(tenant, sandbox, id)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events) == 0 && w.changed.After(w.arrived) {
		t := time.NewTimer(time.Until(w.changed.Add(settle)))
		defer t.Stop()
		for len(w.events) == 0 && w.err == nil {
			more, over := w.more, false
			w.mu.Unlock()
			select {
			case <-more:
			case <-w.done:
				over = true
			case <-t.C:
				over = true
			case <-ctx.Done():
				over = true
			}
			w.mu.Lock()
			if over {
				break
			}
		}
	}
	w.polled = ws.now()
	if w.err != nil {
		return nil, w.err
	}
	evs := w.events
	w.events = nil
	return evs, nil
}

// remove stops a watcher and forgets it.
func (ws *watchers) remove(tenant, sandbox, id string) error {
	w, err := ws.lookup(tenant, sandbox, id)
	if err != nil {
		return err
	}
	ws.forget(id)
	w.stop()
	return nil
}

// reap stops, every reapEvery, the watchers nobody polled for watcherIdle.
func (ws *watchers) reap() {
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-ws.stop:
			return
		case <-t.C:
		}
		cutoff := ws.now().Add(-watcherIdle)
		var idle []*watcher
		ws.mu.Lock()
		for id, w := range ws.byID {
			w.mu.Lock()
			if w.polled.Before(cutoff) {
				delete(ws.byID, id)
				idle = append(idle, w)
			}
			w.mu.Unlock()
		}
		ws.mu.Unlock()
		for _, w := range idle {
			w.stop()
		}
	}
}

// closeAll stops every watcher and the reaper, and waits for them.
func (ws *watchers) closeAll() {
	ws.mu.Lock()
	if ws.closed {
		ws.mu.Unlock()
		return
	}
	ws.closed = true
	all := ws.byID
	ws.byID = map[string]*watcher{}
	ws.mu.Unlock()
	close(ws.stop)
	for _, w := range all {
		w.cancel()
	}
	ws.wg.Wait()
}
