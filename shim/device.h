/*
 * device: the shim's destinations in device memory.  It opens the CUDA driver (gpu/) at the
 * first cuFile read that needs it, tells device memory from host memory, and turns a device
 * pointer into a loader destination whose copies are host-to-device copies from the region,
 * fenced once per piece.  It starts the region's registration with the driver at the first
 * device copy.
 */
#ifndef KVS_SHIM_DEVICE_H
#define KVS_SHIM_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "gpu.h"
#include "loader.h"

struct kvs_config;

/* One read's destination.  Lives as long as the read (the loader calls dest's functions). */
struct kvs_device_target {
	bool host; /* the CPU's memory: the loader copies with memcpy into iov */
	struct iovec iov;
	struct kvs_gpu_ptr dst;
	struct kvs_gpu_copy cp;
	struct kvs_dest dest;
	struct kvs_cache *c;
	uint64_t bytes; /* copied since the last fence */
};

/*
 * Where do the len bytes at ptr live?  Opens the driver on first use (cfg's cuda.library).
 * Fills t and returns 0 for host memory (t->host) and for one device allocation; -errno for
 * anything else (no driver, memory the driver does not know as either): the caller passes
 * the read through.
 */
int kvs_device_target(const struct kvs_config *cfg, uint64_t ptr, size_t len,
		      struct kvs_device_target *t);

/* Make t's destination ready for copies counted in cache c: for device memory a copy session
 * and t->dest; the region's registration starts with the first one.  Returns 0 or -errno. */
int kvs_device_begin(struct kvs_device_target *t, struct kvs_cache *c,
		     const struct kvs_config *cfg);

/* On the program's stream (cuFileReadAsync), in its order: copy len bytes from src to t's
 * device memory at pos (cuMemcpyHtoDAsync); run fn(arg) on a driver thread (no CUDA calls in
 * fn, and no blocking: host functions of all streams may share one thread).  0 or -errno. */
int kvs_device_stream_copy(struct kvs_device_target *t, void *stream, uint64_t pos, const void *src,
			   size_t len);
int kvs_device_stream_func(struct kvs_device_target *t, void *stream, void (*fn)(void *),
			   void *arg);

/* n copies in one cuMemcpyBatchAsync on the program's stream, sources read when the stream
 * reaches them (in_order) or during the call: kvs_gpu_copy_many_on_stream.  -ENOTSUP without
 * cuMemcpyBatchAsync (then kvs_device_has_batch is false and nothing is enqueued). */
int kvs_device_stream_copies(struct kvs_device_target *t, void *stream, size_t n,
			     const uint64_t *pos, const void *const *srcs, const size_t *lens,
			     bool in_order);
bool kvs_device_has_batch(const struct kvs_device_target *t);

/* A gate on the program's stream (kvs_gpu_gate_wait), in t's context; given back with
 * kvs_device_gate_release from a host function behind it. */
int kvs_device_gate_wait(struct kvs_device_target *t, void *stream, struct kvs_gpu_gate *gate);
void kvs_device_gate_release(const struct kvs_device_target *t, const struct kvs_gpu_gate *gate);

/* Is the program's stream capturing into a graph?  1, 0, or -errno (kvs_gpu_stream_capturing). */
int kvs_device_stream_capturing(struct kvs_device_target *t, void *stream);

/* For a call into libcufile on a thread of the shim's: t's context current (device memory;
 * nothing for host memory), 0 or -errno; kvs_device_pop undoes a push that returned 0. */
int kvs_device_push(const struct kvs_device_target *t);
void kvs_device_pop(const struct kvs_device_target *t);

/* Will the driver read [src, src+len) (in the region) when the stream reaches a copy from it,
 * rather than when the copy is enqueued?  True only for bytes the region's registration has
 * pinned already (kvs_gpu_pinned). */
bool kvs_device_pinned(const struct kvs_device_target *t, const void *src, size_t len);

/* Copy len bytes of t's device memory at pos into host memory dst, and return once they are
 * there (a cuFileWrite's bytes, for write-through), on a stream of the shim's own: the
 * program's streams are not waited for.  0 or -errno. */
int kvs_device_copy_to_host(const struct kvs_device_target *t, uint64_t pos, void *dst, size_t len);

/* The fork child: forget the driver state without a call into it. */
void kvs_device_atfork_child(void);

#endif
