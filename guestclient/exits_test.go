package guestclient

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/errdefs"
)

func TestExitsFromAHostileGuest(t *testing.T) {
	for name, body := range map[string]string{
		"garbage":        "this is not json\n",
		"not an exit":    `{"type":"stdout","pid":3}` + "\n",
		"no result":      `{"type":"exit","pid":3}` + "\n",
		"no pid":         `{"type":"exit","result":{"pid":0}}` + "\n",
		"pids differ":    `{"type":"exit","pid":3,"result":{"pid":4}}` + "\n",
		"over-long line": `{"type":"exit","pid":3,"result":{"pid":3,"start_error":"` + strings.Repeat("A", guestapi.MaxExitLine) + `"}}` + "\n",
		"ends":           "",
	} {
		t.Run(name, func(t *testing.T) {
			c := hostile(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) })
			st, err := c.Exits(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if r, err := st.Next(); !errdefs.IsUnavailable(err) {
				t.Fatalf("a hostile exit was accepted: %+v %v", r, err)
			}
		})
	}
	t.Run("good", func(t *testing.T) {
		c := hostile(t, func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `{"type":"exit","pid":3,"result":{"pid":3,"exit_code":2,"stdout":"QUFB"}}`+"\n")
		})
		st, err := c.Exits(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		r, err := st.Next()
		if err != nil || r.Pid != 3 || r.ExitCode != 2 || r.Stdout != nil {
			t.Fatalf("exit: %+v %v", r, err)
		}
	})
	t.Run("older guest", func(t *testing.T) {
		c := hostile(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"class":"not_found","message":"no route"}`)
		})
		if _, err := c.Exits(t.Context()); errdefs.ClassOf(err) != errdefs.NotImplemented {
			t.Fatalf("older guest: %v", err)
		}
	})
}
