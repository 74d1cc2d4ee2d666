package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/errdefs"
)

// Bounds of the file tools.
const (
	// DefaultReadLines is read_file's page when no limit is given.
	DefaultReadLines = 2000
	// MaxReadBytes bounds the text of one read_file page.
	MaxReadBytes = 256 << 10
	// MaxDownloadBytes bounds a file that download or a resource read
	// returns whole (base64 grows it by a third on the wire).
	MaxDownloadBytes = 16 << 20
	// MaxGlobMatches and MaxGrepMatches are the defaults of glob and grep.
	MaxGlobMatches = 1000
	MaxGrepMatches = 500
)

// The resource template of a sandbox's files: berth://sandbox/{id}/ then the
// absolute path without its leading slash, each segment URL-escaped.
const (
	resourcePrefix   = "berth://sandbox/"
	resourceTemplate = resourcePrefix + "{sandbox_id}/{+path}"
)

// FileURI is the resource URI of an absolute path in a sandbox.
func FileURI(id, p string) string {
	segs := strings.Split(strings.TrimPrefix(path.Clean("/"+p), "/"), "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return resourcePrefix + url.PathEscape(id) + "/" + strings.Join(segs, "/")
}

// parseFileURI is FileURI's inverse.
func parseFileURI(uri string) (id, p string, err error) {
	rest, ok := strings.CutPrefix(uri, resourcePrefix)
	if !ok {
		return "", "", fmt.Errorf("%q does not start with %s", uri, resourcePrefix)
	}
	rawID, rawPath, ok := strings.Cut(rest, "/")
	if !ok || rawID == "" {
		return "", "", fmt.Errorf("%q: want %s<sandbox id>/<path>", uri, resourcePrefix)
	}
	if id, err = url.PathUnescape(rawID); err != nil {
		return "", "", fmt.Errorf("%q: sandbox id: %v", uri, err)
	}
	if p, err = url.PathUnescape(rawPath); err != nil {
		return "", "", fmt.Errorf("%q: path: %v", uri, err)
	}
	return id, "/" + p, nil
}

type readInput struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path" jsonschema:"The file to read: absolute, or relative to the sandbox's workdir."`
	Offset    int    `json:"offset,omitempty" jsonschema:"Lines to skip first (0-based line offset; default 0). To read on, pass the next_offset of the previous page."`
	Limit     int    `json:"limit,omitempty" jsonschema:"Most lines to return (default 2000)."`
}

type readOutput struct {
	Path       string `json:"path"`
	Size       int64  `json:"size"`
	Binary     bool   `json:"binary,omitempty" jsonschema:"The file is not text: use download to get it as base64."`
	TotalLines int    `json:"total_lines"`
	Offset     int    `json:"offset"`
	// NextOffset reads on; 0 when this page reached the end.
	NextOffset int `json:"next_offset"`
	// Content is the page with line numbers, as cat -n shows it.
	Content string `json:"content"`
}

type writeInput struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path" jsonschema:"The file to write: absolute, or relative to the sandbox's workdir. Missing parent directories are made."`
	Content   string `json:"content" jsonschema:"The whole new content of the file (it replaces what was there)."`
}

type writeOutput struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

type editInput struct {
	SandboxID  string `json:"sandbox_id"`
	Path       string `json:"path" jsonschema:"The file to edit: absolute, or relative to the sandbox's workdir."`
	OldString  string `json:"old_string" jsonschema:"The exact text to replace, whitespace and indentation included. It must occur exactly once unless replace_all is true: give enough surrounding lines to make it unique."`
	NewString  string `json:"new_string" jsonschema:"The text to put in its place."`
	ReplaceAll bool   `json:"replace_all,omitempty" jsonschema:"Replace every occurrence of old_string instead of exactly one."`
}

type editOutput struct {
	Path        string `json:"path"`
	Occurrences int    `json:"occurrences"`
}

type lsInput struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path,omitempty" jsonschema:"The directory to list (default: the sandbox's workdir)."`
}

type entry struct {
	Path       string    `json:"path"`
	Type       string    `json:"type" jsonschema:"file, dir, symlink, fifo, socket, char_device or block_device"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modified_at"`
	Target     string    `json:"target,omitempty" jsonschema:"Where a symlink points."`
}

func entryOf(fi api.FileInfo) entry {
	return entry{Path: fi.Path, Type: fi.Type, Size: fi.Size, ModifiedAt: fi.ModifiedAt, Target: fi.Target}
}

// line is how ls and glob show an entry: directories end with a slash.
func (e entry) line() string {
	switch e.Type {
	case api.TypeDir:
		return e.Path + "/"
	case api.TypeSymlink:
		return e.Path + " -> " + e.Target
	case api.TypeFile:
		return fmt.Sprintf("%s (%d bytes)", e.Path, e.Size)
	}
	return e.Path + " (" + e.Type + ")"
}

type lsOutput struct {
	Entries   []entry `json:"entries"`
	Truncated bool    `json:"truncated,omitempty"`
}

type globInput struct {
	SandboxID string `json:"sandbox_id"`
	Pattern   string `json:"pattern" jsonschema:"Glob pattern: * and ? match within a path segment, ** any number of directories, {a,b} alternatives. A pattern without / matches file names at any depth (*.py), one with / matches paths relative to path (src/**/*.go)."`
	Path      string `json:"path,omitempty" jsonschema:"The directory to search under (default: the sandbox's workdir)."`
}

type globOutput struct {
	Matches   []entry `json:"matches"`
	Truncated bool    `json:"truncated,omitempty"`
}

type grepInput struct {
	SandboxID  string `json:"sandbox_id"`
	Pattern    string `json:"pattern" jsonschema:"The text to search for: literal, unless regex is true."`
	Path       string `json:"path,omitempty" jsonschema:"A file or directory to search (default: the sandbox's workdir)."`
	Glob       string `json:"glob,omitempty" jsonschema:"Only files matching this glob, e.g. *.py or src/**/*.ts."`
	Regex      bool   `json:"regex,omitempty" jsonschema:"Treat pattern as a regular expression (RE2 syntax)."`
	IgnoreCase bool   `json:"ignore_case,omitempty" jsonschema:"Match regardless of case."`
	Limit      int    `json:"limit,omitempty" jsonschema:"Most matching lines to return (default 500)."`
}

type grepOutput struct {
	Matches       []api.GrepMatch `json:"matches"`
	Truncated     bool            `json:"truncated,omitempty"`
	FilesSearched int             `json:"files_searched"`
}

type uploadInput struct {
	SandboxID string  `json:"sandbox_id"`
	Path      string  `json:"path" jsonschema:"Where to put the file: absolute, or relative to the sandbox's workdir. Missing parent directories are made; an existing file is replaced."`
	Text      *string `json:"text,omitempty" jsonschema:"The content as text (UTF-8). Give exactly one of text and base64."`
	Base64    *string `json:"base64,omitempty" jsonschema:"The content base64-encoded, for binary files. Give exactly one of text and base64."`
	Mode      string  `json:"mode,omitempty" jsonschema:"Permission bits in octal, e.g. 755 for a script (default: 644, or the existing file's)."`
}

type uploadOutput struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

type downloadInput struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path" jsonschema:"The file to download: absolute, or relative to the sandbox's workdir."`
	Encoding  string `json:"encoding,omitempty" jsonschema:"auto (the default: text for a text file, base64 and an embedded resource for a binary one), text, or base64."`
}

type downloadOutput struct {
	Path     string `json:"path"`
	URI      string `json:"uri" jsonschema:"The file as an MCP resource (resources/read)."`
	Size     int64  `json:"size"`
	MIMEType string `json:"mime_type"`
	Encoding string `json:"encoding" jsonschema:"text or base64: how content is given."`
	Content  string `json:"content"`
	// blob is a binary file's bytes, for the embedded resource.
	blob []byte
}

// extraContent embeds a binary file as a resource with its MIME type.
func (o downloadOutput) extraContent() []mcp.Content {
	if o.blob == nil {
		return nil
	}
	return []mcp.Content{&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: o.URI, MIMEType: o.MIMEType, Blob: o.blob}}}
}

// pathSchema marks path required and non-empty where a tool has it.
func pathSchema(s *jsonschema.Schema) {
	describeSandboxID(s)
	if p := s.Properties["path"]; p != nil && contains(s.Required, "path") {
		p.MinLength = ptr(1)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (b *backend) addFileTools(s *mcp.Server) {
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)}
	writes := &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)}

	addTool(s, &mcp.Tool{
		Name:  "read_file",
		Title: "Read a text file",
		Description: "Read a text file in the sandbox, with line numbers (as cat -n), a page of up to 2000 lines at a time " +
			"(offset and limit page through long files). The line numbers are not part of the file: leave them out of edit_file's old_string.",
		Annotations: readOnly,
	}, func(s *jsonschema.Schema) {
		pathSchema(s)
		s.Properties["offset"].Minimum = ptr(0.0)
		s.Properties["limit"].Minimum = ptr(1.0)
	}, b.readFile)

	addTool(s, &mcp.Tool{
		Name:        "write_file",
		Title:       "Write a text file",
		Description: "Write a text file in the sandbox, replacing it if it exists and making missing parent directories.",
		Annotations: writes,
	}, pathSchema, func(ctx context.Context, in writeInput) (writeOutput, string, error) {
		fi, err := b.c.Write(ctx, in.SandboxID, api.WriteRequest{Path: in.Path, Content: in.Content})
		if err != nil {
			return writeOutput{}, "", err
		}
		out := writeOutput{Path: fi.Path, Bytes: len(in.Content)}
		return out, fmt.Sprintf("Wrote %d bytes to %s", out.Bytes, out.Path), nil
	})

	addTool(s, &mcp.Tool{
		Name:  "edit_file",
		Title: "Edit a text file",
		Description: "Replace old_string with new_string in a text file of the sandbox: exactly one occurrence, or every one with replace_all. " +
			"old_string must match the file exactly (read_file first; leave out its line numbers).",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, func(s *jsonschema.Schema) {
		pathSchema(s)
		s.Properties["old_string"].MinLength = ptr(1)
	}, func(ctx context.Context, in editInput) (editOutput, string, error) {
		r, err := b.c.Edit(ctx, in.SandboxID, api.EditRequest{Path: in.Path, Old: in.OldString, New: in.NewString, ReplaceAll: in.ReplaceAll})
		if err != nil {
			return editOutput{}, "", err
		}
		out := editOutput{Path: r.Path, Occurrences: r.Occurrences}
		return out, fmt.Sprintf("Replaced %d occurrence(s) in %s", r.Occurrences, r.Path), nil
	})

	addTool(s, &mcp.Tool{
		Name:        "ls",
		Title:       "List a directory",
		Description: "List the entries of a directory in the sandbox (directories end with /, files show their size).",
		Annotations: readOnly,
	}, pathSchema, func(ctx context.Context, in lsInput) (lsOutput, string, error) {
		p := in.Path
		if p == "" {
			p = "."
		}
		r, err := b.c.List(ctx, in.SandboxID, api.ListRequest{Path: p})
		if err != nil {
			return lsOutput{}, "", err
		}
		out := lsOutput{Entries: make([]entry, 0, len(r.Entries)), Truncated: r.Truncated}
		lines := make([]string, 0, len(r.Entries))
		for _, fi := range r.Entries {
			e := entryOf(fi)
			out.Entries = append(out.Entries, e)
			lines = append(lines, e.line())
		}
		if len(lines) == 0 {
			return out, "The directory is empty.", nil
		}
		if r.Truncated {
			lines = append(lines, "[more entries not shown]")
		}
		return out, strings.Join(lines, "\n"), nil
	})

	addTool(s, &mcp.Tool{
		Name:        "glob",
		Title:       "Find files by name",
		Description: "Find files in the sandbox whose paths match a glob pattern such as **/*.py (sorted by path; dot-directories are not entered).",
		Annotations: readOnly,
	}, func(s *jsonschema.Schema) {
		describeSandboxID(s)
		s.Properties["pattern"].MinLength = ptr(1)
	}, func(ctx context.Context, in globInput) (globOutput, string, error) {
		r, err := b.c.Glob(ctx, in.SandboxID, api.GlobRequest{Pattern: in.Pattern, Path: in.Path, Limit: MaxGlobMatches})
		if err != nil {
			return globOutput{}, "", err
		}
		out := globOutput{Matches: make([]entry, 0, len(r.Matches)), Truncated: r.Truncated}
		lines := make([]string, 0, len(r.Matches))
		for _, fi := range r.Matches {
			e := entryOf(fi)
			out.Matches = append(out.Matches, e)
			lines = append(lines, e.Path)
		}
		if len(lines) == 0 {
			return out, "No files match " + in.Pattern, nil
		}
		if r.Truncated {
			lines = append(lines, fmt.Sprintf("[only the first %d matches are shown: narrow the pattern or the path]", MaxGlobMatches))
		}
		return out, strings.Join(lines, "\n"), nil
	})

	addTool(s, &mcp.Tool{
		Name:        "grep",
		Title:       "Search file contents",
		Description: "Search the text files under a path in the sandbox for a literal string (or a regular expression with regex=true). Returns path:line:text per matching line; binary files are skipped.",
		Annotations: readOnly,
	}, func(s *jsonschema.Schema) {
		describeSandboxID(s)
		s.Properties["pattern"].MinLength = ptr(1)
		s.Properties["limit"].Minimum = ptr(1.0)
	}, func(ctx context.Context, in grepInput) (grepOutput, string, error) {
		limit := in.Limit
		if limit == 0 {
			limit = MaxGrepMatches
		}
		r, err := b.c.Grep(ctx, in.SandboxID, api.GrepRequest{Pattern: in.Pattern, Path: in.Path, Glob: in.Glob, Regex: in.Regex,
			IgnoreCase: in.IgnoreCase, Limit: limit})
		if err != nil {
			return grepOutput{}, "", err
		}
		out := grepOutput{Matches: r.Matches, Truncated: r.Truncated, FilesSearched: r.FilesSearched}
		if out.Matches == nil {
			out.Matches = []api.GrepMatch{}
		}
		if len(r.Matches) == 0 {
			return out, fmt.Sprintf("No matches for %q (%d files searched).", in.Pattern, r.FilesSearched), nil
		}
		var b strings.Builder
		for _, m := range r.Matches {
			fmt.Fprintf(&b, "%s:%d:%s\n", m.Path, m.Line, m.Text)
		}
		if r.Truncated {
			fmt.Fprintf(&b, "[only the first %d matches are shown: raise limit or narrow the search]\n", limit)
		}
		return out, strings.TrimSuffix(b.String(), "\n"), nil
	})

	addTool(s, &mcp.Tool{
		Name:  "upload",
		Title: "Upload a file",
		Description: "Put a file into the sandbox, given as text or as base64 (for binary files), making missing parent directories. " +
			"An existing file is replaced.",
		Annotations: writes,
	}, pathSchema, b.upload)

	addTool(s, &mcp.Tool{
		Name:  "download",
		Title: "Download a file",
		Description: "Get a whole file from the sandbox (up to 16 MiB): a text file as text, a binary file as base64 " +
			"and as an embedded resource with its MIME type. For a page of a long text file, use read_file.",
		Annotations: readOnly,
	}, func(s *jsonschema.Schema) {
		pathSchema(s)
		s.Properties["encoding"].Enum = []any{"auto", "text", "base64"}
	}, b.download)
}

func (b *backend) readFile(ctx context.Context, in readInput) (readOutput, string, error) {
	limit := in.Limit
	if limit == 0 {
		limit = DefaultReadLines
	}
	r, err := b.c.Read(ctx, in.SandboxID, api.ReadRequest{Path: in.Path, Offset: in.Offset, Limit: limit})
	if err != nil {
		return readOutput{}, "", err
	}
	out := readOutput{Path: r.Path, Size: r.Size, Binary: r.Binary, TotalLines: r.TotalLines, Offset: in.Offset}
	switch {
	case r.Binary:
		return out, fmt.Sprintf("%s is a binary file (%d bytes), not text: use download to get it as base64.", r.Path, r.Size), nil
	case r.Size == 0:
		return out, "System reminder: File exists but has empty contents", nil
	case len(r.Lines) == 0:
		return out, "", invalid("offset", "line offset %d is past the end of %s, which has %d lines", in.Offset, r.Path, r.TotalLines)
	}
	var text strings.Builder
	next := r.NextOffset
	for i, ln := range r.Lines {
		s := fmt.Sprintf("%6d\t%s", ln.Number, ln.Text)
		if ln.Truncated {
			s += " [line cut at 2000 characters]"
		}
		if i > 0 && text.Len()+len(s)+1 > MaxReadBytes {
			next = ln.Number - 1
			break
		}
		if i > 0 {
			text.WriteByte('\n')
		}
		text.WriteString(s)
	}
	out.NextOffset, out.Content = next, text.String()
	msg := out.Content
	if next != 0 {
		msg += fmt.Sprintf("\n[lines %d-%d of %d shown; call read_file with offset=%d to read on]", in.Offset+1, next, r.TotalLines, next)
	}
	return out, msg, nil
}

func (b *backend) upload(ctx context.Context, in uploadInput) (uploadOutput, string, error) {
	var data []byte
	switch {
	case in.Text != nil && in.Base64 != nil:
		return uploadOutput{}, "", invalid("text, base64", "give only one of them")
	case in.Text != nil:
		data = []byte(*in.Text)
	case in.Base64 != nil:
		var err error
		if data, err = base64.StdEncoding.DecodeString(strings.TrimSpace(*in.Base64)); err != nil {
			return uploadOutput{}, "", invalid("base64", "not valid base64: %v", err)
		}
	default:
		return uploadOutput{}, "", invalid("text, base64", "give the content as one of them")
	}
	var opts client.FileOptions
	if in.Mode != "" {
		var m uint32
		if _, err := fmt.Sscanf(in.Mode, "%o", &m); err != nil || m > 0o7777 || strings.Trim(in.Mode, "01234567") != "" {
			return uploadOutput{}, "", invalid("mode", "%q is not octal permission bits such as 644 or 755", in.Mode)
		}
		opts.Mode = &m
	}
	fi, err := b.c.Upload(ctx, in.SandboxID, in.Path, bytes.NewReader(data), opts)
	if err != nil {
		return uploadOutput{}, "", err
	}
	out := uploadOutput{Path: fi.Path, Size: fi.Size}
	return out, fmt.Sprintf("Uploaded %d bytes to %s", fi.Size, fi.Path), nil
}

// fetch reads a whole regular file of up to MaxDownloadBytes, and its
// absolute path.
func (b *backend) fetch(ctx context.Context, id, p string) (string, []byte, error) {
	fi, err := b.c.Stat(ctx, id, api.StatRequest{Path: p})
	if err != nil {
		return "", nil, err
	}
	if fi.Type != api.TypeFile {
		return "", nil, errdefs.New(errdefs.InvalidArgument, "%s is a %s, not a regular file", fi.Path, fi.Type)
	}
	if fi.Size > MaxDownloadBytes {
		return "", nil, errdefs.New(errdefs.TooLarge, "%s has %d bytes, more than the %d that can be sent whole here: read_file pages through text, and execute can split a file (split, head -c)",
			fi.Path, fi.Size, MaxDownloadBytes)
	}
	// The sandbox may swap the path for a larger file between the stat and
	// the read: the read itself is bounded too.
	rc, err := b.c.Download(ctx, id, fi.Path, client.FileOptions{})
	if err != nil {
		return "", nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxDownloadBytes+1))
	if err != nil {
		return "", nil, err
	}
	if len(data) > MaxDownloadBytes {
		return "", nil, errdefs.New(errdefs.TooLarge, "%s grew past the %d bytes that can be sent whole here while it was read", fi.Path, MaxDownloadBytes)
	}
	return fi.Path, data, nil
}

// isText says whether data reads as UTF-8 text (no NUL byte either).
func isText(data []byte) bool {
	return utf8.Valid(data) && bytes.IndexByte(data, 0) < 0
}

// mimeType guesses a file's type from its name, else from its bytes.
func mimeType(p string, data []byte, text bool) string {
	if t := mime.TypeByExtension(path.Ext(p)); t != "" {
		return t
	}
	if text {
		return "text/plain; charset=utf-8"
	}
	return http.DetectContentType(data)
}

func (b *backend) download(ctx context.Context, in downloadInput) (downloadOutput, string, error) {
	abs, data, err := b.fetch(ctx, in.SandboxID, in.Path)
	if err != nil {
		return downloadOutput{}, "", err
	}
	text := isText(data)
	out := downloadOutput{Path: abs, URI: FileURI(in.SandboxID, abs), Size: int64(len(data)), MIMEType: mimeType(abs, data, text)}
	switch in.Encoding {
	case "text":
		if !text {
			return out, "", invalid("encoding", "%s is not UTF-8 text: download it with encoding base64", abs)
		}
	case "base64":
		text = false
	}
	if text {
		out.Encoding, out.Content = "text", string(data)
		return out, out.Content, nil
	}
	out.Encoding, out.Content, out.blob = "base64", base64.StdEncoding.EncodeToString(data), data
	return out, fmt.Sprintf("%s: %d bytes of %s, base64 below and as the embedded resource %s\n%s", abs, out.Size, out.MIMEType, out.URI, out.Content), nil
}

func (b *backend) addResources(s *mcp.Server) {
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "sandbox-file",
		Title:       "A file in a berth sandbox",
		URITemplate: resourceTemplate,
		Description: "A file of a sandbox by absolute path, e.g. berth://sandbox/<sandbox id>/home/user/notes.txt: text, or a base64 blob for binary files, with a MIME type.",
	}, b.readResource)
}

func (b *backend) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	id, p, err := parseFileURI(uri)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
	}
	abs, data, err := b.fetch(ctx, id, p)
	switch {
	case errdefs.IsNotFound(err):
		return nil, mcp.ResourceNotFoundError(uri)
	case errdefs.IsInvalidArgument(err):
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: ErrorText(err)}
	case err != nil:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: ErrorText(err)}
	}
	text := isText(data)
	c := &mcp.ResourceContents{URI: uri, MIMEType: mimeType(abs, data, text)}
	if text {
		c.Text = string(data)
	} else {
		c.Blob = data
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c}}, nil
}
