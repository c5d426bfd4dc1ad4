/*
 * shmap: writable shared mappings of KV files (see shmap.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "shmap.h"

struct shmap {
	uintptr_t start, end; /* [start, end): what is left of the mapping */
	struct kvs_cache *c;
	struct kvs_wtok tok;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct shmap maps[KVS_SHMAP_MAX]; /* [0, n), under mu */
static _Atomic int n;			 /* written under mu, read by anyone */

void kvs_shmap_begin(struct kvs_cache *c, uint64_t dev, uint64_t ino, const void *addr, size_t len)
{
	struct kvs_wtok tok;

	kvs_cache_write_begin(c, dev, ino, &tok);
	if (!tok.held || !len)
		return; /* not attached: no write of ours can be in flight; nothing is kept */
	pthread_mutex_lock(&mu);
	int i = atomic_load_explicit(&n, memory_order_relaxed);
	/* A full table keeps the write in flight until the process is gone (shmap.h). */
	if (i < KVS_SHMAP_MAX) {
		maps[i] = (struct shmap){
		    .start = (uintptr_t)addr, .end = (uintptr_t)addr + len, .c = c, .tok = tok};
		atomic_store_explicit(&n, i + 1, memory_order_relaxed);
	}
	pthread_mutex_unlock(&mu);
}

void kvs_shmap_unmapped(const void *addr, size_t len)
{
	uintptr_t lo = (uintptr_t)addr, hi = lo + len;

	if (!atomic_load_explicit(&n, memory_order_relaxed) || !len)
		return;
	/* munmap takes whole pages: a length that is not a multiple reaches the page's end. */
	uintptr_t page = (uintptr_t)getpagesize();

	hi = (hi + page - 1) & ~(page - 1);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < atomic_load_explicit(&n, memory_order_relaxed);) {
		struct shmap *m = &maps[i];

		if (hi <= m->start || lo >= m->end) {
			i++;
			continue;
		}
		if (lo <= m->start && hi >= m->end) { /* gone whole: its write ends */
			kvs_cache_write_end(m->c, &m->tok);
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
	pthread_mutex_unlock(&mu);
}

void kvs_shmap_atfork_child(void)
{
	pthread_mutex_init(&mu, NULL);
	atomic_store_explicit(&n, 0, memory_order_relaxed);
}
