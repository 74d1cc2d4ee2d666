#include "textflag.h"

#define SYS_rt_sigreturn 15

// func catchers() (handler, restorer uintptr)
TEXT ·catchers(SB),NOSPLIT,$0-16
	LEAQ	catch<>(SB), AX
	MOVQ	AX, handler+0(FP)
	LEAQ	restore<>(SB), AX
	MOVQ	AX, restorer+8(FP)
	RET

// catch is the handler: it touches nothing and returns into restore,
// whose address the kernel put on the signal frame.
TEXT catch<>(SB),NOSPLIT|NOFRAME,$0
	RET

// restore ends the handler's frame (the kernel restores the interrupted
// thread from it).
TEXT restore<>(SB),NOSPLIT|NOFRAME,$0
	MOVQ	$SYS_rt_sigreturn, AX
	SYSCALL
	INT	$3
