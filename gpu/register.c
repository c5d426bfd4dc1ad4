/*
 * gpu: background registration of the cache's data region (see gpu.h).
 *
 * DESIGN
 *
 * One registration per process, on one thread, so that pinning a large region (seconds for
 * hundreds of GiB) never delays a copy: a copy from a chunk not yet registered only runs at
 * pageable speed.  The thread waits (g->cond) until the module knows a context to register in
 * (g->home_ctx: the context current on the thread that asked, else the first device
 * pointer's), so it never creates a context of its own, then registers KVS_GPU_REG_CHUNK at a
 * time with that context pushed, checking reg.stop between chunks.  Only chunks whose pages
 * the region has (reg.ready) are pinned: cuMemHostRegister faults in every page it pins, and
 * the cache gives a slot its pages only as cache.populate and cache.shm_headroom allow.  After
 * a pass that left chunks without their pages, the thread sleeps KVS_GPU_REG_RESCAN_MS on
 * g->cond (stop wakes it) and passes again, until every chunk is registered.
 *
 * Fields: reg.started, reg.stop and g->home_ctx are under g->lock.  reg.base, len, nchunks and
 * the done[] array are written once, before the thread starts, by the one caller that set
 * reg.started, and published to kvs_gpu_pinned by a release store of reg.armed.  done[i] is
 * written by the thread only, with a release store once the driver has pinned the chunk, and
 * read by kvs_gpu_pinned (acquire) and by kvs_gpu_register_stop after the join.  reg.bytes
 * and reg.err are relaxed atomics: readers want a figure, not an ordering.
 *
 * Why kvs_gpu_pinned exists: the driver reads a pageable source of cuMemcpyHtoDAsync when the
 * copy is enqueued (it stages it), and a pinned one when the stream reaches the copy.  A
 * caller that orders a copy behind work that fills the source (cuFileReadAsync's host
 * function) may do so only for a source that is pinned when it enqueues.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

enum { REG_NOT, REG_OURS, REG_THEIRS };

void kvs_gpu_set_home(struct kvs_gpu *g, kvs_cu_context c)
{
	if (!c)
		return;
	pthread_mutex_lock(&g->lock);
	if (!g->home_ctx) {
		g->home_ctx = c;
		pthread_cond_broadcast(&g->cond); /* wakes the wait in reg_thread */
	}
	pthread_mutex_unlock(&g->lock);
}

static void *reg_thread(void *arg)
{
	struct kvs_gpu *g = arg;
	struct kvs_gpu_reg *reg = &g->reg;

	pthread_mutex_lock(&g->lock);
	while (!g->home_ctx && !reg->stop)
		pthread_cond_wait(&g->cond, &g->lock);
	kvs_cu_context ctx = g->home_ctx;
	pthread_mutex_unlock(&g->lock);
	if (!ctx || g->cu.ctx_push_current(ctx) != KVS_CU_SUCCESS)
		return NULL;

	for (bool failed = false, stop = false; !failed && !stop;) {
		size_t left = 0;

		for (size_t i = 0; i < reg->nchunks && !failed; i++) {
			pthread_mutex_lock(&g->lock);
			stop = reg->stop;
			pthread_mutex_unlock(&g->lock);
			if (stop)
				break;
			if (atomic_load_explicit(&reg->done[i], memory_order_relaxed) != REG_NOT)
				continue;
			size_t off = i * reg->chunk;
			size_t n = reg->len - off < reg->chunk ? reg->len - off : reg->chunk;
			if (reg->ready && !reg->ready(reg->ready_ctx, off, n)) {
				left++; /* its pages are not all there: pinning would allocate them
					 */
				continue;
			}
			kvs_cu_result r = g->cu.mem_host_register(reg->base + off, n,
								  KVS_CU_MEMHOSTREGISTER_PORTABLE);
			if (r == KVS_CU_SUCCESS) {
				atomic_store_explicit(&reg->done[i], REG_OURS,
						      memory_order_release); /* pairs with pinned */
				atomic_fetch_add_explicit(&reg->bytes, n, memory_order_relaxed);
			} else if (r == KVS_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
				atomic_store_explicit(&reg->done[i], REG_THEIRS,
						      memory_order_release); /* not ours to undo */
			} else {
				/* Out of lockable memory, or not permitted: the rest would fail
				 * too. */
				atomic_store_explicit(&reg->err, kvs_gpu_errno(r),
						      memory_order_relaxed);
				failed = true;
			}
		}
		if (!left || failed || stop)
			break;
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until); /* g->cond's clock */
		until.tv_nsec += (long)KVS_GPU_REG_RESCAN_MS * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		pthread_mutex_lock(&g->lock);
		while (!reg->stop && pthread_cond_timedwait(&g->cond, &g->lock, &until) == 0)
			;
		stop = reg->stop;
		pthread_mutex_unlock(&g->lock);
	}
	kvs_cu_context old;
	g->cu.ctx_pop_current(&old); /* pairs with the push above */
	return NULL;
}

void kvs_gpu_register_region(struct kvs_gpu *g, void *base, size_t len, size_t page,
			     kvs_gpu_ready_fn ready, void *ready_ctx)
{
	if (!g->register_host || !base || len == 0 ||
	    atomic_load_explicit(&g->forgotten, memory_order_relaxed))
		return;
	pthread_mutex_lock(&g->lock);
	bool started = g->reg.started;
	g->reg.started = true;
	pthread_mutex_unlock(&g->lock);
	if (started)
		return;

	kvs_cu_context cur = NULL;
	if (g->cu.ctx_get_current(&cur) == KVS_CU_SUCCESS)
		kvs_gpu_set_home(g, cur);

	struct kvs_gpu_reg *reg = &g->reg;
	reg->base = base;
	reg->len = len;
	if (page < 4096)
		page = 4096;
	reg->chunk = (KVS_GPU_REG_CHUNK + page - 1) / page * page; /* a huge page in one */
	reg->nchunks = (len + reg->chunk - 1) / reg->chunk;
	reg->ready = ready;
	reg->ready_ctx = ready_ctx;
	reg->done = calloc(reg->nchunks, sizeof(*reg->done));
	if (!reg->done) {
		atomic_store_explicit(&reg->err, -ENOMEM, memory_order_relaxed);
		return;
	}
	int r = pthread_create(&reg->th, NULL, reg_thread, g);
	if (r != 0) {
		atomic_store_explicit(&reg->err, -r, memory_order_relaxed);
		free((void *)reg->done);
		reg->done = NULL;
		return;
	}
	atomic_store_explicit(&reg->armed, true,
			      memory_order_release); /* pairs with kvs_gpu_pinned */
}

bool kvs_gpu_pinned(const struct kvs_gpu *g, const void *p, size_t len)
{
	const struct kvs_gpu_reg *reg = &g->reg;
	uintptr_t a = (uintptr_t)p, base = (uintptr_t)reg->base;

	if (!atomic_load_explicit(&reg->armed, memory_order_acquire) || len == 0 || a < base ||
	    a - base > reg->len ||
	    len > reg->len - (a - base)) /* pairs with the store in kvs_gpu_register_region */
		return false;
	for (size_t i = (a - base) / reg->chunk; i <= (a - base + len - 1) / reg->chunk; i++)
		if (atomic_load_explicit(&reg->done[i], memory_order_acquire) ==
		    REG_NOT) /* pairs with reg_thread */
			return false;
	return true;
}

uint64_t kvs_gpu_registered_bytes(const struct kvs_gpu *g)
{
	return atomic_load_explicit(&g->reg.bytes, memory_order_relaxed);
}

int kvs_gpu_register_error(const struct kvs_gpu *g)
{
	return atomic_load_explicit(&g->reg.err, memory_order_relaxed);
}

void kvs_gpu_register_stop(struct kvs_gpu *g)
{
	struct kvs_gpu_reg *reg = &g->reg;
	if (!reg->done) /* never started, or failed to */
		return;
	atomic_store_explicit(&reg->armed, false,
			      memory_order_relaxed); /* no other call is in progress (gpu.h) */
	pthread_mutex_lock(&g->lock);
	reg->stop = true;
	pthread_cond_broadcast(&g->cond); /* wakes the wait in reg_thread */
	kvs_cu_context ctx = g->home_ctx;
	pthread_mutex_unlock(&g->lock);
	pthread_join(reg->th, NULL);

	if (ctx && g->cu.ctx_push_current(ctx) == KVS_CU_SUCCESS) {
		for (size_t i = 0; i < reg->nchunks; i++)
			if (atomic_load_explicit(&reg->done[i], memory_order_relaxed) ==
			    REG_OURS) /* joined: ours alone */
				g->cu.mem_host_unregister(reg->base + i * reg->chunk);
		kvs_cu_context old;
		g->cu.ctx_pop_current(&old); /* pairs with the push */
	}
	atomic_store_explicit(&reg->bytes, 0, memory_order_relaxed);
	free((void *)reg->done);
	reg->done = NULL;
}
