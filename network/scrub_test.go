package network

import (
	"bytes"
	"encoding/base64"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestScrubberAcrossReads: a secret split over reads of every size, in its
// raw and base64 forms, comes out masked, with the length kept.
func TestScrubberAcrossReads(t *testing.T) {
	secret := "sk-live-0123456789"
	body := "head " + secret + " mid " + base64.StdEncoding.EncodeToString([]byte(secret)) + " tail" + secret
	for _, r := range []func(io.Reader) io.Reader{iotest.OneByteReader, iotest.HalfReader, func(r io.Reader) io.Reader { return r }} {
		s := newScrubber(io.NopCloser(r(strings.NewReader(body))), secretForms(secret))
		got, err := io.ReadAll(s)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(body) || bytes.Contains(got, []byte(secret)) || bytes.Contains(got, []byte(base64.StdEncoding.EncodeToString([]byte(secret)))) {
			t.Fatalf("scrubbed %q", got)
		}
		if !strings.HasPrefix(string(got), "head ****") || !strings.HasSuffix(string(got), "tail"+strings.Repeat("*", len(secret))) {
			t.Fatalf("scrubbed %q", got)
		}
	}
}
