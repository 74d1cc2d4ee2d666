package client

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/errdefs"
)

// BuildTemplate builds template req.Name from the build context tar read
// from buildContext (ContextTar makes one of a directory). With log, the
// daemon streams the build's log (steps, their output), which log
// receives as it comes.
func (c *Client) BuildTemplate(ctx context.Context, req api.BuildTemplateRequest, buildContext io.Reader, log func(api.BuildEvent)) (api.BuildResult, error) {
	q := url.Values{"name": {req.Name}}
	if req.Dockerfile != "" {
		q.Set("dockerfile", req.Dockerfile)
	}
	for k, v := range req.Args {
		q.Add("arg", k+"="+v)
	}
	if req.NoCache {
		q.Set("no_cache", "true")
	}
	if req.CPUs != 0 {
		q.Set("cpus", strconv.FormatFloat(req.CPUs, 'g', -1, 64))
	}
	if req.MemoryBytes != 0 {
		q.Set("memory_bytes", strconv.FormatInt(req.MemoryBytes, 10))
	}
	if req.Network != nil {
		b, err := json.Marshal(req.Network)
		if err != nil {
			return api.BuildResult{}, err
		}
		q.Set("network", string(b))
	}
	hdr := http.Header{"Content-Type": {"application/x-tar"}}
	if log != nil {
		hdr.Set("Accept", "application/x-ndjson")
	}
	resp, err := c.requestRaw(ctx, http.MethodPost, "/v1/templates/build", q, buildContext, hdr)
	if err != nil {
		return api.BuildResult{}, err
	}
	defer resp.Body.Close()
	if log == nil {
		var out api.BuildResult
		err := json.NewDecoder(resp.Body).Decode(&out)
		return out, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev api.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return api.BuildResult{}, fmt.Errorf("build log: %w", err)
		}
		log(ev)
		switch ev.Type {
		case api.BuildDone:
			if ev.Image == nil {
				return api.BuildResult{}, errdefs.New(errdefs.Internal, "build log: done without an image")
			}
			return api.BuildResult{Image: *ev.Image, Executed: ev.Executed, CachedSteps: ev.CachedSteps}, nil
		case api.BuildError:
			if ev.Error == nil {
				return api.BuildResult{}, errdefs.New(errdefs.Internal, "the build failed")
			}
			return api.BuildResult{}, fromAPIError(*ev.Error)
		}
	}
	if err := sc.Err(); err != nil {
		return api.BuildResult{}, err
	}
	return api.BuildResult{}, errdefs.New(errdefs.Unavailable, "build log: the stream ended before the build did")
}

// ListTemplates lists the images built from a Dockerfile, newest first.
func (c *Client) ListTemplates(ctx context.Context) ([]api.Image, error) {
	var out api.ListImagesResponse
	err := c.do(ctx, http.MethodGet, "/v1/templates", nil, nil, &out)
	return out.Images, err
}

// ContextTar writes directory dir as a build context tar to w, as docker
// build sends one: its files, directories and symlinks (as links, never
// followed), with names relative to dir, less what dir/.dockerignore
// leaves out (never dockerfile, the Dockerfile's path in dir).
func ContextTar(w io.Writer, dir, dockerfile string) error {
	skip, err := dockerignore(dir, dockerfile)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if skip != nil && skip(rel, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !info.Mode().IsRegular() && !info.IsDir() {
			return nil // devices, sockets, fifos
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = rel, 0, 0, "", ""
		if info.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.Copy(tw, f)
		if err == nil && n != hdr.Size {
			err = fmt.Errorf("%s changed size while it was read (%s bytes)", p, strconv.FormatInt(n, 10))
		}
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// dockerignore reads CONTEXT/.dockerignore into a filter of what the
// context leaves out, as docker build does (the Dockerfile is always sent).
func dockerignore(dir, dockerfile string) (func(rel string, isDir bool) bool, error) {
	f, err := os.Open(filepath.Join(dir, ".dockerignore"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	return func(rel string, isDir bool) bool {
		if rel == dockerfile {
			return false
		}
		skip, err := pm.MatchesOrParentMatches(rel)
		if err != nil {
			return false
		}
		// With exceptions ("!keep/this"), a directory is walked all the
		// same: something beneath it may be let back in.
		if isDir && pm.Exclusions() {
			return false
		}
		return skip
	}, nil
}
