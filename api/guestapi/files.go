package guestapi

import "time"

// File routes, relative to the guest's HTTP root. Every path in a request is
// resolved by the guest inside the sandbox; a relative one is taken from Cwd
// (or the acting user's home). Requests act as User (default: the guest's own
// identity, root inside), with that user's permissions.
const (
	// GET ?path=&user= -> the file's bytes; PUT ?path=&user=&mode= with the
	// bytes as body -> FileInfo (written to a temporary file, then renamed).
	PathFiles = "/guest/v1/files"
	// GET ?path=&user= -> a tar stream of path (a file or a tree);
	// PUT ?path=&user= with a tar stream -> ArchiveResult (extracted beside,
	// then moved into path: a bad stream leaves nothing behind).
	PathArchive = "/guest/v1/archive"
	// PUT ?path=&user= with a layer tar -> ApplyResult: the tar is applied
	// onto the directory path (normally "/") as an image layer is (see
	// FeatureApply). An apply has a route of its own so that a guest that
	// predates it answers not_found instead of extracting the whiteouts as
	// files.
	PathApply = "/guest/v1/apply"
	// POST {PathFS}/{op} with the op's request -> its result, for the ops below.
	PathFS = "/guest/v1/fs"
	// GET ?path=&recursive=&user= -> NDJSON WatchEvent stream.
	PathWatch = "/guest/v1/watch"
)

// The file operations served under PathFS, with their request and result types.
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

// Where is who acts and where relative paths start; every file request has it.
type Where struct {
	// User acts: a name or uid[:gid] inside the sandbox. The daemon fills the
	// sandbox's default user.
	User string `json:"user,omitempty"`
	// Cwd is where a relative path starts (default: the user's home).
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

// FeatureApply: the guest serves PathApply. It applies a layer tar in the
// OCI image layer format (what layerdiff writes) onto a directory, which
// must exist (not_found):
//
//   - Entry names are relative to the directory; a leading "/" is dropped,
//     and a name that leads outside is refused. An entry for the directory
//     itself (".") is skipped, as for PathArchive.
//   - The stream must end with tar's end-of-archive marker: one cut short,
//     even between two entries, is refused. Every refusal of the stream is
//     invalid_argument naming the entry.
//   - ".wh.NAME" removes NAME (a file, a symlink or a whole tree) from the
//     directory at the destination; a missing NAME is fine. ".wh..wh..opq"
//     in directory D removes everything D held at the destination. Both
//     apply to what the destination held before: a tar may remove a path
//     and put a new one there. Other ".wh..wh." names, and names below a
//     ".wh." component, are refused.
//   - Every other entry replaces what is at its path: a file over a file
//     (renamed over it, so a reader sees the old file or the new one), a
//     directory over a file or symlink, a file over a directory tree. A
//     directory over a directory merges, and takes the entry's metadata
//     once its contents are in. A directory the tar only implies (a parent
//     with no entry of its own) merges into a directory and keeps its
//     metadata; over anything else it is a conflict. Nothing at the
//     destination is followed: a symlink there is replaced, not entered.
//   - Hard links within the tar, symlinks (stored as given) and FIFOs are
//     made; devices and sparse files are refused, as for PathArchive. A
//     name given twice takes the later entry, but an earlier directory is
//     not replaced by a later non-directory (refused).
//   - Acting as root (the default), the owner (numeric ids; names are
//     ignored), the mode with setuid, setgid and sticky, the mtime and the
//     "user." extended attributes (on files and directories; overlayfs's
//     own "user.overlay." ones are left out) are applied as the tar gives
//     them: the guest is root of the sandbox's user namespace, so none
//     gives more than root inside already has, and an id outside the
//     sandbox's mapping is refused. Acting as another user, entries belong
//     to that user and take mode and mtime only, as PathArchive's do.
//   - /proc, /sys and /dev are the kernel's: an entry or whiteout below
//     them, or a whiteout of one, is refused naming the path; a directory
//     entry for one of them is skipped, and an opaque root leaves them.
//   - Mount points inside the destination are not removed or replaced
//     (conflict, naming the mount point); files are copied into a mounted
//     directory (each written beside its path, then renamed over it).
//
// The whole stream is staged first, in a hidden directory at the
// destination (same file system, so entries are renamed into place), and
// every refusal above happens before anything at the destination changes:
// a malformed, truncated or hostile stream leaves the destination as it
// was. A failure after that (a full disk, a permission the acting user
// lacks) stops the apply there and is reported; each file is then either
// the old one or the new one.
const FeatureApply = "apply"

// ApplyResult says what an apply did: Entries written (files, directories,
// links), Whiteouts applied (".wh." and opaque markers) and Bytes of file
// content.
type ApplyResult struct {
	Entries   int   `json:"entries"`
	Whiteouts int   `json:"whiteouts"`
	Bytes     int64 `json:"bytes"`
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

// Bounds shared by both sides.
const (
	MaxPathLen     = 4096
	MaxBatchBytes  = 64 << 20 // total content of a batch upload or download
	MaxBatchFiles  = 10000
	MaxTextBytes   = 64 << 20 // read, write and edit work on files up to this size
	MaxGlobResults = 100000
	MaxGrepResults = 100000
)

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
