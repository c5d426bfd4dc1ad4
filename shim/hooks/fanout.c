/*
 * fanout: forks and closes, told to every module in one order (see hooks/fanout.h).
 *
 * Fork.  prepare takes the locks a child must not inherit held: POSIX aio's table, then the
 * attach lock (a fork waits for an attach in progress); parent and the child release them.
 * In the child every resource has a rule, in this order: the region's mapping and descriptor
 * dropped and the loader forgotten (attach.c), the anchors closed, the device, the stream
 * settler, write-through, io_uring's tables, write-once records, the unseen opens, the
 * writable shared mappings and the atime queue forgotten, the position locks made anew, POSIX
 * aio's table and kernel AIO's contexts forgotten; the populating walker's descriptor is
 * closed by the cache itself (cache/populate.c), and the child attaches anew at its first
 * cacheable read.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>

#include "anchor.h"
#include "atime.h"
#include "attach.h"
#include "cache.h"
#include "device.h"
#include "fanout.h"
#include "hooks_uring.h"
#include "kaio.h"
#include "paio.h"
#include "raw.h"
#include "serve.h"
#include "shim.h"
#include "shmap.h"
#include "unseen_marks.h"
#include "uring.h"
#include "wonce.h"
#include "wthru.h"

static void fork_prepare(void)
{
	kvs_posix_aio_atfork_prepare();
	kvs_shim_attach_atfork_prepare();
}

static void fork_parent(void)
{
	kvs_shim_attach_atfork_parent();
	kvs_posix_aio_atfork_parent();
}

static void fork_child(void)
{
	kvs_shim_attach_atfork_child();
	kvs_anchor_atfork_child();
	kvs_device_atfork_child();
	kvs_stream_atfork_child();
	kvs_wthru_atfork_child();
	kvs_uring_atfork_child();
	kvs_uring_doors_atfork_child();
	kvs_wonce_atfork_child();
	kvs_unseen_atfork_child();
	kvs_shmap_atfork_child();
	kvs_atime_atfork_child();
	kvs_serve_pos_init(); /* a parent's thread may have held a position lock */
	kvs_posix_aio_atfork_child();
	kvs_libaio_atfork_child();
}

/* At load, before the program's own code runs, whether the shim turns on or not: a fork must
 * never leave a lock of the shim's held in the child, and POSIX aio's table lock is taken by its
 * writes either way (api/paio_write.c).  A hooked call made by a library's constructor that
 * runs before this one may turn the shim on before the handlers are there: a fork in that
 * window, before the program's main, is made without them; and should the registration then
 * fail (no memory at load), the shim stays on without them. */
__attribute__((constructor)) static void fanout_register(void)
{
	if (pthread_atfork(fork_prepare, fork_parent, fork_child))
		kvs_shim_refuse(); /* an init still to come leaves the shim off (attach.c) */
}

void kvs_shim_fds_closing(unsigned int lo, unsigned int hi)
{
	/* The walk's descriptor counts with or without a mapped handle: a walk starts inside
	 * kvs_cache_open, before the handle is published. */
	struct kvs_cache *c = kvs_shim_is_mapped() ? kvs_shim_cache : NULL;

	/* Before the kernel closes: once it has, another thread's open may take the number and
	 * mark it (unseen.h). */
	kvs_unseen_closed(lo, hi);
	/* Most closes are of the program's own numbers: looked at with loads, no system call. */
	if (!kvs_cache_fds_in(c, lo, hi) && !kvs_anchor_numbers_in(lo, hi) &&
	    !kvs_libaio_numbers_in(lo, hi))
		return;
	if (!kvs_shim_in_owner())
		return; /* no state of this process yet, or a vfork child's close */
	int saved = errno;

	kvs_cache_fds_closing(c, lo, hi);
	kvs_anchor_numbers_closing(lo, hi);
	kvs_libaio_numbers_closing(lo, hi);
	errno = saved;
}

void kvs_shim_dup_closing(int oldfd, int newfd, int flags)
{
	int saved = errno;
	/* What the kernel refuses closes nothing: the shim's descriptor would stay where it was. */
	bool closes = newfd >= 0 && oldfd != newfd && !(flags & ~O_CLOEXEC) &&
		      kvs_sys_fcntl(oldfd, F_GETFD) >= 0;

	errno = saved;
	kvs_shim_fd_duped(oldfd);
	if (closes)
		kvs_shim_fds_closing((unsigned int)newfd, (unsigned int)newfd);
}

void kvs_shim_range_closing(unsigned int lo, unsigned int hi, unsigned int flags)
{
	/* CLOSE_RANGE_CLOEXEC closes nothing; unknown flags and lo > hi are EINVAL. */
	if (lo <= hi && !(flags & ~(CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC)) &&
	    !(flags & CLOSE_RANGE_CLOEXEC))
		kvs_shim_fds_closing(lo, hi);
}
