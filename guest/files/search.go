package files

import (
	"bytes"
	"context"
	"errors"
	"io"
	"iter"
	"os"
	"path"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// errStop ends a walk early without an error.
var errStop = errors.New("stop walking")

// visit is called for each entry of a walk with its directory's descriptor,
// its name there, its full path and its type bits; it returns whether to
// descend into a directory.
type visit func(dir int, name, full string, typ os.FileMode) (bool, error)

// walk visits the tree below d (not d itself) to depth levels, in name order.
// It never follows a symlink, and it does not enter procfs or sysfs. It
// stops with ctx's error when ctx ends: the daemon's request is gone.
func walk(ctx context.Context, d *os.File, p string, depth int, fn visit) error {
	err := walkDir(ctx, d, p, depth, fn)
	if err == errStop {
		return nil
	}
	return err
}

func walkDir(ctx context.Context, d *os.File, p string, depth int, fn visit) error {
	var entries []os.DirEntry
	for {
		batch, err := d.ReadDir(4096)
		entries = append(entries, batch...)
		if err != nil || len(batch) == 0 {
			break
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	dir := int(d.Fd())
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := e.Name()
		full := path.Join(p, name)
		descend, err := fn(dir, name, full, e.Type())
		if err != nil {
			return err
		}
		if !descend || !e.IsDir() || depth <= 1 {
			continue
		}
		fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // gone, replaced or unreadable: skip it
		}
		if notProc(fd, full) != nil {
			unix.Close(fd)
			continue
		}
		sub := os.NewFile(uintptr(fd), full)
		err = walkDir(ctx, sub, full, depth-1, fn)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// expandBraces turns "a{b,c}d" into "abd" and "acd" (nested too), at most
// 256 patterns.
func expandBraces(p string) ([]string, error) {
	open := -1
	depth := 0
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			i++
		case '{':
			if depth == 0 {
				open = i
			}
			depth++
		case '}':
			if depth == 0 {
				continue
			}
			depth--
			if depth > 0 {
				continue
			}
			var alts []string
			start, d := open+1, 0
			for j := open + 1; j < i; j++ {
				switch p[j] {
				case '\\':
					j++
				case '{':
					d++
				case '}':
					d--
				case ',':
					if d == 0 {
						alts = append(alts, p[start:j])
						start = j + 1
					}
				}
			}
			alts = append(alts, p[start:i])
			var out []string
			for _, a := range alts {
				more, err := expandBraces(p[:open] + a + p[i+1:])
				if err != nil {
					return nil, err
				}
				out = append(out, more...)
				if len(out) > 256 {
					return nil, errdefs.New(errdefs.InvalidArgument, "pattern: %q expands to more than 256 patterns", p)
				}
			}
			return out, nil
		}
	}
	return []string{p}, nil
}

// matcher matches slash-separated relative paths against glob patterns.
type matcher struct {
	pats    [][]string
	deep    bool // some pattern has "**"
	maxSegs int
}

func newMatcher(field, pattern string) (*matcher, error) {
	if pattern == "" {
		return nil, errdefs.New(errdefs.InvalidArgument, "%s: is empty", field)
	}
	if strings.IndexByte(pattern, 0) >= 0 || len(pattern) > guestapi.MaxPathLen {
		return nil, errdefs.New(errdefs.InvalidArgument, "%s: not a valid pattern", field)
	}
	alts, err := expandBraces(pattern)
	if err != nil {
		return nil, err
	}
	m := &matcher{}
	for _, a := range alts {
		for _, seg := range strings.Split(a, "/") {
			if seg == ".." {
				return nil, errdefs.New(errdefs.InvalidArgument, "%s: %q has a \"..\" segment", field, pattern)
			}
		}
		segs := strings.Split(strings.Trim(path.Clean("/" + a)[1:], "/"), "/")
		for _, s := range segs {
			if s == "**" {
				m.deep = true
				continue
			}
			if _, err := path.Match(s, ""); err != nil {
				return nil, errdefs.New(errdefs.InvalidArgument, "%s: %q is not a valid pattern", field, pattern)
			}
		}
		m.pats = append(m.pats, segs)
		m.maxSegs = max(m.maxSegs, len(segs))
	}
	return m, nil
}

// match reports whether rel (no leading slash) matches a pattern.
func (m *matcher) match(rel string) bool {
	parts := strings.Split(rel, "/")
	for _, p := range m.pats {
		if matchSegs(p, parts) {
			return true
		}
	}
	return false
}

// matchSegs matches pattern segments against path segments. As in shells
// and Python's glob, a wildcard does not match a leading dot.
func matchSegs(pat, parts []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(parts); i++ {
				if i > 0 && strings.HasPrefix(parts[i-1], ".") {
					return false
				}
				if matchSegs(pat[1:], parts[i:]) {
					return true
				}
			}
			return false
		}
		if len(parts) == 0 {
			return false
		}
		if strings.HasPrefix(parts[0], ".") && !strings.HasPrefix(pat[0], ".") {
			return false
		}
		if ok, _ := path.Match(pat[0], parts[0]); !ok {
			return false
		}
		pat, parts = pat[1:], parts[1:]
	}
	return len(parts) == 0
}

// Glob finds files matching a pattern below a directory, with the shared
// contract of agent backends (deepagents'): a pattern without "/" matches
// the name at any depth; one with "/" matches the path relative to the
// search root ("**" spans directories but not dot-directories); a leading
// "/" anchors to the search root. Directories match only with IncludeDirs.
func (s *Service) Glob(ctx context.Context, req guestapi.GlobRequest) (guestapi.GlobResult, error) {
	c, err := s.caller(req.Where)
	if err != nil {
		return guestapi.GlobResult{}, err
	}
	base := req.Path
	if base == "" {
		base = c.cwd
	}
	p, err := c.abs("path", base)
	if err != nil {
		return guestapi.GlobResult{}, err
	}
	anchored := strings.Contains(req.Pattern, "/")
	m, err := newMatcher("pattern", strings.TrimPrefix(req.Pattern, "/"))
	if err != nil {
		return guestapi.GlobResult{}, err
	}
	limit := req.Limit
	if limit <= 0 || limit > guestapi.MaxGlobResults {
		limit = 10000
	}
	depth := 64
	if anchored && !m.deep {
		depth = m.maxSegs
	}
	out := guestapi.GlobResult{Matches: []guestapi.FileInfo{}}
	err = as(c.acc, func() error {
		d, err := s.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer d.Close()
		n := &namer{}
		prefix := len(strings.TrimSuffix(p, "/")) + 1
		return walk(ctx, d, p, depth, func(dir int, name, full string, typ os.FileMode) (bool, error) {
			if !typ.IsRegular() && !(req.IncludeDirs && typ.IsDir()) {
				return true, nil
			}
			ok := anchored && m.match(full[prefix:]) || !anchored && m.matchName(name)
			if !ok {
				return true, nil
			}
			if len(out.Matches) >= limit {
				out.Truncated = true
				return false, errStop
			}
			if fi, err := n.statAt(dir, name, full); err == nil {
				out.Matches = append(out.Matches, fi)
			}
			return true, nil
		})
	})
	sort.Slice(out.Matches, func(i, j int) bool { return out.Matches[i].Path < out.Matches[j].Path })
	return out, err
}

// matchName matches a file's name against the single-segment patterns, a
// wildcard not matching a leading dot.
func (m *matcher) matchName(name string) bool {
	for _, p := range m.pats {
		if len(p) == 1 && p[0] != "**" && matchSegs(p, []string{name}) {
			return true
		}
	}
	return false
}

// Bounds of the text tools.
const (
	binarySniff  = 8 << 10 // a NUL byte in the first 8 KiB makes a file binary
	maxLineChars = 2000
	grepWorkers  = 4
)

// Grep searches text files for a pattern.
func (s *Service) Grep(ctx context.Context, req guestapi.GrepRequest) (guestapi.GrepResult, error) {
	c, err := s.caller(req.Where)
	if err != nil {
		return guestapi.GrepResult{}, err
	}
	base := req.Path
	if base == "" {
		base = c.cwd
	}
	p, err := c.abs("path", base)
	if err != nil {
		return guestapi.GrepResult{}, err
	}
	if req.Pattern == "" {
		return guestapi.GrepResult{}, errdefs.New(errdefs.InvalidArgument, "pattern: is empty")
	}
	expr := req.Pattern
	if !req.Regex {
		expr = regexp.QuoteMeta(expr)
	}
	if req.IgnoreCase {
		expr = "(?i)" + expr
	}
	expr = "(?m)" + expr // ^ and $ at line ends
	re, err := regexp.Compile(expr)
	if err != nil {
		return guestapi.GrepResult{}, errdefs.New(errdefs.InvalidArgument, "pattern: %v", err)
	}
	var literal []byte
	if !req.Regex && !req.IgnoreCase {
		literal = []byte(req.Pattern)
	}
	var filter *matcher
	if req.Glob != "" {
		if filter, err = newMatcher("glob", req.Glob); err != nil {
			return guestapi.GrepResult{}, err
		}
	}
	limit := req.Limit
	if limit <= 0 || limit > guestapi.MaxGrepResults {
		limit = 1000
	}
	g := &grep{re: re, literal: literal, limit: limit}
	err = as(c.acc, func() error {
		f, err := s.open(p, unix.O_RDONLY|unix.O_NONBLOCK)
		if err != nil {
			return err
		}
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return pathError(p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if st.Mode&unix.S_IFMT == unix.S_IFREG {
				g.searchFile(int(f.Fd()), p)
			}
			return nil
		}
		// With one P (the guest's default) one thread searches as it walks,
		// opening each file by name in its directory without following it:
		// handing the P between locked threads at every system call costs more
		// than it overlaps. With more, the walk lists files and workers, each
		// acting as the caller, open them beneath the searched directory.
		base := len(strings.TrimSuffix(p, "/")) + 1
		keep := func(full string, typ os.FileMode) bool {
			return typ.IsRegular() && (filter == nil || filter.matchFile(full[base:]))
		}
		workers := min(grepWorkers, runtime.GOMAXPROCS(0))
		if workers <= 1 {
			return walk(ctx, f, p, 64, func(dir int, name, full string, typ os.FileMode) (bool, error) {
				if g.full() {
					return false, errStop
				}
				if keep(full, typ) {
					if fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
						g.searchFile(fd, full)
						unix.Close(fd)
					}
				}
				return true, nil
			})
		}
		var rels []string
		err = walk(ctx, f, p, 64, func(_ int, name, full string, typ os.FileMode) (bool, error) {
			if keep(full, typ) {
				rels = append(rels, full[base:])
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		g.searchAll(ctx, int(f.Fd()), p, rels, min(workers, len(rels)), func(fn func()) { as(c.acc, func() error { fn(); return nil }) })
		return ctx.Err()
	})
	return g.result(), err
}

// matchFile matches a file's path relative to the searched directory; a
// pattern without a slash matches the file's name at any depth.
func (m *matcher) matchFile(rel string) bool {
	if m.match(rel) {
		return true
	}
	for _, p := range m.pats {
		if len(p) == 1 && p[0] != "**" {
			if ok, _ := path.Match(p[0], path.Base(rel)); ok {
				return true
			}
		}
	}
	return false
}

type grep struct {
	re      *regexp.Regexp
	literal []byte // set for a case-sensitive literal: bytes.Index is faster
	limit   int

	mu        sync.Mutex
	matches   []guestapi.GrepMatch
	searched  int
	truncated bool
}

func (g *grep) full() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.truncated
}

// searchAll searches files relative to base with workers, each run by
// runAs so that it acts as the caller.
func (g *grep) searchAll(ctx context.Context, base int, p string, rels []string, workers int, runAs func(func())) {
	next := make(chan string, 256)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runAs(func() {
				g.searchRels(base, p, func(yield func(string) bool) {
					for rel := range next {
						if !yield(rel) {
							return
						}
					}
				})
			})
		}()
	}
	for _, rel := range rels {
		if g.full() || ctx.Err() != nil {
			break
		}
		next <- rel
	}
	close(next)
	wg.Wait()
}

// searchRels searches files relative to base, opened beneath it without
// following any symlink, until the matches are full.
func (g *grep) searchRels(base int, p string, rels iter.Seq[string]) {
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for rel := range rels {
		if g.full() {
			continue // drain
		}
		fd, err := unix.Openat2(base, rel, &how)
		if err != nil {
			continue
		}
		g.searchFile(fd, path.Join(p, rel))
		unix.Close(fd)
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// searchFile searches one regular file (at most MaxTextBytes of it),
// skipping binary files. It reads the descriptor directly: an *os.File
// would cost system calls to learn it cannot use the poller.
func (g *grep) searchFile(fd int, p string) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf, err := readFD(fd, (*bp)[:0], min(st.Size+1, guestapi.MaxTextBytes))
	*bp = buf[:0]
	if err != nil {
		return
	}
	g.mu.Lock()
	g.searched++
	g.mu.Unlock()
	if bytes.IndexByte(buf[:min(len(buf), binarySniff)], 0) >= 0 {
		return
	}
	var found []guestapi.GrepMatch
	line, start := 1, 0
	for start <= len(buf) {
		// Jump to the next match, counting the lines skipped.
		var at int
		if g.literal != nil {
			at = bytes.Index(buf[start:], g.literal)
		} else if loc := g.re.FindIndex(buf[start:]); loc != nil {
			at = loc[0]
		} else {
			at = -1
		}
		if at < 0 {
			break
		}
		at += start
		line += bytes.Count(buf[start:at], []byte{'\n'})
		ls := bytes.LastIndexByte(buf[:at], '\n') + 1
		le := bytes.IndexByte(buf[at:], '\n')
		if le < 0 {
			le = len(buf)
		} else {
			le += at
		}
		text, _ := cut(strings.TrimSuffix(string(buf[ls:le]), "\r"), maxLineChars)
		found = append(found, guestapi.GrepMatch{Path: p, Line: line, Text: text})
		line++
		start = le + 1
	}
	if len(found) == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if room := g.limit - len(g.matches); len(found) > room {
		found, g.truncated = found[:max(room, 0)], true
	}
	g.matches = append(g.matches, found...)
}

func (g *grep) result() guestapi.GrepResult {
	sort.SliceStable(g.matches, func(i, j int) bool {
		a, b := g.matches[i], g.matches[j]
		return a.Path < b.Path || a.Path == b.Path && a.Line < b.Line
	})
	if g.matches == nil {
		g.matches = []guestapi.GrepMatch{}
	}
	return guestapi.GrepResult{Matches: g.matches, Truncated: g.truncated, FilesSearched: g.searched}
}

// readAll reads f into buf up to limit bytes.
func readAll(f *os.File, buf []byte, limit int64) ([]byte, error) {
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		end := cap(buf)
		if int64(end) > limit {
			end = int(limit)
		}
		room := buf[len(buf):end]
		n, err := f.Read(room)
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// readFD reads fd into buf up to limit bytes.
func readFD(fd int, buf []byte, limit int64) ([]byte, error) {
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		end := cap(buf)
		if int64(end) > limit {
			end = int(limit)
		}
		n, err := unix.Read(fd, buf[len(buf):end])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return buf, err
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
	return buf, nil
}

// cut bounds s to n characters.
func cut(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	i := 0
	for j := range s {
		if i == n {
			return s[:j], true
		}
		i++
	}
	return s, false
}
