/*
 * unseen: see unseen.h.
 *
 * marks: one bit per descriptor number below UNSEEN_SLOTS, set by the opening thread, cleared
 * by whoever clears it first (a look, a close, a forget: atomic and-not, the clearer that
 * found it set counts).  pending: the closes of marked numbers, moved into the region's
 * counter at exit when the process read no KV file the shim saw.  owner: the pid the marks
 * belong to (a vfork child closes in its parent's memory: not counted).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>

#include "attach.h"
#include "cache.h"
#include "fdinfo.h"
#include "raw.h"
#include "shim.h"
#include "sys.h"
#include "unseen.h"

#define UNSEEN_SLOTS 65536
static _Atomic uint64_t marks[UNSEEN_SLOTS / 64];
static _Atomic uint32_t nmarked; /* a hint for the close hooks: 0, nothing to look at */
static _Atomic uint64_t pending;
static _Atomic long owner;

void kvs_unseen_opened(int fd, int flags)
{
	struct kvs_fdinfo fi;

	if (fd < 0 || fd >= UNSEEN_SLOTS || !(flags & O_DIRECT) ||
	    (flags & O_ACCMODE) == O_WRONLY || (flags & O_PATH) || !kvs_shim_wants(SIZE_MAX))
		return;
	int saved = kvs_shim_in();
	/* The look at the open is the shim's own: the mark comes after it. */
	if (kvs_fdinfo_get(fd, &fi) == 0 && fi.kv) {
		atomic_store_explicit(&owner, kvs_syscall(SYS_getpid), memory_order_relaxed);
		if (!(atomic_fetch_or(&marks[fd / 64], 1ull << (fd % 64)) & (1ull << (fd % 64))))
			atomic_fetch_add(&nmarked, 1);
	}
	kvs_shim_out(saved);
}

/* At exit, what is pending is counted, if this process read no KV file the shim saw: a loader
 * that reads through the shim and opens a file it then reads nothing of (a probe, a spare
 * descriptor per thread) is not one whose reads went where the shim cannot see.  Not at _exit
 * or a kill. */
__attribute__((destructor)) static void unseen_at_exit(void)
{
	struct kvs_cache *c;

	if (!atomic_load(&pending) || kvs_shim_guard || !kvs_shim_wants(SIZE_MAX) ||
	    kvs_syscall(SYS_getpid) != atomic_load_explicit(&owner, memory_order_relaxed))
		return;
	int saved = kvs_shim_in();
	if (!(kvs_shim_is_mapped() && kvs_cache_counted(kvs_shim_cache, KVS_CTR_read_bytes)) &&
	    (c = kvs_shim_region(true)))
		kvs_cache_count(c, KVS_CTR_unserved_unseen, atomic_exchange(&pending, 0));
	kvs_shim_out(saved);
}

/* Clear fd's mark: true when this call cleared it. */
static bool take(int fd)
{
	uint64_t bit = 1ull << (fd % 64);

	if (fd < 0 || fd >= UNSEEN_SLOTS ||
	    !(atomic_load_explicit(&marks[fd / 64], memory_order_relaxed) & bit) ||
	    !(atomic_fetch_and(&marks[fd / 64], ~bit) & bit))
		return false;
	atomic_fetch_sub(&nmarked, 1);
	return true;
}

void kvs_unseen_looked(int fd)
{
	if (atomic_load_explicit(&nmarked, memory_order_relaxed))
		take(fd);
}

void kvs_unseen_forget(int fd)
{
	kvs_unseen_looked(fd);
}

void kvs_unseen_closed(unsigned int lo, unsigned int hi)
{
	uint64_t n = 0;

	if (!atomic_load_explicit(&nmarked, memory_order_relaxed) ||
	    !kvs_bitmap_any(marks, UNSEEN_SLOTS, lo, hi))
		return;
	int saved = errno;
	long pid = kvs_syscall(SYS_getpid);
	errno = saved;
	if (pid != atomic_load_explicit(&owner, memory_order_relaxed))
		return; /* a vfork child's close, in its parent's memory: the marks are the parent's
			 */
	if (hi >= UNSEEN_SLOTS)
		hi = UNSEEN_SLOTS - 1;
	for (unsigned int fd = lo; fd <= hi && atomic_load(&nmarked); fd++)
		n += take((int)fd);
	if (n)
		atomic_fetch_add(&pending, n); /* counted at exit (unseen_at_exit) */
}

void kvs_unseen_atfork_child(void)
{
	for (unsigned int i = 0; i < UNSEEN_SLOTS / 64; i++)
		atomic_store_explicit(&marks[i], 0, memory_order_relaxed);
	atomic_store(&nmarked, 0);
	atomic_store(&pending, 0);
}
