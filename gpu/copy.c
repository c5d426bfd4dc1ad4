/*
 * gpu: host-to-device copies (see gpu.h).
 *
 * DESIGN
 *
 * The module owns one non-blocking stream per context, created at the first copy session into
 * that context and kept until kvs_gpu_close; g->ctxs and g->nctx are guarded by g->lock (see
 * gpu.c for the rule that no driver call runs under it).  A session (struct kvs_gpu_copy)
 * belongs to one thread.  Sessions of several threads share the context's stream: the driver
 * orders their copies, and a fence waits for the others' earlier copies as well as its own,
 * which is correct and costs only the wait.  Every driver call runs with the session's
 * context pushed and popped on the calling thread.
 */
#include <errno.h>
#include <string.h>

#include "internal.h"

#define BATCH_MAX 64

/* res = call, run with ctx pushed on this thread; a failed push is the call's failure. */
#define WITH_CTX(res, g, ctx, call)                                                                \
	do {                                                                                       \
		(res) = (g)->cu.ctx_push_current(ctx);                                             \
		if ((res) == KVS_CU_SUCCESS) {                                                     \
			kvs_cu_context with_old_;                                                  \
			(res) = (call);                                                            \
			(g)->cu.ctx_pop_current(&with_old_); /* pairs with the push */             \
		}                                                                                  \
	} while (0)

static bool forgotten(struct kvs_gpu *g)
{
	return atomic_load_explicit(&g->forgotten, memory_order_relaxed);
}

static kvs_cu_stream stream_find(struct kvs_gpu *g, kvs_cu_context ctx)
{
	kvs_cu_stream s = NULL;
	pthread_mutex_lock(&g->lock);
	for (int i = 0; i < g->nctx; i++)
		if (g->ctxs[i].ctx == ctx)
			s = g->ctxs[i].stream;
	pthread_mutex_unlock(&g->lock);
	return s;
}

/* The module's stream for ctx, created at the first use. */
static int stream_get(struct kvs_gpu *g, kvs_cu_context ctx, kvs_cu_stream *out)
{
	kvs_cu_stream s = stream_find(g, ctx);
	if (s) {
		*out = s;
		return 0;
	}
	kvs_cu_result cr;
	WITH_CTX(cr, g, ctx, g->cu.stream_create(&s, KVS_CU_STREAM_NON_BLOCKING));
	int r = kvs_gpu_errno(cr);
	if (r < 0)
		return r;
	kvs_cu_stream winner = NULL;
	pthread_mutex_lock(&g->lock);
	for (int i = 0; i < g->nctx; i++)
		if (g->ctxs[i].ctx == ctx)
			winner = g->ctxs[i].stream;
	if (!winner && g->nctx < KVS_GPU_MAX_CTX) {
		g->ctxs[g->nctx++] = (struct kvs_gpu_ctx){ctx, s};
		winner = s;
	}
	pthread_mutex_unlock(&g->lock);
	if (winner != s) /* another thread's stream won, or the table is full */
		WITH_CTX(cr, g, ctx, g->cu.stream_destroy(s));
	if (!winner)
		return -ENOSPC;
	*out = winner;
	return 0;
}

void kvs_gpu_streams_destroy(struct kvs_gpu *g)
{
	kvs_cu_result r;
	for (int i = 0; i < g->nctx; i++) /* the driver finishes the stream's copies first */
		WITH_CTX(r, g, g->ctxs[i].ctx, g->cu.stream_destroy(g->ctxs[i].stream));
	g->nctx = 0;
}

int kvs_gpu_copy_begin(struct kvs_gpu *g, const struct kvs_gpu_ptr *dst, struct kvs_gpu_copy *cp)
{
	memset(cp, 0, sizeof(*cp));
	if (forgotten(g))
		return -ENODEV;
	if (dst->kind != KVS_MEM_DEVICE || !dst->ctx)
		return -EINVAL;
	kvs_cu_stream s;
	int r = stream_get(g, dst->ctx, &s);
	if (r < 0)
		return r;
	cp->g = g;
	cp->ctx = dst->ctx;
	cp->stream = s;
	cp->dptr = dst->dptr;
	return 0;
}

int kvs_gpu_copy(struct kvs_gpu_copy *cp, uint64_t dst_off, const void *src, size_t len)
{
	struct kvs_gpu *g = cp->g;
	if (cp->err)
		return cp->err;
	if (!g)
		return -EINVAL;
	kvs_cu_result cr;
	WITH_CTX(cr, g, cp->ctx, g->cu.memcpy_htod_async(cp->dptr + dst_off, src, len, cp->stream));
	int r = kvs_gpu_errno(cr);
	if (r < 0)
		cp->err = r;
	else
		cp->queued++;
	return r;
}

static int batch(struct kvs_gpu_copy *cp, size_t n, const uint64_t *offs, const void *const *srcs,
		 const size_t *lens)
{
	struct kvs_gpu *g = cp->g;
	kvs_cu_deviceptr d[BATCH_MAX], s[BATCH_MAX];
	size_t sz[BATCH_MAX], idx = 0, fail = 0;
	for (size_t i = 0; i < n; i++) {
		d[i] = cp->dptr + offs[i];
		s[i] = (kvs_cu_deviceptr)(uintptr_t)srcs[i];
		sz[i] = lens[i];
	}
	/* Sources are read in stream order, like cuMemcpyHtoDAsync's. */
	struct kvs_cu_memcpy_attributes a = {.src_access_order =
						 KVS_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
	kvs_cu_result r;
	if (g->cu.memcpy_batch_v2)
		WITH_CTX(r, g, cp->ctx,
			 g->cu.memcpy_batch_v2(d, s, sz, n, &a, &idx, 1, cp->stream));
	else
		WITH_CTX(r, g, cp->ctx,
			 g->cu.memcpy_batch_v1(d, s, sz, n, &a, &idx, 1, &fail, cp->stream));
	return kvs_gpu_errno(r);
}

int kvs_gpu_copy_many(struct kvs_gpu_copy *cp, size_t n, const uint64_t *offs,
		      const void *const *srcs, const size_t *lens)
{
	struct kvs_gpu *g = cp->g;
	if (cp->err)
		return cp->err;
	if (!g)
		return -EINVAL;
	bool batched = g->cu.memcpy_batch_v2 || g->cu.memcpy_batch_v1;
	for (size_t i = 0; i < n;) {
		size_t k = n - i < BATCH_MAX ? n - i : BATCH_MAX;
		int r;
		if (batched && k > 1) {
			r = batch(cp, k, offs + i, srcs + i, lens + i);
			if (r < 0) {
				/* Some copies of the batch may be queued: the fence must wait. */
				cp->queued++;
				cp->err = r;
				return r;
			}
			cp->queued += (uint32_t)k;
		} else {
			k = 1;
			r = kvs_gpu_copy(cp, offs[i], srcs[i], lens[i]);
			if (r < 0)
				return r;
		}
		i += k;
	}
	return 0;
}

int kvs_gpu_fence(struct kvs_gpu_copy *cp)
{
	struct kvs_gpu *g = cp->g;
	int err = cp->err;
	if (!g || cp->queued == 0)
		return err;
	/* The stream names its context, so synchronising needs no push; a failed push must not
	 * keep us from waiting for the copies that read the caller's buffers. */
	kvs_cu_result r = g->cu.ctx_push_current(cp->ctx);
	kvs_cu_result s = g->cu.stream_synchronize(cp->stream);
	if (r == KVS_CU_SUCCESS) {
		kvs_cu_context old;
		g->cu.ctx_pop_current(&old); /* pairs with the push */
	}
	cp->queued = 0;
	return err ? err : kvs_gpu_errno(s);
}

int kvs_gpu_copy_on_stream(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst,
			   uint64_t dst_off, const void *src, size_t len)
{
	if (forgotten(g))
		return -ENODEV;
	if (dst->kind != KVS_MEM_DEVICE || !dst->ctx)
		return -EINVAL;
	kvs_cu_result r;
	WITH_CTX(r, g, dst->ctx, g->cu.memcpy_htod_async(dst->dptr + dst_off, src, len, stream));
	return kvs_gpu_errno(r);
}

int kvs_gpu_copy_to_host(struct kvs_gpu *g, const struct kvs_gpu_ptr *src, uint64_t src_off,
			 void *dst, size_t len)
{
	if (forgotten(g))
		return -ENODEV;
	if (src->kind != KVS_MEM_DEVICE || !src->ctx)
		return -EINVAL;
	kvs_cu_result r;
	WITH_CTX(r, g, src->ctx, g->cu.memcpy_dtoh(dst, src->dptr + src_off, len));
	return kvs_gpu_errno(r);
}

int kvs_gpu_host_func(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst,
		      void (*fn)(void *), void *arg)
{
	if (forgotten(g))
		return -ENODEV;
	if (!dst || !dst->ctx)
		return kvs_gpu_errno(g->cu.launch_host_func(stream, fn, arg));
	kvs_cu_result r;
	WITH_CTX(r, g, dst->ctx, g->cu.launch_host_func(stream, fn, arg));
	return kvs_gpu_errno(r);
}
