package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testregistry"
)

// The images bench measures sandboxes made of a pulled OCI image beside
// sandboxes of the host image, and the first pull of that image. The image
// is built here and served by a registry in the bench's own process
// (internal/testregistry, on loopback; nothing on the internet is
// reached). Its bottom layer is the peers' root file system
// (makeRootfs), so the image, the host image and podman all run the same
// /usr/bin/echo; above it, layers of one file of random bytes each give it
// its size.

const (
	imageRepo   = "bench/image:1" // on the bench's registry
	imageLayers = 4               // layers of random bytes above the root file system
	// podmanImageRef is the same image, loaded into podman.
	podmanImageRef = "localhost/berth-bench-image:1"
)

// benchImage is the image the step built, and what it holds.
type benchImage struct {
	img        v1.Image
	digests    []string // its layers' blobs, bottom first
	unpacked   int64    // bytes of its layers' tars
	compressed int64    // bytes of its layers' blobs (gzip)
}

// images runs the image measurements; the registry, the daemons, their
// sandboxes and images, and podman's copy of the image are gone when it
// returns.
func (s *suite) images(ctx context.Context) (err error) {
	t := &fakeT{dir: s.cfg.work}
	defer t.close()
	defer recoverFatal(&err)
	dir := filepath.Join(s.cfg.work, "image")
	defer os.RemoveAll(dir)
	rootfs, err := makeRootfs(dir)
	if err != nil {
		return fmt.Errorf("the image's root file system: %w", err)
	}
	t0 := time.Now()
	im, err := buildImage(t, rootfs, s.cfg.imageBytes)
	if err != nil {
		return err
	}
	reg := testregistry.Start(t)
	reg.Push(t, imageRepo, im.img)
	ref := reg.Ref(imageRepo)
	s.log.Info("image built and pushed", "ref", ref, "layers", len(im.digests), "unpacked", im.unpacked, "gzip", im.compressed, "took", time.Since(t0).Round(time.Millisecond))
	what := fmt.Sprintf("%s image of %d layers", mib(im.unpacked), len(im.digests))

	// A daemon without pools takes the pulls and then keeps the image for
	// its creates; the other keeps a warm pool of 2 of each image.
	cold, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-images", 0, s.log, "--insecure-registry", reg.Host)
	if err != nil {
		return err
	}
	defer cold.close()
	if err := s.pulls(ctx, cold, reg, ref, im, what); err != nil {
		return err
	}
	if _, err := cold.client.PullImage(ctx, ref, nil); err != nil {
		return fmt.Errorf("pull %s: %w", ref, err)
	}
	warm, err := startDaemon(ctx, s.cfg.berth, s.cfg.work, "berth-images-pool", 2, s.log, "--insecure-registry", reg.Host, "--warm-pool", ref+"=2")
	if err != nil {
		return err
	}
	defer warm.close()
	warm.pool = 4 // berth_sandboxes{state="pooled"} counts both pools
	if err := warm.settle(ctx); err != nil {
		return err
	}

	const (
		imgWarm  = "berth, pulled image, warm pool of 2"
		hostWarm = "berth, host image, warm pool of 2"
		imgCold  = "berth, pulled image, no pool"
		hostCold = "berth, host image, no pool"
	)
	subjects := []subject{
		imageSubject(imgWarm, warm, ref), imageSubject(hostWarm, warm, ""),
		imageSubject(imgCold, cold, ref), imageSubject(hostCold, cold, ""),
	}
	if s.cfg.peers {
		podman, cleanup := podmanImageSubject(ctx, dir, im.img)
		defer cleanup()
		subjects = append(subjects, podman)
	}
	for i := range subjects {
		subjects[i] = probe(ctx, subjects[i])
	}
	got := s.interleave(ctx, measurable(subjects), s.cfg.rounds, warm.settle, func(ctx context.Context, sub subject) (func(), error) {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return sub.once(ctx)
	})
	// podman's ratio is to berth without a pool: neither starts from
	// anything booted ahead.
	s.res.Metrics = append(s.res.Metrics, rows("images", "create → first exec output (`echo hi`), sequential: a pulled "+what+" beside `host`",
		subjects, got, imgCold, s.cfg.rounds, nil)...)
	for _, pair := range []struct{ subject, img, host string }{
		{"berth, warm pool of 2 of each", imgWarm, hostWarm},
		{"berth, no pool", imgCold, hostCold},
	} {
		m := Metric{Group: "images", Name: "pulled image over host image, create → first exec output, per round", Subject: pair.subject, Unit: "×",
			Target: &Target{Stat: "p50", AtMost: true, Limit: 1.1}}
		if r := ratios(got[pair.img], got[pair.host]); len(r) > 0 {
			sum := summarize(r)
			m.Summary, m.Samples = &sum, r
		} else {
			m.NotMeasured = "no round with a sample of both (see the log)"
		}
		s.res.Metrics = append(s.res.Metrics, m)
	}
	return nil
}

// pulls measures first pulls of the image into d: before each round d has
// none of it (the image of the round before is removed outside the clock)
// and the registry must serve every layer again.
func (s *suite) pulls(ctx context.Context, d *daemon, reg *testregistry.Registry, ref string, im benchImage, what string) error {
	gets := func() []int {
		var n []int
		for _, dg := range im.digests {
			n = append(n, reg.BlobGets(dg))
		}
		return n
	}
	var rates, walls, floor []float64
	var firstErr error
	for r := range s.cfg.pullRounds {
		unix.Sync() // nothing of the round before left to write back
		before := gets()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		t0 := time.Now()
		img, err := d.client.PullImage(pctx, ref, nil)
		wall := time.Since(t0)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err() // the daemon's close removes what it stored
		}
		after, served := gets(), 0
		for i := range after {
			if after[i] > before[i] {
				served++
			}
		}
		if err == nil && served < len(im.digests) {
			err = fmt.Errorf("not a first pull: the registry served %d of the %d layers", served, len(im.digests))
		}
		// Leave nothing for the next round, a failed pull's layers included.
		if img.ID != "" {
			if _, rerr := d.client.RemoveImage(ctx, img.ID); rerr != nil {
				return fmt.Errorf("remove the pulled image: %w", rerr)
			}
		} else if _, rerr := d.client.PruneImages(ctx, true); rerr != nil {
			return fmt.Errorf("prune after a failed pull: %w", rerr)
		}
		if err != nil {
			s.log.Warn("pull failed", "round", r, "err", err)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		rates = append(rates, float64(im.unpacked)/1e6/wall.Seconds())
		walls = append(walls, ms(wall))
		t0 = time.Now()
		if err := fetchBlobs(ctx, reg.Host, im.digests); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
		floor = append(floor, float64(im.unpacked)/1e6/time.Since(t0).Seconds())
	}
	rate := Metric{Group: "images", Subject: "berth", Unit: "MB/s", Target: &Target{Stat: "p50", AtMost: false, Limit: 200},
		Name: fmt.Sprintf("first pull of a %s (%s of gzip blobs) from a registry on loopback: unpacked bytes / wall time", what, mib(im.compressed))}
	wall := Metric{Group: "images", Subject: "berth", Unit: "ms", Name: "first pull, wall time (`client.PullImage` until the image is stored)"}
	for _, row := range []struct {
		m       *Metric
		samples []float64
	}{{&rate, rates}, {&wall, walls}} {
		if len(row.samples) > 0 {
			sum := summarize(row.samples)
			row.m.Summary, row.m.Samples = &sum, row.samples
		}
		if firstErr != nil {
			row.m.NotMeasured = fmt.Sprintf("%d of %d pulls failed, first: %s", s.cfg.pullRounds-len(row.samples), s.cfg.pullRounds, firstLine(firstErr.Error()))
		}
	}
	s.res.Metrics = append(s.res.Metrics, rate, wall)
	if len(floor) > 0 {
		sum := summarize(floor)
		s.res.Metrics = append(s.res.Metrics, Metric{Group: "images", Subject: "host", Unit: "MB/s", Summary: &sum, Samples: floor,
			Name: "baseline: the bench itself fetching the same blobs from the registry and gunzipping them, one after another (no digests, no disk)"})
	}
	return nil
}

// fetchBlobs downloads the blobs of the bench's image from the registry at
// host, one after another, and decompresses each to nothing.
func fetchBlobs(ctx context.Context, host string, digests []string) error {
	repo, _, _ := strings.Cut(imageRepo, ":")
	for _, dg := range digests {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/v2/"+repo+"/blobs/"+dg, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return fmt.Errorf("GET blob %s: %s", dg, resp.Status)
		}
		z, err := gzip.NewReader(resp.Body)
		if err == nil {
			_, err = io.Copy(io.Discard, z)
		}
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("blob %s: %w", dg, err)
		}
	}
	return nil
}

// imageSubject measures berth's create of image ("": the host image) and
// the first exec's output, on d.
func imageSubject(name string, d *daemon, image string) subject {
	return subject{
		name: name,
		once: func(ctx context.Context) (func(), error) {
			id, err := d.createEcho(ctx, image)
			if id == "" {
				return nil, err
			}
			return func() { d.remove(id) }, err
		},
	}
}

// podmanImageSubject measures `podman run --rm` of the bench's image,
// written as a `docker save` tar and loaded into podman (outside every
// clock). The cleanup removes podman's copy.
func podmanImageSubject(ctx context.Context, dir string, img v1.Image) (subject, func()) {
	s := subject{name: "podman run --rm (the same image, loaded)"}
	path, err := exec.LookPath("podman")
	if err != nil {
		s.why = "podman is not installed (scripts/bench-deps.sh installs it with apt)"
		return s, func() {}
	}
	tag, err := name.NewTag(podmanImageRef)
	if err != nil {
		s.why = err.Error()
		return s, func() {}
	}
	file := filepath.Join(dir, "image.tar")
	defer os.Remove(file)
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		s.why = "write the image as a docker save tar: " + firstLine(err.Error())
		return s, func() {}
	}
	cleanup := func() { command(context.Background(), path, "rmi", "-f", podmanImageRef) }
	if _, err := command(ctx, path, "load", "-q", "-i", file); err != nil {
		s.why = "podman load: " + firstLine(err.Error())
		return s, cleanup
	}
	s.once = func(ctx context.Context) (func(), error) {
		return nil, wantHi(command(ctx, path, append(append([]string{"run", "--rm"}, podmanRunFlags...), podmanImageRef, "/usr/bin/echo", "hi")...))
	}
	return s, cleanup
}

// buildImage makes the bench's image: the root file system at rootfs as
// its bottom layer and, above it, imageLayers layers of one file of random
// bytes each, dataBytes in all.
func buildImage(t *fakeT, rootfs string, dataBytes int64) (benchImage, error) {
	entries, err := treeEntries(rootfs)
	if err != nil {
		return benchImage{}, fmt.Errorf("the image's root file system: %w", err)
	}
	// The users a sandbox of an image runs as are looked up in its own
	// /etc/passwd: root, the image's default.
	entries = append(entries,
		testregistry.Entry{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/usr/bin/false\n"},
		testregistry.Entry{Name: "etc/group", Body: "root:x:0:\n"})
	tars := [][]byte{testregistry.Tar(t, entries...)}
	for i := range imageLayers {
		tars = append(tars, testregistry.Tar(t,
			testregistry.Entry{Name: "data/", Type: tar.TypeDir},
			testregistry.Entry{Name: fmt.Sprintf("data/%d", i), Body: string(noise(uint64(i), dataBytes/imageLayers))}))
	}
	var im benchImage
	var layers []v1.Layer
	for _, b := range tars {
		l := testregistry.Layer(t, b)
		size, err := l.Size()
		if err != nil {
			return benchImage{}, err
		}
		dg, err := l.Digest()
		if err != nil {
			return benchImage{}, err
		}
		layers = append(layers, l)
		im.digests = append(im.digests, dg.String())
		im.unpacked += int64(len(b))
		im.compressed += size
	}
	im.img = testregistry.Image(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin"}}, goruntime.GOARCH, layers...)
	return im, nil
}

// treeEntries are the tar entries of the tree at root: its directories,
// regular files and symbolic links.
func treeEntries(root string) ([]testregistry.Entry, error) {
	var out []testregistry.Entry
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		mode := int64(info.Mode().Perm())
		switch {
		case e.IsDir():
			out = append(out, testregistry.Entry{Name: rel + "/", Type: tar.TypeDir, Mode: mode})
		case e.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			out = append(out, testregistry.Entry{Name: rel, Type: tar.TypeSymlink, Link: link, Mode: 0o777})
		case e.Type().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			out = append(out, testregistry.Entry{Name: rel, Body: string(b), Mode: mode})
		default:
			return fmt.Errorf("%s: not a directory, file or symbolic link", path)
		}
		return nil
	})
	return out, err
}

// noise is n bytes, each one of 16 values at random: gzip can do no better
// than about half (4 bits a byte), and unpacking it decodes every byte.
func noise(seed uint64, n int64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x6265727468))
	b := make([]byte, n)
	for i := 0; i < len(b); i += 16 {
		v := r.Uint64()
		for j := i; j < min(i+16, len(b)); j++ {
			b[j] = 'a' + byte(v&15)
			v >>= 4
		}
	}
	return b
}

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }
