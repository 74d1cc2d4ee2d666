package template

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/berthsh/berth/errdefs"
)

func TestParseRefusesWhatItCannotRun(t *testing.T) {
	for _, c := range []struct{ dockerfile, want string }{
		{"FROM a\nRUN x\nHEALTHCHECK CMD true\n", "line 3: HEALTHCHECK CMD true: HEALTHCHECK is not supported"},
		{"FROM a\nVOLUME /data\n", "line 2: VOLUME /data: VOLUME is not supported"},
		{"FROM a AS build\n", "line 1"},
		{"FROM a\nFROM b\n", "line 2: FROM b: a second FROM"},
		{"FROM a\nCOPY --from=x /a /b\n", "--from (a multi-stage build) is not supported"},
		{"FROM a\nRUN --mount=type=cache,target=/x true\n", "flag --mount=type=cache,target=/x of RUN is not supported"},
		{"FROM a\nCOPY --chmod=755 a /b\n", "flag --chmod=755 of COPY is not supported"},
		{"RUN true\nFROM a\n", "line 1: RUN true: RUN before FROM"},
		{"ARG X\n", "no FROM"},
		{"FROM a\nRUN <<EOF\necho hi\nEOF\n", "heredocs are not supported"},
	} {
		_, err := parse([]byte(c.dockerfile))
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want invalid_argument saying %q", c.dockerfile, err, c.want)
		}
	}
	steps, err := parse([]byte("ARG V=1\nFROM a:${V}\nENV A=1 B=\"two words\"\nRUN [\"/bin/sh\", \"-c\", \"x\"]\nRUN echo \\\n  continued\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 5 || steps[2].cmd != "env" || !slices.Equal(steps[2].args, []string{"A", "1", "=", "B", "\"two words\"", "="}) ||
		!steps[3].json || steps[4].line != 5 || steps[4].args[0] != "echo   continued" {
		t.Fatalf("parsed: %+v", steps)
	}
}

func contextOf(t *testing.T, entries ...[3]string) *buildContext {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, Typeflag: e[1][0]}
		switch h.Typeflag {
		case tar.TypeReg:
			h.Size = int64(len(e[2]))
		case tar.TypeSymlink, tar.TypeLink:
			h.Linkname = e[2]
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e[2]))
		}
	}
	tw.Close()
	c, err := readContext(t.TempDir(), &b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return c
}

func reg(name, body string) [3]string { return [3]string{name, string(tar.TypeReg), body} }

func TestContextRefusesNamesThatClimbOut(t *testing.T) {
	for _, name := range []string{"../x", "a/../../x"} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
		tw.Write([]byte("x"))
		tw.Close()
		if _, err := readContext(t.TempDir(), &b); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v", name, err)
		}
	}
	c := contextOf(t, reg("a.txt", "a"))
	if _, err := c.match("../a.txt"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a source that climbs out: %v", err)
	}
	if _, err := c.match("b.txt"); !errdefs.IsNotFound(err) {
		t.Errorf("a missing source: %v", err)
	}
}

// copyTar names what it copies as COPY does: a directory's contents, a
// file under its name or the destination's; symlinks stay links; the sum
// sees content and modes, not times.
func TestCopyTar(t *testing.T) {
	c := contextOf(t, reg("app/main.py", "print()"), reg("app/lib/u.py", "u"), [3]string{"app/link", string(tar.TypeSymlink), "/etc/shadow"},
		reg("x.txt", "x"), reg("y.txt", "y"), [3]string{"hard", string(tar.TypeLink), "x.txt"})
	names := func(sources []string, rename string) ([]string, string) {
		var b bytes.Buffer
		sum := sha256.New()
		if err := c.copyTar(&b, sum, sources, rename); err != nil {
			t.Fatal(err)
		}
		var out []string
		tr := tar.NewReader(&b)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return out, string(sum.Sum(nil))
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, h.Name)
			if h.Name == "link" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/shadow") {
				t.Errorf("symlink: %+v", h)
			}
		}
	}
	if got, _ := names([]string{"app"}, ""); !slices.Equal(got, []string{"lib/", "lib/u.py", "link", "main.py"}) {
		t.Errorf("a directory's contents: %q", got)
	}
	if got, _ := names([]string{"x.txt"}, "renamed"); !slices.Equal(got, []string{"renamed"}) {
		t.Errorf("a file to a file's path: %q", got)
	}
	matched, err := c.match("*.txt")
	if err != nil || !slices.Equal(matched, []string{"x.txt", "y.txt"}) {
		t.Errorf("wildcard: %q %v", matched, err)
	}
	_, x := names([]string{"x.txt"}, "")
	_, hard := names([]string{"hard"}, "")
	_, y := names([]string{"y.txt"}, "")
	if x == y || hard == x {
		t.Errorf("the sum must follow names and contents")
	}
}
