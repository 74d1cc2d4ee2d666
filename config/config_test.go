package config

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "rewrite dist/berth/config.yaml from serve's flags")

// newFlags binds a Config to a fresh flag set as serve does, and parses args.
func newFlags(t *testing.T, args ...string) (*Config, *pflag.FlagSet) {
	t.Helper()
	var c Config
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	c.Bind(fs)
	fs.String(FileFlag, DefaultPath, "")
	fs.Bool(PrintFlag, false, "")
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &c, fs
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every flag of serve is a key of the file, and every key a flag: a flag
// added without a field (or a field whose tag is not a flag's name) fails.
func TestEveryFlagHasAKey(t *testing.T) {
	_, fs := newFlags(t)
	keys := Keys()
	fs.VisitAll(func(f *pflag.Flag) {
		if !notKeys[f.Name] && !slices.Contains(keys, f.Name) {
			t.Errorf("flag --%s has no key in Config (a field with yaml:%q)", f.Name, f.Name)
		}
	})
	for _, k := range keys {
		if fs.Lookup(k) == nil {
			t.Errorf("Config key %q is no flag of serve", k)
		}
	}
	if len(keys) != reflect.TypeFor[Config]().NumField() {
		t.Errorf("keys %v: a field without a yaml tag", keys)
	}
}

func TestFileValuesApplyAndFlagsWin(t *testing.T) {
	p := writeFile(t, `# a comment
listen: 127.0.0.1:9999
state-dir: /srv/berth
default-pids: 100
default-idle-timeout: 1h30m
no-seccomp: true
warm-pool: [1, python:3.12=3]
egress-dns: 9.9.9.9
exec-output-budget: 1G
`)
	c, fs := newFlags(t, "--listen", "127.0.0.1:7000", "--config", p)
	if err := Load(p, fs); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:7000" {
		t.Errorf("listen = %q: the command line must win over the file", c.Listen)
	}
	if c.StateDir != "/srv/berth" || c.DefaultPids != 100 || c.DefaultIdleTimeout != 90*time.Minute || !c.NoSeccomp {
		t.Errorf("file values not applied: %+v", c)
	}
	if !slices.Equal(c.WarmPool, []string{"1", "python:3.12=3"}) || !slices.Equal(c.EgressDNS, []string{"9.9.9.9"}) {
		t.Errorf("lists: warm-pool %q, egress-dns %q", c.WarmPool, c.EgressDNS)
	}
	if c.DefaultRuntime != "native" || c.Domain == "" {
		t.Errorf("defaults lost: %+v", c)
	}
	d, err := c.Daemon()
	if err != nil {
		t.Fatal(err)
	}
	if d.WarmPool != 1 || d.WarmPools["python:3.12"] != 3 || d.ExecOutputBudget != 1<<30 || !d.Native.NoSeccomp || d.DefaultLimits.Pids != 100 {
		t.Errorf("daemon config: %+v", d)
	}
}

func TestRepeatableFlagOnCommandLineReplacesFileList(t *testing.T) {
	p := writeFile(t, "allowed-host: [a.example, b.example]\n")
	c, fs := newFlags(t, "--allowed-host", "c.example")
	if err := Load(p, fs); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.AllowedHosts, []string{"c.example"}) {
		t.Errorf("allowed-host = %q, want the command line's alone", c.AllowedHosts)
	}
}

func TestBadFilesAreRefusedWithFileLineAndKey(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"unknown key", "listen: 127.0.0.1:1\n\nlisten-addr: x\n", []string{":3:", `unknown key "listen-addr"`}},
		{"hidden alias is no key", "runtime: gvisor\n", []string{":1:", `unknown key "runtime"`}},
		{"bad int", "default-pids: lots\n", []string{":1:", "default-pids", `"lots"`}},
		{"bad bool", "state-dir: /x\nno-seccomp: maybe\n", []string{":2:", "no-seccomp", "bool"}},
		{"bad duration", "default-idle-timeout: 15\n", []string{":1:", "default-idle-timeout", "duration"}},
		{"list for one value", "listen:\n  - a\n  - b\n", []string{":1:", "listen", "not a list"}},
		{"mapping value", "state-dir: {a: b}\n", []string{":1:", "state-dir", "mapping"}},
		{"no value", "egress-ca:\n", []string{":1:", "egress-ca", "no value"}},
		{"twice", "debug: true\ndebug: false\n", []string{":2:", `"debug" is given twice`}},
		{"not a mapping", "- listen\n", []string{":1:", "mapping"}},
		{"bad yaml", "listen: [\n", []string{"config.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, tc.text)
			_, fs := newFlags(t)
			err := Load(p, fs)
			if err == nil {
				t.Fatalf("%q accepted", tc.text)
			}
			for _, w := range append([]string{p}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestBadTextValuesNameTheKey(t *testing.T) {
	for _, tc := range []struct{ text, key string }{
		{"exec-output-budget: lots\n", "exec-output-budget"},
		{"warm-pool: [x=y]\n", "warm-pool"},
	} {
		c, fs := newFlags(t)
		if err := Load(writeFile(t, tc.text), fs); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Daemon(); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%q: %v, want an error naming %s", tc.text, err, tc.key)
		}
	}
}

func TestEmptyFileChangesNothing(t *testing.T) {
	for _, text := range []string{"", "# only comments\n", "---\n"} {
		c, fs := newFlags(t)
		want := *c
		if err := Load(writeFile(t, text), fs); err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if !reflect.DeepEqual(*c, want) {
			t.Errorf("%q changed the config", text)
		}
	}
}

// Print's output, read back, gives the same settings.
func TestPrintRoundTrips(t *testing.T) {
	c, fs := newFlags(t, "--listen", "", "--warm-pool", "0", "--warm-pool", "img=2", "--no-seccomp", "--default-max-lifetime", "2h",
		"--allowed-host", "berth.example")
	out, err := Print(fs, false)
	if err != nil {
		t.Fatal(err)
	}
	c2, fs2 := newFlags(t)
	if err := Load(writeFile(t, string(out)), fs2); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// (an empty list reads back as empty, not nil: the same setting)
	if fmt.Sprintf("%+v", c) != fmt.Sprintf("%+v", c2) {
		t.Errorf("printed and read back:\n%+v\nwant\n%+v\n%s", c2, c, out)
	}
	for _, k := range Keys() {
		if !bytes.Contains(out, []byte("\n"+k+":")) {
			t.Errorf("key %s not printed", k)
		}
	}
}

// dist/berth/config.yaml is Print of the defaults, commented out: every key
// documented, and installing it changes nothing. go test ./config -update
// rewrites it after a flag changes.
func TestExampleFileIsCurrent(t *testing.T) {
	c, fs := newFlags(t)
	want, err := Print(fs, true)
	if err != nil {
		t.Fatal(err)
	}
	want = append([]byte(exampleHeader), want...)
	path := filepath.Join("..", "dist", "berth", "config.yaml")
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not the current defaults: go test ./config -update rewrites it", path)
	}
	for _, k := range Keys() {
		if !bytes.Contains(got, []byte("\n#"+k+":")) {
			t.Errorf("%s lacks key %s", path, k)
		}
	}
	before := *c
	if err := Load(path, fs); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*c, before) {
		t.Error("the example file changes settings: every key must be commented out")
	}
}

const exampleHeader = `# berth serve's configuration (YAML): /etc/berth/config.yaml, or the file
# that serve --config names. Each key is one of serve's flags, under its
# name; a flag given on the command line wins over the file, the file over
# the default. Every key below is commented out at its default: uncomment
# and change what you need. An unknown key is an error naming its line.
# berth serve --print-config shows the settings in effect; docs/operate.md
# explains each.

`

// docs/operate.md documents every key.
func TestEveryKeyIsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operate.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Keys() {
		if !bytes.Contains(doc, []byte("| `"+k+"` |")) {
			t.Errorf("docs/operate.md has no row for key %s", k)
		}
	}
}

func TestPath(t *testing.T) {
	p := writeFile(t, "debug: true\n")
	for _, tc := range []struct {
		args    []string
		want    string
		wantErr bool
	}{
		{[]string{"--config", p}, p, false},
		{[]string{"--config", ""}, "", false},
		{[]string{"--config", p + ".absent"}, "", true},
	} {
		_, fs := newFlags(t, tc.args...)
		got, err := Path(fs)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("%q: %q, %v", tc.args, got, err)
		}
	}
	if _, err := os.Stat(DefaultPath); err == nil {
		t.Logf("%s exists here: the default case is not checked", DefaultPath)
		return
	}
	_, fs := newFlags(t)
	if got, err := Path(fs); got != "" || err != nil {
		t.Errorf("no --config and no %s: %q, %v", DefaultPath, got, err)
	}
}
