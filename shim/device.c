/*
 * device: destinations in device memory (see device.h).
 *
 * DESIGN.  gpu is opened once, under open_mu, by the first cuFile read whose destination is
 * not plainly host memory; the outcome (the handle, or the error) is published with a release
 * store of state and read with an acquire load, so later reads take no lock.  A failure is
 * final for the process and reported once: every cuFile read then goes to the real library.
 * counted is the part of gpu's registered bytes already added to the region's counter; the
 * thread that moves it forward does so with a CAS, so each byte is counted once.
 *
 * Exit: the open registers an atexit handler (once per process image), which stops and joins
 * gpu's registration thread (kvs_gpu_quiesce).  It is registered after the program's cuInit,
 * so it runs before the driver's own exit handlers: the thread is never inside
 * cuMemHostRegister while the driver tears down.  gpu itself is never freed (other threads
 * may still be copying while exit runs).
 *
 * Fork: the child forgets gpu without a call into the driver (kvs_gpu_forget) and may open it
 * again if it reads into device memory itself; the inherited atexit handler then finds the
 * child's own handle, or none.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "device.h"
#include "dlsym.h"
#include "log.h"

enum { DEV_UNOPENED, DEV_OPEN, DEV_FAILED };

static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int state = DEV_UNOPENED;
static struct kvs_gpu *gpu;
static _Atomic uint64_t counted;
static bool exit_handler; /* under open_mu; inherited by a fork child, as the handler is */

/* At exit: the registration thread out of the driver before the driver's own handlers run. */
static void device_exit(void)
{
	if (atomic_load_explicit(&state, memory_order_acquire) == DEV_OPEN) /* pairs: driver() */
		kvs_gpu_quiesce(gpu);
}

static struct kvs_gpu *driver(const struct kvs_config *cfg)
{
	int s = atomic_load_explicit(&state, memory_order_acquire); /* pairs with the store below */

	if (s != DEV_UNOPENED)
		return s == DEV_OPEN ? gpu : NULL;
	pthread_mutex_lock(&open_mu);
	s = atomic_load_explicit(&state, memory_order_relaxed);
	if (s == DEV_UNOPENED) {
		struct kvs_gpu_params p = {.library = cfg->cuda_library,
					   .register_host = cfg->cuda_register_host,
					   .dlsym = kvs_dlsym_real};
		int r = kvs_gpu_open(&p, &gpu);

		if (r)
			kvs_log_once(KVS_CAUSE_DEVICE, KVS_LOG_WARN,
				     "cannot use the CUDA driver %s (%s): cuFile reads go to "
				     "libcufile",
				     cfg->cuda_library, strerror(-r));
		s = r ? DEV_FAILED : DEV_OPEN;
		atomic_store_explicit(&state, s, memory_order_release); /* publishes gpu */
		if (s == DEV_OPEN && !exit_handler)
			exit_handler = atexit(device_exit) == 0;
	}
	pthread_mutex_unlock(&open_mu);
	return s == DEV_OPEN ? gpu : NULL;
}

int kvs_device_target(const struct kvs_config *cfg, uint64_t ptr, size_t len,
		      struct kvs_device_target *t)
{
	struct kvs_gpu *g = driver(cfg);
	int r;

	memset(t, 0, sizeof(*t));
	if (!g)
		return -ENODEV;
	r = kvs_gpu_classify(g, ptr, len, &t->dst);
	if (r)
		return r;
	t->host = t->dst.kind == KVS_MEM_HOST;
	t->iov.iov_base = (void *)(uintptr_t)ptr;
	t->iov.iov_len = len;
	return 0;
}

static int device_copy(void *ctx, uint64_t pos, const void *src, uint64_t len)
{
	struct kvs_device_target *t = ctx;
	int r = kvs_gpu_copy(&t->cp, pos, src, len);

	if (r == 0)
		t->bytes += len;
	return r;
}

/* The copies are over: count what landed, and what the background registration has done. */
static int device_fence(void *ctx)
{
	struct kvs_device_target *t = ctx;
	int r = kvs_gpu_fence(&t->cp);
	uint64_t reg = kvs_gpu_registered_bytes(t->cp.g);
	uint64_t had = atomic_load_explicit(&counted, memory_order_relaxed);

	if (r == 0)
		kvs_cache_count(t->c, KVS_CTR_h2d_bytes, t->bytes);
	t->bytes = 0;
	while (reg > had && !atomic_compare_exchange_weak(&counted, &had, reg))
		;
	if (reg > had)
		kvs_cache_count(t->c, KVS_CTR_registered_bytes, reg - had);
	return r;
}

/* The unit of the region's registration chunks: the least common multiple of its frame size
 * and its page size (both powers of two times 4 KiB, or a frame any multiple of 4 KiB). */
static size_t frame_and_page(const struct kvs_cache *c)
{
	size_t a = kvs_cache_shard_size(c), b = kvs_cache_page_size(c), x = a, y = b;

	while (y) {
		size_t t = x % y;

		x = y;
		y = t;
	}
	return x ? a / x * b : a;
}

static bool data_ready(void *c, size_t off, size_t len)
{
	return kvs_cache_data_ready(c, off, len);
}

int kvs_device_begin(struct kvs_device_target *t, struct kvs_cache *c, const struct kvs_config *cfg)
{
	struct kvs_gpu *g = driver(cfg);
	void *base;
	size_t len;
	int r;

	t->c = c;
	if (t->host)
		return 0;
	if (!g)
		return -ENODEV;
	r = kvs_gpu_copy_begin(g, &t->dst, &t->cp);
	if (r)
		return r;
	kvs_cache_data_region(c, &base, &len);
	/* Once per process; never waited for; only the pages the region has; whole frames, and
	 * whole pages of the region (a huge page pinned by one registration). */
	kvs_gpu_register_region(g, base, len, frame_and_page(c), data_ready, c);
	t->dest = (struct kvs_dest){.copy = device_copy, .fence = device_fence, .ctx = t};
	return 0;
}

int kvs_device_stream_copy(struct kvs_device_target *t, void *stream, uint64_t pos, const void *src,
			   size_t len)
{
	return kvs_gpu_copy_on_stream(t->cp.g, stream, &t->dst, pos, src, len);
}

int kvs_device_stream_copies(struct kvs_device_target *t, void *stream, size_t n,
			     const uint64_t *pos, const void *const *srcs, const size_t *lens,
			     bool in_order)
{
	return kvs_gpu_copy_many_on_stream(t->cp.g, stream, &t->dst, n, pos, srcs, lens,
					   in_order ? KVS_GPU_READ_IN_ORDER : KVS_GPU_READ_AT_CALL);
}

bool kvs_device_has_batch(const struct kvs_device_target *t)
{
	return t->cp.g && kvs_gpu_has_batch(t->cp.g);
}

int kvs_device_gate_wait(struct kvs_device_target *t, void *stream, struct kvs_gpu_gate *gate)
{
	return kvs_gpu_gate_wait(t->cp.g, stream, &t->dst, gate);
}

void kvs_device_gate_release(const struct kvs_device_target *t, const struct kvs_gpu_gate *gate)
{
	kvs_gpu_gate_release(t->cp.g, gate);
}

int kvs_device_stream_capturing(struct kvs_device_target *t, void *stream)
{
	return kvs_gpu_stream_capturing(t->cp.g, stream, &t->dst);
}

int kvs_device_push(const struct kvs_device_target *t)
{
	struct kvs_gpu *g =
	    atomic_load_explicit(&state, memory_order_acquire) == DEV_OPEN ? gpu : NULL;

	if (t->host)
		return 0;
	return g ? kvs_gpu_ctx_push(g, &t->dst) : -ENODEV;
}

void kvs_device_pop(const struct kvs_device_target *t)
{
	if (!t->host)
		kvs_gpu_ctx_pop(gpu); /* a push succeeded: gpu is open */
}

int kvs_device_stream_func(struct kvs_device_target *t, void *stream, void (*fn)(void *), void *arg)
{
	return kvs_gpu_host_func(t->cp.g, stream, &t->dst, fn, arg);
}

int kvs_device_copy_to_host(const struct kvs_device_target *t, uint64_t pos, void *dst, size_t len)
{
	struct kvs_gpu *g =
	    atomic_load_explicit(&state, memory_order_acquire) == DEV_OPEN ? gpu : NULL;

	return g ? kvs_gpu_copy_to_host(g, &t->dst, pos, dst, len) : -ENODEV;
}

bool kvs_device_pinned(const struct kvs_device_target *t, const void *src, size_t len)
{
	return t->cp.g && kvs_gpu_pinned(t->cp.g, src, len);
}

void kvs_device_atfork_child(void)
{
	if (atomic_load_explicit(&state, memory_order_relaxed) == DEV_OPEN)
		kvs_gpu_forget(gpu);
	gpu = NULL;
	atomic_store(&counted, 0);
	atomic_store(&state, DEV_UNOPENED);
	pthread_mutex_init(&open_mu, NULL);
}
