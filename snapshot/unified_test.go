package snapshot_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/snapshot"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func lines(from, to int, edit func(i int) string) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		if s := edit(i); s != "" {
			b.WriteString(s)
		}
	}
	return b.String()
}

// diffLayers are an image layer and a sandbox's writable layer over it
// that change files every way WriteUnified shows.
func diffLayers(t *testing.T) (img, up *layerDir) {
	readme := lines(1, 30, func(i int) string { return fmt.Sprintf("line %d\n", i) })
	img = newLayer(t, 0).
		file("doc/readme.md", readme, 0o644).
		file("doc/gone.txt", "bye\n", 0o644).
		file("doc/run.sh", "#!/bin/sh\necho hi\n", 0o644).
		file("doc/nonl.txt", "no newline", 0o644).
		file("old/a.txt", "a\n", 0o644).
		file("old/sub/b.txt", "b\nb\n", 0o644).
		symlink("old/link", "a.txt").
		file("bin.dat", "\x00\x01\x02", 0o644).
		file("big.txt", strings.Repeat("big\n", 75), 0o644).
		symlink("link", "target-a").
		file("type-change", "was a file\n", 0o644).
		file("dir-to-file/x.txt", "x\n", 0o644).
		file("file-to-dir", "a file\n", 0o644)
	up = newLayer(t, hostBase).
		file("doc/readme.md", lines(1, 32, func(i int) string {
			switch i {
			case 2:
				return "line two\n"
			case 25:
				return ""
			case 31, 32:
				return fmt.Sprintf("new line %d\n", i)
			}
			return fmt.Sprintf("line %d\n", i)
		}), 0o644).
		whiteout("doc/gone.txt").
		file("doc/run.sh", "#!/bin/sh\necho hi\n", 0o755).
		file("doc/nonl.txt", "no newline, edited", 0o644).
		whiteout("old").
		file("bin.dat", "\x00\x01\x03", 0o644).
		file("big.txt", strings.Repeat("BIG\n", 75), 0o644).
		symlink("link", "target-b").
		symlink("type-change", "elsewhere").
		file("new.txt", "a\nb\n", 0o644).
		file("empty", "", 0o600).
		file("evil\nname.txt", "x\n", 0o644).
		file("ünïcode.txt", "ü\n", 0o644).
		file("newdir/f.txt", "f\n", 0o644).
		file("dir-to-file", "now a file\n", 0o644).
		file("file-to-dir/inner.txt", "inner\n", 0o644)
	return img, up
}

func TestWriteUnified(t *testing.T) {
	img, up := diffLayers(t)
	from, to := stack(img), stack(up, img)
	o := snapshot.Options{MaxTextBytes: 280}
	changes, err := snapshot.Changes(t.Context(), from, to, o)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := snapshot.WriteUnified(t.Context(), &b, changes, from, to, o); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "unified.golden")
	if *update {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("diff differs from %s (go test -update rewrites it):\n%s", golden, b.String())
	}
}

// git applies the diff to the image's files and gets the sandbox's.
func TestWriteUnifiedAppliesWithGit(t *testing.T) {
	testutil.RequireProgram(t, "git")
	img, up := diffLayers(t)
	from, to := stack(img), stack(up, img)
	changes, err := snapshot.Changes(t.Context(), from, to, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var text []snapshot.Change // git applies no "Binary files differ"
	for _, c := range changes {
		if c.Path != "/bin.dat" {
			text = append(text, c)
		}
	}
	var b bytes.Buffer
	if err := snapshot.WriteUnified(t.Context(), &b, text, from, to, snapshot.Options{}); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if out, err := exec.Command("cp", "-a", img.dir+"/.", work).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	cmd := exec.Command("git", "apply", "--unidiff-zero", "-")
	cmd.Dir, cmd.Stdin = work, &b
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git apply: %v\n%s\n%s", err, out, b.String())
	}
	for rel, want := range map[string]string{
		"doc/readme.md":         readFile(t, up.path("doc/readme.md")),
		"doc/gone.txt":          "<absent>",
		"doc/run.sh":            "#!/bin/sh\necho hi\n",
		"doc/nonl.txt":          "no newline, edited",
		"old/a.txt":             "<absent>",
		"old/sub/b.txt":         "<absent>",
		"old/link":              "<absent>",
		"big.txt":               strings.Repeat("BIG\n", 75),
		"link":                  "-> target-b",
		"type-change":           "-> elsewhere",
		"new.txt":               "a\nb\n",
		"empty":                 "",
		"evil\nname.txt":        "x\n",
		"ünïcode.txt":           "ü\n",
		"newdir/f.txt":          "f\n",
		"dir-to-file":           "now a file\n",
		"file-to-dir/inner.txt": "inner\n",
	} {
		if got := readFile(t, filepath.Join(work, rel)); got != want {
			t.Errorf("%q after git apply: %q, want %q", rel, got, want)
		}
	}
	if st, err := os.Stat(filepath.Join(work, "doc/run.sh")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("run.sh: %v %v, want mode 0755", st.Mode(), err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	st, err := os.Lstat(p)
	if os.IsNotExist(err) {
		return "<absent>"
	}
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(p)
		if err != nil {
			t.Fatal(err)
		}
		return "-> " + target
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A deleted directory's files are found in every layer that holds some.
func TestWriteUnifiedDeletedTreeAcrossLayers(t *testing.T) {
	bottom := newLayer(t, 0).file("t/a.txt", "a\n", 0o644).file("t/sub/c.txt", "c\n", 0o644)
	middle := newLayer(t, 0).file("t/b.txt", "b\n", 0o644)
	up := newLayer(t, hostBase).whiteout("t")
	from, to := stack(middle, bottom), stack(up, middle, bottom)
	changes, err := snapshot.Changes(t.Context(), from, to, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes", briefs(changes), []string{"deleted /t dir 0755 0:0"})
	var b strings.Builder
	if err := snapshot.WriteUnified(t.Context(), &b, changes, from, to, snapshot.Options{}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "--- ") {
			got = append(got, l)
		}
	}
	sameList(t, "files deleted", got, []string{"--- a/t/a.txt", "--- a/t/b.txt", "--- a/t/sub/c.txt"})
}
