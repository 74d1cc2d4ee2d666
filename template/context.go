package template

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/berthsh/berth/errdefs"
)

// Bounds of a build context.
const (
	maxContextBytes   = 16 << 30
	maxContextEntries = 1_000_000
)

// buildContext is the files COPY and ADD may name: the tar the client
// sent, indexed. Names are checked and file contents kept aside as
// numbered blobs, so nothing of the context is ever a path on the host
// and its symlinks point at nothing here; they are copied as symlinks.
type buildContext struct {
	dir     string
	entries map[string]*ctxEntry // by name relative to the context's root
	names   []string             // sorted
}

type ctxEntry struct {
	typ    byte // tar.TypeReg, TypeDir or TypeSymlink
	mode   int64
	link   string // a symlink's target
	blob   string // a file's content
	size   int64
	digest string // of a file's content
	hdr    tar.Header
}

// readContext indexes tar stream r into a new directory under dir.
func readContext(dir string, r io.Reader) (*buildContext, error) {
	tmp, err := os.MkdirTemp(dir, ".context-")
	if err != nil {
		return nil, fmt.Errorf("build context: %w", err)
	}
	c := &buildContext{dir: tmp, entries: map[string]*ctxEntry{"": {typ: tar.TypeDir, mode: 0o755}}}
	if err := c.read(r); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *buildContext) close() { os.RemoveAll(c.dir) }

func (c *buildContext) read(r io.Reader) error {
	tr := tar.NewReader(io.LimitReader(r, maxContextBytes+1))
	var total int64
	links := map[string]string{} // hard link -> target
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "build context: not a valid tar: %v", err)
		}
		if n >= maxContextEntries {
			return errdefs.New(errdefs.TooLarge, "build context: over %d entries", maxContextEntries)
		}
		name, err := cleanName(h.Name)
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "build context: entry %q: %v", h.Name, err)
		}
		if name == "" {
			continue
		}
		e := &ctxEntry{mode: h.Mode & 0o7777, hdr: *h}
		switch h.Typeflag {
		case tar.TypeDir:
			e.typ = tar.TypeDir
		case tar.TypeSymlink:
			e.typ, e.link = tar.TypeSymlink, h.Linkname
		case tar.TypeLink:
			target, err := cleanName(h.Linkname)
			if err != nil {
				return errdefs.New(errdefs.InvalidArgument, "build context: link %q: %v", h.Name, err)
			}
			links[name] = target
			continue
		case tar.TypeReg:
			e.typ = tar.TypeReg
			e.blob = filepath.Join(c.dir, strconv.Itoa(n))
			f, err := os.OpenFile(e.blob, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("build context: %w", err)
			}
			sum := sha256.New()
			e.size, err = io.Copy(io.MultiWriter(f, sum), tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return errdefs.New(errdefs.InvalidArgument, "build context: %s: %v", name, err)
			}
			e.digest = hex.EncodeToString(sum.Sum(nil))
			if total += e.size; total > maxContextBytes {
				return errdefs.New(errdefs.TooLarge, "build context: over %d bytes", int64(maxContextBytes))
			}
		default:
			continue // devices, fifos: nothing a template copies
		}
		c.add(name, e)
	}
	for name, target := range links {
		t, ok := c.entries[target]
		if !ok || t.typ != tar.TypeReg {
			return errdefs.New(errdefs.InvalidArgument, "build context: hard link %s to %s, which is not a file before it", name, target)
		}
		c.add(name, t)
	}
	for n := range c.entries {
		c.names = append(c.names, n)
	}
	slices.Sort(c.names)
	return nil
}

// add indexes e under name, with directories for its parents.
func (c *buildContext) add(name string, e *ctxEntry) {
	c.entries[name] = e
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		if _, ok := c.entries[d]; ok {
			break
		}
		c.entries[d] = &ctxEntry{typ: tar.TypeDir, mode: 0o755}
	}
}

// cleanName is a tar name relative to the context's root, or an error for
// one that climbs out of it.
func cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("the name holds a NUL byte")
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
		case "..":
			return "", fmt.Errorf("the name climbs out with \"..\"")
		default:
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "/"), nil
}

// file returns the content of a regular file of the context.
func (c *buildContext) file(name string) ([]byte, error) {
	e, ok := c.entries[name]
	if !ok || e.typ != tar.TypeReg {
		return nil, errdefs.New(errdefs.NotFound, "%s is not a file in the build context", name)
	}
	return os.ReadFile(e.blob)
}

// match returns the context's names that source pattern src names: one
// name, or those a wildcard matches. None is not_found.
func (c *buildContext) match(src string) ([]string, error) {
	p, err := cleanName(src)
	if err != nil {
		return nil, errdefs.New(errdefs.InvalidArgument, "source %q: %v", src, err)
	}
	var out []string
	if strings.ContainsAny(p, "*?[") {
		for _, n := range c.names {
			if ok, err := path.Match(p, n); err != nil {
				return nil, errdefs.New(errdefs.InvalidArgument, "source %q: %v", src, err)
			} else if ok {
				out = append(out, n)
			}
		}
	} else if _, ok := c.entries[p]; ok {
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errdefs.New(errdefs.NotFound, "source %q is not in the build context", src)
	}
	return out, nil
}

// isDir says whether name is a directory of the context.
func (c *buildContext) isDir(name string) bool {
	e, ok := c.entries[name]
	return ok && e.typ == tar.TypeDir
}

// copyTar writes the tar that copies sources into a directory: a
// directory's contents, a file or symlink under its own name, or, with
// rename set (one file to a file's path), under that name. Owners are
// root; every name, type, mode, link and content goes into sum, which is
// thus the step's input for the cache (times are not).
func (c *buildContext) copyTar(w io.Writer, sum hash.Hash, sources []string, rename string) error {
	tw := tar.NewWriter(w)
	put := func(name string, e *ctxEntry) error {
		h := &tar.Header{Name: name, Mode: e.mode, ModTime: e.hdr.ModTime, Format: tar.FormatPAX}
		switch e.typ {
		case tar.TypeDir:
			h.Typeflag, h.Name = tar.TypeDir, name+"/"
		case tar.TypeSymlink:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, e.size
		}
		fmt.Fprintf(sum, "%c %s %o %q %s\n", h.Typeflag, h.Name, h.Mode, h.Linkname, e.digest)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if e.typ != tar.TypeReg || e.size == 0 {
			return nil
		}
		f, err := os.Open(e.blob)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	}
	for _, src := range sources {
		e := c.entries[src]
		if e.typ != tar.TypeDir {
			name := path.Base(src)
			if rename != "" {
				name = rename
			}
			if err := put(name, e); err != nil {
				return err
			}
			continue
		}
		prefix := src + "/"
		if src == "" {
			prefix = ""
		}
		for _, n := range c.names {
			if n == "" || !strings.HasPrefix(n, prefix) {
				continue
			}
			if err := put(strings.TrimPrefix(n, prefix), c.entries[n]); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}
