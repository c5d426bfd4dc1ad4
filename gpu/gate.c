/*
 * gpu: gates, words in host memory that a stream waits on until the host raises them (see
 * gpu.h, struct kvs_gpu_gate).
 *
 * DESIGN
 *
 * One page of KVS_GPU_GATES 32-bit words per process, mmap'd by the module (not allocated by
 * the driver: a context the program resets frees the driver's allocations, and a raise into a
 * freed page would crash), registered with cuMemHostRegister(PORTABLE | DEVICEMAP) so that
 * every context may map it.  The page's address is published once with a CAS (g->gates);
 * g->gate_free is a bitmap under g->lock, taken only to take or give back a gate.  The
 * registration is made at the first wait, in the waiting stream's context; when that context
 * goes away the registration goes with it, cuMemHostGetDevicePointer then fails, and the
 * next wait registers the page again in its own context.
 *
 * A gate's life: kvs_gpu_gate_wait takes a free one, stores 0 (lowered), and enqueues
 * cuStreamWaitValue32(word >= 1); the owner raises it (store 1, release) from any thread when
 * the work behind the wait may start; a host function behind the wait gives it back.  The
 * stream reads the word only while it waits, and is past the wait before that host function
 * runs, so a gate given back is never read by a stream again: it may be lowered for its next
 * user.  A gate whose host function never runs (a context that died with the stream) stays
 * taken: KVS_GPU_GATES of them in one process and waits answer -ENOSPC.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"
#include "raw.h"

#define PAGE 4096

_Static_assert(KVS_GPU_GATES * sizeof(uint32_t) == PAGE, "one page of gates");

/* The gates' page, mapped at the first use; NULL if it cannot be. */
static _Atomic uint32_t *gates_page(struct kvs_gpu *g)
{
	_Atomic uint32_t *p = atomic_load_explicit(&g->gates, memory_order_acquire);
	_Atomic uint32_t *none = NULL;

	if (p)
		return p;
	void *m = kvs_sys_mmap(NULL, PAGE, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	pthread_mutex_lock(&g->lock);
	if (!atomic_load_explicit(&g->gates, memory_order_relaxed))
		memset(g->gate_free, 0xff, sizeof(g->gate_free)); /* every gate free */
	pthread_mutex_unlock(&g->lock);
	if (!atomic_compare_exchange_strong_explicit(&g->gates, &none, m, memory_order_acq_rel,
						     memory_order_acquire)) {
		kvs_sys_munmap(m, PAGE); /* another thread's page won */
		return none;
	}
	return m;
}

/* A free gate's index, taken; -1 if none is free. */
static int gate_take(struct kvs_gpu *g)
{
	int idx = -1;

	pthread_mutex_lock(&g->lock);
	for (unsigned i = 0; i < KVS_GPU_GATES / 64 && idx < 0; i++) {
		if (g->gate_free[i]) {
			int b = __builtin_ctzll(g->gate_free[i]);

			g->gate_free[i] &= ~(1ull << b);
			idx = (int)(i * 64 + (unsigned)b);
		}
	}
	pthread_mutex_unlock(&g->lock);
	return idx;
}

void kvs_gpu_gate_release(struct kvs_gpu *g, const struct kvs_gpu_gate *gate)
{
	pthread_mutex_lock(&g->lock);
	g->gate_free[gate->idx / 64] |= 1ull << (gate->idx % 64);
	pthread_mutex_unlock(&g->lock);
}

/* The device address of word in the current context, registering the page there if no live
 * context has it registered. */
static kvs_cu_result device_address(struct kvs_gpu *g, _Atomic uint32_t *page,
				    _Atomic uint32_t *word, kvs_cu_deviceptr *out)
{
	kvs_cu_result r = g->cu.mem_host_get_device_pointer(out, (void *)word, 0);

	if (r == KVS_CU_SUCCESS)
		return r;
	r = g->cu.mem_host_register(
	    (void *)page, PAGE, KVS_CU_MEMHOSTREGISTER_PORTABLE | KVS_CU_MEMHOSTREGISTER_DEVICEMAP);
	if (r != KVS_CU_SUCCESS && r != KVS_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
		return r;
	return g->cu.mem_host_get_device_pointer(out, (void *)word, 0);
}

int kvs_gpu_gate_wait(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst,
		      struct kvs_gpu_gate *gate)
{
	if (atomic_load_explicit(&g->forgotten, memory_order_relaxed))
		return -ENODEV;
	if (dst->kind != KVS_MEM_DEVICE || !dst->ctx)
		return -EINVAL;
	if (!g->cu.stream_wait_value32)
		return -ENOTSUP;
	_Atomic uint32_t *page = gates_page(g);
	if (!page)
		return -ENOTSUP;
	int idx = gate_take(g);
	if (idx < 0)
		return -ENOSPC;
	gate->idx = (unsigned)idx;
	gate->word = &page[idx];
	atomic_store_explicit(gate->word, 0, memory_order_relaxed); /* the wait is not queued */

	kvs_cu_result r = g->cu.ctx_push_current(dst->ctx);
	if (r == KVS_CU_SUCCESS) {
		kvs_cu_deviceptr d = 0;
		kvs_cu_context old;

		r = device_address(g, page, gate->word, &d);
		if (r == KVS_CU_SUCCESS)
			r = g->cu.stream_wait_value32(stream, d, 1, KVS_CU_STREAM_WAIT_VALUE_GEQ);
		g->cu.ctx_pop_current(&old); /* pairs with the push */
	}
	if (r != KVS_CU_SUCCESS) {
		kvs_gpu_gate_release(g, gate);
		return r == KVS_CU_ERROR_NOT_SUPPORTED || r == KVS_CU_ERROR_INVALID_VALUE
			   ? -ENOTSUP
			   : kvs_gpu_errno(r);
	}
	return 0;
}

void kvs_gpu_gate_raise(const struct kvs_gpu_gate *gate)
{
	/* pairs with the stream's read of the word, and with the acquire load of a host
	 * function behind the wait that reads what the raiser wrote before */
	atomic_store_explicit(gate->word, 1, memory_order_release);
}

void kvs_gpu_gates_free(struct kvs_gpu *g)
{
	_Atomic uint32_t *p = atomic_load_explicit(&g->gates, memory_order_relaxed);

	if (!p)
		return;
	kvs_cu_context home = g->home_ctx; /* close: no other call in progress */
	if (home && g->cu.ctx_push_current(home) == KVS_CU_SUCCESS) {
		kvs_cu_context old;

		g->cu.mem_host_unregister((void *)p); /* not registered: an error, harmless */
		g->cu.ctx_pop_current(&old);	      /* pairs with the push */
	}
	kvs_sys_munmap((void *)p, PAGE);
	atomic_store_explicit(&g->gates, NULL, memory_order_relaxed);
}
