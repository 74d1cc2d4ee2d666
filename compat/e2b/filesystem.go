package e2b

import (
	"time"

	"github.com/berthsh/berth/api/e2b/envd/filesystem/filesystemconnect"
)

// filesystemService is envd's filesystem.Filesystem over the manager's
// file operations.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	g *Group
}

// watchers are the polled watchers of CreateWatcher.
type watchers struct{}

func newWatchers(now func() time.Time) *watchers { return &watchers{} }

func (w *watchers) closeAll() {}
