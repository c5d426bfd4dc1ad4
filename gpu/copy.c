/*
 * gpu: host-to-device copies, device-to-host copies for write-through, copies on a caller's
 * stream (see gpu.h).
 *
 * DESIGN
 *
 * The module owns one non-blocking stream per context, created at the first copy session into
 * that context; g->ctxs and g->nctx are guarded by g->lock (see gpu.c for the rule that no
 * driver call runs under it).  A context is known by its address and its id (cuCtxGetId): a
 * program that resets or destroys a context and gets a new one at the same address must not
 * find the old context's stream, which died with it.  So each session checks, with one driver
 * call, that the entry's context still has the id it had, and drops a stale entry (never
 * destroying its stream: the driver did); so does a copy that fails with a context error.  The
 * same check of the registration's home context tells register.c that its registrations are
 * gone (kvs_gpu_home_gone).
 *
 * A session (struct kvs_gpu_copy) belongs to one thread.  Sessions of several threads share
 * the context's stream: the driver orders their copies, and a fence waits for the others'
 * earlier copies as well as its own, which is correct and costs only the wait.  Every driver
 * call runs with the session's context pushed and popped on the calling thread.
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

/* ctx's entry: its stream and id, or false. */
static bool stream_find(struct kvs_gpu *g, kvs_cu_context ctx, kvs_cu_stream *s,
			unsigned long long *id)
{
	bool found = false;

	pthread_mutex_lock(&g->lock);
	for (int i = 0; i < g->nctx && !found; i++) {
		if (g->ctxs[i].ctx == ctx) {
			*s = g->ctxs[i].stream;
			*id = g->ctxs[i].id;
			found = true;
		}
	}
	pthread_mutex_unlock(&g->lock);
	return found;
}

/* Drop ctx's entry if it still holds stream s (its context is gone: the stream with it). */
static void stream_forget(struct kvs_gpu *g, kvs_cu_context ctx, kvs_cu_stream s)
{
	pthread_mutex_lock(&g->lock);
	for (int i = 0; i < g->nctx; i++) {
		if (g->ctxs[i].ctx == ctx && g->ctxs[i].stream == s) {
			g->ctxs[i] = g->ctxs[--g->nctx];
			break;
		}
	}
	pthread_mutex_unlock(&g->lock);
}

/* A driver call in ctx on stream s failed with r: a context error means both are gone. */
static void note_failure(struct kvs_gpu *g, kvs_cu_context ctx, kvs_cu_stream s, kvs_cu_result r)
{
	unsigned long long id;
	kvs_cu_stream cur;

	if (!kvs_gpu_ctx_error(r) && r != KVS_CU_ERROR_INVALID_HANDLE)
		return;
	if (stream_find(g, ctx, &cur, &id) && cur == s) {
		stream_forget(g, ctx, s);
		kvs_gpu_home_gone(g, ctx, id);
	}
}

/* Is the registration's home context (if it is not ctx, checked by the caller) still alive?
 * If not, its registrations are gone: tell register.c. */
static void check_home(struct kvs_gpu *g, kvs_cu_context ctx)
{
	kvs_cu_context home;
	unsigned long long id;

	pthread_mutex_lock(&g->lock);
	home = g->home_ctx;
	id = g->home_id;
	pthread_mutex_unlock(&g->lock);
	if (home && home != ctx && !kvs_gpu_ctx_alive(g, home, id))
		kvs_gpu_home_gone(g, home, id);
}

/* The module's stream for ctx, created at the first use, made again after ctx was reset. */
static int stream_get(struct kvs_gpu *g, kvs_cu_context ctx, kvs_cu_stream *out)
{
	kvs_cu_stream s = NULL;
	unsigned long long id = 0;

	if (stream_find(g, ctx, &s, &id)) {
		if (kvs_gpu_ctx_alive(g, ctx, id)) {
			*out = s;
			return 0;
		}
		stream_forget(g, ctx, s); /* a context gone, another at its address */
		kvs_gpu_home_gone(g, ctx, id);
	}
	kvs_cu_result cr;
	WITH_CTX(cr, g, ctx, g->cu.stream_create(&s, KVS_CU_STREAM_NON_BLOCKING));
	int r = kvs_gpu_errno(cr);
	if (r < 0)
		return r;
	id = kvs_gpu_ctx_id(g, ctx);
	kvs_cu_stream winner = NULL;
	pthread_mutex_lock(&g->lock);
	for (int i = 0; i < g->nctx; i++)
		if (g->ctxs[i].ctx == ctx)
			winner = g->ctxs[i].stream;
	if (!winner && g->nctx < KVS_GPU_MAX_CTX) {
		g->ctxs[g->nctx++] = (struct kvs_gpu_ctx){ctx, id, s};
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
	check_home(g, dst->ctx);
	kvs_gpu_set_home(g, dst->ctx); /* a registration that lost its context starts over here */
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
	if (r < 0) {
		cp->err = r;
		note_failure(g, cp->ctx, cp->stream, cr);
	} else {
		cp->queued++;
	}
	return r;
}

/* One cuMemcpyBatchAsync of n (<= BATCH_MAX) copies to dptr + offs[i] on stream, in ctx,
 * sources read in order (a CU_MEMCPY_SRC_ACCESS_ORDER_*).  The driver's result. */
static kvs_cu_result batch(struct kvs_gpu *g, kvs_cu_context ctx, kvs_cu_stream stream,
			   uint64_t dptr, size_t n, const uint64_t *offs, const void *const *srcs,
			   const size_t *lens, int order)
{
	kvs_cu_deviceptr d[BATCH_MAX], s[BATCH_MAX];
	size_t sz[BATCH_MAX], idx = 0, fail = 0;
	for (size_t i = 0; i < n; i++) {
		d[i] = dptr + offs[i];
		s[i] = (kvs_cu_deviceptr)(uintptr_t)srcs[i];
		sz[i] = lens[i];
	}
	struct kvs_cu_memcpy_attributes a = {.src_access_order = order};
	kvs_cu_result r;
	if (g->cu.memcpy_batch_v2)
		WITH_CTX(r, g, ctx, g->cu.memcpy_batch_v2(d, s, sz, n, &a, &idx, 1, stream));
	else
		WITH_CTX(r, g, ctx, g->cu.memcpy_batch_v1(d, s, sz, n, &a, &idx, 1, &fail, stream));
	return r;
}

bool kvs_gpu_has_batch(const struct kvs_gpu *g)
{
	return g->cu.memcpy_batch_v2 || g->cu.memcpy_batch_v1;
}

int kvs_gpu_copy_many_on_stream(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst,
				size_t n, const uint64_t *offs, const void *const *srcs,
				const size_t *lens, enum kvs_gpu_order order)
{
	if (forgotten(g))
		return -ENODEV;
	if (dst->kind != KVS_MEM_DEVICE || !dst->ctx || n == 0)
		return -EINVAL;
	if (!kvs_gpu_has_batch(g))
		return -ENOTSUP;
	if (n > BATCH_MAX)
		return -E2BIG;
	return kvs_gpu_errno(batch(g, dst->ctx, stream, dst->dptr, n, offs, srcs, lens,
				   order == KVS_GPU_READ_IN_ORDER
				       ? KVS_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
				       : KVS_CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL));
}

int kvs_gpu_copy_many(struct kvs_gpu_copy *cp, size_t n, const uint64_t *offs,
		      const void *const *srcs, const size_t *lens)
{
	struct kvs_gpu *g = cp->g;
	if (cp->err)
		return cp->err;
	if (!g)
		return -EINVAL;
	bool batched = kvs_gpu_has_batch(g);
	for (size_t i = 0; i < n;) {
		size_t k = n - i < BATCH_MAX ? n - i : BATCH_MAX;
		int r;
		if (batched && k > 1) {
			/* Sources are read in stream order, like cuMemcpyHtoDAsync's of pinned
			 * memory. */
			kvs_cu_result cr =
			    batch(g, cp->ctx, cp->stream, cp->dptr, k, offs + i, srcs + i, lens + i,
				  KVS_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM);
			r = kvs_gpu_errno(cr);
			if (r < 0) {
				note_failure(g, cp->ctx, cp->stream, cr);
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

/* Wait for stream s of ctx.  The stream names its context, so synchronising needs no push; a
 * failed push must not keep us from waiting for copies that use the caller's buffers. */
static kvs_cu_result sync_stream(struct kvs_gpu *g, kvs_cu_context ctx, kvs_cu_stream s)
{
	kvs_cu_result r = g->cu.ctx_push_current(ctx);
	kvs_cu_result sy = g->cu.stream_synchronize(s);
	if (r == KVS_CU_SUCCESS) {
		kvs_cu_context old;
		g->cu.ctx_pop_current(&old); /* pairs with the push */
	}
	return sy;
}

int kvs_gpu_fence(struct kvs_gpu_copy *cp)
{
	struct kvs_gpu *g = cp->g;
	int err = cp->err;
	if (!g || cp->queued == 0)
		return err;
	kvs_cu_result s = sync_stream(g, cp->ctx, cp->stream);
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
	kvs_cu_stream s;
	int r = stream_get(g, src->ctx, &s);
	if (r < 0)
		return r;
	/* Not cuMemcpyDtoH: on the legacy default stream it would first wait for all work on the
	 * program's blocking streams, and hold back what they queue after it. */
	kvs_cu_result cr;
	WITH_CTX(cr, g, src->ctx, g->cu.memcpy_dtoh_async(dst, src->dptr + src_off, len, s));
	if (cr == KVS_CU_SUCCESS) /* queued: dst is written until the stream is past it */
		cr = sync_stream(g, src->ctx, s);
	if (cr != KVS_CU_SUCCESS)
		note_failure(g, src->ctx, s, cr);
	return kvs_gpu_errno(cr);
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

int kvs_gpu_stream_capturing(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst)
{
	if (forgotten(g))
		return -ENODEV;
	if (!g->cu.stream_is_capturing)
		return 0;
	int status = KVS_CU_STREAM_CAPTURE_STATUS_NONE;
	kvs_cu_result r;
	if (dst && dst->ctx)
		WITH_CTX(r, g, dst->ctx, g->cu.stream_is_capturing(stream, &status));
	else
		r = g->cu.stream_is_capturing(stream, &status);
	if (r != KVS_CU_SUCCESS)
		return kvs_gpu_errno(r);
	return status != KVS_CU_STREAM_CAPTURE_STATUS_NONE;
}

int kvs_gpu_ctx_push(struct kvs_gpu *g, const struct kvs_gpu_ptr *p)
{
	if (forgotten(g))
		return -ENODEV;
	if (p->kind != KVS_MEM_DEVICE || !p->ctx)
		return -EINVAL;
	return kvs_gpu_errno(g->cu.ctx_push_current(p->ctx));
}

void kvs_gpu_ctx_pop(struct kvs_gpu *g)
{
	kvs_cu_context old;

	g->cu.ctx_pop_current(&old); /* pairs with kvs_gpu_ctx_push */
}
