package hostcheck

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthsh/berth/api/guestapi"
	"github.com/berthsh/berth/cgroup"
	"github.com/berthsh/berth/internal/guestbin"
	"github.com/berthsh/berth/internal/hostpath"
	"github.com/berthsh/berth/internal/osthread"
	"github.com/berthsh/berth/runtime"
	"github.com/berthsh/berth/runtime/gvisor"
	"github.com/berthsh/berth/runtime/native"
	"github.com/berthsh/berth/seccomp"
)

const cgroupMount = "/sys/fs/cgroup"

func checkRoot(_ context.Context, _ *Options) (Status, string, string) {
	if os.Geteuid() == 0 {
		return OK, "running as root", ""
	}
	return Fail, fmt.Sprintf("running as uid %d: berth creates namespaces, cgroups and mounts, which need root", os.Geteuid()),
		"run berth as root (sudo berth …, or the systemd unit in dist/systemd)"
}

// cgoFix is how to get a static berth.
const cgoFix = "rebuild berth with CGO_ENABLED=0: make build, or CGO_ENABLED=0 go build ./cmd/berth"

// checkStatic asks what every create asks of the guest: can this binary
// run a system call on every thread at once (syscall.AllThreadsSyscall,
// which a build linked with cgo answers ENOTSUP)? Without it a sandbox's
// init cannot drop its capabilities.
func checkStatic(_ context.Context, o *Options) (Status, string, string) {
	_, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_GET_DUMPABLE, 0, 0)
	if e == 0 {
		return OK, "built without cgo: sandboxes' init can harden every thread", ""
	}
	if e != syscall.ENOTSUP {
		return Fail, fmt.Sprintf("syscall.AllThreadsSyscall: %v", e), cgoFix
	}
	self := fmt.Sprintf("this berth is linked with cgo: syscall.AllThreadsSyscall answers %v, so a sandbox's init cannot drop its capabilities "+
		"(every create would fail: set permitted and effective capabilities: operation not supported)", e)
	if o.GuestBinary == "" && !guestbin.Embedded() {
		return Fail, self, cgoFix
	}
	// Sandboxes run another binary: this one only needs that one to work.
	tmp, err := scratchDir(o)
	if err != nil {
		return Fail, self + "; the guest binary could not be checked: " + err.Error(), cgoFix
	}
	defer os.RemoveAll(tmp)
	guest, err := guestBinary(o, tmp)
	if err == nil {
		err = runtime.CheckGuest(guest)
	}
	if err != nil {
		return Fail, self + "; so is its guest: " + err.Error(), cgoFix
	}
	return Warn, "this berth is linked with cgo, but sandboxes run a static guest (" + guest + "), which can harden them", cgoFix
}

func checkStateDir(_ context.Context, o *Options) (Status, string, string) {
	if o.StateDir == "" {
		return Fail, "no state dir given", "pass --state-dir DIR (default /var/lib/berth)"
	}
	if fi, err := os.Stat(o.StateDir); err == nil && !fi.IsDir() {
		return Fail, o.StateDir + " is not a directory", "pass a directory to --state-dir"
	}
	err := hostpath.CheckSearchable(o.StateDir)
	var unsearchable *hostpath.UnsearchableError
	switch {
	case errors.As(err, &unsearchable):
		return Fail, fmt.Sprintf("%s has mode %o: sandboxes run as unprivileged host uids and must search every parent of the state dir %s",
			unsearchable.Dir, unsearchable.Mode, o.StateDir), "chmod o+x " + unsearchable.Dir + " (or pick another --state-dir)"
	case errors.Is(err, os.ErrNotExist):
		// A parent that does not exist yet is made by the daemon (0711).
	case err != nil:
		return Fail, "check the state dir's parents: " + err.Error(), "pick another --state-dir"
	}
	if _, err := os.Stat(o.StateDir); errors.Is(err, os.ErrNotExist) {
		return OK, o.StateDir + " does not exist yet (serve makes it, mode 0711); its parents are searchable", ""
	}
	return OK, o.StateDir + " and its parents are searchable by sandboxes' uids", ""
}

// fsNames are the file systems a state dir is commonly on, by magic.
var fsNames = map[int64]string{unix.EXT4_SUPER_MAGIC: "ext4", unix.XFS_SUPER_MAGIC: "xfs", unix.BTRFS_SUPER_MAGIC: "btrfs",
	unix.TMPFS_MAGIC: "tmpfs", unix.OVERLAYFS_SUPER_MAGIC: "overlay"}

// checkStateFS looks at the file system under the state dir: every create
// and delete makes and frees inodes there (the sandbox's directory, its
// writable layer, the overlay's work files), and an ext4 without a journal
// skips every inode freed in the last 30 seconds, reading each, so
// create/delete churn makes every later create slower (docs/benchmarks.md
// measured about 6 ms a create).
func checkStateFS(_ context.Context, o *Options) (Status, string, string) {
	dir := o.StateDir // or the nearest parent that exists
	var st unix.Statfs_t
	for unix.Statfs(dir, &st) != nil {
		if dir == filepath.Dir(dir) {
			return Warn, "cannot read the file system of " + o.StateDir, "pass an existing --state-dir"
		}
		dir = filepath.Dir(dir)
	}
	fs, ok := fsNames[int64(st.Type)]
	if !ok {
		fs = fmt.Sprintf("file system 0x%x", st.Type)
	}
	if st.Type != unix.EXT4_SUPER_MAGIC {
		return OK, fmt.Sprintf("%s is on %s", dir, fs), ""
	}
	dev, journal, err := ext4Journal(dir)
	if err != nil {
		return OK, fmt.Sprintf("%s is on ext4 (whether it has a journal is unknown: %v)", dir, err), ""
	}
	if journal {
		return OK, fmt.Sprintf("%s is on ext4 with a journal (%s)", dir, dev), ""
	}
	return Warn, fmt.Sprintf("%s is on ext4 without a journal (%s): such an ext4 skips every inode freed in the last 30 s, "+
			"so the inodes each create makes and each delete frees make later creates slower", dir, dev),
		"a --state-dir on a journaled ext4 or XFS, or add a journal while " + dev + " is unmounted: tune2fs -O has_journal /dev/" + dev
}

// ext4Journal names the block device of dir's ext4 (its /dev name) and
// says whether it has a journal: jbd2 lists every journal it runs as
// /proc/fs/jbd2/NAME-INODE, NAME the kernel's name of the device (its
// directory in sysfs).
func ext4Journal(dir string) (dev string, journal bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", false, err
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	uevent, err := os.ReadFile(sys + "/uevent")
	if err != nil {
		return "", false, err
	}
	for line := range strings.Lines(string(uevent)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "DEVNAME="); ok {
			dev = v
		}
	}
	link, err := filepath.EvalSymlinks(sys)
	if dev == "" || strings.Contains(dev, "..") || err != nil {
		return "", false, fmt.Errorf("no device name for %s", sys)
	}
	m, _ := filepath.Glob("/proc/fs/jbd2/" + filepath.Base(link) + "-*")
	return dev, len(m) > 0, nil
}

// cgroupMounts lists the host's cgroup mounts: v1 controllers by mount
// point, and each cgroup2 mount.
func cgroupMounts() (v1 map[string][]string, v2 []string, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	v1 = map[string][]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || len(fields) < sep+4 {
			continue
		}
		switch fields[sep+1] {
		case "cgroup":
			for _, c := range strings.Split(fields[sep+3], ",") {
				switch c {
				case "cpu", "cpuacct", "freezer", "memory", "pids":
					v1[c] = append(v1[c], fields[4])
				}
			}
		case "cgroup2":
			v2 = append(v2, fields[4])
		}
	}
	return v1, v2, sc.Err()
}

func checkCgroups(_ context.Context, o *Options) (Status, string, string) {
	root := o.CgroupRoot
	if root == "" {
		root = "berth"
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupMount, &st); err != nil {
		return Fail, "no cgroup file system at " + cgroupMount + ": " + err.Error(),
			"mount one: mount -t cgroup2 none " + cgroupMount
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		b, err := os.ReadFile(filepath.Join(cgroupMount, "cgroup.controllers"))
		if err != nil {
			return Fail, "cgroup v2: " + err.Error(), "mount cgroup2 at " + cgroupMount
		}
		have := strings.Fields(string(b))
		var missing []string
		for _, c := range []string{"cpu", "memory", "pids"} {
			if !slices.Contains(have, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return Fail, fmt.Sprintf("cgroup v2 at %s offers %q: %s missing (berth's groups need cpu, memory and pids)",
					cgroupMount, strings.Join(have, " "), strings.Join(missing, ", ")),
				"a controller missing from " + cgroupMount + "/cgroup.controllers is bound to a v1 hierarchy or disabled at boot: " +
					"unmount its v1 hierarchy, or boot without cgroup_disable=" + missing[0]
		}
		m, err := cgroup.New(root)
		if err != nil {
			return Fail, "cgroup v2: " + err.Error(), "echo '+cpu +memory +pids' > " + cgroupMount + "/cgroup.subtree_control"
		}
		detail := fmt.Sprintf("cgroup v2 at %s: cpu, memory and pids enabled for %s/%s", cgroupMount, cgroupMount, root)
		if why := m.CanFreeze(); why != "" {
			return Warn, detail + "; pause is unavailable: " + why, "Linux 5.2 or later (cgroup.freeze)"
		}
		return OK, detail + "; pause (freezer) works", ""
	}
	v1, v2, err := cgroupMounts()
	if err != nil {
		return Fail, "read /proc/self/mountinfo: " + err.Error(), "mount /proc"
	}
	var have []string
	for _, c := range []string{"cpu", "cpuacct", "freezer", "memory", "pids"} {
		if len(v1[c]) > 0 {
			have = append(have, c)
		}
	}
	detail := "cgroup v1: " + strings.Join(have, ", ") + " mounted"
	if len(have) == 0 {
		detail = "cgroup v1: none of cpu, memory, pids is mounted"
	}
	for _, u := range v2 {
		ctl, _ := os.ReadFile(filepath.Join(u, "cgroup.controllers"))
		if c := strings.Fields(string(ctl)); len(c) > 0 {
			detail += fmt.Sprintf("; cgroup2 at %s carries %s (hybrid layout; berth uses the v1 controllers)", u, strings.Join(c, ", "))
		} else {
			detail += fmt.Sprintf("; cgroup2 at %s carries no controllers (hybrid layout; berth uses the v1 controllers)", u)
		}
	}
	m, err := cgroup.New(root)
	if err != nil {
		return Fail, detail + ": " + err.Error(),
			"mount the missing controller, e.g. mkdir -p /sys/fs/cgroup/memory && mount -t cgroup -o memory cgroup /sys/fs/cgroup/memory " +
				"(and boot without cgroup_disable=memory), or boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2"
	}
	var warns []string
	if len(v1["cpuacct"]) == 0 {
		warns = append(warns, "no cpuacct: sandboxes' CPU usage reads 0")
	}
	if why := m.CanFreeze(); why != "" {
		warns = append(warns, "pause is unavailable: "+why)
	}
	if len(warns) > 0 {
		return Warn, detail + "; " + strings.Join(warns, "; "),
			"mount the v1 controller: mkdir -p /sys/fs/cgroup/freezer && mount -t cgroup -o freezer cgroup /sys/fs/cgroup/freezer (likewise cpuacct)"
	}
	return OK, detail + "; limits, stats and pause (freezer) work", ""
}

func checkUserNS(_ context.Context, o *Options) (Status, string, string) {
	const sysctlFix = "sysctl -w user.max_user_namespaces=65536 (and put user.max_user_namespaces=65536 in /etc/sysctl.d/90-berth.conf)"
	b, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	if errors.Is(err, os.ErrNotExist) {
		return Fail, "this kernel has no user namespaces (no /proc/sys/user/max_user_namespaces)", "a kernel built with CONFIG_USER_NS=y"
	}
	if err != nil {
		return Fail, "read max_user_namespaces: " + err.Error(), sysctlFix
	}
	max, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if max == 0 {
		return Fail, "user.max_user_namespaces is 0: no process may create a user namespace", sysctlFix
	}
	// Create one as a sandbox does: a child in new user and mount
	// namespaces. Its root is host root, so that it can run this
	// executable wherever it lives; `berth guest --check` returns at once.
	exe, err := os.Executable()
	if err != nil {
		return Fail, "find this executable: " + err.Error(), "run berth from a file on disk"
	}
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
	cmd := &exec.Cmd{
		Path: exe, Args: []string{"berth", "guest", guestapi.CheckFlag}, Env: []string{},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings: ids, GidMappings: ids,
		},
	}
	if err := cmd.Start(); err != nil {
		fix := sysctlFix
		if errors.Is(err, syscall.EPERM) {
			fix = "allow root to create user namespaces: check kernel.unprivileged_userns_clone, an AppArmor or SELinux policy, " +
				"or a container runtime's seccomp profile that forbids clone(CLONE_NEWUSER)"
		}
		return Fail, fmt.Sprintf("cannot create a user namespace (max_user_namespaces is %d): %v", max, err), fix
	}
	cmd.Wait() // its exit status is the static check's business
	if max < 1024 {
		return Warn, fmt.Sprintf("user namespaces work, but user.max_user_namespaces is %d: each sandbox takes one", max), sysctlFix
	}
	return OK, fmt.Sprintf("this process can create user namespaces (user.max_user_namespaces = %d)", max), ""
}

func checkOverlay(_ context.Context, o *Options) (Status, string, string) {
	const modFix = "modprobe overlay (and add overlay to /etc/modules-load.d/berth.conf)"
	tmp, err := scratchDir(o)
	if err != nil {
		return Fail, "make a directory for the probe: " + err.Error(), "make the state dir writable"
	}
	defer os.RemoveAll(tmp)
	dirs := map[string]string{}
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		dirs[d] = filepath.Join(tmp, d)
		if err := os.Mkdir(dirs[d], 0o755); err != nil {
			return Fail, "make a directory for the probe: " + err.Error(), "make the state dir writable"
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", dirs["lower"], dirs["upper"], dirs["work"])
	if err := unix.Mount("overlay", dirs["merged"], "overlay", 0, opts); err != nil {
		where := existingAncestor(o.StateDir)
		if errors.Is(err, unix.ENODEV) {
			return Fail, "overlayfs is not available: mount: " + err.Error(), modFix
		}
		return Fail, fmt.Sprintf("mount an overlay in %s: %v", tmp, err),
			modFix + "; if it is loaded, the state dir's file system cannot be an overlay's upper layer: put --state-dir (now under " +
				where + ") on ext4, xfs or btrfs"
	}
	defer unix.Unmount(dirs["merged"], unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(dirs["merged"], "probe"), []byte("ok"), 0o644); err != nil {
		return Fail, "write through an overlay: " + err.Error(), "put --state-dir on ext4, xfs or btrfs"
	}
	if err := unix.Unmount(dirs["merged"], 0); err != nil {
		return Warn, "overlayfs mounts, but the probe's unmount failed: " + err.Error(), "umount " + dirs["merged"]
	}
	return OK, "an overlay mounts (with its upper layer on the state dir's file system)", ""
}

func checkSeccomp(_ context.Context, o *Options) (Status, string, string) {
	const fix = "a kernel built with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y"
	if o.NoSeccomp {
		return Warn, "turned off (serve --no-seccomp): sandboxes run without berth's syscall filter", "drop --no-seccomp (no_seccomp: false)"
	}
	// With no program, a kernel that has filters answers EFAULT.
	_, _, e := syscall.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, 0)
	switch e {
	case unix.EFAULT:
	case unix.ENOSYS:
		return Fail, "this kernel has no seccomp system call", fix
	default:
		return Fail, fmt.Sprintf("this kernel refuses seccomp filters: %v", e), fix
	}
	prog, err := seccomp.Default().Assemble()
	if err != nil {
		return Fail, "assemble berth's seccomp profile: " + err.Error(), "report it: berth's profile does not build for this architecture"
	}
	return OK, fmt.Sprintf("seccomp filters work (berth's profile: %d instructions)", len(prog)), ""
}

func checkIDMapped(_ context.Context, o *Options) (Status, string, string) {
	const fix = "Linux 5.19 or later (idmapped overlay layers), with the state dir on ext4, xfs, btrfs or tmpfs"
	if o.NoIDMappedLayers {
		return Warn, "turned off (serve --no-idmapped-layers): image layers are copied once per sandbox's id range", "drop --no-idmapped-layers"
	}
	tmp, err := scratchDir(o)
	if err != nil {
		return Warn, "make a directory for the probe: " + err.Error(), fix
	}
	defer os.RemoveAll(tmp)
	guest, err := guestBinary(o, tmp)
	if err != nil {
		return Warn, "find the guest binary for the probe: " + err.Error(), fix
	}
	if why := native.ProbeIDMappedLayers(guest, filepath.Join(tmp, "probe")); why != "" {
		return Warn, "sandboxes get shifted copies of image layers (made once per image and id range: more disk, a slower first create): " + why, fix
	}
	return OK, "image layers are idmapped into sandboxes (no copies)", ""
}

func checkDisk(_ context.Context, o *Options) (Status, string, string) {
	dir := existingAncestor(o.StateDir)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Fail, "statfs " + dir + ": " + err.Error(), "pick another --state-dir"
	}
	free := st.Bavail * uint64(st.Bsize)
	total := st.Blocks * uint64(st.Bsize)
	detail := fmt.Sprintf("%s free of %s on %s", humanBytes(free), humanBytes(total), dir)
	inodes := st.Files > 0 // btrfs and others have no fixed count
	if inodes {
		detail += fmt.Sprintf(", %d of %d inodes free", st.Ffree, st.Files)
	}
	fix := "free space on the file system of " + dir + ", or move --state-dir to a larger one"
	switch {
	case free < 1<<30:
		return Fail, detail + ": less than 1 GiB, creates and image pulls will fail", fix
	case inodes && st.Ffree < 10000:
		return Fail, detail + ": fewer than 10000 inodes, every sandbox's files need some", fix
	case free < 10<<30:
		return Warn, detail + ": less than 10 GiB leaves little room for images and sandboxes' layers", fix
	case inodes && st.Ffree < 100000:
		return Warn, detail + ": fewer than 100000 inodes", fix
	}
	return OK, detail, ""
}

func checkRunsc(_ context.Context, o *Options) (Status, string, string) {
	path, version, err := gvisor.CheckRunsc(gvisor.Options{Runsc: o.Runsc, Platform: o.RunscPlatform})
	if err != nil {
		return Warn, "the gvisor runtime is unavailable: " + err.Error(),
			"make runsc (a pinned runsc built from go.mod), or install gVisor's runsc and pass --runsc PATH (runsc: in the config file)"
	}
	platform := o.RunscPlatform
	if platform == "" {
		platform = "systrap"
	}
	return OK, fmt.Sprintf("%s: %s; the gvisor runtime can run (platform %s)", path, version, platform), ""
}

// kvmGetAPIVersion is KVM_GET_API_VERSION, _IO(0xAE, 0x00).
const kvmGetAPIVersion = 0xAE00

func checkKVM(_ context.Context, o *Options) (Status, string, string) {
	const fix = "enable virtualization (VT-x or AMD-V in the firmware, nested virtualization on a VM) and modprobe kvm_intel (or kvm_amd)"
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return Warn, "no /dev/kvm: the gvisor runtime's kvm platform and a microvm runtime cannot run here (native and gvisor on systrap can)", fix
	}
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return Warn, "/dev/kvm exists but cannot be opened: " + err.Error(), "check its permissions (crw-rw---- root:kvm) and that berth runs as root"
	}
	defer unix.Close(fd)
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil {
		return Warn, "/dev/kvm opens but does not answer KVM_GET_API_VERSION: " + err.Error(), fix
	}
	return OK, fmt.Sprintf("/dev/kvm works (KVM API version %d): --runsc-platform kvm is possible", v), ""
}

// checkCgroupMoves says how a guest gets into its cgroups. On cgroup v2
// the runtime creates it there (CLONE_INTO_CGROUP). On v1 the thread that
// forks it joins each of the guest's groups first, by writing "0" (the
// writing thread) to the group's tasks file; the check times one such
// move into a scratch pids group, after 50 ms idle, the way a create
// meets it. Kernels that move the writing thread without the global
// threadgroup lock take a fraction of a millisecond (0.3 ms on this
// project's 2-core VM, Linux 6.18); one that takes the lock waits for an
// RCU grace period (5.5 ms there by thread id), unless a cgroup2 root is
// mounted with favordynmods (Linux 6.0+).
func checkCgroupMoves(_ context.Context, _ *Options) (Status, string, string) {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupMount, &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return OK, "cgroup v2: guests are created inside their cgroup (CLONE_INTO_CGROUP), no move to wait for", ""
	}
	took, err := timeMove(filepath.Join(cgroupMount, "pids"))
	if err != nil {
		return Warn, "cgroup v1: could not time a move into a scratch pids group: " + err.Error(), "mount the pids controller at " + cgroupMount + "/pids"
	}
	detail := fmt.Sprintf("cgroup v1: the thread that forks each guest joins its groups first; one move here took %.2f ms", float64(took)/float64(time.Millisecond))
	if took < 2*time.Millisecond {
		return OK, detail, ""
	}
	detail += " (this kernel takes its global threadgroup lock for it, whose writer waits for an RCU grace period): every create without a spare or a warm pool pays it once per hierarchy"
	opts, _ := cgroup2Options()
	for mnt := range opts {
		return Warn, detail, "mount -o remount,favordynmods " + mnt + " (Linux 6.0+; every fork and exit on the host costs a little more)"
	}
	return Warn, detail, "mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 -o favordynmods none /sys/fs/cgroup/unified " +
		"(Linux 6.0+; every fork and exit on the host costs a little more)"
}

// timeMove times the move berth's spawner makes: a thread writing "0" to
// the tasks file of a fresh group in hierarchy, after 50 ms without one.
// The group is removed again (the thread ends, leaving it empty).
func timeMove(hierarchy string) (time.Duration, error) {
	dir := filepath.Join(hierarchy, fmt.Sprintf("berth-doctor-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, err
	}
	var took time.Duration
	tid, err := osthread.Discarded(func(int) error {
		f, err := os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		time.Sleep(50 * time.Millisecond)
		t := time.Now()
		_, err = f.Write([]byte("0"))
		took = time.Since(t)
		return err
	})
	osthread.WaitGone(tid)
	if rmErr := os.Remove(dir); err == nil {
		err = rmErr
	}
	return took, err
}

// cgroup2Options returns each cgroup2 mount's super-block options.
func cgroup2Options() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || len(fields) < sep+4 || fields[sep+1] != "cgroup2" {
			continue
		}
		out[fields[4]] = fields[sep+3]
	}
	return out, sc.Err()
}
