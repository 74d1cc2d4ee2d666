package guest

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// prefault maps in every page of the guest's own binary (its code and
// read-only data) with MADV_POPULATE_READ, before the guest waits for its
// bootstrap. A new process faults in each page of a binary the first time
// it runs code there: the guest's setup and its first requests run code it
// has not run yet, a fault per page (each a trap to the hypervisor on a
// nested VM). A spare guest does this while it waits, off every create's
// path. Errors are ignored: a kernel before 5.14 lacks the advice, and
// nothing depends on it.
func prefault() {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || !strings.HasPrefix(fields[1], "r") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_POPULATE_READ)
	}
}
