/*
 * shmap: writable shared mappings of KV files (see shmap.h).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "shmap.h"

struct shmap {
	uintptr_t start, end; /* [start, end): what is left of the mapping */
	uintptr_t base;	      /* where it was made: file offset off is there */
	uint64_t gen;	      /* when it was recorded (kvs_shmap_now) */
	uint64_t dev, ino;
	struct kvs_key block;
	uint64_t off, len; /* the file's range it was made over */
	struct kvs_cache *c;
	bool kept; /* moved by mremap: held until the process ends */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct shmap maps[KVS_SHMAP_MAX]; /* [0, n), under mu */
static _Atomic int n;			 /* written under mu, read by anyone */
static _Atomic uint64_t gens;		 /* moved by each record */

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
	struct kvs_wtok tok;
	sigset_t old;

	if (!len)
		return;
	lock(&old);
	if (kvs_cache_map_hold(c, dev, ino)) {
		/* No lock: a write in flight on the file's write sequence instead, never ended
		 * (loads are refused their mark until the process is gone), said once. */
		kvs_cache_write_begin(c, dev, ino, &tok);
		kvs_log_once(KVS_CAUSE_SHMAP, KVS_LOG_WARN,
			     "a writable shared mapping of a KV file could not be recorded on the "
			     "region's file; its file is kept out of the cache by the write "
			     "sequences until this process exits");
	} else if (atomic_load_explicit(&n, memory_order_relaxed) < KVS_SHMAP_MAX) {
		int i = atomic_load_explicit(&n, memory_order_relaxed);

		maps[i] = (struct shmap){.start = (uintptr_t)addr,
					 .end = (uintptr_t)addr + len,
					 .base = (uintptr_t)addr,
					 .gen = atomic_fetch_add(&gens, 1) + 1,
					 .dev = dev,
					 .ino = ino,
					 .block = *block,
					 .off = off,
					 .len = len,
					 .c = c};
		atomic_store_explicit(&n, i + 1, memory_order_relaxed);
	} /* else a full table: the lock is held until the process is gone (shmap.h) */
	drop(c, block, off, len);
	unlock(&old);
}

uint64_t kvs_shmap_now(void)
{
	return atomic_load_explicit(&gens, memory_order_acquire);
}

void kvs_shmap_unmapped(const void *addr, size_t len, uint64_t before)
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

		if (hi <= m->start || lo >= m->end || m->gen > before) {
			i++; /* not this munmap's: recorded after it took the pages (another thread)
			      */
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

void kvs_shmap_remapped(const void *old_addr, size_t old_len, size_t new_len, uint64_t before)
{
	uintptr_t lo = (uintptr_t)old_addr, hi = lo + (old_len ? old_len : 1);
	sigset_t old;

	if (!atomic_load_explicit(&n, memory_order_relaxed))
		return;
	lock(&old);
	for (int i = 0; i < atomic_load_explicit(&n, memory_order_relaxed); i++) {
		struct shmap *m = &maps[i];

		if (hi <= m->start || lo >= m->end || m->gen > before)
			continue;
		/* Where its pages are now is not followed: held for good, and the file's range the
		 * moved part may reach now dropped. */
		uint64_t from = m->off + (lo > m->base ? lo - m->base : 0);

		m->kept = true;
		drop(m->c, &m->block, from, old_len > new_len ? old_len : new_len);
	}
	unlock(&old);
}

void kvs_shmap_atfork_child(void)
{
	pthread_mutex_init(&mu, NULL);
	atomic_store_explicit(&n, 0, memory_order_relaxed);
}
