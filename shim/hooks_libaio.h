/*
 * hooks_libaio: kernel AIO served by the cache (hooks_libaio.c).  What the syscall() door
 * (hooks_syscall.c) needs of it.
 */
#ifndef KVS_SHIM_HOOKS_LIBAIO_H
#define KVS_SHIM_HOOKS_LIBAIO_H

#include <stdbool.h>

/* libc's syscall() with one of the io_* numbers (a[0..5] its arguments): served entries are
 * submitted, reaped, cancelled and destroyed as through libaio's names.  True, with the
 * kernel's answer in *r (-errno on failure), when number was one of them, or when libaio
 * itself is calling (then the raw system call); false for any other number. */
bool kvs_libaio_syscall(long number, const long *a, long *r);

/* The program is about to close the numbers lo to hi: the carriers' /dev/null descriptor, if it
 * is among them, moves (base/sys.h, kvs_ownfd_closing).  Async-signal-safe. */
void kvs_libaio_numbers_closing(unsigned int lo, unsigned int hi);
/* Is it among lo to hi?  Loads only. */
bool kvs_libaio_numbers_in(unsigned int lo, unsigned int hi);

/* Its fork rule (fanout.c): the kernel gave the child none of the parent's contexts; the
 * carriers' descriptor is inherited, its users are not. */
void kvs_libaio_atfork_child(void);

#endif
