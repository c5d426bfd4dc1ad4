/*
 * gpu: loading the driver, its entry points, pointer classification, open/close/forget (see
 * gpu.h).  Copies are in copy.c, registration in register.c.
 *
 * DESIGN
 *
 * struct kvs_gpu is written once by kvs_gpu_open (the entry points, the library handle, the
 * driver version) and read without a lock afterwards.  kvs_gpu.lock guards the tables that
 * grow while threads use the module: the per-context streams (copy.c), the retained primary
 * contexts, the registration's home context and the registration thread's flags
 * (register.c), and which gates are free (gate.c).  The lock is never held across a driver call: a
 * table entry is looked up under the lock, created unlocked, then inserted under the lock, and an
 * entry that lost the race is destroyed unlocked.  A stream entry is removed only when its context
 * is gone (the driver destroyed the stream with it: copy.c); the others stay until kvs_gpu_close.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "deadline.h"
#include "internal.h"

typedef kvs_cu_result (*gpa_v2_fn)(const char *, void **, int, unsigned long long, int *);
typedef kvs_cu_result (*gpa_v1_fn)(const char *, void **, int, unsigned long long);

/* Each entry point: the name cuGetProcAddress knows, the exported name of the version gpu/
 * wants (for drivers without cuGetProcAddress), where it goes, and whether gpu/ works without
 * it (the field stays NULL). */
static const struct {
	const char *name, *exported;
	size_t off;
	bool optional;
} entries[] = {
#define E(n, x, f)                                                                                 \
	{                                                                                          \
		n, x, offsetof(struct kvs_cu_fns, f), false                                        \
	}
#define OPT(n, x, f)                                                                               \
	{                                                                                          \
		n, x, offsetof(struct kvs_cu_fns, f), true                                         \
	}
    E("cuInit", "cuInit", init),
    E("cuDriverGetVersion", "cuDriverGetVersion", driver_get_version),
    E("cuPointerGetAttributes", "cuPointerGetAttributes", pointer_get_attributes),
    E("cuCtxGetCurrent", "cuCtxGetCurrent", ctx_get_current),
    E("cuCtxPushCurrent", "cuCtxPushCurrent_v2", ctx_push_current),
    E("cuCtxPopCurrent", "cuCtxPopCurrent_v2", ctx_pop_current),
    E("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", primary_ctx_retain),
    E("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", primary_ctx_release),
    E("cuStreamCreate", "cuStreamCreate", stream_create),
    E("cuStreamDestroy", "cuStreamDestroy_v2", stream_destroy),
    E("cuStreamSynchronize", "cuStreamSynchronize", stream_synchronize),
    E("cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", memcpy_htod_async),
    E("cuMemcpyDtoH", "cuMemcpyDtoH_v2", memcpy_dtoh),
    E("cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", memcpy_dtoh_async),
    E("cuMemHostGetDevicePointer", "cuMemHostGetDevicePointer_v2", mem_host_get_device_pointer),
    E("cuLaunchHostFunc", "cuLaunchHostFunc", launch_host_func),
    E("cuMemHostRegister", "cuMemHostRegister_v2", mem_host_register),
    E("cuMemHostUnregister", "cuMemHostUnregister", mem_host_unregister),
    OPT("cuStreamWaitValue32", "cuStreamWaitValue32_v2", stream_wait_value32),
    OPT("cuCtxGetId", "cuCtxGetId", ctx_get_id),
    OPT("cuStreamIsCapturing", "cuStreamIsCapturing", stream_is_capturing),
#undef OPT
#undef E
};

unsigned long long kvs_gpu_ctx_id(struct kvs_gpu *g, kvs_cu_context c)
{
	unsigned long long id = 0;

	if (!g->cu.ctx_get_id || g->cu.ctx_get_id(c, &id) != KVS_CU_SUCCESS)
		return 0;
	return id;
}

bool kvs_gpu_ctx_alive(struct kvs_gpu *g, kvs_cu_context c, unsigned long long id)
{
	unsigned long long now = 0;

	if (!g->cu.ctx_get_id)
		return true;
	return g->cu.ctx_get_id(c, &now) == KVS_CU_SUCCESS && now == id;
}

int kvs_gpu_errno(kvs_cu_result r)
{
	switch (r) {
	case KVS_CU_SUCCESS:
		return 0;
	case KVS_CU_ERROR_INVALID_VALUE:
		return -EINVAL;
	case KVS_CU_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case KVS_CU_ERROR_NOT_INITIALIZED:
	case KVS_CU_ERROR_DEINITIALIZED:
	case KVS_CU_ERROR_NO_DEVICE:
	case KVS_CU_ERROR_INVALID_DEVICE:
		return -ENODEV;
	case KVS_CU_ERROR_NOT_PERMITTED:
		return -EPERM;
	case KVS_CU_ERROR_NOT_SUPPORTED:
		return -ENOTSUP;
	default:
		return -EIO;
	}
}

/* Fill g->cu: through cuGetProcAddress (the `_v2` of 12.0+ drivers, else the 11.3 one) at
 * version min(driver, 12000), else by the exported names. */
static int resolve(struct kvs_gpu *g, void *(*sym)(void *, const char *))
{
	gpa_v2_fn gpa2 = (gpa_v2_fn)sym(g->lib, "cuGetProcAddress_v2");
	gpa_v1_fn gpa1 = gpa2 ? NULL : (gpa_v1_fn)sym(g->lib, "cuGetProcAddress");
	kvs_cu_result (*version)(int *) =
	    (kvs_cu_result(*)(int *))sym(g->lib, "cuDriverGetVersion");
	int drv = 0;
	if (!version || version(&drv) != KVS_CU_SUCCESS)
		return -ENOSYS;
	g->driver_version = drv;
	int want = drv < KVS_GPU_PROC_VERSION ? drv : KVS_GPU_PROC_VERSION;

	for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
		void *fn = NULL;
		int status = 0;
		if (gpa2 && (gpa2(entries[i].name, &fn, want, KVS_CU_GET_PROC_ADDRESS_DEFAULT,
				  &status) != KVS_CU_SUCCESS))
			fn = NULL;
		else if (gpa1 &&
			 gpa1(entries[i].name, &fn, want, KVS_CU_GET_PROC_ADDRESS_DEFAULT) != 0)
			fn = NULL;
		if (!fn)
			fn = sym(g->lib, entries[i].exported);
		if (!fn && !entries[i].optional)
			return -ENOSYS;
		memcpy((char *)&g->cu + entries[i].off, &fn, sizeof(fn));
	}

	/* cuMemcpyBatchAsync changed its signature in 13.0 (failIdx went away): ask for the one
	 * whose ABI we declare.  Only through cuGetProcAddress: the plain exported name has the
	 * 12.8 ABI and is not worth the ambiguity. */
	void *fn = NULL;
	int status = 0;
	if (gpa2 && drv >= 13000 &&
	    gpa2("cuMemcpyBatchAsync", &fn, 13000, KVS_CU_GET_PROC_ADDRESS_DEFAULT, &status) == 0)
		memcpy(&g->cu.memcpy_batch_v2, &fn, sizeof(fn));
	else if (gpa2 && drv >= 12080 &&
		 gpa2("cuMemcpyBatchAsync", &fn, 12080, KVS_CU_GET_PROC_ADDRESS_DEFAULT, &status) ==
		     0)
		memcpy(&g->cu.memcpy_batch_v1, &fn, sizeof(fn));
	return 0;
}

int kvs_gpu_open(const struct kvs_gpu_params *p, struct kvs_gpu **out)
{
	int r;
	const char *name = p && p->library ? p->library : "libcuda.so.1";
	void *(*sym)(void *, const char *) = p && p->dlsym ? p->dlsym : dlsym;

	struct kvs_gpu *g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->register_host = p && p->register_host;
	/* Never dlclose()d: the engine may share the handle, and unloading the driver under it
	 * would be fatal. */
	g->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!g->lib) {
		r = -ENOENT;
		goto err_free;
	}
	r = resolve(g, sym);
	if (r < 0)
		goto err_free;
	if (g->cu.init(0) != KVS_CU_SUCCESS) {
		r = -ENODEV;
		goto err_free;
	}
	pthread_mutex_init(&g->lock, NULL);
	kvs_cond_init_mono(&g->cond); /* reg_sleep's timed waits (register.c) */
	*out = g;
	return 0;

err_free:
	free(g);
	return r;
}

/* The primary context of device dev, retained once for the module's life. */
static int primary_ctx(struct kvs_gpu *g, int dev, kvs_cu_context *out)
{
	if (dev < 0 || dev >= KVS_GPU_MAX_DEVICES)
		return -EINVAL;
	pthread_mutex_lock(&g->lock);
	kvs_cu_context c = g->primary[dev];
	pthread_mutex_unlock(&g->lock);
	if (c) {
		*out = c;
		return 0;
	}
	int r = kvs_gpu_errno(g->cu.primary_ctx_retain(&c, dev));
	if (r < 0)
		return r;
	pthread_mutex_lock(&g->lock);
	bool lost = g->primary[dev] != NULL;
	if (!lost)
		g->primary[dev] = c;
	pthread_mutex_unlock(&g->lock);
	if (lost) /* pairs with the retain above; the winner's retain stays */
		g->cu.primary_ctx_release(dev);
	*out = c;
	return 0;
}

int kvs_gpu_classify(struct kvs_gpu *g, uint64_t ptr, size_t len, struct kvs_gpu_ptr *out)
{
	if (atomic_load_explicit(&g->forgotten, memory_order_relaxed))
		return -ENODEV;
	if (ptr + len < ptr)
		return -EINVAL;

	unsigned int memtype = 0, managed = 0;
	kvs_cu_context ctx = NULL;
	int ordinal = -1;
	kvs_cu_deviceptr start = 0;
	size_t size = 0;
	kvs_cu_pointer_attribute attrs[] = {
	    KVS_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      KVS_CU_POINTER_ATTRIBUTE_IS_MANAGED,
	    KVS_CU_POINTER_ATTRIBUTE_CONTEXT,	       KVS_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
	    KVS_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, KVS_CU_POINTER_ATTRIBUTE_RANGE_SIZE,
	};
	void *data[] = {&memtype, &managed, &ctx, &ordinal, &start, &size};
	/* Unlike cuPointerGetAttribute, this succeeds for memory the driver does not know
	 * (pageable host memory), with memory type 0. */
	int r = kvs_gpu_errno(g->cu.pointer_get_attributes(6, attrs, data, ptr));
	if (r < 0)
		return r;

	memset(out, 0, sizeof(*out));
	out->dptr = ptr;
	out->device = -1;
	if (memtype == 0 || memtype == KVS_CU_MEMORYTYPE_HOST ||
	    (memtype == KVS_CU_MEMORYTYPE_DEVICE && managed)) {
		out->kind = KVS_MEM_HOST;
		return 0;
	}
	if (memtype != KVS_CU_MEMORYTYPE_DEVICE)
		return -EINVAL;
	/* The whole range inside one allocation: the driver refuses a copy across two. */
	if (ptr < start || ptr - start > size || len > size - (ptr - start))
		return -EINVAL;
	if (!ctx) {
		r = primary_ctx(g, ordinal, &ctx);
		if (r < 0)
			return r;
	}
	out->kind = KVS_MEM_DEVICE;
	out->ctx = ctx;
	out->device = ordinal;
	kvs_gpu_set_home(g, ctx);
	return 0;
}

void kvs_gpu_forget(struct kvs_gpu *g)
{
	if (g)
		atomic_store_explicit(&g->forgotten, true, memory_order_relaxed);
}

void kvs_gpu_close(struct kvs_gpu *g)
{
	if (!g)
		return;
	if (atomic_load_explicit(&g->forgotten, memory_order_relaxed))
		return;
	kvs_gpu_register_stop(g);
	kvs_gpu_gates_free(g);
	kvs_gpu_streams_destroy(g);
	for (int d = 0; d < KVS_GPU_MAX_DEVICES; d++)
		if (g->primary[d]) /* pairs with the retain in primary_ctx */
			g->cu.primary_ctx_release(d);
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	free(g);
}
