package network

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"slices"
)

// A secret must be findable nowhere in the sandbox, answers included: an
// upstream that echoes a request's headers back (many test endpoints do)
// would hand it over. So every answer from a host a secret was added for is
// scrubbed of the secret, as it is and in the encodings a server is likely
// to echo it in (base64, URL-escaped), each replaced by as many '*': the
// lengths, and so Content-Length, stay right.

// secretForms are the byte strings that give a secret away.
func secretForms(v string) [][]byte {
	forms := [][]byte{[]byte(v)}
	for _, f := range []string{
		base64.StdEncoding.EncodeToString([]byte(v)),
		base64.RawStdEncoding.EncodeToString([]byte(v)),
		base64.URLEncoding.EncodeToString([]byte(v)),
		base64.RawURLEncoding.EncodeToString([]byte(v)),
		url.QueryEscape(v),
		url.PathEscape(v),
	} {
		if !slices.ContainsFunc(forms, func(b []byte) bool { return string(b) == f }) {
			forms = append(forms, []byte(f))
		}
	}
	return slices.DeleteFunc(forms, func(b []byte) bool { return len(b) == 0 })
}

func mask(b []byte, needles [][]byte) []byte {
	for _, n := range needles {
		for i := bytes.Index(b, n); i >= 0; {
			for j := range n {
				b[i+j] = '*'
			}
			k := bytes.Index(b[i+len(n):], n)
			if k < 0 {
				break
			}
			i += len(n) + k
		}
	}
	return b
}

func scrubHeader(h http.Header, needles [][]byte) {
	for k, vals := range h {
		for i, v := range vals {
			vals[i] = string(mask([]byte(v), needles))
		}
		h[k] = vals
	}
}

// scrubber masks needles in a stream. It holds back the last longest-1
// bytes it has read, which may be the start of a needle that the next read
// completes.
type scrubber struct {
	r       io.ReadCloser
	needles [][]byte
	keep    int
	buf     []byte // read, not yet returned: [0:ready) masked and final
	ready   int
	err     error
	tmp     []byte
}

func newScrubber(r io.ReadCloser, needles [][]byte) io.ReadCloser {
	longest := 0
	for _, n := range needles {
		longest = max(longest, len(n))
	}
	return &scrubber{r: r, needles: needles, keep: longest - 1}
}

func (s *scrubber) Read(p []byte) (int, error) {
	for s.ready == 0 {
		if s.err != nil {
			if len(s.buf) == 0 {
				return 0, s.err
			}
			mask(s.buf, s.needles)
			s.ready = len(s.buf) // the end: nothing more can complete a needle
			break
		}
		if s.tmp == nil {
			s.tmp = make([]byte, 32<<10)
		}
		n, err := s.r.Read(s.tmp)
		s.buf = append(s.buf, s.tmp[:n]...)
		s.err = err
		mask(s.buf, s.needles)
		s.ready = max(len(s.buf)-s.keep, 0)
	}
	n := copy(p, s.buf[:s.ready])
	s.buf = s.buf[n:]
	s.ready -= n
	return n, nil
}

func (s *scrubber) Close() error { return s.r.Close() }
