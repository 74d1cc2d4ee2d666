package layerdiff_test

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testutil"
	"github.com/berthsh/berth/layerdiff"
)

// The benchmarks copy trees on the disk of berth's state directory (under
// /var/tmp, not a tmpfs; $LAYERDIFF_BENCH_DIR if set), made once per
// process and removed at its end.
var benchTrees struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchTrees.dir != "" {
		os.RemoveAll(benchTrees.dir)
	}
	os.Exit(code)
}

// benchTree returns the tree called name: "100MiB", 1,000 files of random
// content and sizes that total 100 MiB in 3 levels of directories, or
// "10k-small", 10,000 files of 1 to 8 KiB in 100 directories. Its files
// are on disk (synced) and older than a pass beginning now would copy
// again.
func benchTree(b *testing.B, name string) string {
	b.Helper()
	testutil.RequireRoot(b)
	benchTrees.once.Do(func() {
		parent := cmp.Or(os.Getenv("LAYERDIFF_BENCH_DIR"), "/var/tmp")
		benchTrees.dir, benchTrees.err = os.MkdirTemp(parent, "layerdiff-bench-")
		if benchTrees.err != nil {
			return
		}
		r := rand.New(rand.NewChaCha8([32]byte{1}))
		weights := make([]float64, 1000)
		sum := 0.0
		for i := range weights {
			weights[i] = r.ExpFloat64()
			sum += weights[i]
		}
		sizes := make([]int, len(weights))
		total := 0
		for i, w := range weights {
			sizes[i] = int(w / sum * (100 << 20))
			total += sizes[i]
		}
		sizes[0] += 100<<20 - total
		if benchTrees.err = writeTree(filepath.Join(benchTrees.dir, "100MiB"), r, sizes, func(i int) string {
			return fmt.Sprintf("d%d/e%d/f%d", i%10, i%3, i)
		}); benchTrees.err != nil {
			return
		}
		sizes = sizes[:0]
		for range 10000 {
			sizes = append(sizes, 1<<10+r.IntN(7<<10))
		}
		if benchTrees.err = writeTree(filepath.Join(benchTrees.dir, "10k-small"), r, sizes, func(i int) string {
			return fmt.Sprintf("pkg%d/lib/f%d.js", i%100, i)
		}); benchTrees.err != nil {
			return
		}
		fd, err := unix.Open(benchTrees.dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			benchTrees.err = err
			return
		}
		benchTrees.err = unix.Syncfs(fd)
		unix.Close(fd)
		waitPastSince()
	})
	if benchTrees.err != nil {
		b.Fatal(benchTrees.err)
	}
	return filepath.Join(benchTrees.dir, name)
}

func writeTree(root string, r *rand.Rand, sizes []int, path func(int) string) error {
	buf := make([]byte, slices.Max(sizes)+8)
	for i, size := range sizes {
		p := filepath.Join(root, path(i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		for j := 0; j < size; j += 8 {
			binary.LittleEndian.PutUint64(buf[j:], r.Uint64())
		}
		if err := os.WriteFile(p, buf[:size], 0o644); err != nil {
			return err
		}
	}
	return nil
}

var benchIDs = layerdiff.IDs{Base: 0, Size: 65536}

// newDst returns an empty directory beside the trees, removed when the
// benchmark ends; with the timer stopped.
func newDst(b *testing.B) string {
	b.StopTimer()
	defer b.StartTimer()
	dst, err := os.MkdirTemp(benchTrees.dir, "copy-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dst) })
	return dst
}

// removeDst removes a copy, with the timer stopped.
func removeDst(b *testing.B, dst string) {
	b.StopTimer()
	defer b.StartTimer()
	if err := os.RemoveAll(dst); err != nil {
		b.Fatal(err)
	}
}

var benchNames = []string{"100MiB", "10k-small"}

// BenchmarkCopy is a full copy into an empty directory.
func BenchmarkCopy(b *testing.B) {
	for _, name := range benchNames {
		b.Run(name, func(b *testing.B) {
			src := benchTree(b, name)
			var st layerdiff.CopyStats
			for b.Loop() {
				dst := newDst(b)
				var err error
				if st, err = layerdiff.Copy(dst, src, layerdiff.CopyOptions{IDs: benchIDs}); err != nil {
					b.Fatal(err)
				}
				removeDst(b, dst)
			}
			b.SetBytes(st.Bytes)
			b.ReportMetric(float64(st.Entries), "entries")
		})
	}
}

// BenchmarkCpA is what Copy is measured against: cp -a of the same tree
// on the same disk.
func BenchmarkCpA(b *testing.B) {
	for _, name := range benchNames {
		b.Run(name, func(b *testing.B) {
			src := benchTree(b, name)
			for b.Loop() {
				dst := filepath.Join(newDst(b), "tree")
				if out, err := exec.Command("/bin/cp", "-a", src, dst).CombinedOutput(); err != nil {
					b.Fatalf("cp -a: %v\n%s", err, out)
				}
				removeDst(b, filepath.Dir(dst))
			}
		})
	}
}

// BenchmarkCopySince is a frozen pass after one file changed: the walk,
// and that file copied again.
func BenchmarkCopySince(b *testing.B) {
	for _, name := range benchNames {
		b.Run(name, func(b *testing.B) {
			src := benchTree(b, name)
			dst := newDst(b)
			began := time.Now()
			if _, err := layerdiff.Copy(dst, src, layerdiff.CopyOptions{IDs: benchIDs, Live: true}); err != nil {
				b.Fatal(err)
			}
			o := layerdiff.CopyOptions{IDs: benchIDs, Since: began.Add(-layerdiff.SinceMargin)}
			changed := filepath.Join(src, map[string]string{"100MiB": "d1/e1/f1", "10k-small": "pkg1/lib/f1.js"}[name])
			content, err := os.ReadFile(changed)
			if err != nil {
				b.Fatal(err)
			}
			var st layerdiff.CopyStats
			for b.Loop() {
				b.StopTimer()
				content[0]++
				if err := os.WriteFile(changed, content, 0o644); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if st, err = layerdiff.Copy(dst, src, o); err != nil {
					b.Fatal(err)
				}
			}
			if st.Copied != 1 {
				b.Errorf("the pass copied %d entries, not the 1 that changed", st.Copied)
			}
			b.ReportMetric(float64(st.Entries), "entries")
		})
	}
}
