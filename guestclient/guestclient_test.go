package guestclient

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

// hostile serves h as if it were a compromised guest.
func hostile(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	c := New("sb-test", "token", func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
	t.Cleanup(c.Close)
	return c
}

func TestHelloRejectsWrongProofAndVersions(t *testing.T) {
	c := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"protocol":1,"min_protocol":1,"proof":"%s"}`, guestapi.Proof("other-token", r.Header.Get(guestapi.HeaderNonce)))
	})
	if _, err := c.Hello(t.Context()); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "authentication") {
		t.Fatalf("wrong proof: %v", err)
	}
	c = hostile(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"protocol":99,"min_protocol":50,"proof":"%s"}`, guestapi.Proof("token", r.Header.Get(guestapi.HeaderNonce)))
	})
	if _, err := c.Hello(t.Context()); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "protocol") {
		t.Fatalf("future-only protocol: %v", err)
	}
}

func TestUntrustedErrorsAreBounded(t *testing.T) {
	c := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"class":"made_up_class","message":"%s"}`, strings.Repeat("A", 100000))
	})
	_, err := c.Get(t.Context(), 1)
	if errdefs.ClassOf(err) != errdefs.Internal {
		t.Fatalf("an unknown class must not be believed: %v", errdefs.ClassOf(err))
	}
	if len(err.Error()) > 2000 {
		t.Fatalf("guest message not bounded: %d bytes", len(err.Error()))
	}
	if msg := errdefs.Message(err); msg != "internal error" {
		t.Fatalf("an unclassified guest error reached the user: %q", msg)
	}
}

func TestHostileStreams(t *testing.T) {
	for name, body := range map[string]string{
		"garbage":          "this is not json\n",
		"unknown event":    `{"type":"sudo"}` + "\n",
		"exit w/o result":  `{"type":"exit"}` + "\n",
		"ends early":       `{"type":"start","pid":3}` + "\n",
		"over-long line":   `{"type":"stdout","data":"` + strings.Repeat("QUFB", maxLine/4+10) + `"}` + "\n",
		"error w/o detail": `{"type":"error"}` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			c := hostile(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) })
			st, err := c.Exec(t.Context(), guestapi.ProcessSpec{Args: []string{"true"}})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var last error
			for range 5 {
				ev, err := st.Next()
				if err != nil {
					last = err
					break
				}
				if ev.Type == guestapi.EventError {
					last = EventError("sb-test", ev)
					break
				}
			}
			if last == nil || last.Error() == "EOF" {
				t.Fatalf("a hostile stream was accepted: %v", last)
			}
		})
	}
}

func TestSlowGuestRespectsContext(t *testing.T) {
	c := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := c.List(ctx); err == nil {
		t.Fatal("no error from a guest that never answers")
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("the daemon waited on a silent guest past its deadline")
	}
}

func TestApply(t *testing.T) {
	guest := func(answer string) *Client {
		return hostile(t, func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			body, _ := io.ReadAll(r.Body)
			if r.Method != http.MethodPut || r.URL.Path != guestapi.PathApply || q.Get("path") != "/" || q.Get("user") != "root" || string(body) != "TAR" {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"class":"invalid_argument","message":"unexpected %s %s %q"}`, r.Method, r.URL, body)
				return
			}
			fmt.Fprint(w, answer)
		})
	}
	c := guest(`{"entries":3,"whiteouts":1,"bytes":10}`)
	res, err := c.Apply(t.Context(), guestapi.Where{User: "root"}, "/", strings.NewReader("TAR"), 3)
	if err != nil || res != (guestapi.ApplyResult{Entries: 3, Whiteouts: 1, Bytes: 10}) {
		t.Fatalf("apply: %+v %v", res, err)
	}
	c = guest(`{"entries":-1}`)
	if _, err := c.Apply(t.Context(), guestapi.Where{User: "root"}, "/", strings.NewReader("TAR"), -1); !errdefs.IsUnavailable(err) {
		t.Fatalf("a negative count was believed: %v", err)
	}
}
