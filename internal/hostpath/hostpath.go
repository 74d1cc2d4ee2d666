// Package hostpath checks host directories that sandboxes must reach: a
// sandbox's init is an unprivileged uid on the host and opens its layers by
// path before it pivots, so every parent of such a directory must let
// others search it.
package hostpath

import (
	"fmt"
	"os"
	"path/filepath"
)

// UnsearchableError is a parent directory that others cannot search.
type UnsearchableError struct {
	Dir  string
	Mode os.FileMode
}

func (e *UnsearchableError) Error() string {
	return fmt.Sprintf("%s has mode %o: sandboxes need it searchable by others (chmod o+x %s)", e.Dir, e.Mode, e.Dir)
}

// CheckSearchable returns an error (an *UnsearchableError) naming the first parent of dir that
// others cannot search (chmod o+x fixes it).
func CheckSearchable(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return &UnsearchableError{Dir: p, Mode: fi.Mode().Perm()}
		}
		if p == "/" {
			return nil
		}
	}
}
