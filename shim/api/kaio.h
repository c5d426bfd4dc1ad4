/*
 * kaio: the engine of kernel AIO served by the cache (api/kaio.c), below its two doors: libaio's
 * names (hooks/libaio.c) and libc's syscall() with the io_* numbers (hooks/syscall.c).
 * Every entry point answers as the kernel does (-errno on failure, errno left alone).
 */
#ifndef KVS_SHIM_KAIO_H
#define KVS_SHIM_KAIO_H

#include <linux/aio_abi.h>
#include <stdbool.h>
#include <time.h>

/* Which door a call came through: the kernel part of a call through libaio goes to libaio's
 * real function when it can be found (a bundled libaio's own state), else the system call. */
enum kvs_kaio_via { KVS_KAIO_SYSCALL, KVS_KAIO_LIBAIO };

/* io_submit: the served reads of each chunk run by the cache and handed to the kernel as
 * carriers; everything else the kernel's (docs/design.md, "Kernel AIO (`api/kaio.c`)"). */
long kvs_kaio_submit(enum kvs_kaio_via v, aio_context_t ctx, long nr, struct iocb **p);
/* io_getevents and io_pgetevents (sig: the kernel's sigset argument, or NULL), io_cancel and
 * io_destroy: the kernel's, their events looked at for the writes noted for write-through. */
long kvs_kaio_getevents(enum kvs_kaio_via v, aio_context_t ctx, long min_nr, long nr,
			struct io_event *ev, struct timespec *ts, const void *sig);
long kvs_kaio_cancel(enum kvs_kaio_via v, aio_context_t ctx, struct iocb *cb, struct io_event *res);
long kvs_kaio_destroy(enum kvs_kaio_via v, aio_context_t ctx);

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

/* Its fork rule (hooks/fanout.c): the kernel gave the child none of the parent's contexts; the
 * carriers' descriptor is inherited, its users are not. */
void kvs_libaio_atfork_child(void);

#endif
