#include "textflag.h"

// func catchers() (handler, restorer uintptr)
TEXT ·catchers(SB),NOSPLIT,$0-16
	MOVD	$catch<>(SB), R0
	MOVD	R0, handler+0(FP)
	MOVD	ZR, restorer+8(FP)
	RET

// catch is the handler: it touches nothing and returns to the kernel's
// sigreturn trampoline, whose address the kernel put in the link register.
TEXT catch<>(SB),NOSPLIT|NOFRAME,$0
	RET
