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
 * Fork: the child forgets gpu without a call into the driver (kvs_gpu_forget) and may open it
 * again if it reads into device memory itself.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
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
	/* Once per process; never waited for; only the pages the region has. */
	kvs_gpu_register_region(g, base, len, kvs_cache_page_size(c), data_ready, c);
	t->dest = (struct kvs_dest){.copy = device_copy, .fence = device_fence, .ctx = t};
	return 0;
}

int kvs_device_stream_copy(struct kvs_device_target *t, void *stream, uint64_t pos, const void *src,
			   size_t len)
{
	return kvs_gpu_copy_on_stream(t->cp.g, stream, &t->dst, pos, src, len);
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
