package capability

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/internal/testutil"
)

const childEnv = "BERTH_CAP_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		child()
		return
	}
	os.Exit(m.Run())
}

// child restricts itself and reports every thread's capability sets.
func child() {
	if err := Restrict(Default()); err != nil {
		panic(err)
	}
	out := map[string]map[string]string{}
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, st := range tasks {
		b, _ := os.ReadFile(st)
		sets := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			for _, k := range []string{"CapBnd", "CapEff", "CapPrm", "CapInh", "CapAmb"} {
				if v, ok := strings.CutPrefix(line, k+":"); ok {
					sets[k] = strings.TrimSpace(v)
				}
			}
		}
		out[st] = sets
	}
	out["mount"] = map[string]string{"err": fmt.Sprint(unix.Mount("none", "/mnt", "tmpfs", 0, ""))}
	json.NewEncoder(os.Stdout).Encode(out)
}

func TestRestrictAllThreads(t *testing.T) {
	testutil.RequireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v %s", err, out)
	}
	var res map[string]map[string]string
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%016x", Mask(Default()))
	threads := 0
	for task, sets := range res {
		if task == "mount" {
			continue
		}
		threads++
		for _, k := range []string{"CapBnd", "CapEff", "CapPrm"} {
			if sets[k] != want {
				t.Errorf("%s %s = %s, want %s", task, k, sets[k], want)
			}
		}
		for _, k := range []string{"CapInh", "CapAmb"} {
			if v, _ := strconv.ParseUint(sets[k], 16, 64); v != 0 {
				t.Errorf("%s %s = %s, want 0", task, k, sets[k])
			}
		}
	}
	if threads < 2 {
		t.Errorf("only %d threads seen; the test needs a multi-threaded child", threads)
	}
	if res["mount"]["err"] != unix.EPERM.Error() {
		t.Errorf("mount without CAP_SYS_ADMIN: %q", res["mount"]["err"])
	}
	if Mask(Default())&(1<<unix.CAP_SYS_ADMIN|1<<unix.CAP_NET_RAW|1<<unix.CAP_SYS_PTRACE) != 0 {
		t.Error("the default set keeps SYS_ADMIN, NET_RAW or SYS_PTRACE")
	}
}
