package sandbox

import (
	"sort"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/runtime"
)

// This file is the one place where the public API's wire types (api) and the
// guest protocol's (api/guestapi) meet. Types whose fields are the same on
// both sides convert with a Go conversion, which stops compiling the day
// they differ; the others are copied field by field, and wire_test.go checks
// that no field is lost either way.

// processSpec merges a sandbox's defaults into an exec request.
func processSpec(sb api.CreateSandboxRequest, req api.ExecRequest) guestapi.ProcessSpec {
	args := req.Cmd
	if req.Shell != "" {
		args = []string{"/bin/sh", "-c", req.Shell}
	}
	env := networkEnv(networkOf(sb))
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range sb.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	list := make([]string, 0, len(keys))
	for _, k := range keys {
		list = append(list, k+"="+env[k])
	}
	cwd, user := req.Cwd, req.User
	if cwd == "" {
		cwd = sb.Workdir
	}
	if user == "" {
		user = sb.User
	}
	out := req.MaxOutputBytes
	if out == 0 {
		out = defaultOutput
	}
	spec := guestapi.ProcessSpec{Args: args, Env: list, Cwd: cwd, User: user, Stdin: req.Stdin,
		TimeoutMs: req.TimeoutMs, MaxOutputBytes: out, OpenStdin: req.OpenStdin}
	if req.TTY != nil {
		spec.TTY = &guestapi.TTY{Rows: uint16(req.TTY.Rows), Cols: uint16(req.TTY.Cols)} // validated: 1 to MaxTTY
	}
	return spec
}

func resultToAPI(r guestapi.Result) api.ExecResult {
	return api.ExecResult{
		Pid: r.Pid, ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut,
		Stdout: nonNil(r.Stdout), Stderr: nonNil(r.Stderr),
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated,
		DurationMs: r.DurationMs, Error: r.StartError,
	}
}

func processToAPI(p guestapi.ProcessInfo) api.Process {
	out := api.Process{Pid: p.Pid, Cmd: p.Args, Running: p.Running, StartedAt: time.UnixMilli(p.StartedUnixMs).UTC(), OpenStdin: p.OpenStdin}
	if p.TTY != nil {
		out.TTY = &api.TTY{Rows: int(p.TTY.Rows), Cols: int(p.TTY.Cols)}
	}
	if p.Result != nil {
		r := resultToAPI(*p.Result)
		out.Result = &r
	}
	return out
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// File requests, API to guest.

func whereToGuest(w api.Where) guestapi.Where { return guestapi.Where(w) }

func statToGuest(r api.StatRequest) guestapi.StatRequest {
	return guestapi.StatRequest{Where: whereToGuest(r.Where), Path: r.Path, NoFollow: r.NoFollow}
}

func listToGuest(r api.ListRequest) guestapi.ListRequest {
	return guestapi.ListRequest{Where: whereToGuest(r.Where), Path: r.Path, Depth: r.Depth, Limit: r.Limit}
}

func mkdirToGuest(r api.MkdirRequest) guestapi.MkdirRequest {
	return guestapi.MkdirRequest{Where: whereToGuest(r.Where), Path: r.Path, Parents: r.Parents, Mode: r.Mode}
}

func moveToGuest(r api.MoveRequest) guestapi.MoveRequest {
	return guestapi.MoveRequest{Where: whereToGuest(r.Where), From: r.From, To: r.To, Overwrite: r.Overwrite}
}

func removeToGuest(r api.RemoveRequest) guestapi.RemoveRequest {
	return guestapi.RemoveRequest{Where: whereToGuest(r.Where), Path: r.Path, Recursive: r.Recursive, Force: r.Force}
}

func chmodToGuest(r api.ChmodRequest) guestapi.ChmodRequest {
	return guestapi.ChmodRequest{Where: whereToGuest(r.Where), Path: r.Path, Mode: r.Mode}
}

func chownToGuest(r api.ChownRequest) guestapi.ChownRequest {
	return guestapi.ChownRequest{Where: whereToGuest(r.Where), Path: r.Path, Owner: r.Owner, Recursive: r.Recursive}
}

func readToGuest(r api.ReadRequest) guestapi.ReadRequest {
	return guestapi.ReadRequest{Where: whereToGuest(r.Where), Path: r.Path, Offset: r.Offset, Limit: r.Limit,
		MaxLineChars: r.MaxLineChars}
}

func writeToGuest(r api.WriteRequest) guestapi.WriteRequest {
	return guestapi.WriteRequest{Where: whereToGuest(r.Where), Path: r.Path, Content: r.Content,
		CreateOnly: r.CreateOnly, Mode: r.Mode}
}

func editToGuest(r api.EditRequest) guestapi.EditRequest {
	return guestapi.EditRequest{Where: whereToGuest(r.Where), Path: r.Path, Old: r.Old, New: r.New, ReplaceAll: r.ReplaceAll}
}

func globToGuest(r api.GlobRequest) guestapi.GlobRequest {
	return guestapi.GlobRequest{Where: whereToGuest(r.Where), Pattern: r.Pattern, Path: r.Path, Limit: r.Limit,
		IncludeDirs: r.IncludeDirs}
}

func grepToGuest(r api.GrepRequest) guestapi.GrepRequest {
	return guestapi.GrepRequest{Where: whereToGuest(r.Where), Pattern: r.Pattern, Path: r.Path, Glob: r.Glob,
		Regex: r.Regex, IgnoreCase: r.IgnoreCase, Limit: r.Limit}
}

func uploadToGuest(r api.UploadRequest) guestapi.UploadRequest {
	out := guestapi.UploadRequest{Where: whereToGuest(r.Where), Files: make([]guestapi.UploadFile, len(r.Files))}
	for i, f := range r.Files {
		out.Files[i] = guestapi.UploadFile(f)
	}
	return out
}

func downloadToGuest(r api.DownloadRequest) guestapi.DownloadRequest {
	return guestapi.DownloadRequest{Where: whereToGuest(r.Where), Paths: r.Paths}
}

// File results, guest to API.

func fileInfoToAPI(fi guestapi.FileInfo) api.FileInfo { return api.FileInfo(fi) }

func fileInfosToAPI(in []guestapi.FileInfo) []api.FileInfo {
	if in == nil {
		return nil
	}
	out := make([]api.FileInfo, len(in))
	for i, fi := range in {
		out[i] = api.FileInfo(fi)
	}
	return out
}

func existsToAPI(r guestapi.ExistsResult) api.ExistsResult { return api.ExistsResult(r) }

func listResultToAPI(r guestapi.ListResult) api.ListResult {
	return api.ListResult{Entries: fileInfosToAPI(r.Entries), Truncated: r.Truncated}
}

func readResultToAPI(r guestapi.ReadResult) api.ReadResult {
	out := api.ReadResult{Path: r.Path, Size: r.Size, Binary: r.Binary, TotalLines: r.TotalLines, NextOffset: r.NextOffset}
	if r.Lines != nil {
		out.Lines = make([]api.Line, len(r.Lines))
		for i, l := range r.Lines {
			out.Lines[i] = api.Line(l)
		}
	}
	return out
}

func editResultToAPI(r guestapi.EditResult) api.EditResult { return api.EditResult(r) }

func globResultToAPI(r guestapi.GlobResult) api.GlobResult {
	return api.GlobResult{Matches: fileInfosToAPI(r.Matches), Truncated: r.Truncated}
}

func grepResultToAPI(r guestapi.GrepResult) api.GrepResult {
	out := api.GrepResult{Truncated: r.Truncated, FilesSearched: r.FilesSearched}
	if r.Matches != nil {
		out.Matches = make([]api.GrepMatch, len(r.Matches))
		for i, m := range r.Matches {
			out.Matches[i] = api.GrepMatch(m)
		}
	}
	return out
}

func fileResultsToAPI(in []guestapi.FileResult) []api.FileResult {
	if in == nil {
		return nil
	}
	out := make([]api.FileResult, len(in))
	for i, r := range in {
		out[i] = api.FileResult{Path: r.Path, Content: r.Content}
		if r.Error != nil {
			e := api.FileError(*r.Error)
			out[i].Error = &e
		}
	}
	return out
}

func uploadResultToAPI(r guestapi.UploadResult) api.UploadResult {
	return api.UploadResult{Results: fileResultsToAPI(r.Results)}
}

func downloadResultToAPI(r guestapi.DownloadResult) api.DownloadResult {
	return api.DownloadResult{Results: fileResultsToAPI(r.Results)}
}

func archiveResultToAPI(r guestapi.ArchiveResult) api.ArchiveResult { return api.ArchiveResult(r) }

func watchEventToAPI(ev guestapi.WatchEvent) api.WatchEvent { return api.WatchEvent(ev) }

// usageToAPI converts a runtime's usage report; the egress summary is the
// manager's to add.
func usageToAPI(u runtime.Usage) api.Usage {
	return api.Usage{CPUSeconds: u.CPUSeconds, MemoryBytes: u.MemoryBytes, MemoryPeakBytes: u.MemoryPeakBytes,
		Pids: u.Pids, OOMKills: u.OOMKills, DiskBytes: u.DiskBytes}
}
