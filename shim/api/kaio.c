/*
 * kaio: the engine of kernel AIO served by the cache (docs/design.md, "Kernel AIO
 * (`api/kaio.c`)").
 *
 * Two doors lead to it: libc's syscall() for the io_* numbers (UCM's AIO engine calls it
 * directly; hooks/syscall.c sends them to kvs_libaio_syscall) and libaio's io_submit,
 * io_getevents, io_pgetevents, io_cancel and io_destroy (NIXL's POSIX plugin, fio's libaio
 * engine; their doors are hooks/libaio.c).  Internally every function returns
 * -errno, as libaio does; syscall() turns that into -1 and errno.  The kernel part of a call
 * goes to libaio's real function when the caller came through libaio and it can be found,
 * else to the raw system call (which is all libaio does).  libc's syscall() is the shim's for
 * every number (hooks/syscall.c): the io_* numbers come here, through kvs_libaio_syscall.
 *
 * DESIGN.  Every event comes from the kernel, so every reaper finds it where the kernel puts
 * it: libaio's io_getevents (which peeks at the completion ring, a static libaio's too, and
 * makes no system call when it is empty), SYS_io_getevents, io_pgetevents, a program that
 * reads the ring itself, and the eventfd of IOCB_FLAG_RESFD.  io_submit looks at the iocbs a
 * chunk at a time (KVS_SUBMIT_CHUNK).  The reads the cache takes (kvs_shim_read_start) are all
 * started, then waited for: the loader runs them together, owners reading storage while the
 * others wait on the state words.  Each read the cache served is then handed to the kernel as
 * its carrier: the program's iocb, rewritten in place, writes the read's bytes to /dev/null (a
 * shim descriptor, kvs_ownfd), which the kernel completes at once with that count, through the
 * program's context, aio_data, eventfd and iocb address, as it would have completed the read.  The
 * whole chunk, carriers and the program's other entries in their order, goes to the kernel in one
 * call.  A read the cache did not serve (a failed load, a short read at the end of a file:
 * kaio_carrier_set) goes to the kernel as it is, and so do carriers the kernel did not take (put
 * back as they were).  io_getevents, io_pgetevents, io_cancel and io_destroy are the kernel's; the
 * shim only looks at their events for the writes it noted for write-through.
 *
 * The price: an io_submit with served reads returns once their bytes are in the buffers (a
 * buffered read's io_submit does the same in the kernel), and a served iocb reads as its
 * carrier from then on.  The shim never writes an iocb once it is in the kernel: the kernel
 * names an event by the address it read the iocb from and posts it during the call, and from
 * then on the program may free or reuse that memory (another thread may reap the event before
 * io_submit returns).  A carrier submitted again gets its read back (kaio_carrier_undo).
 * Why not complete later, from the loader: for the same reason, the shim cannot write an iocb
 * after io_submit returns.
 *
 * Locks: kaio_ctx_mu guards the list of contexts (held briefly, never across a call); each
 * context's mu guards its noted writes.  Lock order: kaio_ctx_mu before a context's mu (only in
 * find/create).  No lock is held across a system call, a call into libaio or into the loader.
 *
 * Fork: the child has none of the parent's contexts (the kernel does not copy them) and none
 * of its loader threads; the child handler forgets the list (its memory is abandoned) and
 * keeps the inherited /dev/null descriptor.
 *
 * Files (their shared state and calls: api/kaio_int.h): this one holds io_submit's chunks
 * (kvs_kaio_submit), the reaping calls, the syscall door and the fork rule; api/kaio_serve.c
 * the served reads of a chunk and their carriers (kaio_carrier_set, kaio_carrier_undo, the
 * /dev/null descriptor); api/kaio_write.c the contexts (ctx_mu) and the writes noted for
 * write-through; api/kaio_kernel.c the kernel part of each call (libaio's real functions, or
 * the system call).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dlsym.h"
#include "fdinfo.h"
#include "kaio.h"
#include "kaio_int.h"
#include "progmem.h"
#include "raw.h"
#include "shim.h"
#include "sys.h"
#include "touch.h"
#include "uring.h"

/* ------------------------------------------------------------------ fork */

void kvs_libaio_atfork_child(void)
{
	pthread_mutex_init(&kaio_ctx_mu, NULL);	     /* a parent's thread may have held it */
	pthread_mutex_init(&kaio_carriers_mu, NULL); /* the same */
	kaio_ctxs = NULL;			     /* the kernel gave the child none of them */
	kvs_ownfd_atfork_child(&kaio_devnull); /* the descriptor is inherited, its users are not */
}

/* ------------------------------------------------------------------ submitting */

/* Copy up to k leading entries of the program's iocb array p, pointers to ptr and the iocbs
 * they name to cbs, as the kernel reads them (it answers EFAULT for the first it cannot):
 * returns how many could be read. */
static long read_iocbs(struct iocb **p, long k, struct iocb **ptr, struct iocb *cbs)
{
	if (!kvs_shim_copy_in(ptr, p, (size_t)k * sizeof(*p))) {
		long all = k;

		for (k = 0; k < all && kvs_shim_copy_in(&ptr[k], &p[k], sizeof(*p));)
			k++; /* the pointers before the first the kernel cannot read */
	}
	for (long i = 0; i < k; i++)
		if (!kvs_shim_copy_in(&cbs[i], ptr[i], sizeof(*cbs)))
			return i;
	return k;
}

/* Submit good (>= 1) readable entries of the program's array p (ptr: its pointers; cbs: our
 * copies of the iocbs) as the kernel would: the reads the cache takes are served first, all of
 * them started before any is waited for, and each then handed to the kernel as its carrier
 * (kaio_carrier_set) in its place among the others, in one system call.  Returns the kernel's
 * answer for the call. */
static long submit_chunk(enum kvs_kaio_via v, struct kctx *c, aio_context_t ctx, long good,
			 struct iocb **p, struct iocb **ptr, struct iocb *cbs)
{
	struct batch *b = NULL;
	bool carried[KVS_SUBMIT_CHUNK] = {false};
	unsigned int ticket = 0;
	int nullfd = -1;
	long n;

	for (long i = 0; i < good; i++)
		kaio_carrier_undo(ptr[i], &cbs[i]);
	for (long i = 0; i < good; i++) {
		size_t len = kaio_candidate(&cbs[i]);

		if (!len)
			continue;
		if (!b) {
			if (!(b = malloc(sizeof(*b))))
				break;
			atomic_init(&b->running, 0);
			memset(b->started, 0, sizeof(b->started));
		}
		b->started[i] = kaio_start(b, &b->e[i], &cbs[i], len);
	}
	if (b)
		kaio_batch_wait(b);
	/* The carriers' descriptor held from here to the submit only: a close of its number by the
	 * program waits for that (kvs_ownfd_closing), never for a load. */
	if (b)
		nullfd = kaio_devnull_get(&ticket);
	for (long i = 0; b && nullfd >= 0 && i < good; i++)
		if (b->started[i])
			carried[i] =
			    kaio_carrier_set(ptr[i], &cbs[i], b->e[i].len, b->e[i].result, nullfd);
	for (long i = 0; i < good; i++)
		if (!carried[i])
			kaio_invalidate_write(&cbs[i]);
	/* The kernel posts a carrier's event during the call, and another thread may reap it and
	 * free the iocb before the call returns: no touch of an iocb the kernel took after this. */
	n = kaio_submit_run(v, c, ctx, good, p, cbs);
	/* Those it did not take (it stops at the first it refuses) it never read and will post
	 * nothing for: still the program's, to submit again or read itself, as they were. */
	for (long i = n < 0 ? 0 : n; i < good; i++)
		if (carried[i])
			kvs_progmem_store(ptr[i], &cbs[i], sizeof(cbs[i]));
	if (nullfd >= 0)
		kvs_ownfd_put(&kaio_devnull, ticket);
	kaio_batch_free(b);
	return n;
}

long kvs_kaio_submit(enum kvs_kaio_via v, aio_context_t ctx, long nr, struct iocb **p)
{
	struct iocb *ptr[KVS_SUBMIT_CHUNK], cbs[KVS_SUBMIT_CHUNK];
	struct kctx *c;

	if (nr <= 0 || !p || !kvs_shim_wants(SIZE_MAX) || !(c = kaio_find_or_make(ctx)))
		return kaio_real_submit(v, ctx, nr, p);
	/* A chunk at a time: the program's pointers and iocbs read as the kernel reads them,
	 * then looked at through the copies (the kernel reads the program's again). */
	for (long base = 0; base < nr;) {
		long k = nr - base < KVS_SUBMIT_CHUNK ? nr - base : KVS_SUBMIT_CHUNK;
		long good = read_iocbs(p + base, k, ptr, cbs), n;

		if (good == 0) {
			/* The kernel's answer for an entry it cannot read: nothing past it. */
			n = kaio_real_submit(v, ctx, 1, p + base);
			if (n > 0) /* it could read it after all (the program remapped it) */
				n = base + n;
			return base ? base : n;
		}
		n = submit_chunk(v, c, ctx, good, p + base, ptr, cbs);
		if (n < 0)
			return base ? base : n;
		base += n;
		if (n < good)
			return base; /* the kernel took part of it: nothing past that point */
	}
	return nr;
}

/* ------------------------------------------------------------------ reaping */

long kvs_kaio_getevents(enum kvs_kaio_via v, aio_context_t ctx, long min_nr, long nr,
			struct io_event *ev, struct timespec *ts, const void *sig)
{
	struct kctx *c = kaio_find(ctx, false);
	long n = kaio_real_getevents(v, ctx, min_nr, nr, ev, ts, sig);

	if (c && n > 0 && ev)
		kaio_kernel_events(c, ev, n);
	return n;
}

long kvs_kaio_cancel(enum kvs_kaio_via v, aio_context_t ctx, struct iocb *cb, struct io_event *res)
{
	struct kctx *c = kaio_find(ctx, false);
	long r = kaio_real_cancel(v, ctx, cb, res);

	if (c && r == 0 && res)
		/* the old kernels' cancel: the event came back here */
		kaio_kernel_events(c, res, 1);
	return r;
}

long kvs_kaio_destroy(enum kvs_kaio_via v, aio_context_t ctx)
{
	struct kctx *c = kaio_find(ctx, true);

	if (c) {
		while (c->writes) /* their events will never be seen: keep nothing of them */
			kaio_complete_write(kaio_take_write(c, c->writes->obj), -1);
		pthread_mutex_destroy(&c->mu);
		free(c);
	}
	return kaio_real_destroy(v, ctx);
}

bool kvs_libaio_syscall(long number, const long *a, long *r)
{
	if (kaio_in_libaio) { /* libaio's own system call, inside one of ours: the kernel's */
		*r = kvs_raw6(number, a[0], a[1], a[2], a[3], a[4], a[5]);
		return true;
	}
	switch (number) {
	case SYS_io_submit:
		*r = kvs_kaio_submit(KVS_KAIO_SYSCALL, (aio_context_t)a[0], a[1],
				     (struct iocb **)a[2]);
		return true;
	case SYS_io_getevents:
		*r = kvs_kaio_getevents(KVS_KAIO_SYSCALL, (aio_context_t)a[0], a[1], a[2],
					(struct io_event *)a[3], (struct timespec *)a[4], NULL);
		return true;
#ifdef SYS_io_pgetevents
	case SYS_io_pgetevents:
		/* A NULL sigset pointer is plain io_getevents to the kernel. */
		*r = kvs_kaio_getevents(KVS_KAIO_SYSCALL, (aio_context_t)a[0], a[1], a[2],
					(struct io_event *)a[3], (struct timespec *)a[4],
					a[5] ? (const void *)a[5] : NULL);
		return true;
#endif
	case SYS_io_cancel:
		*r = kvs_kaio_cancel(KVS_KAIO_SYSCALL, (aio_context_t)a[0], (struct iocb *)a[1],
				     (struct io_event *)a[2]);
		return true;
	case SYS_io_destroy:
		*r = kvs_kaio_destroy(KVS_KAIO_SYSCALL, (aio_context_t)a[0]);
		return true;
	default:
		return false;
	}
}
