package seccomp

import "golang.org/x/sys/unix"

const auditArch = unix.AUDIT_ARCH_AARCH64

func archPrologue() []unix.SockFilter { return nil }

// arm64 never had these.
var knownMissing = map[string]struct{}{"iopl": {}, "ioperm": {}, "nfsservctl": {}}

var syscallNumbers = map[string]int{
	"mount": unix.SYS_MOUNT, "umount2": unix.SYS_UMOUNT2, "pivot_root": unix.SYS_PIVOT_ROOT,
	"move_mount": unix.SYS_MOVE_MOUNT, "open_tree": unix.SYS_OPEN_TREE, "fsopen": unix.SYS_FSOPEN,
	"fsconfig": unix.SYS_FSCONFIG, "fsmount": unix.SYS_FSMOUNT, "fspick": unix.SYS_FSPICK,
	"mount_setattr": unix.SYS_MOUNT_SETATTR, "kexec_load": unix.SYS_KEXEC_LOAD, "kexec_file_load": unix.SYS_KEXEC_FILE_LOAD,
	"init_module": unix.SYS_INIT_MODULE, "finit_module": unix.SYS_FINIT_MODULE, "delete_module": unix.SYS_DELETE_MODULE,
	"bpf": unix.SYS_BPF, "perf_event_open": unix.SYS_PERF_EVENT_OPEN, "syslog": unix.SYS_SYSLOG,
	"lookup_dcookie": unix.SYS_LOOKUP_DCOOKIE, "keyctl": unix.SYS_KEYCTL, "add_key": unix.SYS_ADD_KEY,
	"request_key": unix.SYS_REQUEST_KEY, "userfaultfd": unix.SYS_USERFAULTFD, "ptrace": unix.SYS_PTRACE,
	"process_vm_readv": unix.SYS_PROCESS_VM_READV, "process_vm_writev": unix.SYS_PROCESS_VM_WRITEV,
	"pidfd_getfd": unix.SYS_PIDFD_GETFD, "open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT,
	"name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT, "swapon": unix.SYS_SWAPON, "swapoff": unix.SYS_SWAPOFF,
	"reboot": unix.SYS_REBOOT, "acct": unix.SYS_ACCT, "settimeofday": unix.SYS_SETTIMEOFDAY,
	"clock_settime": unix.SYS_CLOCK_SETTIME, "clock_adjtime": unix.SYS_CLOCK_ADJTIME, "adjtimex": unix.SYS_ADJTIMEX,
	"quotactl": unix.SYS_QUOTACTL, "setns": unix.SYS_SETNS, "clone3": unix.SYS_CLONE3, "unshare": unix.SYS_UNSHARE,
	"clone": unix.SYS_CLONE,
}
