package image

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/berthsh/berth/errdefs"
)

// Archives are stopped sandboxes' writable layers, kept compressed while
// their directories are freed (a lifetime's archive_after): a layer tar
// (ids as the sandbox sees them, whiteouts in the OCI format) in gzip, one
// file per sandbox, restored into a new writable layer by the same
// unpacker as a pulled layer's.

var archiveNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9-]{1,64}$`) })

func (s *Store) archivePath(name string) (string, error) {
	if !archiveNameRE().MatchString(name) {
		return "", errdefs.New(errdefs.InvalidArgument, "archive name %q", name)
	}
	return filepath.Join(s.dir, "archives", name+".tar.gz"), nil
}

// WriteArchive stores what write writes (a layer tar) compressed as
// archive name, durably: written beside, synced, renamed. It returns the
// archive's size. On error nothing of it is left.
func (s *Store) WriteArchive(ctx context.Context, name string, write func(io.Writer) error) (int64, error) {
	p, err := s.archivePath(name)
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return 0, fmt.Errorf("archives: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-"+name+"-")
	if err != nil {
		return 0, fmt.Errorf("archives: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if tmp != "" {
			f.Close()
			os.Remove(tmp)
		}
	}()
	zw, err := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if err != nil {
		return 0, err
	}
	if err := write(zw); err != nil {
		return 0, err
	}
	if err := zw.Close(); err != nil {
		return 0, fmt.Errorf("archive %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("archive %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("archive %s: %w", name, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return 0, fmt.Errorf("archive %s: %w", name, err)
	}
	tmp = ""
	return st.Size(), syncDir(filepath.Dir(p))
}

// RestoreArchive unpacks archive name into directory dir (an empty
// writable layer) with every id moved up by base (the sandbox's range).
func (s *Store) RestoreArchive(ctx context.Context, name, dir string, base int) error {
	p, err := s.archivePath(name)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.New(errdefs.NotFound, "the archive of %s is gone from the store", name)
	}
	if err != nil {
		return fmt.Errorf("archive %s: %w", name, err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("archive %s: %w", name, err)
	}
	// A sandbox's own layer: no image's limits, only a full disk stops it.
	b := &budget{lim: Limits{MaxBytes: 1 << 62, MaxEntries: 1 << 40, MinFree: 1}, dir: dir}
	if _, err := unpackLayerAt(dir, zr, b, base); err != nil {
		return fmt.Errorf("restore %s: %w", name, err)
	}
	return nil
}

// RemoveArchive deletes archive name; absent is not an error.
func (s *Store) RemoveArchive(name string) error {
	p, err := s.archivePath(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("archive %s: %w", name, err)
	}
	return nil
}
