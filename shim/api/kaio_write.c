/*
 * kaio_write: the kernel AIO engine's contexts and writes (kaio_int.h): what the shim keeps of
 * an io context (its kernel writes of KV files, noted for write-through until their events are
 * seen), a write's invalidation before the kernel has it, and the submit of a run of entries
 * with its writes noted first.  The protocol is the DESIGN comment of api/kaio.c ("Locks":
 * kaio_ctx_mu, each context's mu).
 */
#include <limits.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include "kaio.h"
#include "kaio_int.h"
#include "raw.h"
#include "shim.h"

/* ------------------------------------------------------------------ contexts */

pthread_mutex_t kaio_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
struct kctx *kaio_ctxs;

/* The context ctx, unlinked from the list if unlink; NULL if the shim keeps none. */
struct kctx *kaio_find(aio_context_t ctx, bool unlink)
{
	struct kctx **p, *c = NULL;

	pthread_mutex_lock(&kaio_ctx_mu);
	for (p = &kaio_ctxs; *p; p = &(*p)->next) {
		if ((*p)->id == ctx) {
			c = *p;
			if (unlink)
				*p = c->next;
			break;
		}
	}
	pthread_mutex_unlock(&kaio_ctx_mu);
	return c;
}

/* The context ctx, made if need be; NULL when the kernel does not know ctx (its io_submit of
 * nothing answers -EINVAL) or memory is short: then the caller passes through. */
struct kctx *kaio_find_or_make(aio_context_t ctx)
{
	struct kctx *c = kaio_find(ctx, false), *other;

	if (c)
		return c;
	if (RAW(SYS_io_submit, ctx, 0, NULL, 0, 0, 0) != 0)
		return NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->id = ctx;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_lock(&kaio_ctx_mu);
	for (other = kaio_ctxs; other && other->id != ctx; other = other->next)
		;
	if (!other) {
		c->next = kaio_ctxs;
		kaio_ctxs = c;
	}
	pthread_mutex_unlock(&kaio_ctx_mu);
	if (other) { /* another thread made it meanwhile */
		pthread_mutex_destroy(&c->mu);
		free(c);
		c = other;
	}
	return c;
}

/* ------------------------------------------------------------------ writes */

/* A write to a KV file changes what the cache holds: drop the shards it covers before the
 * kernel has it (the file's new times then keep the rest from being served stale). */
void kaio_invalidate_write(const struct iocb *cb)
{
	size_t len = 0;

	if (!cb || (int64_t)cb->aio_offset < 0)
		return;
	if (cb->aio_lio_opcode == IOCB_CMD_PWRITE) {
		len = (size_t)cb->aio_nbytes;
	} else if (cb->aio_lio_opcode == IOCB_CMD_PWRITEV) {
		struct iovec local[KVS_IOV_LOCAL];
		uint64_t n = 0;

		/* Read as the kernel reads it; one it refuses fails the entry, which changes
		 * nothing. */
		if (cb->aio_nbytes <= IOV_MAX &&
		    kvs_shim_iov_read((const struct iovec *)(uintptr_t)cb->aio_buf,
				      (int)cb->aio_nbytes, local, &n))
			len = (size_t)n;
	}
	if (len) {
		kvs_shim_invalidate((int)cb->aio_fildes, (off_t)cb->aio_offset, len, false, 0);
		/* A rewrite of a write-once file counts at the submission (its event comes later,
		 * maybe where the shim does not look). */
		kvs_shim_invalidate((int)cb->aio_fildes, (off_t)cb->aio_offset, len, false,
				    -(off_t)len);
	}
}

/* Note cb (a copy of the program's iocb) in p for write-through when it is a write of a KV
 * file; false: not noted. */
static bool note_write(struct kvs_shim_wpend *p, const struct iocb *cb)
{
	if (!cb || (int64_t)cb->aio_offset < 0 || cb->aio_rw_flags)
		return false;
	if (cb->aio_lio_opcode == IOCB_CMD_PWRITE) {
		struct iovec v = {(void *)(uintptr_t)cb->aio_buf, (size_t)cb->aio_nbytes};

		return kvs_shim_write_submitted(p, (int)cb->aio_fildes, &v, 1, cb->aio_offset);
	}
	if (cb->aio_lio_opcode == IOCB_CMD_PWRITEV && cb->aio_nbytes <= IOV_MAX)
		return kvs_shim_write_submitted(p, (int)cb->aio_fildes,
						(const struct iovec *)(uintptr_t)cb->aio_buf,
						(int)cb->aio_nbytes, cb->aio_offset);
	return false;
}

/* The noted write of the iocb at obj, taken out; NULL if none.  Caller holds c->mu. */
struct kwrite *kaio_take_write(struct kctx *c, uint64_t obj)
{
	for (struct kwrite **pp = &c->writes; *pp; pp = &(*pp)->next) {
		if ((*pp)->obj == obj) {
			struct kwrite *w = *pp;

			*pp = w->next;
			c->nwrites--;
			return w;
		}
	}
	return NULL;
}

/* Complete w's write with result n (-1: failed, or never submitted), and free it. */
void kaio_complete_write(struct kwrite *w, ssize_t n)
{
	if (w) {
		kvs_shim_write_completed(&w->p, n);
		free(w);
	}
}

/* n events came from the kernel into ev: the writes among them are over. */
void kaio_kernel_events(struct kctx *c, const struct io_event *ev, long n)
{
	for (long k = 0; k < n; k++) {
		pthread_mutex_lock(&c->mu);
		struct kwrite *w = c->nwrites ? kaio_take_write(c, ev[k].obj) : NULL;
		pthread_mutex_unlock(&c->mu);
		kaio_complete_write(w, ev[k].res < 0 ? -1 : (ssize_t)ev[k].res);
	}
}

/* Submit a run of entries to the kernel (p: the program's pointers; cbs: copies of the iocbs
 * they name), noting its writes for write-through first (their bytes are copied now, and
 * their notes are in the list before the kernel has them: another thread may reap their
 * events before io_submit returns); the entries it did not take are not writes in flight. */
long kaio_submit_run(enum kvs_kaio_via v, struct kctx *c, aio_context_t ctx, long nr,
		     struct iocb **p, const struct iocb *cbs)
{
	bool noted[KVS_SUBMIT_CHUNK] = {false};
	long n;

	for (long k = 0; k < nr; k++) {
		struct kwrite *w = malloc(sizeof(*w));

		if (!w || !note_write(&w->p, &cbs[k])) {
			free(w);
			continue;
		}
		noted[k] = true;
		w->obj = (uint64_t)(uintptr_t)p[k];
		pthread_mutex_lock(&c->mu);
		/* A note left on this iocb (its event was reaped where the shim does not look):
		 * that write is of no use now. */
		struct kwrite *stale = kaio_take_write(c, w->obj);
		w->next = c->writes;
		c->writes = w;
		c->nwrites++;
		pthread_mutex_unlock(&c->mu);
		kaio_complete_write(stale, -1);
	}
	n = kaio_real_submit(v, ctx, nr, p);
	for (long k = n < 0 ? 0 : n; k < nr; k++) {
		if (!noted[k])
			continue;
		pthread_mutex_lock(&c->mu);
		struct kwrite *gone = kaio_take_write(c, (uint64_t)(uintptr_t)p[k]);
		pthread_mutex_unlock(&c->mu);
		kaio_complete_write(gone, -1); /* never submitted */
	}
	return n;
}
