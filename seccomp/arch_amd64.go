package seccomp

import "golang.org/x/sys/unix"

// auditArch is the seccomp_data.arch value of this build's native ABI.
const auditArch = unix.AUDIT_ARCH_X86_64

// x32SyscallBit marks the number of an x32-ABI syscall (__X32_SYSCALL_BIT).
const x32SyscallBit = 0x40000000

// abiPrologue runs with the syscall number in the accumulator and refuses
// x32 calls with ENOSYS (see Assemble for why ENOSYS).
func abiPrologue() []unix.SockFilter {
	return []unix.SockFilter{
		jump(opJumpSet, x32SyscallBit, 0, 1),
		retErrno(unix.ENOSYS),
	}
}

// syscallTable maps every syscall a profile may name to its x86-64 number.
func syscallTable() map[string]int {
	return map[string]int{
		"acct":              unix.SYS_ACCT,
		"add_key":           unix.SYS_ADD_KEY,
		"adjtimex":          unix.SYS_ADJTIMEX,
		"bpf":               unix.SYS_BPF,
		"clock_adjtime":     unix.SYS_CLOCK_ADJTIME,
		"clock_settime":     unix.SYS_CLOCK_SETTIME,
		"clone":             unix.SYS_CLONE,
		"clone3":            unix.SYS_CLONE3,
		"delete_module":     unix.SYS_DELETE_MODULE,
		"finit_module":      unix.SYS_FINIT_MODULE,
		"fsconfig":          unix.SYS_FSCONFIG,
		"fsmount":           unix.SYS_FSMOUNT,
		"fsopen":            unix.SYS_FSOPEN,
		"fspick":            unix.SYS_FSPICK,
		"init_module":       unix.SYS_INIT_MODULE,
		"io_uring_enter":    unix.SYS_IO_URING_ENTER,
		"io_uring_register": unix.SYS_IO_URING_REGISTER,
		"io_uring_setup":    unix.SYS_IO_URING_SETUP,
		"ioperm":            unix.SYS_IOPERM,
		"iopl":              unix.SYS_IOPL,
		"kexec_file_load":   unix.SYS_KEXEC_FILE_LOAD,
		"kexec_load":        unix.SYS_KEXEC_LOAD,
		"keyctl":            unix.SYS_KEYCTL,
		"lookup_dcookie":    unix.SYS_LOOKUP_DCOOKIE,
		"mount":             unix.SYS_MOUNT,
		"mount_setattr":     unix.SYS_MOUNT_SETATTR,
		"move_mount":        unix.SYS_MOVE_MOUNT,
		"name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT,
		"nfsservctl":        unix.SYS_NFSSERVCTL,
		"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT,
		"open_tree":         unix.SYS_OPEN_TREE,
		"perf_event_open":   unix.SYS_PERF_EVENT_OPEN,
		"personality":       unix.SYS_PERSONALITY,
		"pidfd_getfd":       unix.SYS_PIDFD_GETFD,
		"pivot_root":        unix.SYS_PIVOT_ROOT,
		"process_vm_readv":  unix.SYS_PROCESS_VM_READV,
		"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV,
		"ptrace":            unix.SYS_PTRACE,
		"quotactl":          unix.SYS_QUOTACTL,
		"reboot":            unix.SYS_REBOOT,
		"request_key":       unix.SYS_REQUEST_KEY,
		"setns":             unix.SYS_SETNS,
		"settimeofday":      unix.SYS_SETTIMEOFDAY,
		"socket":            unix.SYS_SOCKET,
		"socketpair":        unix.SYS_SOCKETPAIR,
		"swapoff":           unix.SYS_SWAPOFF,
		"swapon":            unix.SYS_SWAPON,
		"syslog":            unix.SYS_SYSLOG,
		"umount2":           unix.SYS_UMOUNT2,
		"unshare":           unix.SYS_UNSHARE,
		"userfaultfd":       unix.SYS_USERFAULTFD,
	}
}
