package cli

import (
	"bytes"
	"testing"
	"time"

	"github.com/berthsh/berth/api"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"512M": 512 << 20, "2G": 2 << 30, "1.5g": 3 << 29, "64Mi": 64 << 20,
		"128MB": 128 << 20, "1024": 1024, "10k": 10 << 10} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "M", "-1G", "12X", "lots"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

func TestLsTable(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	writeTable(&b, []api.Sandbox{
		{ID: "sb-aaaaaaaaaaaa", State: "running", Image: "host", CreatedAt: now.Add(-90 * time.Second), Labels: map[string]string{"b": "2", "a": "1"}},
		{ID: "sb-bbbbbbbbbbbb", State: "error", Image: "host", CreatedAt: now.Add(-3 * time.Hour)},
	}, now)
	want := "ID               STATE    IMAGE  CREATED  LABELS\n" +
		"sb-aaaaaaaaaaaa  running  host   1m ago   a=1,b=2\n" +
		"sb-bbbbbbbbbbbb  error    host   3h ago   \n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestPairs(t *testing.T) {
	m, err := parsePairs("--env", []string{"A=1", "B=x=y", "C="})
	if err != nil || m["A"] != "1" || m["B"] != "x=y" || m["C"] != "" {
		t.Fatalf("%v %v", m, err)
	}
	if _, err := parsePairs("--label", []string{"novalue"}); err == nil {
		t.Fatal("accepted an entry without =")
	}
}
