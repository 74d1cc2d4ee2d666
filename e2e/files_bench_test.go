package e2e

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
	"github.com/berthsh/berth/client"
	"github.com/berthsh/berth/internal/testutil"
)

// Len tells the client the length, as a file's size would.
func (z *zeros) Len() int { return int(z.n) }

// zeros is an endless reader of zero bytes that hides WriteTo, so copies
// run through the HTTP stack as they would from a real file.
type zeros struct{ n int64 }

func (z *zeros) Read(b []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := int64(len(b))
	if k > z.n {
		k = z.n
	}
	clear(b[:k])
	z.n -= k
	return int(k), nil
}

const transferSize = 1 << 30

// BenchmarkUpload1GiB measures an upload of 1 GiB through the public API
// (client → daemon on loopback → guest → the sandbox's writable layer);
// MB/s is the throughput.
func BenchmarkUpload1GiB(b *testing.B) {
	d := startDaemon(b, "")
	ctx := context.Background()
	id := newSandbox(b, d)
	b.SetBytes(transferSize)
	b.ResetTimer()
	for b.Loop() {
		fi, err := d.client.Upload(ctx, id, "/tmp/big", &zeros{n: transferSize}, client.FileOptions{})
		if err != nil || fi.Size != transferSize {
			b.Fatalf("upload: %+v %v", fi, err)
		}
	}
}

// BenchmarkDownload1GiB measures a download of a 1 GiB file.
func BenchmarkDownload1GiB(b *testing.B) {
	d := startDaemon(b, "")
	ctx := context.Background()
	id := newSandbox(b, d)
	if r, err := d.client.Exec(ctx, id, api.ExecRequest{Shell: "head -c 1073741824 /dev/urandom > /tmp/big"}); err != nil || r.ExitCode != 0 {
		b.Fatalf("make file: %+v %v", r, err)
	}
	b.SetBytes(transferSize)
	buf := make([]byte, 1<<20)
	b.ResetTimer()
	for b.Loop() {
		rc, err := d.client.Download(ctx, id, "/tmp/big", client.FileOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{rc}, buf)
		rc.Close()
		if err != nil || n != transferSize {
			b.Fatalf("download: %d bytes, %v", n, err)
		}
	}
}

// BenchmarkGrep10kFiles measures grep over a tree of 10,000 source-like
// files (about 33 MiB) in a sandbox, through the public API.
func BenchmarkGrep10kFiles(b *testing.B) {
	d := startDaemon(b, "")
	ctx := context.Background()
	id := newSandbox(b, d)
	mk := `python3 - <<'PY'
import os, random
random.seed(1)
words = ["alpha", "beta", "gamma", "delta", "return", "def", "self", "value", "index", "print"]
for i in range(10000):
    d = "/home/user/tree/d%d/e%d" % (i % 50, i % 7)
    os.makedirs(d, exist_ok=True)
    with open("%s/f%d.py" % (d, i), "w") as f:
        for j in range(100):
            f.write(" ".join(random.choice(words) for _ in range(6)) + "\n")
        if i % 100 == 0:
            f.write("needle_%d = True\n" % i)
PY`
	if r, err := d.client.Exec(ctx, id, api.ExecRequest{Shell: mk, TimeoutMs: 120000}); err != nil || r.ExitCode != 0 {
		b.Fatalf("make tree: %+v %v", r, err)
	}
	var samples []time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		res, err := d.client.Grep(ctx, id, api.GrepRequest{Pattern: "needle_", Path: "/home/user/tree"})
		if err != nil || len(res.Matches) != 100 || res.FilesSearched != 10000 {
			b.Fatalf("grep: %d matches, %d files, %v", len(res.Matches), res.FilesSearched, err)
		}
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}

// BenchmarkDiskWrite1GiB is the baseline for BenchmarkUpload1GiB: the host
// itself writing a new 1 GiB file with 1 MiB writes on the disk that holds
// the sandboxes' writable layers (the state directory's), in the same run.
func BenchmarkDiskWrite1GiB(b *testing.B) {
	dir := testutil.StateDir(b)
	buf := make([]byte, 1<<20)
	b.SetBytes(transferSize)
	for b.Loop() {
		f, err := os.CreateTemp(dir, "disk-baseline-")
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; n < transferSize; n += len(buf) {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		f.Close()
		b.StopTimer()
		os.Remove(f.Name())
		b.StartTimer()
	}
}
