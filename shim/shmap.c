/*
 * shmap: writable shared mappings of KV files (see shmap.h).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "shmap.h"

struct shmap {
	uintptr_t start, end; /* [start, end): what is left of the mapping */
	uint64_t dev, ino;
	struct kvs_key block;
	uint64_t off, len; /* the file's range it was made over */
	struct kvs_cache *c;
	bool kept; /* moved by mremap: held until the process ends */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct shmap maps[KVS_SHMAP_MAX]; /* [0, n), under mu */
static _Atomic int n;			 /* written under mu, read by anyone */

/* mu with every signal blocked: a handler that unmaps would wait on its own thread. */
static void lock(sigset_t *old)
{
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, old);
	pthread_mutex_lock(&mu);
}

static void unlock(const sigset_t *old)
{
	pthread_mutex_unlock(&mu);
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* Drop the cache's shards of [off, off + len) of block. */
static void drop(struct kvs_cache *c, const struct kvs_key *block, uint64_t off, uint64_t len)
{
	uint64_t S = kvs_cache_shard_size(c);

	if (len)
		kvs_cache_invalidate(c, block, off / S, (off + len - 1) / S);
}

void kvs_shmap_begin(struct kvs_cache *c, uint64_t dev, uint64_t ino, const struct kvs_key *block,
		     const void *addr, uint64_t off, size_t len)
{
	sigset_t old;

	if (!len || kvs_cache_map_hold(c, dev, ino))
		return; /* not held: what was kept stays kept, as before the shim knew of maps */
	drop(c, block, off, len);
	lock(&old);
	int i = atomic_load_explicit(&n, memory_order_relaxed);
	/* A full table keeps the lock until the process is gone (shmap.h). */
	if (i < KVS_SHMAP_MAX) {
		maps[i] = (struct shmap){.start = (uintptr_t)addr,
					 .end = (uintptr_t)addr + len,
					 .dev = dev,
					 .ino = ino,
					 .block = *block,
					 .off = off,
					 .len = len,
					 .c = c};
		atomic_store_explicit(&n, i + 1, memory_order_relaxed);
	}
	unlock(&old);
}

void kvs_shmap_unmapped(const void *addr, size_t len)
{
	uintptr_t lo = (uintptr_t)addr, hi = lo + len;
	sigset_t old;

	if (!atomic_load_explicit(&n, memory_order_relaxed) || !len)
		return;
	/* munmap takes whole pages: a length that is not a multiple reaches the page's end. */
	uintptr_t page = (uintptr_t)getpagesize();

	hi = (hi + page - 1) & ~(page - 1);
	lock(&old);
	for (int i = 0; i < atomic_load_explicit(&n, memory_order_relaxed);) {
		struct shmap *m = &maps[i];

		if (hi <= m->start || lo >= m->end) {
			i++;
			continue;
		}
		if (lo <= m->start && hi >= m->end) {
			if (!m->kept) { /* gone whole: dropped again, then its lock goes */
				drop(m->c, &m->block, m->off, m->len);
				kvs_cache_map_release(m->c, m->dev, m->ino);
			}
			int last = atomic_load_explicit(&n, memory_order_relaxed) - 1;
			maps[i] = maps[last];
			atomic_store_explicit(&n, last, memory_order_relaxed);
			continue;
		}
		if (lo <= m->start)
			m->start = hi; /* its front went */
		else if (hi >= m->end)
			m->end = lo; /* its back went */
		/* else a hole: what is left on either side still lives */
		i++;
	}
	unlock(&old);
}

void kvs_shmap_remapped(const void *old_addr, size_t old_len, size_t new_len)
{
	uintptr_t lo = (uintptr_t)old_addr, hi = lo + (old_len ? old_len : 1);
	sigset_t old;

	if (!atomic_load_explicit(&n, memory_order_relaxed))
		return;
	lock(&old);
	for (int i = 0; i < atomic_load_explicit(&n, memory_order_relaxed); i++) {
		struct shmap *m = &maps[i];

		if (hi <= m->start || lo >= m->end)
			continue;
		/* Where its pages are now is not followed: held for good, the file's range as
		 * far as it may reach dropped. */
		m->kept = true;
		if (new_len > m->len)
			drop(m->c, &m->block, m->off, new_len);
	}
	unlock(&old);
}

void kvs_shmap_atfork_child(void)
{
	pthread_mutex_init(&mu, NULL);
	atomic_store_explicit(&n, 0, memory_order_relaxed);
}
