package snapshot_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/berthsh/berth/snapshot"
)

// imageLayer is a base image's layer: ids as the sandbox sees them.
func imageLayer(t *testing.T) *layerDir {
	return newLayer(t, 0).
		file("etc/hosts", "127.0.0.1 localhost\n", 0o644).
		file("etc/motd", "hello\n", 0o644).
		file("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644).
		file("etc/shadow", "root:*:1::::::\n", 0o640, 0, 42).
		file("usr/bin/tool", "#!/bin/sh\necho tool\n", 0o755).
		file("usr/share/doc/a.txt", "a\n", 0o644).
		file("usr/share/doc/sub/b.txt", "b\n", 0o644).
		file("opt/app/config.json", "{}\n", 0o644).
		file("opt/app/data/x", "x\n", 0o644).
		file("srv/old/inner.txt", "inner\n", 0o644).
		file("srv/file", "a file\n", 0o644).
		mkdir("home/u", 0o750, 1000).
		file("home/u/notes.txt", "notes\n", 0o600, 1000).
		file("home/u/other.txt", "other\n", 0o600, 1000).
		file("var/log/syslog", "log\n", 0o640).
		file("rename/src.txt", "moving\n", 0o644)
}

// sandboxUpper is what a sandbox wrote over imageLayer, as overlay keeps
// it: host ids from hostBase, whiteouts, an opaque directory, copies up.
func sandboxUpper(t *testing.T) *layerDir {
	u := newLayer(t, hostBase).
		file("etc/new.conf", "new=1\n", 0o644).                               // added
		file("newdir/sub/f.txt", "fresh\n", 0o644).                           // added tree
		file("etc/hosts", "127.0.0.1 localhost\n10.0.0.2 db\n", 0o644).       // edited
		file("etc/motd", "HELLO\n", 0o644).                                   // edited, same size
		file("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644).             // copied up, unchanged
		file("etc/shadow", "root:*:1::::::\n", 0o600, 0, 42).                 // chmod
		whiteout("usr/bin/tool").                                             // deleted file
		whiteout("usr/share/doc").                                            // deleted tree
		whiteout("rename/src.txt").file("rename/dst.txt", "moving\n", 0o644). // renamed
		mkdir("home/u", 0o750, 1000).                                         // copied up
		file("home/u/notes.txt", "notes\n", 0o600, 1001).                     // chown
		file("home/u/other.txt", "other\n", 0o600, 1000).                     // copied up, unchanged
		file("srv/old", "now a file\n", 0o644).                               // dir -> file
		file("srv/file/inner", "in a dir\n", 0o644).                          // file -> dir
		mkdir("opt/app", 0o755).opaque("opt/app").                            // rmdir + mkdir
		file("opt/app/config.json", "{}\n", 0o644).                           // as it was
		file("opt/app/new.txt", "new\n", 0o644).                              // added
		whiteout("etc/ghost").                                                // whiteout over nothing
		symlink("root-link", "/").                                            // to the host's root, never followed
		symlink("var/log", "/").                                              // a directory replaced by a link
		file("etc/foreign", "x\n", 0o644, -5).                                // host uid 5: outside the range
		fifo("tmp/pipe").                                                     // a fifo
		file("etc/hostname", "sandbox\n", 0o644).                             // berth's
		file("etc/resolv.conf", "# mine\nnameserver 10.0.0.1\n", 0o644).      // berth's
		file("etc/ssl/ca.crt", "USER CA\n", 0o644).                           // berth's, then edited
		file("run/berth/token", "secret\n", 0o600).                           // berth's, in a new dir
		file("bin/h1", "linked\n", 0o755).link("bin/h2", "bin/h1")            // hard links
	return u
}

var skip = map[string][]byte{
	"/etc/hostname":    nil,
	"/etc/resolv.conf": []byte("nameserver 10.0.0.1\n"),
	"/etc/ssl/ca.crt":  []byte("BERTH CA\n"),
	"/run/berth/token": nil,
}

var wantSandboxChanges = []string{
	"added /bin dir 0755 0:0",
	"added /bin/h1 file 0755 0:0 7B",
	"added /bin/h2 file 0755 0:0 7B",
	"added /etc/foreign file 0644 65534:65534 2B",
	"modified /etc/hosts file 0644 0:0 32B",
	"modified /etc/motd file 0644 0:0 6B",
	"added /etc/new.conf file 0644 0:0 6B",
	"modified /etc/shadow file 0600 0:42 15B",
	"added /etc/ssl dir 0755 0:0",
	"added /etc/ssl/ca.crt file 0644 0:0 8B",
	"modified /home/u/notes.txt file 0600 1001:1001 6B",
	"added /newdir dir 0755 0:0",
	"added /newdir/sub dir 0755 0:0",
	"added /newdir/sub/f.txt file 0644 0:0 6B",
	"deleted /opt/app/data dir 0755 0:0",
	"added /opt/app/new.txt file 0644 0:0 4B",
	"added /rename/dst.txt file 0644 0:0 7B",
	"deleted /rename/src.txt file 0644 0:0 7B",
	"added /root-link symlink 0777 0:0 -> /",
	"modified /srv/file dir 0755 0:0",
	"added /srv/file/inner file 0644 0:0 9B",
	"modified /srv/old file 0644 0:0 11B",
	"added /tmp dir 0755 0:0",
	"added /tmp/pipe fifo 0644 0:0",
	"deleted /usr/bin/tool file 0755 0:0 20B",
	"deleted /usr/share/doc dir 0755 0:0",
	"modified /var/log symlink 0777 0:0 -> /",
}

// A sandbox over its image: the stacks share the image, so only the
// writable layer is walked.
func TestChangesOfASandbox(t *testing.T) {
	img := imageLayer(t)
	up := sandboxUpper(t)
	got, err := snapshot.Changes(t.Context(), stack(img), stack(up, img), snapshot.Options{Skip: skip})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes", briefs(got), wantSandboxChanges)
	for _, c := range got {
		if c.ModTime.IsZero() {
			t.Errorf("%s: no time", c.Path)
		}
	}
}

// Stacks that share no layer (a copy of the image under the sandbox's
// layer) are walked whole and give the same answer.
func TestChangesWithoutSharedLayers(t *testing.T) {
	img := imageLayer(t)
	img2 := imageLayer(t)
	up := sandboxUpper(t)
	got, err := snapshot.Changes(t.Context(), stack(img), stack(up, img2), snapshot.Options{Skip: skip})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes", briefs(got), wantSandboxChanges)
}

// A snapshot's layer and another sandbox's writable layer over the same
// image: the general comparison.
func TestChangesBetweenTwoStacks(t *testing.T) {
	img := newLayer(t, 0).
		file("etc/motd", "hello\n", 0o644).
		file("same.txt", "same\n", 0o644).
		file("gone.txt", "gone\n", 0o644).
		file("both-gone.txt", "x\n", 0o644).
		file("dir/keep.txt", "keep\n", 0o644).
		file("dir/lost.txt", "lost\n", 0o644)
	snap := newLayer(t, 0).
		file("etc/motd", "AAAAA\n", 0o644).
		file("same.txt", "same\n", 0o644).
		file("only-snap.txt", "s\n", 0o644).
		whiteout("gone.txt").
		whiteout("both-gone.txt").
		mkdir("dir", 0o755).opaque("dir").file("dir/keep.txt", "keep\n", 0o644)
	up := newLayer(t, hostBase).
		file("etc/motd", "BBBBB\n", 0o644). // the same size, other bytes
		file("same.txt", "same\n", 0o644).  // the same bytes, another inode
		file("only-upper.txt", "u\n", 0o644).
		whiteout("both-gone.txt").
		file("dir/keep.txt", "keep\n", 0o644)
	got, err := snapshot.Changes(t.Context(), stack(snap, img), stack(up, img), snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes", briefs(got), []string{
		"added /dir/lost.txt file 0644 0:0 5B", // hidden by the snapshot's opaque dir, there in the sandbox
		"modified /etc/motd file 0644 0:0 6B",
		"added /gone.txt file 0644 0:0 5B",
		"deleted /only-snap.txt file 0644 0:0 2B",
		"added /only-upper.txt file 0644 0:0 2B",
	})
	// And back.
	got, err = snapshot.Changes(t.Context(), stack(up, img), stack(snap, img), snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes back", briefs(got), []string{
		"deleted /dir/lost.txt file 0644 0:0 5B",
		"modified /etc/motd file 0644 0:0 6B",
		"deleted /gone.txt file 0644 0:0 5B",
		"added /only-snap.txt file 0644 0:0 2B",
		"deleted /only-upper.txt file 0644 0:0 2B",
	})
}

// Lookups follow overlay through several layers: an upper non-directory
// hides a lower directory's entries, a whiteout hides what is below it.
func TestChangesThroughLayers(t *testing.T) {
	bottom := newLayer(t, 0).
		file("a/b/c.txt", "c\n", 0o644).
		file("x/y.txt", "y\n", 0o644)
	middle := newLayer(t, 0).
		file("a", "a file now\n", 0o644). // hides a/b/c.txt
		whiteout("x")
	top := newLayer(t, hostBase).
		file("a/b/c.txt", "c\n", 0o644). // a directory over the file: c.txt is new
		file("x/y.txt", "y\n", 0o644)    // over the whiteout: new
	got, err := snapshot.Changes(t.Context(), stack(middle, bottom), stack(top, middle, bottom), snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes", briefs(got), []string{
		"modified /a dir 0755 0:0",
		"added /a/b dir 0755 0:0",
		"added /a/b/c.txt file 0644 0:0 2B",
		"added /x dir 0755 0:0",
		"added /x/y.txt file 0644 0:0 2B",
	})
	got, err = snapshot.Changes(t.Context(), stack(bottom), stack(top, middle, bottom), snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes over the bottom", briefs(got), nil) // what the top wrote is the bottom again
}

// Skip leaves out berth's files in the writable layer, not a deletion of
// the image's file.
func TestSkipDoesNotHideDeletions(t *testing.T) {
	img := newLayer(t, 0).file("etc/hostname", "image\n", 0o644)
	up := newLayer(t, hostBase).whiteout("etc/hostname")
	got, err := snapshot.Changes(t.Context(), stack(img), stack(up, img), snapshot.Options{Skip: skip})
	if err != nil {
		t.Fatal(err)
	}
	sameList(t, "changes", briefs(got), []string{"deleted /etc/hostname file 0644 0:0 6B"})
}

func TestChangesOfNothing(t *testing.T) {
	img := imageLayer(t)
	up := newLayer(t, hostBase).
		mkdir("etc", 0o755).
		file("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644).
		file("etc/hostname", "sb\n", 0o644).
		whiteout("nothing-here")
	got, err := snapshot.Changes(t.Context(), stack(img), stack(up, img), snapshot.Options{Skip: skip})
	if err != nil || len(got) != 0 {
		t.Fatalf("got %v, %v; want nothing", briefs(got), err)
	}
}

func TestChangesStopsWhenCanceled(t *testing.T) {
	up := newLayer(t, hostBase)
	for i := range 600 {
		up.file(fmt.Sprintf("f/%03d", i), "", 0o644)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := snapshot.Changes(ctx, nil, stack(up), snapshot.Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

// A name with a newline is listed as it is and printed escaped.
func TestHostileNamesAreEscapedInErrors(t *testing.T) {
	up := newLayer(t, hostBase).file("evil\nname", "x\n", 0o644)
	got, err := snapshot.Changes(t.Context(), nil, stack(up), snapshot.Options{})
	if err != nil || len(got) != 1 || got[0].Path != "/evil\nname" {
		t.Fatalf("got %v, %v", briefs(got), err)
	}
	if err := os.Remove(up.path("evil\nname")); err != nil {
		t.Fatal(err)
	}
	err = snapshot.WriteTar(t.Context(), &strings.Builder{}, got, stack(up))
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), `evil\nname`) {
		t.Fatalf("err %q: want the name escaped", err)
	}
	t.Logf("as expected: %v", err)
}

// The walk opens nothing through a symlink: a writable layer whose
// directory is swapped for a link to / after the listing reads no host
// file.
func TestSymlinkedDirectoryIsNotFollowed(t *testing.T) {
	img := newLayer(t, 0).file("d/f", "f\n", 0o644)
	up := newLayer(t, hostBase).file("d/f", "F\n", 0o644)
	got, err := snapshot.Changes(t.Context(), stack(img), stack(up, img), snapshot.Options{})
	if err != nil || len(got) != 1 {
		t.Fatalf("got %v, %v", briefs(got), err)
	}
	// Swap d for a link to a directory that has an f too.
	host := t.TempDir()
	if err := os.WriteFile(host+"/f", []byte("HOST SECRET\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("sh", "-c", `rm -r "$0/d" && ln -s "$1" "$0/d"`, up.dir, host).Run(); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	err = snapshot.WriteTar(t.Context(), &b, got, stack(up, img))
	if err == nil || strings.Contains(b.String(), "HOST SECRET") {
		t.Fatalf("err %v; tar holds the host's file: %v", err, strings.Contains(b.String(), "HOST SECRET"))
	}
	t.Logf("tar, as expected: %v", err)
	err = snapshot.WriteUnified(t.Context(), &b, got, stack(img), stack(up, img), snapshot.Options{})
	if err == nil || strings.Contains(b.String(), "HOST SECRET") {
		t.Fatalf("err %v; diff shows the host's file", err)
	}
	t.Logf("diff, as expected: %v", err)
}
