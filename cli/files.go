package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
)

// sandboxPath splits "ID:/path"; ok is false for a local path.
func sandboxPath(arg string) (id, p string, ok bool) {
	id, p, ok = strings.Cut(arg, ":")
	if !ok || id == "" || strings.ContainsAny(id, "/\\") {
		return "", "", false
	}
	if p == "" {
		p = "."
	}
	return id, p, true
}

func cpCommand(connect connector) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "cp SRC DEST",
		Short: "Copy files between a sandbox and the local machine",
		Long: `Copy files like docker cp: one side is ID:PATH (a relative PATH starts at the
sandbox's working directory), the other a local path, or - for a tar stream on
stdin or stdout. A directory is copied with its contents; copying into an
existing directory puts the source inside it under its own name.`,
		Example: "  berth cp report.csv sb-123:/home/user/data/\n  berth cp sb-123:/home/user/out ./out\n  tar c src | berth cp - sb-123:/home/user",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			srcID, srcPath, srcIn := sandboxPath(args[0])
			dstID, dstPath, dstIn := sandboxPath(args[1])
			ctx, opts := cmd.Context(), client.FileOptions{User: user}
			switch {
			case srcIn && dstIn:
				return usageError(cmd, "copying between two sandboxes: copy out, then in")
			case !srcIn && !dstIn:
				return usageError(cmd, "one of SRC and DEST must be ID:PATH")
			case srcIn:
				return copyOut(ctx, cmd, c, srcID, srcPath, args[1], opts)
			default:
				return copyIn(ctx, cmd, c, args[0], dstID, dstPath, opts)
			}
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "act as this user inside (default: the sandbox's user)")
	return cmd
}

func usageError(cmd *cobra.Command, msg string) error {
	return errdefs.New(errdefs.InvalidArgument, "%s (see %s --help)", msg, cmd.CommandPath())
}

// copyOut copies ID:srcPath to a local path or, for "-", a tar stream on stdout.
func copyOut(ctx context.Context, cmd *cobra.Command, c *client.Client, id, srcPath, dst string, opts client.FileOptions) error {
	rc, err := c.DownloadArchive(ctx, id, srcPath, opts)
	if err != nil {
		return err
	}
	defer rc.Close()
	if dst == "-" {
		_, err := io.Copy(cmd.OutOrStdout(), rc)
		return err
	}
	// Into an existing directory: under the source's own name. Else the
	// destination is the new name of the source's top entry.
	dir, rename := dst, ""
	if st, err := os.Stat(dst); err != nil || !st.IsDir() {
		dir, rename = filepath.Dir(dst), filepath.Base(dst)
	}
	return extractLocal(rc, dir, rename)
}

// extractLocal unpacks a tar stream from a sandbox into dir. The stream is
// hostile: os.Root keeps every entry, link and symlink lookup inside dir.
func extractLocal(r io.Reader, dir, rename string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return errdefs.Wrap(errdefs.InvalidArgument, err, "destination %s", dir)
	}
	defer root.Close()
	tr := tar.NewReader(r)
	top := ""
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errdefs.Wrap(errdefs.Unavailable, err, "tar stream from the sandbox")
		}
		name := path.Clean(strings.TrimLeft(h.Name, "/"))
		if name == "." || name == ".." || strings.HasPrefix(name, "../") {
			return errdefs.New(errdefs.Unavailable, "the sandbox sent an entry outside the copy: %q", h.Name)
		}
		first, rest, _ := strings.Cut(name, "/")
		if top == "" {
			top = first
		}
		if rename != "" && first == top {
			name = path.Join(rename, rest)
		}
		mode := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			err = root.MkdirAll(name, 0o755)
			if err == nil {
				err = root.Chmod(name, mode|0o700)
			}
		case tar.TypeReg:
			if err = root.MkdirAll(path.Dir(name), 0o755); err != nil {
				break
			}
			root.Remove(name) // replace, never write through a symlink
			var f *os.File
			if f, err = root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode); err != nil {
				break
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		case tar.TypeSymlink:
			if err = root.MkdirAll(path.Dir(name), 0o755); err == nil {
				root.Remove(name)
				err = root.Symlink(h.Linkname, name)
			}
		case tar.TypeLink:
			target := path.Clean(strings.TrimLeft(h.Linkname, "/"))
			if f, r, _ := strings.Cut(target, "/"); rename != "" && f == top {
				target = path.Join(rename, r)
			}
			root.Remove(name)
			err = root.Link(target, name)
		default:
			continue // FIFOs and the rest are not recreated locally
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
		}
	}
}

// copyIn copies a local path (or a tar stream on stdin for "-") to ID:dstPath.
func copyIn(ctx context.Context, cmd *cobra.Command, c *client.Client, src, id, dstPath string, opts client.FileOptions) error {
	if src == "-" {
		_, err := c.UploadArchive(ctx, id, dstPath, cmd.InOrStdin(), opts)
		return err
	}
	st, err := os.Lstat(src)
	if err != nil {
		return errdefs.Wrap(errdefs.InvalidArgument, err, "source")
	}
	// Into an existing directory: under the source's own name.
	target := dstPath
	isDir := strings.HasSuffix(dstPath, "/")
	if fi, err := c.Stat(ctx, id, api.StatRequest{Where: api.Where{User: opts.User}, Path: dstPath}); err == nil && fi.Type == "dir" {
		isDir = true
	} else if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if isDir {
		target = path.Join(dstPath, filepath.Base(src))
	}
	if st.Mode().IsRegular() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		m := uint32(st.Mode().Perm())
		opts.Mode = &m
		_, err = c.Upload(ctx, id, target, f, opts)
		return err
	}
	if !st.IsDir() {
		return errdefs.New(errdefs.InvalidArgument, "source %s: not a file or directory", src)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeLocalTar(pw, src, path.Base(target))) }()
	defer pr.Close()
	_, err = c.UploadArchive(ctx, id, path.Dir(target), pr, opts)
	return err
}

// writeLocalTar writes the tree at dir as a tar stream whose top is named top.
func writeLocalTar(w io.Writer, dir, top string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		name := path.Join(top, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return nil // sockets and devices are left out
		}
		h.Name, h.Uname, h.Gname, h.Uid, h.Gid = name, "", "", 0, 0
		if info.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, h.Size)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func fsCommand(connect connector) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "fs",
		Short: "Work with a sandbox's files: ls, cat, stat, mkdir, mv, rm, watch",
	}
	cmd.PersistentFlags().StringVarP(&user, "user", "u", "", "act as this user inside (default: the sandbox's user)")
	where := func() api.Where { return api.Where{User: user} }
	run := func(use, short string, nargs int, fn func(cmd *cobra.Command, c *client.Client, args []string) error) *cobra.Command {
		return &cobra.Command{Use: use, Short: short, Args: cobra.ExactArgs(nargs),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := connect()
				if err != nil {
					return err
				}
				return fn(cmd, c, args)
			}}
	}

	var depth int
	var asJSON bool
	ls := run("ls ID PATH", "List a directory", 2, func(cmd *cobra.Command, c *client.Client, args []string) error {
		res, err := c.List(cmd.Context(), args[0], api.ListRequest{Where: where(), Path: args[1], Depth: depth})
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), res)
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		for _, e := range res.Entries {
			name := e.Path
			if e.Type == "symlink" {
				name += " -> " + e.Target
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", modeString(e), e.Owner, e.Group, e.Size, e.ModifiedAt.Local().Format(time.DateTime), name)
		}
		if res.Truncated {
			fmt.Fprintln(cmd.ErrOrStderr(), "berth: listing truncated")
		}
		return tw.Flush()
	})
	ls.Flags().IntVarP(&depth, "depth", "d", 1, "levels to list (1 to 32)")
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	cat := run("cat ID PATH", "Print a file", 2, func(cmd *cobra.Command, c *client.Client, args []string) error {
		rc, err := c.Download(cmd.Context(), args[0], args[1], client.FileOptions{User: user})
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(cmd.OutOrStdout(), rc)
		return err
	})

	stat := run("stat ID PATH", "Describe a path as JSON", 2, func(cmd *cobra.Command, c *client.Client, args []string) error {
		fi, err := c.Stat(cmd.Context(), args[0], api.StatRequest{Where: where(), Path: args[1]})
		if err != nil {
			return err
		}
		return printJSON(cmd.OutOrStdout(), fi)
	})

	var parents bool
	mkdir := run("mkdir ID PATH", "Make a directory", 2, func(cmd *cobra.Command, c *client.Client, args []string) error {
		_, err := c.Mkdir(cmd.Context(), args[0], api.MkdirRequest{Where: where(), Path: args[1], Parents: parents})
		return err
	})
	mkdir.Flags().BoolVarP(&parents, "parents", "p", false, "make parents as needed; an existing directory is fine")

	var overwrite bool
	mv := run("mv ID FROM TO", "Rename a file or directory", 3, func(cmd *cobra.Command, c *client.Client, args []string) error {
		_, err := c.Move(cmd.Context(), args[0], api.MoveRequest{Where: where(), From: args[1], To: args[2], Overwrite: overwrite})
		return err
	})
	mv.Flags().BoolVarP(&overwrite, "force", "f", false, "replace an existing TO")

	var recursive, force bool
	rm := run("rm ID PATH", "Remove a file, or a directory with -r", 2, func(cmd *cobra.Command, c *client.Client, args []string) error {
		return c.Remove(cmd.Context(), args[0], api.RemoveRequest{Where: where(), Path: args[1], Recursive: recursive, Force: force})
	})
	rm.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove a directory and its contents")
	rm.Flags().BoolVarP(&force, "force", "f", false, "a missing path is fine")

	var watchRecursive bool
	watch := run("watch ID PATH", "Print changes under a directory until interrupted", 2, func(cmd *cobra.Command, c *client.Client, args []string) error {
		w, err := c.Watch(cmd.Context(), args[0], args[1], watchRecursive, client.FileOptions{User: user})
		if err != nil {
			return err
		}
		defer w.Close()
		for {
			ev, err := w.Next()
			if errors.Is(err, io.EOF) || cmd.Context().Err() != nil {
				return nil
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s\n", ev.Time.Local().Format(time.TimeOnly), ev.Type, ev.Path)
		}
	})
	watch.Flags().BoolVarP(&watchRecursive, "recursive", "r", false, "also watch the directories below")

	cmd.AddCommand(ls, cat, stat, mkdir, mv, rm, watch)
	return cmd
}

// modeString renders a file's type and permission bits as ls does.
func modeString(e api.FileInfo) string {
	t := map[string]string{"dir": "d", "symlink": "l", "fifo": "p", "socket": "s", "char_device": "c", "block_device": "b"}[e.Type]
	if t == "" {
		t = "-"
	}
	perm := fs.FileMode(e.Mode & 0o777).String()[1:]
	return t + perm
}
