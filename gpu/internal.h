/*
 * gpu/ internals shared by its files: the driver's entry points and struct kvs_gpu.
 */
#ifndef KVS_GPU_INTERNAL_H
#define KVS_GPU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cuda_types.h"
#include "gpu.h"

#define KVS_GPU_MAX_CTX	      64
#define KVS_GPU_MAX_DEVICES   64
#define KVS_GPU_REG_CHUNK     (64ull << 20) /* at least this much per registration */
#define KVS_GPU_REG_RESCAN_MS 500	    /* a look for chunks that have their pages now */
#define KVS_GPU_REG_RETRY_MS  500	    /* the first retry of a failed registration */
#define KVS_GPU_REG_RETRY_MAX 30000	    /* the longest wait between two retries */
#define KVS_GPU_GATES	      1024	    /* gates in the module's page (gate.c) */
#define KVS_GPU_PROC_VERSION  12000	    /* the ABI the typedefs below describe */

/* Entry points, each with the signature of the version gpu/ asks for. */
struct kvs_cu_fns {
	kvs_cu_result (*init)(unsigned int);
	kvs_cu_result (*driver_get_version)(int *);
	kvs_cu_result (*pointer_get_attributes)(unsigned int, kvs_cu_pointer_attribute *, void **,
						kvs_cu_deviceptr);
	kvs_cu_result (*ctx_get_current)(kvs_cu_context *);
	kvs_cu_result (*ctx_push_current)(kvs_cu_context);
	kvs_cu_result (*ctx_pop_current)(kvs_cu_context *);
	kvs_cu_result (*primary_ctx_retain)(kvs_cu_context *, kvs_cu_device);
	kvs_cu_result (*primary_ctx_release)(kvs_cu_device);
	kvs_cu_result (*stream_create)(kvs_cu_stream *, unsigned int);
	kvs_cu_result (*stream_destroy)(kvs_cu_stream);
	kvs_cu_result (*stream_synchronize)(kvs_cu_stream);
	kvs_cu_result (*memcpy_htod_async)(kvs_cu_deviceptr, const void *, size_t, kvs_cu_stream);
	kvs_cu_result (*memcpy_dtoh)(void *, kvs_cu_deviceptr, size_t);
	kvs_cu_result (*memcpy_dtoh_async)(void *, kvs_cu_deviceptr, size_t, kvs_cu_stream);
	kvs_cu_result (*mem_host_get_device_pointer)(kvs_cu_deviceptr *, void *, unsigned int);
	kvs_cu_result (*launch_host_func)(kvs_cu_stream, kvs_cu_hostfn, void *);
	kvs_cu_result (*mem_host_register)(void *, size_t, unsigned int);
	kvs_cu_result (*mem_host_unregister)(void *);
	/* Optional (NULL where the driver lacks them): stream memory operations (gate.c), context
	 * ids (12.0: a context's identity, which its address is not), capture status (10.0). */
	kvs_cu_result (*stream_wait_value32)(kvs_cu_stream, kvs_cu_deviceptr, unsigned int,
					     unsigned int);
	kvs_cu_result (*ctx_get_id)(kvs_cu_context, unsigned long long *);
	kvs_cu_result (*stream_is_capturing)(kvs_cu_stream, int *);
	/* Optional: cuMemcpyBatchAsync as of CUDA 13.0 (batch_v2) or 12.8 (with failIdx). */
	kvs_cu_result (*memcpy_batch_v2)(kvs_cu_deviceptr *, kvs_cu_deviceptr *, size_t *, size_t,
					 struct kvs_cu_memcpy_attributes *, size_t *, size_t,
					 kvs_cu_stream);
	kvs_cu_result (*memcpy_batch_v1)(kvs_cu_deviceptr *, kvs_cu_deviceptr *, size_t *, size_t,
					 struct kvs_cu_memcpy_attributes *, size_t *, size_t,
					 size_t *, kvs_cu_stream);
};

struct kvs_gpu_ctx {
	kvs_cu_context ctx;
	unsigned long long id; /* cuCtxGetId when the stream was made (0: no ids) */
	kvs_cu_stream stream;
};

struct kvs_gpu_reg {
	pthread_t th;
	bool started; /* under kvs_gpu.lock */
	bool running; /* the thread exists and is not joined yet; under kvs_gpu.lock */
	bool stop;    /* under kvs_gpu.lock */
	bool lost;    /* the home context went away: start over; under kvs_gpu.lock */
	char *base;   /* set before the thread starts */
	size_t len;
	size_t chunk; /* bytes per registration: whole frames, and whole pages */
	size_t nchunks;
	kvs_gpu_ready_fn ready; /* which chunks have their pages (NULL: all); set before too */
	void *ready_ctx;
	/* chunk i: 0 not pinned yet, REG_OURS registered by the thread, REG_THEIRS registered
	 * already by someone else; stored (release) by the thread after the driver returned,
	 * loaded (acquire) by kvs_gpu_pinned from any thread. */
	_Atomic uint8_t *done;
	_Atomic bool armed;	/* base, len, nchunks, done are set (release; kvs_gpu_pinned) */
	_Atomic bool live;	/* false from a loss until the thread has cleared done[] */
	_Atomic uint64_t bytes; /* written by the thread, read by anyone */
	_Atomic int err;
};

struct kvs_gpu {
	struct kvs_cu_fns cu;
	void *lib;
	int driver_version;
	bool register_host;
	_Atomic bool forgotten;
	pthread_mutex_t lock; /* guards ctxs, nctx, primary, home_ctx, home_id, reg's flags,
			       * gate_free */
	pthread_cond_t cond;  /* home_ctx set, or reg.stop, or reg.lost */
	struct kvs_gpu_ctx ctxs[KVS_GPU_MAX_CTX];
	int nctx;
	kvs_cu_context primary[KVS_GPU_MAX_DEVICES];
	kvs_cu_context home_ctx;    /* the context the registration thread uses */
	unsigned long long home_id; /* its cuCtxGetId (0: no ids) */
	struct kvs_gpu_reg reg;
	_Atomic(_Atomic uint32_t *) gates;	/* gate.c: a page of words streams wait on */
	uint64_t gate_free[KVS_GPU_GATES / 64]; /* bit set: that gate is free (under lock) */
};

/* A CUresult as -errno (see gpu.h). */
int kvs_gpu_errno(kvs_cu_result r);

/* Record c as the registration's context if there is none yet. */
void kvs_gpu_set_home(struct kvs_gpu *g, kvs_cu_context c);

/* Is c still the context that had id (cuCtxGetId)?  True where the driver has no ids. */
bool kvs_gpu_ctx_alive(struct kvs_gpu *g, kvs_cu_context c, unsigned long long id);

/* c's id, 0 where the driver has no ids or refuses. */
unsigned long long kvs_gpu_ctx_id(struct kvs_gpu *g, kvs_cu_context c);

/* Context c (with id) is gone: if it is the registration's home, what was registered in it is
 * gone with it; the registration thread starts over in the next context gpu/ learns of. */
void kvs_gpu_home_gone(struct kvs_gpu *g, kvs_cu_context c, unsigned long long id);

/* Stop and join the registration thread, unregister its chunks (close). */
void kvs_gpu_register_stop(struct kvs_gpu *g);

/* Destroy the module's streams (close). */
void kvs_gpu_streams_destroy(struct kvs_gpu *g);

/* Unregister and unmap the gates' page (close). */
void kvs_gpu_gates_free(struct kvs_gpu *g);

/* Is r a driver's answer meaning the context (or a handle in it) is gone? */
static inline bool kvs_gpu_ctx_error(kvs_cu_result r)
{
	return r == KVS_CU_ERROR_INVALID_CONTEXT || r == KVS_CU_ERROR_CONTEXT_IS_DESTROYED;
}

#endif
