/*
 * serve_async: reads that complete later: POSIX aio and kernel AIO reads started
 * (kvs_shim_read_start), and cuFile reads into host or device memory (kvs_shim_read_to,
 * kvs_shim_read_to_start), observed or served; a cuFile read's common part is serve.c's
 * (kvs_serve_cufile_prepare).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "anchor.h"
#include "attach.h"
#include "cache.h"
#include "fdinfo.h"
#include "loader.h"
#include "observe.h"
#include "serve.h"
#include "shim.h"
ssize_t kvs_shim_read_to(int fd, uint64_t ptr, size_t size, off_t off)
{
	int cancel_state;
	struct kvs_shim_async a;
	ssize_t ret = -1;

	int saved = kvs_shim_in();
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	if (kvs_serve_cufile_prepare(&a, fd, ptr, size, off))
		goto out;
	int64_t n = kvs_loader_read(kvs_shim_loader, &a.rd);
	kvs_anchor_put(a.rd.fd);
	kvs_serve_after_read(n);
	if (n < 0)
		kvs_serve_fell_back(fd, &a.rd, n);
	if (n >= 0) {
		kvs_cache_count(kvs_shim_cache, KVS_CTR_cufile_requests, 1);
		kvs_observe_served(kvs_shim_cache, a.rd.tally, (uint64_t)n);
		ret = n;
	}
out:
	pthread_setcancelstate(cancel_state, NULL);
	kvs_shim_out(saved);
	return ret;
}

/* A served asynchronous POSIX read that stopped short at the end of the file: zero the rest
 * of its buffers where the kernel would (a short O_DIRECT read on ext4, XFS, btrfs), as the
 * synchronous path does. */
static void async_tail(struct kvs_shim_async *a, int64_t result)
{
	if (a->posix && a->zero_tail && result >= 0 && (uint64_t)result < a->rd.len)
		kvs_serve_zero_tail(a->rd.iov, a->rd.iovcnt, (uint64_t)result);
}

static void async_done(struct kvs_task *t, int64_t result)
{
	struct kvs_shim_async *a = t->arg;

	async_tail(a, result);
	kvs_serve_after_read(result);
	if (result < 0)
		kvs_serve_fell_back(a->fd, &a->rd, result); /* a->done reads it for real */
	else
		kvs_observe_served(kvs_shim_cache, a->rd.tally, (uint64_t)result);
	if (result >= 0 && !a->posix)
		kvs_cache_count(kvs_shim_cache, KVS_CTR_cufile_requests, 1);
	int anchor = a->rd.fd;
	a->done(a, result); /* may read again through the anchor (kernel AIO), then reuse a */
	kvs_anchor_put(anchor);
}

/* kvs_loader_start for a prepared a: 0 (a->done will be called, and the anchor put after
 * it), 1 (over already: a->result), -1 (not started).  The anchor is put here for the last
 * two. */
static int start_async(struct kvs_shim_async *a)
{
	int r = kvs_loader_start(kvs_shim_loader, &a->task, &a->rd, async_done, a);

	if (r != 1) {
		if (r != 0) {
			kvs_anchor_put(a->rd.fd);
			kvs_serve_fell_back(a->fd, &a->rd, r); /* the caller passes it through */
		}
		return r == 0 ? 0 : -1;
	}
	kvs_anchor_put(a->rd.fd); /* a hit: the loader read nothing through it */
	a->result = a->task.result;
	async_tail(a, a->result);
	kvs_serve_after_read(a->result);
	kvs_observe_served(kvs_shim_cache, a->rd.tally, (uint64_t)a->result);
	if (!a->posix)
		kvs_cache_count(kvs_shim_cache, KVS_CTR_cufile_requests, 1);
	return 1;
}

int kvs_shim_read_to_start(struct kvs_shim_async *a, int fd, uint64_t ptr, size_t size, off_t off,
			   void (*done)(struct kvs_shim_async *a, int64_t result))
{
	int cancel_state, ret = -1;

	int saved = kvs_shim_in();
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	a->done = done;
	a->posix = false;
	if (kvs_serve_cufile_prepare(a, fd, ptr, size, off) == 0)
		ret = start_async(a);
	pthread_setcancelstate(cancel_state, NULL);
	kvs_shim_out(saved);
	return ret;
}

bool kvs_shim_observing(void)
{
	return kvs_shim_on() && kvs_observe_on();
}

void kvs_shim_observe_to(int fd, uint64_t ptr, size_t size, off_t off)
{
	int cancel_state;
	struct kvs_shim_async a;

	int saved = kvs_shim_in();
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	memset(&a.tg, 0, sizeof(a.tg));
	(void)kvs_serve_cufile_prepare(&a, fd, ptr, size,
				       off); /* observes, then passes it through (-1) */
	pthread_setcancelstate(cancel_state, NULL);
	kvs_shim_out(saved);
}

int kvs_shim_read_start(struct kvs_shim_async *a, int fd, const struct iovec *iov, int iovcnt,
			off_t off, void (*done)(struct kvs_shim_async *a, int64_t result))
{
	int cancel_state, ret = -1, anchor;
	struct kvs_fdinfo fi;
	uint64_t len = 0;

	if (iovcnt <= 0 || iovcnt > IOV_MAX || off < 0)
		return -1;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].iov_len > SSIZE_MAX - len)
			return -1;
		len += iov[i].iov_len;
	}
	if (len == 0 || len > KVS_MAX_RW_COUNT)
		return -1;
	int saved = kvs_shim_in();
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	memset(&a->tg, 0, sizeof(a->tg));
	a->done = done;
	a->zero_tail = false;
	if (!kvs_serve_admit(fd, kvs_fdinfo_get(fd, &fi), &fi, false, (uint64_t)off, len))
		goto out;
	if (!kvs_serve_direct_fits(fd, &fi, iov, iovcnt, off))
		goto out;
	if (!kvs_observe_on() && !kvs_serve_buffers_fit(fd, &fi, iov, iovcnt, (uint64_t)off, len))
		goto out;
	if (kvs_observe_on()) { /* keyed and counted; the real call reads it */
		kvs_serve_observe_posix(fd, &fi, (uint64_t)off, len);
		goto out;
	}
	anchor = kvs_serve_attach_anchor(fd, &fi, (uint64_t)off, len);
	if (anchor < 0)
		goto out;
	a->fd = fd;
	a->rd = kvs_serve_make_read(&fi, anchor, (uint64_t)off, len);
	a->rd.iov = iov;
	a->rd.iovcnt = iovcnt;
	a->posix = true;
	a->zero_tail = fi.direct && fi.dio_zero_tail;
	ret = start_async(a);
out:
	pthread_setcancelstate(cancel_state, NULL);
	kvs_shim_out(saved);
	return ret;
}
