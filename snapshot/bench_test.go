package snapshot_test

import (
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/snapshot"
)

// BenchmarkChanges10k compares a writable layer that rewrote each of an
// image's 10,000 files (100 directories of 100) with the image. "same-size"
// keeps each file's size and owner, so every pair is read and compared
// byte by byte (the worst case); "new-size" changes the size, which
// decides without reading.
func BenchmarkChanges10k(b *testing.B) {
	for _, bc := range []struct {
		name string
		edit func(string) string
	}{
		{"same-size", strings.ToUpper},
		{"new-size", func(s string) string { return s + "!" }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			img := newLayer(b, 0)
			up := newLayer(b, hostBase)
			for d := range 100 {
				for f := range 100 {
					rel := fmt.Sprintf("d%02d/f%02d.txt", d, f)
					content := strings.Repeat(fmt.Sprintf("line of %s\n", rel), 8)
					img.file(rel, content, 0o644)
					up.file(rel, bc.edit(content), 0o644)
				}
			}
			unix.Sync() // not to time the writeback of what was just written
			from, to := stack(img), stack(up, img)
			for b.Loop() {
				got, err := snapshot.Changes(b.Context(), from, to, snapshot.Options{})
				if err != nil || len(got) != 10_000 {
					b.Fatalf("%d changes, %v", len(got), err)
				}
			}
		})
	}
}
