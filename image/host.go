package image

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berthsh/berth/runtime"
)

// hostImageVersion changes whenever the image layout below changes, so that
// a daemon rebuilds images made by an older one.
const hostImageVersion = "1"

// Host is the name of the image that shows the host's own system: a
// skeleton root with a curated /etc, and the host's system directories bound
// read-only over it inside each sandbox.
const Host = "host"

// hostImage is the host image as built for one id mapping.
type hostImage struct {
	dir    string          // the skeleton: the one read-only layer
	mounts []runtime.Mount // host directories bound read-only at the same path
}

// systemDirs are the host directories a sandbox sees. On a merged-/usr host
// /bin, /sbin and /lib* are symlinks into /usr and are copied as symlinks.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// etcAllowlist is everything of the host's /etc a sandbox sees: what programs
// need to run (the dynamic linker's cache, alternatives, certificates, time
// zone, shell start-up files) and nothing that identifies or unlocks the host
// (no shadow, ssh keys, ssl private keys, machine-id, fstab, sudoers).
var etcAllowlist = []string{
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
	"ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf",
	"localtime", "timezone", "os-release", "debian_version", "issue",
	"profile", "profile.d", "bash.bashrc", "inputrc", "shells", "environment",
	"nsswitch.conf", "mime.types", "login.defs", "skel", "magic", "magic.mime",
	"resolv.conf", "gai.conf", "protocols", "services", "ethertypes", "rpc",
	"python3", "perl", "bindresvport.blacklist",
}

// buildHostImage makes the image under imagesDir if it is missing or stale.
// Files are owned by the sandbox's root (ids.HostID on the host) so that
// root inside can change them through the writable layer.
func buildHostImage(imagesDir string, ids runtime.IDMap) (hostImage, error) {
	name := "host-v" + hostImageVersion + "-" + strconv.FormatUint(uint64(ids.HostID), 10)
	dir := filepath.Join(imagesDir, name)
	img := hostImage{dir: dir}
	for _, d := range systemDirs {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			img.mounts = append(img.mounts, runtime.Mount{Source: d, Target: d, ReadOnly: true})
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ".berth-image")); err == nil {
		return img, nil
	}
	tmp, err := os.MkdirTemp(imagesDir, ".build-")
	if err != nil {
		return hostImage{}, err
	}
	defer os.RemoveAll(tmp)
	if err := populateHostImage(tmp, int(ids.HostID)); err != nil {
		return hostImage{}, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return hostImage{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return hostImage{}, err
	}
	return img, nil
}

func populateHostImage(root string, base int) error {
	uid := func(inside int) int { return base + inside }
	mk := func(rel string, mode os.FileMode, owner int) error {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
		return os.Lchown(p, uid(owner), uid(owner))
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	if err := os.Lchown(root, uid(0), uid(0)); err != nil {
		return err
	}
	for _, d := range []struct {
		rel   string
		mode  os.FileMode
		owner int
	}{
		{"etc", 0o755, 0}, {"root", 0o700, 0}, {"home", 0o755, 0}, {"home/user", 0o750, 1000},
		{"tmp", 0o777 | os.ModeSticky, 0}, {"var", 0o755, 0}, {"var/tmp", 0o777 | os.ModeSticky, 0},
		{"var/log", 0o755, 0}, {"var/cache", 0o755, 0}, {"var/lib", 0o755, 0}, {"run", 0o755, 0},
		{"mnt", 0o755, 0}, {"opt", 0o755, 0}, {"srv", 0o755, 0}, {"proc", 0o555, 0}, {"sys", 0o555, 0},
		{"dev", 0o755, 0},
	} {
		if err := mk(d.rel, d.mode, d.owner); err != nil {
			return fmt.Errorf("image dir %s: %w", d.rel, err)
		}
	}
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		if err != nil {
			continue
		}
		rel := strings.TrimPrefix(d, "/")
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(d)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(root, rel)); err != nil {
				return err
			}
			os.Lchown(filepath.Join(root, rel), uid(0), uid(0))
		} else if fi.IsDir() {
			if err := mk(rel, 0o755, 0); err != nil {
				return err
			}
		}
	}
	for _, rel := range etcAllowlist {
		if err := copyTree(filepath.Join("/etc", rel), filepath.Join(root, "etc", rel), uid(0)); err != nil {
			return fmt.Errorf("copy /etc/%s: %w", rel, err)
		}
	}
	users := map[string]string{
		"passwd": "root:x:0:0:root:/root:/bin/bash\n" +
			"user:x:1000:1000:user:/home/user:/bin/bash\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"group":    "root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n",
		"hostname": "sandbox\n",
		"hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	}
	for name, content := range users {
		p := filepath.Join(root, "etc", name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
		if err := os.Lchown(p, uid(0), uid(0)); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(root, ".berth-image"), []byte(hostImageVersion+"\n"), 0o644)
}

// copyTree copies src to dst (files, directories and symlinks as symlinks),
// owned by owner. A missing src is skipped.
func copyTree(src, dst string, owner int) error {
	if _, err := os.Lstat(src); os.IsNotExist(err) {
		return nil
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, out); err != nil {
				return err
			}
		case info.IsDir():
			if err := os.MkdirAll(out, info.Mode().Perm()); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := os.WriteFile(out, b, info.Mode().Perm()&0o755); err != nil {
				return err
			}
		default:
			return nil // sockets, fifos and devices have no place in an image
		}
		return os.Lchown(out, owner, owner)
	})
}
