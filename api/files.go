package api

import "time"

// The file API's wire types. The daemon hands each request to the sandbox's
// guest agent, which resolves every path inside the sandbox as the acting
// user; the guest protocol has types of its own (api/guestapi), and the
// manager converts between the two in one place (sandbox/wire.go), so the
// public API and the guest protocol can change apart.

// The file operations of POST /v1/sandboxes/{id}/fs/{op}, with their
// request and result types.
const (
	OpStat     = "stat"     // StatRequest -> FileInfo
	OpExists   = "exists"   // StatRequest -> ExistsResult
	OpList     = "list"     // ListRequest -> ListResult
	OpMkdir    = "mkdir"    // MkdirRequest -> FileInfo
	OpMove     = "move"     // MoveRequest -> FileInfo
	OpRemove   = "remove"   // RemoveRequest -> (nothing)
	OpChmod    = "chmod"    // ChmodRequest -> FileInfo
	OpChown    = "chown"    // ChownRequest -> FileInfo
	OpRead     = "read"     // ReadRequest -> ReadResult
	OpWrite    = "write"    // WriteRequest -> FileInfo
	OpEdit     = "edit"     // EditRequest -> EditResult
	OpGlob     = "glob"     // GlobRequest -> GlobResult
	OpGrep     = "grep"     // GrepRequest -> GrepResult
	OpUpload   = "upload"   // UploadRequest -> UploadResult (a batch)
	OpDownload = "download" // DownloadRequest -> DownloadResult (a batch)
)

// File types in FileInfo.Type.
const (
	TypeFile        = "file"
	TypeDir         = "dir"
	TypeSymlink     = "symlink"
	TypeFIFO        = "fifo"
	TypeSocket      = "socket"
	TypeCharDevice  = "char_device"
	TypeBlockDevice = "block_device"
)

// Where is who acts and where relative paths start; every file request has
// it. Paths resolve inside the sandbox, with that user's permissions.
type Where struct {
	// User acts: a name or uid[:gid] inside the sandbox (default: the
	// sandbox's user).
	User string `json:"user,omitempty"`
	// Cwd is where a relative path starts (default: the sandbox's workdir).
	Cwd string `json:"cwd,omitempty"`
}

// FileInfo describes one file.
type FileInfo struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the permission bits, with setuid, setgid and sticky (07777).
	Mode       uint32    `json:"mode"`
	UID        uint32    `json:"uid"`
	GID        uint32    `json:"gid"`
	Owner      string    `json:"owner,omitempty"`
	Group      string    `json:"group,omitempty"`
	ModifiedAt time.Time `json:"modified_at"`
	// Target is where a symlink points, as stored (not resolved).
	Target string `json:"target,omitempty"`
}

// StatRequest names one path. NoFollow describes a final symlink itself.
type StatRequest struct {
	Where
	Path     string `json:"path"`
	NoFollow bool   `json:"no_follow,omitempty"`
}

// ExistsResult answers OpExists.
type ExistsResult struct {
	Exists bool   `json:"exists"`
	Type   string `json:"type,omitempty"`
}

// ListRequest lists a directory to Depth levels (default 1, at most 32).
type ListRequest struct {
	Where
	Path  string `json:"path"`
	Depth int    `json:"depth,omitempty"`
	// Limit bounds the entries (default and maximum 100,000).
	Limit int `json:"limit,omitempty"`
}

// ListResult is a directory listing, sorted by path.
type ListResult struct {
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated,omitempty"`
}

// MkdirRequest makes a directory; Parents makes missing parents and accepts an
// existing directory (mkdir -p). Mode defaults to 0755.
type MkdirRequest struct {
	Where
	Path    string  `json:"path"`
	Parents bool    `json:"parents,omitempty"`
	Mode    *uint32 `json:"mode,omitempty"`
}

// MoveRequest renames From to To. Without Overwrite an existing To is an
// already_exists error.
type MoveRequest struct {
	Where
	From      string `json:"from"`
	To        string `json:"to"`
	Overwrite bool   `json:"overwrite,omitempty"`
}

// RemoveRequest removes a file, a symlink (not its target) or an empty
// directory; Recursive removes a tree. A missing path is not_found unless Force.
type RemoveRequest struct {
	Where
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
	Force     bool   `json:"force,omitempty"`
}

// ChmodRequest sets permission bits (07777).
type ChmodRequest struct {
	Where
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
}

// ChownRequest sets the owner: "name", "uid", "name:group" or "uid:gid".
type ChownRequest struct {
	Where
	Path      string `json:"path"`
	Owner     string `json:"owner"`
	Recursive bool   `json:"recursive,omitempty"`
}

// ReadRequest reads text lines: Offset lines are skipped (0-based), then up
// to Limit lines (default 2,000) are returned, each cut at MaxLineChars
// characters (default 2,000, at most 16,777,216). An offset past the end
// gives no lines (TotalLines says how many there are).
type ReadRequest struct {
	Where
	Path         string `json:"path"`
	Offset       int    `json:"offset,omitempty"`
	Limit        int    `json:"limit,omitempty"`
	MaxLineChars int    `json:"max_line_chars,omitempty"`
}

// Line is one line of a text file.
type Line struct {
	// Number is 1-based.
	Number    int    `json:"number"`
	Text      string `json:"text"`
	Truncated bool   `json:"truncated,omitempty"`
}

// ReadResult is a page of a text file. A binary file (a NUL byte in its first
// 8 KiB) has Binary set and no lines.
type ReadResult struct {
	Path       string `json:"path"`
	Size       int64  `json:"size"`
	Binary     bool   `json:"binary,omitempty"`
	Lines      []Line `json:"lines"`
	TotalLines int    `json:"total_lines"`
	// NextOffset is the Offset that reads on; 0 when the page reached the end.
	NextOffset int `json:"next_offset"`
}

// WriteRequest writes text, making missing parents. With CreateOnly an
// existing file is an already_exists error. Mode applies to a new file
// (default 0644).
type WriteRequest struct {
	Where
	Path       string  `json:"path"`
	Content    string  `json:"content"`
	CreateOnly bool    `json:"create_only,omitempty"`
	Mode       *uint32 `json:"mode,omitempty"`
}

// EditRequest replaces Old with New: exactly one occurrence, or all of them
// with ReplaceAll.
type EditRequest struct {
	Where
	Path       string `json:"path"`
	Old        string `json:"old"`
	New        string `json:"new"`
	ReplaceAll bool   `json:"replace_all,omitempty"`
}

// EditResult says how many occurrences were replaced.
type EditResult struct {
	Path        string `json:"path"`
	Occurrences int    `json:"occurrences"`
}

// GlobRequest finds files under Path (default: cwd) matching Pattern, where
// "*", "?" and "[...]" match within one path segment, "**" any number of
// segments (not entering dot-directories), and "{a,b}" alternatives. A
// pattern without "/" matches the file name at any depth; one with "/" the
// path relative to Path; a leading "/" anchors to Path. A wildcard does not
// match a leading dot. Limit defaults to 10,000.
type GlobRequest struct {
	Where
	Pattern string `json:"pattern"`
	Path    string `json:"path,omitempty"`
	Limit   int    `json:"limit,omitempty"`
	// IncludeDirs matches directories too (only regular files otherwise).
	IncludeDirs bool `json:"include_dirs,omitempty"`
}

// GlobResult lists matches sorted by path.
type GlobResult struct {
	Matches   []FileInfo `json:"matches"`
	Truncated bool       `json:"truncated,omitempty"`
}

// GrepRequest searches text files under Path (a file or a tree) for Pattern,
// literal unless Regex (RE2 syntax). Glob filters files by the same syntax
// as GlobRequest, matched against the path relative to Path (a pattern
// without "/" matches the file name). Binary files are skipped. Limit bounds
// the matches (default 1,000); each line is cut at 2,000 characters.
type GrepRequest struct {
	Where
	Pattern    string `json:"pattern"`
	Path       string `json:"path,omitempty"`
	Glob       string `json:"glob,omitempty"`
	Regex      bool   `json:"regex,omitempty"`
	IgnoreCase bool   `json:"ignore_case,omitempty"`
	Limit      int    `json:"limit,omitempty"`
}

// GrepMatch is one matching line.
type GrepMatch struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Text string `json:"text"`
}

// GrepResult lists matches by path, then line.
type GrepResult struct {
	Matches       []GrepMatch `json:"matches"`
	Truncated     bool        `json:"truncated,omitempty"`
	FilesSearched int         `json:"files_searched"`
}

// UploadFile is one file of a batch upload.
type UploadFile struct {
	Path    string  `json:"path"`
	Content []byte  `json:"content"`
	Mode    *uint32 `json:"mode,omitempty"`
}

// UploadRequest writes many files; each succeeds or fails on its own.
type UploadRequest struct {
	Where
	Files []UploadFile `json:"files"`
}

// FileError is the error of one path in a batch.
type FileError struct {
	Class   string `json:"class"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message"`
}

// FileResult is one path's outcome in a batch; Error is nil on success.
type FileResult struct {
	Path    string     `json:"path"`
	Content []byte     `json:"content,omitempty"`
	Error   *FileError `json:"error,omitempty"`
}

// UploadResult has one result per file, in request order.
type UploadResult struct {
	Results []FileResult `json:"results"`
}

// DownloadRequest reads many files.
type DownloadRequest struct {
	Where
	Paths []string `json:"paths"`
}

// DownloadResult has one result per path, in request order, with Content.
type DownloadResult struct {
	Results []FileResult `json:"results"`
}

// ArchiveResult says what a tar upload wrote.
type ArchiveResult struct {
	Entries int   `json:"entries"`
	Bytes   int64 `json:"bytes"`
}

// Watch event kinds.
const (
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	WatchRename = "rename"
	WatchChmod  = "chmod"
	// WatchOverflow says events were lost (the kernel's queue overflowed).
	WatchOverflow = "overflow"
)

// WatchEvent is one NDJSON line of a watch stream.
type WatchEvent struct {
	Type  string    `json:"type"`
	Path  string    `json:"path,omitempty"`
	IsDir bool      `json:"is_dir,omitempty"`
	Time  time.Time `json:"time"`
}

// Bounds of file requests.
const (
	MaxPathLen     = 4096
	MaxBatchBytes  = 64 << 20 // total content of a batch upload or download
	MaxBatchFiles  = 10000
	MaxTextBytes   = 64 << 20 // read, write and edit work on files up to this size
	MaxGlobResults = 100000
	MaxGrepResults = 100000
)

// ActingUser is the user a request acts as ("" for the sandbox's).
func (w Where) ActingUser() string { return w.User }

// Defaults fills the user and working directory a request leaves out;
// every file request embeds Where, so each has this method.
func (w *Where) Defaults(user, cwd string) {
	if w.User == "" {
		w.User = user
	}
	if w.Cwd == "" {
		w.Cwd = cwd
	}
}
