package files

import (
	"context"
	"encoding/binary"
	"os"
	"path"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// maxWatches bounds the directories one recursive watch follows.
const maxWatches = 8192

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// Watch reports changes in a directory (and, if recursive, below it, new
// directories included) to emit until ctx ends, emit fails or the directory
// goes away; ready is called once the watch is set up. Repeated writes to one file within one read of the kernel's
// queue are reported once.
func (s *Service) Watch(ctx context.Context, w guestapi.Where, reqPath string, recursive bool, ready func() error, emit func(guestapi.WatchEvent) error) error {
	c, err := s.caller(w)
	if err != nil {
		return err
	}
	p, err := c.abs("path", reqPath)
	if err != nil {
		return err
	}
	ifd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return errdefs.Wrap(errdefs.ResourceExhausted, err, "watch %s: no inotify instance", p)
	}
	in := os.NewFile(uintptr(ifd), "inotify") // non-blocking: reads park in the netpoller
	defer in.Close()
	wt := &watcher{s: s, fd: ifd, paths: map[int32]string{}, recursive: recursive}
	if err := as(c.acc, func() error { return wt.add(p, true) }); err != nil {
		return err
	}
	if err := ready(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { in.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		n, err := in.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return errdefs.Wrap(errdefs.Unavailable, err, "watch %s", p)
		}
		evs, gone := wt.decode(buf[:n])
		if recursive {
			as(c.acc, func() error {
				for _, ev := range evs {
					if ev.IsDir && (ev.Type == guestapi.WatchCreate || ev.Type == guestapi.WatchRename) {
						wt.add(ev.Path, false)
					}
				}
				return nil
			})
		}
		for _, ev := range evs {
			if err := emit(ev); err != nil {
				return err
			}
		}
		if gone {
			return nil
		}
	}
}

type watcher struct {
	s         *Service
	fd        int
	root      int32
	paths     map[int32]string // watch descriptor -> directory
	recursive bool
}

// add watches a directory (and, if recursive, the directories below it). The
// directory is opened safely first and watched through its descriptor.
func (wt *watcher) add(p string, top bool) error {
	f, err := wt.s.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		if top {
			return err
		}
		return nil
	}
	defer f.Close()
	if len(wt.paths) >= maxWatches {
		return nil
	}
	wd, err := unix.InotifyAddWatch(wt.fd, procFD(f), watchMask)
	if err != nil {
		if top {
			return errdefs.Wrap(errdefs.ResourceExhausted, err, "watch %s", p)
		}
		return nil
	}
	wt.paths[int32(wd)] = p
	if top {
		wt.root = int32(wd)
	}
	if !wt.recursive {
		return nil
	}
	return walk(context.Background(), f, p, 64, func(_ int, name, full string, typ os.FileMode) (bool, error) {
		if !typ.IsDir() {
			return false, nil
		}
		if len(wt.paths) >= maxWatches {
			return false, errStop
		}
		d, err := wt.s.open(full, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW)
		if err != nil {
			return false, nil
		}
		wd, err := unix.InotifyAddWatch(wt.fd, procFD(d), watchMask)
		d.Close()
		if err == nil {
			wt.paths[int32(wd)] = full
		}
		return true, nil
	})
}

// decode turns a read of inotify events into watch events; gone says the
// watched directory itself was removed or moved.
func (wt *watcher) decode(b []byte) (evs []guestapi.WatchEvent, gone bool) {
	now := time.Now().UTC()
	lastWrite := map[string]bool{}
	for len(b) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(b[0:4]))
		mask := binary.NativeEndian.Uint32(b[4:8])
		nameLen := binary.NativeEndian.Uint32(b[12:16])
		end := unix.SizeofInotifyEvent + int(nameLen)
		if end > len(b) {
			break
		}
		raw := b[unix.SizeofInotifyEvent:end]
		b = b[end:]
		for len(raw) > 0 && raw[len(raw)-1] == 0 {
			raw = raw[:len(raw)-1]
		}
		if mask&unix.IN_Q_OVERFLOW != 0 {
			evs = append(evs, guestapi.WatchEvent{Type: guestapi.WatchOverflow, Time: now})
			continue
		}
		dir, ok := wt.paths[wd]
		if !ok {
			continue
		}
		if mask&unix.IN_IGNORED != 0 {
			delete(wt.paths, wd)
			if wd == wt.root {
				gone = true
			}
			continue
		}
		if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
			if wd == wt.root {
				gone = true
			}
			continue
		}
		ev := guestapi.WatchEvent{Path: path.Join(dir, string(raw)), IsDir: mask&unix.IN_ISDIR != 0, Time: now}
		switch {
		case mask&unix.IN_CREATE != 0:
			ev.Type = guestapi.WatchCreate
		case mask&unix.IN_MODIFY != 0:
			if lastWrite[ev.Path] {
				continue
			}
			lastWrite[ev.Path] = true
			ev.Type = guestapi.WatchWrite
		case mask&unix.IN_DELETE != 0:
			ev.Type = guestapi.WatchRemove
		case mask&(unix.IN_MOVED_FROM|unix.IN_MOVED_TO) != 0:
			ev.Type = guestapi.WatchRename
		case mask&unix.IN_ATTRIB != 0:
			ev.Type = guestapi.WatchChmod
		default:
			continue
		}
		evs = append(evs, ev)
	}
	return evs, gone
}
