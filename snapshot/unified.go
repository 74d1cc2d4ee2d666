package snapshot

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/layerfs"
)

// contextLines is how many unchanged lines a hunk shows around a change.
const contextLines = 3

// WriteUnified writes changes (from Changes of the same stacks) as a
// unified diff in git's form: a "diff --git" header, "new file mode",
// "deleted file mode" or "old mode"/"new mode" lines, then "--- a/path",
// "+++ b/path" ("/dev/null" for a side that is absent) and hunks with three
// lines of context. Regular files and symlinks are diffed (a symlink's
// content is its target, as in git); a file with a NUL in its first 8 KiB
// or that is not UTF-8 gets the line "Binary files a/x and b/x differ",
// one over o.MaxTextBytes "File a/x too large to diff". A deleted
// directory is shown as the deletion of each file it held. Owners and
// other types are not shown (Changes lists them). A path that holds a
// control or formatting character, bytes that are not UTF-8, a quote or
// a backslash is quoted as git quotes it, so no name can forge a line.
//
// The line diff is this package's own: Myers' shortest edit script (see
// lineDiff), a page of code that keeps the module free of a dependency
// and gives git's output without adapting another library's.
func WriteUnified(ctx context.Context, w io.Writer, changes []Change, from, to Stack, o Options) error {
	wk, err := newWalker(ctx, from, to, o)
	if err != nil {
		return err
	}
	defer wk.close()
	wk.expand = true
	var items []diffItem
	for i, c := range changes {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := checkPath(c.Path); err != nil {
			return err
		}
		if items, err = wk.diffItems(items, c); err != nil {
			return err
		}
	}
	slices.SortStableFunc(items, func(a, b diffItem) int { return strings.Compare(a.path, b.path) })
	bw := bufio.NewWriterSize(w, 64<<10)
	u := &unified{w: bw, wk: wk, max: o.maxText()}
	for i, it := range items {
		if i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if err := u.item(it); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// side is one side of a diffed path: the layer it is in (index + 1, 0
// when it is looked up) and its type (S_IFREG or S_IFLNK).
type side struct {
	at  int
	typ uint32
}

type diffItem struct {
	path     string
	old, new *side // nil: absent on that side, or not diffed
}

// sideOf is a side of type typ (a Change's) read from layer at, or nil
// for a type that is not diffed.
func sideOf(typ string, at int) *side {
	switch typ {
	case "file":
		return &side{at, unix.S_IFREG}
	case "symlink":
		return &side{at, unix.S_IFLNK}
	}
	return nil
}

// diffItems appends what change c shows as: a pair of files, a file on one
// side, nothing (a directory, a fifo), or, for a directory gone, each file
// it held.
func (w *walker) diffItems(items []diffItem, c Change) ([]diffItem, error) {
	var before, after *side
	if c.Kind != Added {
		e, v, err := w.from.find(c.Path, c.oldAt)
		if err == nil && e.isDir() && (c.Kind == Deleted || c.Type != "dir") {
			// A directory gone: all it held, looked up through every
			// layer (a layer of the Change's is only where it is topmost).
			v.close()
			if e, v, err = w.from.find(c.Path, 0); err == nil && e.isDir() {
				err = w.under(c.Path, v, &e, nil, nil, strings.Count(c.Path, "/"))
			}
		}
		v.close()
		if err == nil && !e.ok() {
			err = errChanged
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", show(c.Path), err)
		}
		before = sideOf(typeName(e.st.Mode), e.layer+1)
		for _, g := range w.out {
			if s := sideOf(g.Type, g.oldAt); s != nil {
				items = append(items, diffItem{path: g.Path, old: s})
			}
		}
		w.out = w.out[:0]
	}
	if c.Kind != Deleted {
		e, v, err := w.to.find(c.Path, c.newAt)
		v.close()
		if err == nil && !e.ok() {
			err = errChanged
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", show(c.Path), err)
		}
		after = sideOf(typeName(e.st.Mode), e.layer+1)
	}
	switch {
	case before != nil && after != nil && before.typ != after.typ: // git shows a type change as two
		items = append(items, diffItem{path: c.Path, old: before}, diffItem{path: c.Path, new: after})
	case before != nil || after != nil:
		items = append(items, diffItem{path: c.Path, old: before, new: after})
	}
	return items, nil
}

type unified struct {
	w    *bufio.Writer
	wk   *walker
	max  int64
	bufs [2][]byte
}

// content is one side's bytes as the diff reads them.
type content struct {
	mode  uint32 // git's: S_IFREG or S_IFLNK with the permissions
	size  int64
	data  []byte
	large bool // over the limit, not read
}

func (u *unified) load(t *tree, p string, s *side) (*content, error) {
	if s == nil {
		return nil, nil
	}
	e, v, err := t.find(p, s.at)
	defer v.close()
	if err == nil && (!e.ok() || e.ftype() != s.typ) {
		err = errChanged
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", show(p), err)
	}
	c := &content{mode: s.typ | e.perm(), size: e.st.Size}
	if s.typ == unix.S_IFLNK {
		target, err := layerfs.ReadLink(e.dirfd, e.name)
		if err != nil {
			return nil, fmt.Errorf("read link %s: %w", show(p), err)
		}
		c.mode, c.data, c.size = unix.S_IFLNK, []byte(target), int64(len(target))
		return c, nil
	}
	if c.large = e.st.Size > u.max; c.large {
		return c, nil
	}
	fd, err := openFile(&e)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", show(p), err)
	}
	defer unix.Close(fd)
	c.data = make([]byte, e.st.Size)
	n, err := layerfs.ReadAt(fd, c.data, 0)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", show(p), err)
	}
	c.data = c.data[:n]
	return c, nil
}

// sameLarge reports whether the two large files of p hold the same bytes.
func (u *unified) sameLarge(p string, before, after *side) (bool, error) {
	a, va, err := u.wk.from.find(p, before.at)
	defer va.close()
	if err != nil {
		return false, fmt.Errorf("%s: %w", show(p), err)
	}
	b, vb, err := u.wk.to.find(p, after.at)
	defer vb.close()
	if err != nil {
		return false, fmt.Errorf("%s: %w", show(p), err)
	}
	if !a.isReg() || !b.isReg() {
		return false, fmt.Errorf("%s: %w", show(p), errChanged)
	}
	same, err := sameContent(u.wk.ctx, &a, &b, &u.bufs)
	if err != nil {
		return false, fmt.Errorf("%s: %w", show(p), err)
	}
	return same, nil
}

func (u *unified) item(it diffItem) error {
	a, err := u.load(u.wk.from, it.path, it.old)
	if err != nil {
		return err
	}
	b, err := u.load(u.wk.to, it.path, it.new)
	if err != nil {
		return err
	}
	rel := it.path[1:]
	aName, bName := quoteName("a/"+rel), quoteName("b/"+rel)
	fmt.Fprintf(u.w, "diff --git %s %s\n", aName, bName)
	switch {
	case a == nil:
		fmt.Fprintf(u.w, "new file mode %06o\n", b.mode)
		a, aName = &content{}, "/dev/null"
	case b == nil:
		fmt.Fprintf(u.w, "deleted file mode %06o\n", a.mode)
		b, bName = &content{}, "/dev/null"
	case a.mode != b.mode:
		fmt.Fprintf(u.w, "old mode %06o\nnew mode %06o\n", a.mode, b.mode)
	}
	if a.large || b.large {
		if it.old != nil && it.new != nil && a.size == b.size {
			if same, err := u.sameLarge(it.path, it.old, it.new); err != nil || same {
				return err
			}
		}
		name := aName
		if it.old == nil {
			name = bName
		}
		fmt.Fprintf(u.w, "File %s too large to diff\n", name)
		return nil
	}
	if bytes.Equal(a.data, b.data) {
		return nil
	}
	if isBinary(a.data) || isBinary(b.data) {
		fmt.Fprintf(u.w, "Binary files %s and %s differ\n", aName, bName)
		return nil
	}
	fmt.Fprintf(u.w, "--- %s\n+++ %s\n", aName, bName)
	writeHunks(u.w, splitLines(a.data), splitLines(b.data))
	return nil
}

func isBinary(b []byte) bool {
	return bytes.IndexByte(b[:min(len(b), 8<<10)], 0) >= 0 || !utf8.Valid(b)
}

// splitLines splits b after each newline; the last line may have none.
func splitLines(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n') + 1
		if i == 0 {
			i = len(b)
		}
		out = append(out, string(b[:i]))
		b = b[i:]
	}
	return out
}

// op is one line of an edit script: ' ' kept, '-' deleted from a, '+'
// inserted from b; ai and bi are the lines of a and b before it.
type op struct {
	kind   byte
	ai, bi int
	line   string
}

// writeHunks writes the hunks that turn a into b.
func writeHunks(w *bufio.Writer, a, b []string) {
	del, ins := lineDiff(a, b)
	var ops []op
	for i, j := 0, 0; i < len(a) || j < len(b); {
		switch {
		case i < len(a) && del[i]:
			ops = append(ops, op{'-', i, j, a[i]})
			i++
		case j < len(b) && ins[j]:
			ops = append(ops, op{'+', i, j, b[j]})
			j++
		default:
			ops = append(ops, op{' ', i, j, a[i]})
			i, j = i+1, j+1
		}
	}
	for i := 0; i < len(ops); {
		for i < len(ops) && ops[i].kind == ' ' {
			i++
		}
		if i == len(ops) {
			break
		}
		// A hunk runs from contextLines before a change to contextLines
		// after the last change that is no more than twice that apart
		// from the one before it.
		start, end := max(i-contextLines, 0), i
		for {
			for end < len(ops) && ops[end].kind != ' ' {
				end++
			}
			k := end
			for k < len(ops) && ops[k].kind == ' ' {
				k++
			}
			if k == len(ops) || k-end > 2*contextLines {
				break
			}
			end = k
		}
		stop := min(end+contextLines, len(ops))
		writeHunk(w, ops[start:stop])
		i = stop
	}
}

func writeHunk(w *bufio.Writer, ops []op) {
	na, nb := 0, 0
	for _, o := range ops {
		if o.kind != '+' {
			na++
		}
		if o.kind != '-' {
			nb++
		}
	}
	fmt.Fprintf(w, "@@ -%s +%s @@\n", hunkRange(ops[0].ai, na), hunkRange(ops[0].bi, nb))
	for _, o := range ops {
		w.WriteByte(o.kind)
		w.WriteString(o.line)
		if !strings.HasSuffix(o.line, "\n") {
			w.WriteString("\n\\ No newline at end of file\n")
		}
	}
}

// hunkRange is a hunk's range as diff writes it: "start,count", the count
// left out when it is 1, and an empty range at the line before it.
func hunkRange(start, n int) string {
	switch n {
	case 0:
		return strconv.Itoa(start) + ",0"
	case 1:
		return strconv.Itoa(start + 1)
	}
	return strconv.Itoa(start+1) + "," + strconv.Itoa(n)
}

// quoteName quotes a path for a diff's header lines as git does when it
// holds a control or formatting character, a quote, a backslash or bytes
// that are not UTF-8: in double quotes, with C escapes and the octal of
// other such bytes. Printable non-ASCII text is left as it is.
func quoteName(s string) string {
	if !needsQuote(s) {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !needsQuote(s[i : i+n]) {
			b.WriteString(s[i : i+n])
			i += n
			continue
		}
		if esc := strings.IndexRune("\a\b\t\n\v\f\r\"\\", r); n == 1 && esc >= 0 {
			b.WriteByte('\\')
			b.WriteByte("abtnvfr\"\\"[esc])
			i++
			continue
		}
		for _, c := range []byte(s[i : i+n]) {
			fmt.Fprintf(&b, "\\%03o", c)
		}
		i += n
	}
	b.WriteByte('"')
	return b.String()
}
