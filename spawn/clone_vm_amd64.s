//go:build !race && !msan && !asan

#include "textflag.h"

#define SYS_clone3 435
#define SYS_exit_group 231

// func clone3VM(args *cloneArgs, size uintptr, c *child) (pid uintptr, errno uintptr)
//
// clone3 with the child on the stack args names, in the caller's address
// space (CLONE_VM). The parent returns the child's pid or the errno; the
// child, which shares no frame with the caller, calls childMain(c) on its
// own stack and exits if that ever returns.
TEXT ·clone3VM(SB),NOSPLIT,$0-40
	MOVQ	args+0(FP), DI
	MOVQ	size+8(FP), SI
	MOVQ	c+16(FP), R12
	MOVQ	$SYS_clone3, AX
	SYSCALL
	CMPQ	AX, $0
	JEQ	child
	CMPQ	AX, $0xfffffffffffff001
	JLS	ok
	MOVQ	$0, pid+24(FP)
	NEGQ	AX
	MOVQ	AX, errno+32(FP)
	RET
ok:
	MOVQ	AX, pid+24(FP)
	MOVQ	$0, errno+32(FP)
	RET
child:
	// SP is the top of the child's stack. No frame pointer to follow
	// into the parent's.
	XORL	BP, BP
	SUBQ	$16, SP
	MOVQ	R12, 0(SP)
	CALL	·childMain(SB)
	MOVL	$253, DI
	MOVL	$SYS_exit_group, AX
	SYSCALL
	INT	$3
