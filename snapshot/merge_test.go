package snapshot_test

import (
	"testing"

	"github.com/berthsh/berth/snapshot"
)

func mergeBase(t *testing.T) *layerDir {
	return newLayer(t, 0).
		file("a/b/x.txt", "x\n", 0o644).
		file("conf.txt", "v1\n", 0o644).
		file("shared.txt", "s\n", 0o644).
		file("del-both.txt", "d\n", 0o644).
		file("edit-vs-del.txt", "e\n", 0o644).
		file("dir/keep.txt", "k\n", 0o644).
		file("mode.sh", "m\n", 0o644)
}

func TestMergeConflicts(t *testing.T) {
	base := mergeBase(t)
	// Two sandboxes, each with its own id range.
	ours := newLayer(t, hostBase).
		file("conf.txt", "v2-ours\n", 0o644).  // an edit against theirs
		file("same-add.txt", "same\n", 0o644). // the same as theirs
		file("shared.txt", "s2\n", 0o644).     // the same edit as theirs
		whiteout("del-both.txt").
		whiteout("edit-vs-del.txt").
		whiteout("a").                          // theirs adds below it
		file("dir/ours-new.txt", "o\n", 0o644). // theirs deletes dir
		file("ours-only.txt", "o\n", 0o644).
		file("mode.sh", "m\n", 0o755)
	theirs := newLayer(t, 2*hostBase).
		file("conf.txt", "v2-thrs\n", 0o644). // the same size as ours
		file("same-add.txt", "same\n", 0o644).
		file("shared.txt", "s2\n", 0o644).
		whiteout("del-both.txt").
		file("edit-vs-del.txt", "edited\n", 0o644).
		file("a/b/c/deep.txt", "deep\n", 0o644).
		whiteout("dir").
		file("theirs-only.txt", "t\n", 0o644).
		file("mode.sh", "m\n", 0o700)
	b := stack(base)
	changes, conflicts, err := snapshot.Merge(t.Context(), b, stack(ours, base), stack(theirs, base), snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes", briefs(changes), []string{
		"added /a/b/c dir 0755 0:0",
		"added /a/b/c/deep.txt file 0644 0:0 5B",
		"modified /conf.txt file 0644 0:0 8B",
		"deleted /del-both.txt file 0644 0:0 2B",
		"deleted /dir dir 0755 0:0",
		"modified /edit-vs-del.txt file 0644 0:0 7B",
		"modified /mode.sh file 0700 0:0 2B",
		"added /same-add.txt file 0644 0:0 5B",
		"modified /shared.txt file 0644 0:0 3B",
		"added /theirs-only.txt file 0644 0:0 2B",
	})
	var got []string
	for _, c := range conflicts {
		got = append(got, c.Path+": ours "+c.Ours.Kind+" "+c.Ours.Path+", theirs "+c.Theirs.Kind+" "+c.Theirs.Path)
	}
	sameList(t, "conflicts", got, []string{
		"/a/b/c: ours deleted /a, theirs added /a/b/c",
		"/a/b/c/deep.txt: ours deleted /a, theirs added /a/b/c/deep.txt",
		"/conf.txt: ours modified /conf.txt, theirs modified /conf.txt",
		"/dir/ours-new.txt: ours added /dir/ours-new.txt, theirs deleted /dir",
		"/edit-vs-del.txt: ours deleted /edit-vs-del.txt, theirs modified /edit-vs-del.txt",
		"/mode.sh: ours modified /mode.sh, theirs modified /mode.sh",
	})
}

func TestMergeWithoutConflicts(t *testing.T) {
	base := mergeBase(t)
	ours := newLayer(t, hostBase).
		file("conf.txt", "v2\n", 0o644).
		file("a/b/ours.txt", "o\n", 0o644).
		whiteout("del-both.txt")
	theirs := newLayer(t, 2*hostBase).
		file("conf.txt", "v2\n", 0o644). // the same edit
		file("a/b/theirs.txt", "t\n", 0o644).
		whiteout("del-both.txt").
		whiteout("dir")
	changes, conflicts, err := snapshot.Merge(t.Context(), stack(base), stack(ours, base), stack(theirs, base), snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(conflicts) != 0 {
		t.Errorf("conflicts %+v", conflicts)
	}
	sameList(t, "changes", briefs(changes), []string{
		"added /a/b/theirs.txt file 0644 0:0 2B",
		"modified /conf.txt file 0644 0:0 3B",
		"deleted /del-both.txt file 0644 0:0 2B",
		"deleted /dir dir 0755 0:0",
	})
}
