/*
 * dlsym and dlvsym as the program sees them: ask the shim's hook (dlsym.c) whether the name is
 * one it answers; if not, jump to glibc's function with the caller's arguments and the
 * caller's return address untouched.  A jump, not a call: glibc resolves RTLD_NEXT (and picks
 * the namespace) from its own return address, which must stay the program's, never the
 * shim's.  This is why these two are written in assembly: C cannot promise a tail call.
 *
 * The hook returns NULL ("pass through"), KVS_DLSYM_NULL (answer NULL: dlerror is set), or the
 * address to answer.
 */
#define KVS_DLSYM_NULL 1

#if defined(__x86_64__)

	.text
	.p2align 4
	.globl dlsym
	.type dlsym, @function
dlsym:
	.cfi_startproc
	endbr64 /* an indirect-branch target where IBT is on; a NOP elsewhere */
	pushq %rdi
	.cfi_adjust_cfa_offset 8
	pushq %rsi
	.cfi_adjust_cfa_offset 8
	pushq %rdx
	.cfi_adjust_cfa_offset 8
	call kvs_dlsym_hook@PLT
	popq %rdx
	.cfi_adjust_cfa_offset -8
	popq %rsi
	.cfi_adjust_cfa_offset -8
	popq %rdi
	.cfi_adjust_cfa_offset -8
	testq %rax, %rax
	jz 1f
	cmpq $KVS_DLSYM_NULL, %rax
	jne 2f
	xorl %eax, %eax
2:	ret
1:	jmp *kvs_real_dlsym_fn(%rip)
	.cfi_endproc
	.size dlsym, .-dlsym

	.p2align 4
	.globl dlvsym
	.type dlvsym, @function
dlvsym:
	.cfi_startproc
	endbr64
	pushq %rdi
	.cfi_adjust_cfa_offset 8
	pushq %rsi
	.cfi_adjust_cfa_offset 8
	pushq %rdx
	.cfi_adjust_cfa_offset 8
	call kvs_dlvsym_hook@PLT
	popq %rdx
	.cfi_adjust_cfa_offset -8
	popq %rsi
	.cfi_adjust_cfa_offset -8
	popq %rdi
	.cfi_adjust_cfa_offset -8
	testq %rax, %rax
	jz 1f
	cmpq $KVS_DLSYM_NULL, %rax
	jne 2f
	xorl %eax, %eax
2:	ret
1:	jmp *kvs_real_dlvsym_fn(%rip)
	.cfi_endproc
	.size dlvsym, .-dlvsym

#elif defined(__aarch64__)

	.text
	.p2align 4
	.globl dlsym
	.type dlsym, %function
dlsym:
	.cfi_startproc
	stp x29, x30, [sp, #-32]!
	.cfi_def_cfa_offset 32
	.cfi_offset 29, -32
	.cfi_offset 30, -24
	mov x29, sp
	stp x0, x1, [sp, #16]
	bl kvs_dlsym_hook
	ldp x1, x2, [sp, #16]
	ldp x29, x30, [sp], #32
	.cfi_def_cfa_offset 0
	cbz x0, 1f
	cmp x0, #KVS_DLSYM_NULL
	b.ne 2f
	mov x0, #0
2:	ret
1:	mov x0, x1
	mov x1, x2
	adrp x16, kvs_real_dlsym_fn
	ldr x16, [x16, #:lo12:kvs_real_dlsym_fn]
	br x16
	.cfi_endproc
	.size dlsym, .-dlsym

	.p2align 4
	.globl dlvsym
	.type dlvsym, %function
dlvsym:
	.cfi_startproc
	stp x29, x30, [sp, #-48]!
	.cfi_def_cfa_offset 48
	.cfi_offset 29, -48
	.cfi_offset 30, -40
	mov x29, sp
	stp x0, x1, [sp, #16]
	str x2, [sp, #32]
	bl kvs_dlvsym_hook
	ldp x3, x1, [sp, #16]
	ldr x2, [sp, #32]
	ldp x29, x30, [sp], #48
	.cfi_def_cfa_offset 0
	cbz x0, 1f
	cmp x0, #KVS_DLSYM_NULL
	b.ne 2f
	mov x0, #0
2:	ret
1:	mov x0, x3
	adrp x16, kvs_real_dlvsym_fn
	ldr x16, [x16, #:lo12:kvs_real_dlvsym_fn]
	br x16
	.cfi_endproc
	.size dlvsym, .-dlvsym

#else
#error "dlsym_stub.S: only x86_64 and aarch64 are written"
#endif

	.section .note.GNU-stack, "", %progbits
