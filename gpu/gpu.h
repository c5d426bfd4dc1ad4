/*
 * gpu: the CUDA driver, reached through dlopen() (never linked), for the loader's copies into
 * device memory: where a pointer lives, host-to-device copies on streams the module owns or on
 * a caller's stream, and the background registration (pinning) of the cache's data region.
 *
 * One struct kvs_gpu per process.  Every function is safe from any number of threads at once,
 * except kvs_gpu_close and kvs_gpu_forget, which must be the last call.  Nothing here prints:
 * errors are returned as -errno, and the caller logs.
 *
 * Contexts.  Every driver call that needs a context runs with the destination's context
 * pushed on the calling thread and popped after, so the caller's current context is never
 * changed.  Device memory that has no context of its own (cuMemMap'd memory) is served
 * through the device's primary context, retained by the module until kvs_gpu_close.
 *
 * Errors (driver CUresult to errno): INVALID_VALUE -EINVAL, OUT_OF_MEMORY -ENOMEM,
 * NOT_INITIALIZED / DEINITIALIZED / NO_DEVICE / INVALID_DEVICE -ENODEV, NOT_PERMITTED -EPERM,
 * NOT_SUPPORTED -ENOTSUP, anything else -EIO.
 */
#ifndef KVS_GPU_H
#define KVS_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvs_gpu;

struct kvs_gpu_params {
	const char *library; /* cuda.library; NULL = "libcuda.so.1" */
	bool register_host;  /* cuda.register_host: kvs_gpu_register_region does something */
	/* The real dlsym (the shim interposes dlsym); NULL = dlsym. */
	void *(*dlsym)(void *handle, const char *name);
};

enum kvs_mem_kind {
	KVS_MEM_HOST,	/* memory the CPU may write: pageable, pinned or managed */
	KVS_MEM_DEVICE, /* device memory: copy with kvs_gpu_copy */
};

struct kvs_gpu_ptr {
	enum kvs_mem_kind kind;
	void *ctx;     /* DEVICE: the CUcontext to copy in */
	int device;    /* DEVICE: its ordinal */
	uint64_t dptr; /* the pointer classified */
};

/* A copy session to one device destination (kvs_gpu_copy_begin); fields are private. */
struct kvs_gpu_copy {
	struct kvs_gpu *g;
	void *ctx;
	void *stream;
	uint64_t dptr;
	int err;	 /* first error of the session, 0 if none */
	uint32_t queued; /* copies enqueued since begin or the last fence */
};

/*
 * Load the driver library p->library, resolve its entry points and call cuInit(0); p may be NULL
 * (libcuda.so.1, the real dlsym, no host registration).  Returns 0
 * and *out, -ENOENT when the library cannot be loaded, -ENOSYS when it lacks an entry point,
 * -ENODEV when the driver refuses (no device, cuInit fails), -ENOMEM.  The library is never
 * unloaded.
 */
int kvs_gpu_open(const struct kvs_gpu_params *p, struct kvs_gpu **out);

/*
 * Where does [ptr, ptr+len) live?  Fills *out and returns 0 for host memory the CPU may write
 * (pageable, pinned, managed: kind HOST) and for a range inside one device allocation (kind
 * DEVICE, with its context and device); -EINVAL for anything else (a device range crossing
 * the end of its allocation, array memory, a wrapping range); another -errno from the driver.
 */
int kvs_gpu_classify(struct kvs_gpu *g, uint64_t ptr, size_t len, struct kvs_gpu_ptr *out);

/*
 * Start a copy session into dst (kind DEVICE): the copies go, in order, on a non-blocking
 * stream the module owns for dst's context (created at the first use).  Returns 0, -EINVAL for
 * a HOST destination, or the error of the stream's creation.
 */
int kvs_gpu_copy_begin(struct kvs_gpu *g, const struct kvs_gpu_ptr *dst, struct kvs_gpu_copy *cp);

/*
 * Enqueue the copy of [src, src+len) to dst->dptr + dst_off (cuMemcpyHtoDAsync).  src must
 * stay valid and unchanged until kvs_gpu_fence returns.  Returns 0 or -errno; after an error
 * the session refuses further copies with the same error.
 */
int kvs_gpu_copy(struct kvs_gpu_copy *cp, uint64_t dst_off, const void *src, size_t len);

/*
 * Enqueue n copies at once (cuMemcpyBatchAsync where the driver has it, else one
 * cuMemcpyHtoDAsync each): copy i goes from srcs[i] to dst->dptr + offs[i], lens[i] bytes.
 * The copies of one batch must not overlap.  Returns as kvs_gpu_copy.
 */
int kvs_gpu_copy_many(struct kvs_gpu_copy *cp, size_t n, const uint64_t *offs,
		      const void *const *srcs, const size_t *lens);

/*
 * Wait until every copy enqueued in the session has finished: after it returns, no copy reads
 * its source any more, even on error.  Returns the session's first error, else the
 * synchronisation's, else 0.  The session may be used again afterwards.
 */
int kvs_gpu_fence(struct kvs_gpu_copy *cp);

/*
 * Enqueue the copy of [src, src+len) to dst->dptr + dst_off on the caller's stream (for
 * cuFileReadAsync) instead of the module's (cuMemcpyHtoDAsync: the driver reads a pinned
 * source in stream order, a pageable one at the call, and may then wait for the stream's
 * earlier work first).  Nothing waits for it.  Returns 0 or -errno.
 */
int kvs_gpu_copy_on_stream(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst,
			   uint64_t dst_off, const void *src, size_t len);

/* Does the driver have cuMemcpyBatchAsync (12.8 and later)? */
bool kvs_gpu_has_batch(const struct kvs_gpu *g);

/* When a batch of copies reads its sources. */
enum kvs_gpu_order {
	KVS_GPU_READ_AT_CALL,  /* during the call, never waiting for the stream (ready sources) */
	KVS_GPU_READ_IN_ORDER, /* when the stream reaches the copies, pinned or pageable */
};

/*
 * Enqueue n copies (at most 64) on the caller's stream with one cuMemcpyBatchAsync, sources
 * read as order says: copy i goes from srcs[i] to dst->dptr + offs[i], lens[i] bytes.
 * Returns 0, -ENOTSUP where the driver has no cuMemcpyBatchAsync (nothing enqueued), -E2BIG,
 * or another -errno (some of the copies may be enqueued).
 */
int kvs_gpu_copy_many_on_stream(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst,
				size_t n, const uint64_t *offs, const void *const *srcs,
				const size_t *lens, enum kvs_gpu_order order);

/*
 * A gate: a 32-bit word in host memory mapped for the device, that a stream waits on until
 * the host raises it (cuStreamWaitValue32), so that work behind it on the stream waits for
 * something the host does (a load) without a host function: the driver's host-function
 * thread is never held up.  kvs_gpu_gate_wait takes a free gate, lowers it and enqueues the
 * wait on stream (dst gives the context); returns 0, -ENOTSUP where the driver has no stream
 * memory operations (or cannot map the gates), -ENOSPC when every gate is taken, or another
 * -errno (nothing enqueued, the gate given back).  kvs_gpu_gate_raise, from any thread and
 * with no driver call, lets the stream go on; kvs_gpu_gate_release gives the gate back once
 * the stream is past the wait (from a host function behind it: no driver call).
 */
struct kvs_gpu_gate {
	_Atomic uint32_t *word;
	unsigned idx;
};
int kvs_gpu_gate_wait(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst,
		      struct kvs_gpu_gate *gate);
void kvs_gpu_gate_raise(const struct kvs_gpu_gate *gate);
void kvs_gpu_gate_release(struct kvs_gpu *g, const struct kvs_gpu_gate *gate);

/*
 * Is stream capturing into a graph (cuStreamIsCapturing, in dst's context)?  1 yes, 0 no (and
 * where the driver cannot say), or -errno.  Work enqueued while capturing runs only when the
 * graph is launched, maybe many times.
 */
int kvs_gpu_stream_capturing(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst);

/*
 * Copy len bytes of the device memory src->dptr + src_off (kind DEVICE) to host memory dst,
 * and return once they are there: what write-through keeps of a cuFileWrite from device
 * memory.  The copy goes on the module's non-blocking stream for src's context
 * (cuMemcpyDtoHAsync, then a synchronisation of that stream only), so it waits for none of
 * the program's streams, as GPUDirect's own DMA does not.  Returns 0 or -errno.
 */
int kvs_gpu_copy_to_host(struct kvs_gpu *g, const struct kvs_gpu_ptr *src, uint64_t src_off,
			 void *dst, size_t len);

/*
 * Enqueue fn(arg) on stream (cuLaunchHostFunc): the driver runs it on a thread of its own once
 * the work before it on the stream has finished; fn must not call CUDA, and must not block
 * (host functions of all streams may run one at a time on one thread).  dst gives the context
 * (NULL: the calling thread's current one).  Returns 0 or -errno (fn will not run).
 */
int kvs_gpu_host_func(struct kvs_gpu *g, void *stream, const struct kvs_gpu_ptr *dst,
		      void (*fn)(void *), void *arg);

/* Make p's context (kind DEVICE) current on the calling thread, for a call into another
 * library that needs it (libcufile's GPU-buffer calls); 0 or -errno.  kvs_gpu_ctx_pop undoes
 * a push that returned 0. */
int kvs_gpu_ctx_push(struct kvs_gpu *g, const struct kvs_gpu_ptr *p);
void kvs_gpu_ctx_pop(struct kvs_gpu *g);

/* Whether every page of [off, off+len) of a registered region has its memory already, so
 * that pinning it allocates nothing; called from the registration thread. */
typedef bool (*kvs_gpu_ready_fn)(void *ctx, size_t off, size_t len);

/*
 * Register [base, base+len) with the driver (cuMemHostRegister, PORTABLE) chunk by chunk on a
 * background thread, so that copies from it run at pinned speed; copies never wait for it.
 * Each chunk is 64 MiB rounded up to a whole number of units (unit: the least common multiple
 * of the region's frame size and its page size; 0: 64 MiB), so that no frame, and no copy from
 * one, spans two registrations or a registered and an unregistered range (the driver refuses
 * such a copy with INVALID_VALUE), and a huge page is pinned by one registration.
 * Pinning faults in every page, so only chunks that ready() says have their memory are
 * registered (ready NULL: all): registration follows the pages the region has (what
 * cache.populate and cache.shm_headroom allowed) and never allocates one; the thread looks
 * again every KVS_GPU_REG_RESCAN_MS until every chunk is registered or stop.  The first call
 * in a process starts it, later calls and params.register_host false do nothing.  The thread
 * needs a context: the calling thread's current one, else that of the first device pointer
 * classified, so it never creates one (no context on device 0 for every rank).  A chunk
 * someone else registered already is skipped; a chunk the driver refuses is tried again
 * after KVS_GPU_REG_RETRY_MS, doubling up to KVS_GPU_REG_RETRY_MAX (kvs_gpu_register_error
 * says why meanwhile).  When the context it registered in goes away (the program reset or
 * destroyed it; seen at the next copy session), its registrations are gone with it: the
 * thread starts over in the next context gpu/ learns of.
 */
void kvs_gpu_register_region(struct kvs_gpu *g, void *base, size_t len, size_t unit,
			     kvs_gpu_ready_fn ready, void *ready_ctx);

/*
 * Is [p, p+len) pinned for this process's copies: inside one registration (one chunk) of the
 * region given to kvs_gpu_register_region that the registration has finished (or found
 * registered already), in a context still alive as far as gpu/ knows?  The driver reads a
 * pinned source of an asynchronous copy when the stream reaches the copy, and a pageable one
 * when the copy is enqueued; a caller that orders a copy after work that fills its source
 * must wait for that work itself when this is false.  Lock-free, from any thread.
 */
bool kvs_gpu_pinned(const struct kvs_gpu *g, const void *p, size_t len);

/* Bytes of the region registered so far. */
uint64_t kvs_gpu_registered_bytes(const struct kvs_gpu *g);

/* The last error the driver gave the registration (-errno), 0 when none, or once the chunk it
 * refused has been registered after all. */
int kvs_gpu_register_error(const struct kvs_gpu *g);

/*
 * At exit (an atexit handler): stop the registration thread and wait until it is out of the
 * driver, so that it is never inside cuMemHostRegister while the driver tears down.  Nothing
 * is unregistered (the driver does that at exit) and g stays usable: copies from the region
 * still work, and no chunk is registered after this.  Idempotent; a forgotten g is left alone.
 */
void kvs_gpu_quiesce(struct kvs_gpu *g);

/*
 * In a fork child: abandon g without a single driver call (the child's CUDA state is not
 * usable, and the parent's threads do not exist here).  g must not be used afterwards.
 */
void kvs_gpu_forget(struct kvs_gpu *g);

/*
 * Stop the registration thread, unregister what it registered, destroy the module's streams
 * (waiting for their copies), release retained primary contexts and free g.  No other call may
 * be in progress.  The library stays loaded.  NULL is accepted.
 */
void kvs_gpu_close(struct kvs_gpu *g);

#endif
