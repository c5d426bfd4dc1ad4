/*
 * unseen_marks: see unseen_marks.h.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>

#include "raw.h"
#include "sys.h"
#include "unseen_marks.h"

static _Atomic uint64_t marks[KVS_UNSEEN_SLOTS / 64];
static _Atomic uint32_t nmarked; /* a hint for the close hooks: 0, nothing to look at */
static _Atomic uint64_t pending;
static _Atomic long owner;

void kvs_unseen_mark(int fd, long pid)
{
	atomic_store_explicit(&owner, pid, memory_order_relaxed);
	if (!(atomic_fetch_or(&marks[fd / 64], 1ull << (fd % 64)) & (1ull << (fd % 64))))
		atomic_fetch_add(&nmarked, 1);
}

/* Clear fd's mark: true when this call cleared it. */
static bool take(int fd)
{
	uint64_t bit = 1ull << (fd % 64);

	if (fd < 0 || fd >= KVS_UNSEEN_SLOTS ||
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
	    !kvs_bitmap_any(marks, KVS_UNSEEN_SLOTS, lo, hi))
		return;
	int saved = errno;
	long pid = kvs_syscall(SYS_getpid);
	errno = saved;
	if (pid != atomic_load_explicit(&owner, memory_order_relaxed))
		return; /* a vfork child's close, in its parent's memory: the marks are the parent's
			 */
	if (hi >= KVS_UNSEEN_SLOTS)
		hi = KVS_UNSEEN_SLOTS - 1;
	for (unsigned int fd = lo; fd <= hi && atomic_load(&nmarked); fd++)
		n += take((int)fd);
	if (n)
		atomic_fetch_add(&pending, n); /* counted at exit (unseen.c) */
}

uint64_t kvs_unseen_pending(void)
{
	return atomic_load(&pending);
}

long kvs_unseen_owner(void)
{
	return atomic_load_explicit(&owner, memory_order_relaxed);
}

uint64_t kvs_unseen_pending_take(void)
{
	return atomic_exchange(&pending, 0);
}

void kvs_unseen_atfork_child(void)
{
	for (unsigned int i = 0; i < KVS_UNSEEN_SLOTS / 64; i++)
		atomic_store_explicit(&marks[i], 0, memory_order_relaxed);
	atomic_store(&nmarked, 0);
	atomic_store(&pending, 0);
}
