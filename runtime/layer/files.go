package layer

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/errdefs"
	"github.com/berthsh/berth/runtime"
)

// WriteFiles puts /etc/hostname and /etc/hosts for the sandbox, and the
// spec's files, into its writable layer before it boots (cheaper than a
// copy-up inside), owned by the sandbox's root, with the directories they
// need. At a start the layer holds what the sandbox wrote: every lookup
// stays beneath it and follows no symlink (a sandbox's /etc pointing at
// "/" must not steer the daemon's writes onto the host), and each file is
// written aside and renamed over the old one.
func WriteFiles(upper, hostname string, files []runtime.File, owner int) error {
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + hostname + "\n"
	all := append([]runtime.File{
		{Path: "/etc/hostname", Data: []byte(hostname + "\n"), Mode: 0o644},
		{Path: "/etc/hosts", Data: []byte(hosts), Mode: 0o644},
	}, files...)
	root, err := unix.Open(upper, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the writable layer: %w", err)
	}
	defer unix.Close(root)
	for _, f := range all {
		if err := writeFile(root, f, owner); err != nil {
			return err
		}
	}
	return nil
}

var beneath = unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}

func writeFile(root int, f runtime.File, owner int) error {
	rel := strings.TrimPrefix(filepath.Clean(f.Path), "/")
	if !filepath.IsAbs(f.Path) || rel == "" || rel == "." || strings.HasPrefix(rel, "..") {
		return errdefs.New(errdefs.InvalidArgument, "file %q: want an absolute path in the sandbox", f.Path)
	}
	dir, err := unix.Dup(root)
	if err != nil {
		return err
	}
	defer func() { unix.Close(dir) }()
	parts := strings.Split(rel, "/")
	for _, name := range parts[:len(parts)-1] {
		how := beneath
		fd, err := unix.Openat2(dir, name, &how)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(dir, name, 0o755); err == nil {
				err = unix.Fchownat(dir, name, owner, owner, unix.AT_SYMLINK_NOFOLLOW)
			}
			if err == nil || errors.Is(err, unix.EEXIST) {
				fd, err = unix.Openat2(dir, name, &how)
			}
		}
		if err != nil {
			return fmt.Errorf("write %s: its directory %s: %w", f.Path, name, err)
		}
		unix.Close(dir)
		dir = fd
	}
	base := parts[len(parts)-1]
	tmp := ".berth-" + base
	unix.Unlinkat(dir, tmp, 0)
	fd, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(f.Mode.Perm()))
	if err != nil {
		return fmt.Errorf("write %s: %w", f.Path, err)
	}
	var werr error
	for data := f.Data; len(data) > 0 && werr == nil; {
		var n int
		n, werr = unix.Write(fd, data)
		data = data[max(n, 0):]
	}
	if werr == nil {
		werr = unix.Fchown(fd, owner, owner)
	}
	if werr == nil {
		werr = unix.Fchmod(fd, uint32(f.Mode.Perm()))
	}
	if cerr := unix.Close(fd); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dir, tmp, dir, base)
	}
	if werr != nil {
		unix.Unlinkat(dir, tmp, 0)
		return fmt.Errorf("write %s: %w", f.Path, werr)
	}
	return nil
}
