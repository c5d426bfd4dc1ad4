/*
 * gpu: background registration of the cache's data region (see gpu.h).
 *
 * DESIGN
 *
 * One registration per process, on one thread, so that pinning a large region (seconds for
 * hundreds of GiB) never delays a copy: a copy from a chunk not yet registered only runs at
 * pageable speed.  The thread waits (g->cond) until the module knows a context to register in
 * (g->home_ctx: the context current on the thread that asked, else the first device
 * pointer's), so it never creates a context of its own, then registers reg.chunk bytes at a
 * time with that context pushed, checking reg.stop and reg.lost between chunks.
 *
 * Chunks are whole frames (reg.chunk is KVS_GPU_REG_CHUNK rounded up to the caller's unit):
 * the driver refuses a copy over registered and unregistered memory (INVALID_VALUE) and
 * documents nothing for a copy over two registrations, so no frame, and no copy from one, may
 * span two chunks.  kvs_gpu_pinned accordingly says yes only inside one finished chunk.
 *
 * Only chunks whose pages the region has (reg.ready) are pinned: cuMemHostRegister faults in
 * every page it pins, and the cache gives a slot its pages only as cache.populate and
 * cache.shm_headroom allow.  After a pass that left chunks without their pages the thread
 * sleeps KVS_GPU_REG_RESCAN_MS on g->cond and passes again.  A chunk the driver refuses
 * (memory pressure, a page gone between the look and the pin) ends the pass, and is tried
 * again after a backoff of KVS_GPU_REG_RETRY_MS, doubled after each refusal up to
 * KVS_GPU_REG_RETRY_MAX; reg.err holds the refusal until that chunk is registered.  Once every
 * chunk is registered the thread sleeps on g->cond until stop or a loss.
 *
 * A loss: the home context went away (the program reset or destroyed it: copy.c sees it by
 * the context's id at a copy session, or the driver answers a context error here).  Its
 * registrations went with it.  kvs_gpu_home_gone clears home_ctx, sets reg.lost and clears
 * reg.live (kvs_gpu_pinned says no from then on); the thread pops the dead context, marks
 * every chunk not registered, sets reg.live again, waits for the next home and starts over.
 *
 * Fields: reg.started, running, stop, lost, g->home_ctx and g->home_id are under g->lock.
 * reg.base, len, chunk, nchunks and the done[] array are written once, before the thread
 * starts, by the one caller that set reg.started, and published to kvs_gpu_pinned by a release
 * store of reg.armed.  done[i] is written by the thread only, with a release store once the
 * driver has pinned the chunk (or after a loss, REG_NOT), and read by kvs_gpu_pinned
 * (acquire) and by kvs_gpu_register_stop after the join.  reg.bytes and reg.err are relaxed
 * atomics: readers want a figure, not an ordering.
 *
 * Exit: kvs_gpu_quiesce (from the shim's atexit handler) stops and joins the thread, so that
 * it is never inside cuMemHostRegister while the driver's own exit handlers tear it down.
 *
 * Why kvs_gpu_pinned exists: the driver reads a pageable source of cuMemcpyHtoDAsync when the
 * copy is enqueued (it stages it), and a pinned one when the stream reaches the copy.  A
 * caller that orders a copy behind work that fills the source (cuFileReadAsync's gate) may do
 * so only for a source that is pinned when it enqueues.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "deadline.h"
#include "internal.h"

enum { REG_NOT, REG_OURS, REG_THEIRS };

void kvs_gpu_set_home(struct kvs_gpu *g, kvs_cu_context c)
{
	if (!c)
		return;
	pthread_mutex_lock(&g->lock);
	bool want = !g->home_ctx;
	pthread_mutex_unlock(&g->lock);
	if (!want)
		return;
	unsigned long long id = kvs_gpu_ctx_id(g, c); /* a driver call: not under the lock */
	pthread_mutex_lock(&g->lock);
	if (!g->home_ctx) {
		g->home_ctx = c;
		g->home_id = id;
		pthread_cond_broadcast(&g->cond); /* wakes the wait in reg_thread */
	}
	pthread_mutex_unlock(&g->lock);
}

void kvs_gpu_home_gone(struct kvs_gpu *g, kvs_cu_context c, unsigned long long id)
{
	pthread_mutex_lock(&g->lock);
	if (g->home_ctx == c && g->home_id == id) {
		g->home_ctx = NULL;
		g->home_id = 0;
		g->reg.lost = true;
		atomic_store_explicit(&g->reg.live, false,
				      memory_order_relaxed); /* kvs_gpu_pinned says no at once */
		pthread_cond_broadcast(&g->cond);	     /* wakes the thread's wait */
	}
	pthread_mutex_unlock(&g->lock);
}

/* Sleep on g->cond until ms have passed (ms < 0: without limit), stop or a loss. */
static void reg_sleep(struct kvs_gpu *g, long ms)
{
	uint64_t until = ms < 0 ? KVS_FOREVER : kvs_mono_ns() + (uint64_t)ms * 1000000ull;

	pthread_mutex_lock(&g->lock);
	while (!g->reg.stop && !g->reg.lost && kvs_cond_wait_until(&g->cond, &g->lock, until) == 0)
		;
	pthread_mutex_unlock(&g->lock);
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* What the thread does after one pass. */
enum pass_end { P_DONE, P_RESCAN, P_RETRY, P_LOST, P_STOP };

/* One pass over the chunks in the pushed home context. */
static enum pass_end reg_pass(struct kvs_gpu *g)
{
	struct kvs_gpu_reg *reg = &g->reg;
	enum pass_end end = P_DONE;

	for (size_t i = 0; i < reg->nchunks; i++) {
		pthread_mutex_lock(&g->lock);
		bool stop = reg->stop, lost = reg->lost;
		pthread_mutex_unlock(&g->lock);
		if (stop || lost)
			return stop ? P_STOP : P_LOST;
		if (atomic_load_explicit(&reg->done[i], memory_order_relaxed) != REG_NOT)
			continue;
		size_t off = i * reg->chunk;
		size_t n = reg->len - off < reg->chunk ? reg->len - off : reg->chunk;
		if (reg->ready && !reg->ready(reg->ready_ctx, off, n)) {
			end =
			    P_RESCAN; /* its pages are not all there: pinning would allocate them */
			continue;
		}
		kvs_cu_result r =
		    g->cu.mem_host_register(reg->base + off, n, KVS_CU_MEMHOSTREGISTER_PORTABLE);
		if (r == KVS_CU_SUCCESS) {
			atomic_store_explicit(&reg->done[i], REG_OURS,
					      memory_order_release); /* pairs with pinned */
			atomic_fetch_add_explicit(&reg->bytes, n, memory_order_relaxed);
			atomic_store_explicit(&reg->err, 0, memory_order_relaxed);
		} else if (r == KVS_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
			atomic_store_explicit(&reg->done[i], REG_THEIRS,
					      memory_order_release); /* not ours to undo */
		} else if (kvs_gpu_ctx_error(r)) {
			return P_LOST; /* the home context is gone (kvs_gpu_home_gone by us) */
		} else {
			/* Out of lockable memory, a page gone, not permitted: the next chunks would
			 * most likely fail too.  Try again later. */
			atomic_store_explicit(&reg->err, kvs_gpu_errno(r), memory_order_relaxed);
			return P_RETRY;
		}
	}
	return end;
}

static void *reg_thread(void *arg)
{
	struct kvs_gpu *g = arg;
	struct kvs_gpu_reg *reg = &g->reg;
	long backoff = KVS_GPU_REG_RETRY_MS;

	for (;;) {
		pthread_mutex_lock(&g->lock);
		while (!g->home_ctx && !reg->stop)
			pthread_cond_wait(&g->cond, &g->lock);
		kvs_cu_context ctx = g->home_ctx;
		unsigned long long id = g->home_id;
		bool stop = reg->stop;
		reg->lost = false;
		pthread_mutex_unlock(&g->lock);
		if (stop)
			break;
		if (g->cu.ctx_push_current(ctx) != KVS_CU_SUCCESS) {
			kvs_gpu_home_gone(g, ctx, id); /* a context that went away already */
			continue;
		}
		enum pass_end end;
		uint64_t retry_at = 0;
		for (;;) {
			end = reg_pass(g);
			if (end == P_LOST)
				kvs_gpu_home_gone(g, ctx, id);
			if (end == P_LOST || end == P_STOP)
				break;
			if (end == P_RETRY) {
				retry_at = mono_ms() + (uint64_t)backoff;
				backoff = backoff * 2 > KVS_GPU_REG_RETRY_MAX
					      ? KVS_GPU_REG_RETRY_MAX
					      : backoff * 2;
			} else if (end == P_DONE) {
				backoff = KVS_GPU_REG_RETRY_MS;
			}
			uint64_t now = mono_ms();
			if (end == P_DONE)
				reg_sleep(g, -1); /* until stop or a loss */
			else if (end == P_RESCAN && (!retry_at || retry_at <= now))
				reg_sleep(g, KVS_GPU_REG_RESCAN_MS);
			else
				reg_sleep(g, retry_at > now ? (long)(retry_at - now) : 0);
		}
		kvs_cu_context old;
		g->cu.ctx_pop_current(&old); /* pairs with the push above */
		if (end == P_STOP)
			break;
		/* Lost: what was registered in the dead context is gone with it. */
		for (size_t i = 0; i < reg->nchunks; i++)
			atomic_store_explicit(&reg->done[i], REG_NOT, memory_order_relaxed);
		atomic_store_explicit(&reg->bytes, 0, memory_order_relaxed);
		atomic_store_explicit(&reg->live, true,
				      memory_order_release); /* pairs with kvs_gpu_pinned */
	}
	return NULL;
}

void kvs_gpu_register_region(struct kvs_gpu *g, void *base, size_t len, size_t unit,
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
	reg->chunk = KVS_GPU_REG_CHUNK;
	if (unit > 0)
		reg->chunk = (KVS_GPU_REG_CHUNK + unit - 1) / unit * unit; /* whole frames */
	reg->nchunks = (len + reg->chunk - 1) / reg->chunk;
	reg->ready = ready;
	reg->ready_ctx = ready_ctx;
	atomic_store_explicit(&reg->live, true, memory_order_relaxed);
	reg->done = calloc(reg->nchunks, sizeof(*reg->done));
	if (!reg->done) {
		atomic_store_explicit(&reg->err, -ENOMEM, memory_order_relaxed);
		return;
	}
	pthread_mutex_lock(&g->lock);
	int r = reg->stop ? ECANCELED : pthread_create(&reg->th, NULL, reg_thread, g);
	reg->running = r == 0;
	pthread_mutex_unlock(&g->lock);
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
	if (!atomic_load_explicit(&reg->live, memory_order_acquire)) /* pairs with reg_thread */
		return false;
	size_t i = (a - base) / reg->chunk;
	if (i != (a - base + len - 1) / reg->chunk) /* over two registrations: not documented */
		return false;
	return atomic_load_explicit(&reg->done[i], memory_order_acquire) !=
	       REG_NOT; /* pairs with reg_thread */
}

uint64_t kvs_gpu_registered_bytes(const struct kvs_gpu *g)
{
	return atomic_load_explicit(&g->reg.bytes, memory_order_relaxed);
}

int kvs_gpu_register_error(const struct kvs_gpu *g)
{
	return atomic_load_explicit(&g->reg.err, memory_order_relaxed);
}

void kvs_gpu_quiesce(struct kvs_gpu *g)
{
	if (!g || atomic_load_explicit(&g->forgotten, memory_order_relaxed))
		return;
	struct kvs_gpu_reg *reg = &g->reg;
	pthread_mutex_lock(&g->lock);
	reg->stop = true;
	bool join = reg->running;
	reg->running = false;
	pthread_cond_broadcast(&g->cond); /* wakes the waits in reg_thread */
	pthread_mutex_unlock(&g->lock);
	if (join)
		pthread_join(reg->th, NULL);
}

void kvs_gpu_register_stop(struct kvs_gpu *g)
{
	struct kvs_gpu_reg *reg = &g->reg;

	kvs_gpu_quiesce(g);
	if (!reg->done) /* never started, or failed to */
		return;
	atomic_store_explicit(&reg->armed, false,
			      memory_order_relaxed); /* no other call is in progress (gpu.h) */
	pthread_mutex_lock(&g->lock);
	kvs_cu_context ctx = g->home_ctx;
	pthread_mutex_unlock(&g->lock);
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
