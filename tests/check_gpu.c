/*
 * gpu/ against the fake driver (tests/fake_cuda.c, FAKECUDA_LIB): classification, copies that
 * land only after the fence, failures, background registration, the fork child.  The test
 * links the fake too, to make device memory and read it back; kvs_gpu_open's dlopen of the
 * same file finds that copy.  cuda_types.h is checked against the real cuda.h here.
 */
#include <check.h>
#include <cuda.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_types.h"
#include "gpu.h"

void *fakecuda_host_view(CUdeviceptr p, size_t len);
int fakecuda_counter(const char *name, unsigned long long *out);

/* limits: gpu/'s own declarations match the toolkit's. */
#define SAME(a, b) _Static_assert((long)(a) == (long)(b), #a)
SAME(KVS_CU_SUCCESS, CUDA_SUCCESS);
SAME(KVS_CU_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME(KVS_CU_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
SAME(KVS_CU_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
SAME(KVS_CU_ERROR_DEINITIALIZED, CUDA_ERROR_DEINITIALIZED);
SAME(KVS_CU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME(KVS_CU_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE);
SAME(KVS_CU_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT);
SAME(KVS_CU_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE);
SAME(KVS_CU_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND);
SAME(KVS_CU_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
SAME(KVS_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
SAME(KVS_CU_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED);
SAME(KVS_CU_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
SAME(KVS_CU_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN);
SAME(KVS_CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST);
SAME(KVS_CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE);
SAME(KVS_CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_ARRAY);
SAME(KVS_CU_MEMORYTYPE_UNIFIED, CU_MEMORYTYPE_UNIFIED);
SAME(KVS_CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT);
SAME(KVS_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
SAME(KVS_CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_IS_MANAGED);
SAME(KVS_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME(KVS_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
SAME(KVS_CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_SIZE);
_Static_assert(sizeof(kvs_cu_pointer_attribute) == sizeof(CUpointer_attribute), "attr size");
_Static_assert(KVS_CU_MEMHOSTREGISTER_PORTABLE == CU_MEMHOSTREGISTER_PORTABLE, "flag");
_Static_assert(KVS_CU_STREAM_NON_BLOCKING == CU_STREAM_NON_BLOCKING, "flag");
_Static_assert(KVS_CU_GET_PROC_ADDRESS_DEFAULT == CU_GET_PROC_ADDRESS_DEFAULT, "flag");
_Static_assert(KVS_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM == CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, "order");
_Static_assert(sizeof(kvs_cu_deviceptr) == sizeof(CUdeviceptr), "CUdeviceptr");
_Static_assert(sizeof(kvs_cu_device) == sizeof(CUdevice), "CUdevice");
_Static_assert(sizeof(struct kvs_cu_memcpy_attributes) == sizeof(CUmemcpyAttributes), "attrs");
_Static_assert(offsetof(struct kvs_cu_memcpy_attributes, dst_loc_hint) ==
		   offsetof(CUmemcpyAttributes, dstLocHint),
	       "attrs");
_Static_assert(offsetof(struct kvs_cu_memcpy_attributes, flags) ==
		   offsetof(CUmemcpyAttributes, flags),
	       "attrs");

static unsigned long long counter(const char *name)
{
	unsigned long long v = 0;
	ck_assert_int_eq(fakecuda_counter(name, &v), 0);
	return v;
}

static CUcontext ctx0;

/* The caller's side: a driver with device 0's primary context current, and gpu/ open. */
static struct kvs_gpu *setup(bool register_host)
{
	ck_assert_int_eq(cuInit(0), CUDA_SUCCESS);
	ck_assert_int_eq(cuDevicePrimaryCtxRetain(&ctx0, 0), CUDA_SUCCESS);
	ck_assert_int_eq(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
	struct kvs_gpu_params p = {.library = FAKECUDA_LIB, .register_host = register_host};
	struct kvs_gpu *g = NULL;
	ck_assert_int_eq(kvs_gpu_open(&p, &g), 0);
	return g;
}

static CUdeviceptr dev_alloc(size_t len)
{
	CUdeviceptr d;
	ck_assert_int_eq(cuMemAlloc(&d, len), CUDA_SUCCESS);
	return d;
}

START_TEST(open_errors)
{
	struct kvs_gpu_params p = {.library = "/nonexistent/libcuda.so.1"};
	struct kvs_gpu *g = NULL;
	ck_assert_int_eq(kvs_gpu_open(&p, &g), -ENOENT);
	setenv("FAKECUDA_MISSING", "1", 1);
	p.library = FAKECUDA_LIB;
	ck_assert_int_eq(kvs_gpu_open(&p, &g), -ENODEV);
	unsetenv("FAKECUDA_MISSING");
	ck_assert_int_eq(kvs_gpu_open(&p, &g), 0);
	kvs_gpu_close(g);
	/* No parameters: the defaults (libcuda.so.1, which this machine may lack). */
	int r = kvs_gpu_open(NULL, &g);
	ck_assert_msg(r == 0 || r == -ENOENT || r == -ENODEV || r == -ENOSYS, "open(NULL): %d", r);
	if (r == 0)
		kvs_gpu_close(g);
}
END_TEST

START_TEST(classify)
{
	struct kvs_gpu *g = setup(false);
	struct kvs_gpu_ptr ptr;
	char *heap = malloc(4096);
	ck_assert_int_eq(kvs_gpu_classify(g, (uintptr_t)heap, 4096, &ptr), 0);
	ck_assert_int_eq(ptr.kind, KVS_MEM_HOST);
	void *pinned;
	ck_assert_int_eq(cuMemAllocHost(&pinned, 4096), CUDA_SUCCESS);
	ck_assert_int_eq(kvs_gpu_classify(g, (uintptr_t)pinned, 4096, &ptr), 0);
	ck_assert_int_eq(ptr.kind, KVS_MEM_HOST);
	CUdeviceptr m;
	ck_assert_int_eq(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
	ck_assert_int_eq(kvs_gpu_classify(g, m, 4096, &ptr), 0);
	ck_assert_int_eq(ptr.kind, KVS_MEM_HOST);

	CUdeviceptr d = dev_alloc(1 << 20);
	ck_assert_int_eq(kvs_gpu_classify(g, d + 4096, 8192, &ptr), 0);
	ck_assert_int_eq(ptr.kind, KVS_MEM_DEVICE);
	ck_assert_ptr_eq(ptr.ctx, ctx0);
	ck_assert_int_eq(ptr.device, 0);
	ck_assert_uint_eq(ptr.dptr, d + 4096);
	/* Past the end of the allocation, and a wrapping range. */
	ck_assert_int_eq(kvs_gpu_classify(g, d + 4096, 1 << 20, &ptr), -EINVAL);
	ck_assert_int_eq(kvs_gpu_classify(g, UINT64_MAX - 10, 100, &ptr), -EINVAL);
	/* A driver failure is an error, never a guess. */
	setenv("FAKECUDA_FAIL", "cuPointerGetAttributes", 1);
	ck_assert_int_eq(kvs_gpu_classify(g, d, 16, &ptr), -EIO);
	unsetenv("FAKECUDA_FAIL");
	kvs_gpu_close(g);
	free(heap);
}
END_TEST

START_TEST(copies_land_after_fence)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "20000", 1);
	struct kvs_gpu *g = setup(false);
	size_t len = 256 << 10;
	CUdeviceptr d = dev_alloc(len);
	unsigned char *src = malloc(len);
	for (size_t i = 0; i < len; i++)
		src[i] = (unsigned char)(i * 7 + 1);
	struct kvs_gpu_ptr dst;
	ck_assert_int_eq(kvs_gpu_classify(g, d, len, &dst), 0);
	struct kvs_gpu_copy cp;
	ck_assert_int_eq(kvs_gpu_copy_begin(g, &dst, &cp), 0);
	/* The calling thread's context is left as it was. */
	ck_assert_int_eq(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
	ck_assert_int_eq(kvs_gpu_copy(&cp, 0, src, len / 2), 0);
	const uint64_t offs[2] = {len / 2, len / 2 + 1000};
	const void *srcs[2] = {src + len / 2, src + len / 2 + 1000};
	const size_t lens[2] = {1000, len / 2 - 1000};
	ck_assert_int_eq(kvs_gpu_copy_many(&cp, 2, offs, srcs, lens), 0);
	CUcontext cur = (CUcontext)1;
	ck_assert_int_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	ck_assert_ptr_null(cur);
	unsigned char *view = fakecuda_host_view(d, len);
	ck_assert_ptr_nonnull(view);
	ck_assert_int_eq(view[0], 0); /* not yet: the copies are asynchronous */
	ck_assert_int_eq(kvs_gpu_fence(&cp), 0);
	ck_assert_int_eq(memcmp(view, src, len), 0);
	ck_assert_uint_eq(counter("h2d_bytes"), len);
	ck_assert_uint_eq(counter("batch_copies"), 2);
	ck_assert_uint_eq(counter("stream_syncs"), 1);
	/* A host destination is refused. */
	struct kvs_gpu_ptr host = {.kind = KVS_MEM_HOST};
	ck_assert_int_eq(kvs_gpu_copy_begin(g, &host, &cp), -EINVAL);
	kvs_gpu_close(g);
	free(src);
}
END_TEST

START_TEST(failed_copy_still_fenced)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "50000", 1);
	struct kvs_gpu *g = setup(false);
	CUdeviceptr d = dev_alloc(8192);
	char src[4096];
	memset(src, 'x', sizeof(src));
	struct kvs_gpu_ptr dst;
	struct kvs_gpu_copy cp;
	ck_assert_int_eq(kvs_gpu_classify(g, d, 8192, &dst), 0);
	ck_assert_int_eq(kvs_gpu_copy_begin(g, &dst, &cp), 0);
	setenv("FAKECUDA_FAIL", "cuMemcpyHtoDAsync_v2:2", 1);
	ck_assert_int_eq(kvs_gpu_copy(&cp, 0, src, sizeof(src)), 0);
	ck_assert_int_eq(kvs_gpu_copy(&cp, 4096, src, sizeof(src)), -EIO);
	ck_assert_int_eq(kvs_gpu_copy(&cp, 4096, src, sizeof(src)), -EIO); /* sticky */
	unsigned char *view = fakecuda_host_view(d, 8192);
	ck_assert_int_eq(kvs_gpu_fence(&cp), -EIO);
	/* The fence waited for the copy that was queued: it no longer reads src. */
	ck_assert_int_eq(view[4095], 'x');
	ck_assert_int_eq(view[4096], 0);
	unsetenv("FAKECUDA_FAIL");
	kvs_gpu_close(g);
}
END_TEST

static void host_fn(void *arg)
{
	*(int *)arg = 1;
}

START_TEST(caller_stream)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "20000", 1);
	struct kvs_gpu *g = setup(false);
	CUdeviceptr d = dev_alloc(4096);
	CUstream s;
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	struct kvs_gpu_ptr dst;
	ck_assert_int_eq(kvs_gpu_classify(g, d, 4096, &dst), 0);
	char src[16] = "on your stream";
	int ran = 0;
	ck_assert_int_eq(kvs_gpu_copy_on_stream(g, s, &dst, 100, src, sizeof(src)), 0);
	ck_assert_int_eq(kvs_gpu_host_func(g, s, &dst, host_fn, &ran), 0);
	ck_assert_int_eq(ran, 0);
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	ck_assert_int_eq(ran, 1);
	ck_assert_str_eq(fakecuda_host_view(d + 100, 16), "on your stream");
	kvs_gpu_close(g);
}
END_TEST

static bool wait_registered(struct kvs_gpu *g, uint64_t want)
{
	for (int i = 0; i < 500; i++) {
		if (kvs_gpu_registered_bytes(g) == want)
			return true;
		usleep(10000);
	}
	return false;
}

START_TEST(register_background)
{
	struct kvs_gpu *g = setup(true);
	size_t len = (3 * 64 + 5) << 20; /* not a whole number of chunks */
	void *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ck_assert_ptr_ne(region, MAP_FAILED);
	ck_assert(!kvs_gpu_pinned(g, region, 4096)); /* before the registration starts */
	kvs_gpu_register_region(g, region, len, 0, NULL, NULL);
	kvs_gpu_register_region(g, region, len, 0, NULL, NULL); /* once per process */
	ck_assert(wait_registered(g, len));
	ck_assert_int_eq(kvs_gpu_register_error(g), 0);
	for (size_t off = 0; off < len; off += 64 << 20) /* each chunk, a registration of its own */
		ck_assert(kvs_gpu_pinned(g, (char *)region + off,
					 len - off < (64 << 20) ? len - off : 64 << 20));
	/* A copy over two registrations is not documented as pinned: not promised. */
	ck_assert(!kvs_gpu_pinned(g, region, len));
	ck_assert(!kvs_gpu_pinned(g, (char *)region + (64 << 20) - 4096, 8192));
	ck_assert(kvs_gpu_pinned(g, (char *)region + len - 1, 1));
	ck_assert(!kvs_gpu_pinned(g, (char *)region + len - 1, 2)); /* past the region */
	ck_assert(!kvs_gpu_pinned(g, (char *)region - 1, 2));
	ck_assert(!kvs_gpu_pinned(g, region, 0));
	ck_assert_uint_eq(counter("registered_bytes"), len);
	ck_assert_uint_eq(counter("host_register_calls"), 4);
	kvs_gpu_close(g);
	ck_assert_uint_eq(counter("registered_bytes"), 0);
}
END_TEST

/* The chunks follow the region's page size: with pages of 128 MiB (a size no real page has,
 * so that it shows), each registration is one page, and a copy's range across the 64 MiB
 * boundary inside it is in one registration; a range over two of them is not taken for pinned
 * (a copy over two registrations is not documented: gpu.md F1). */
START_TEST(register_follows_page_size)
{
	struct kvs_gpu *g = setup(true);
	size_t page = 128 << 20, len = 3 * page + (5 << 20);
	void *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ck_assert_ptr_ne(region, MAP_FAILED);
	kvs_gpu_register_region(g, region, len, page, NULL, NULL);
	ck_assert(wait_registered(g, len));
	ck_assert_uint_eq(counter("host_register_calls"), 4); /* 7 in 64 MiB chunks */
	ck_assert(kvs_gpu_pinned(g, (char *)region + (60 << 20), 8 << 20));
	ck_assert(kvs_gpu_pinned(g, region, page));
	ck_assert(!kvs_gpu_pinned(g, region, page + 4096));
	kvs_gpu_close(g);
	ck_assert_uint_eq(counter("registered_bytes"), 0);
}
END_TEST

/* Which 64 MiB chunks of register_follows_pages's region "have their pages". */
static _Atomic bool chunk_ready[4];

static bool ready_chunks(void *ctx, size_t off, size_t len)
{
	(void)ctx;
	for (size_t i = off / (64 << 20); i <= (off + len - 1) / (64 << 20); i++)
		if (!atomic_load(&chunk_ready[i]))
			return false;
	return true;
}

/* Pinning faults in every page: only chunks whose pages the region has are registered, and
 * the registration follows as more get theirs. */
START_TEST(register_follows_pages)
{
	struct kvs_gpu *g = setup(true);
	size_t len = 4 * (64 << 20);
	void *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ck_assert_ptr_ne(region, MAP_FAILED);
	atomic_store(&chunk_ready[0], true);
	atomic_store(&chunk_ready[2], true);
	kvs_gpu_register_region(g, region, len, 0, ready_chunks, NULL);
	ck_assert(wait_registered(g, 2 * (64 << 20)));
	usleep(700000); /* a rescan finds nothing new */
	ck_assert_uint_eq(kvs_gpu_registered_bytes(g), 2 * (64 << 20));
	ck_assert_uint_eq(counter("host_register_calls"), 2);
	ck_assert(kvs_gpu_pinned(g, region, 64 << 20));
	ck_assert(!kvs_gpu_pinned(g, (char *)region + (64 << 20), 4096));
	ck_assert(kvs_gpu_pinned(g, (char *)region + 2 * (64 << 20), 4096));
	atomic_store(&chunk_ready[1], true);
	atomic_store(&chunk_ready[3], true);
	ck_assert(wait_registered(g, len)); /* within a rescan or two */
	for (int i = 0; i < 4; i++)
		ck_assert(kvs_gpu_pinned(g, (char *)region + i * (64 << 20), 64 << 20));
	ck_assert_int_eq(kvs_gpu_register_error(g), 0);
	kvs_gpu_close(g);
	ck_assert_uint_eq(counter("registered_bytes"), 0);
}
END_TEST

/* The registration thread waits for a context rather than make one. */
START_TEST(register_waits_for_context)
{
	struct kvs_gpu *g = setup(true);
	size_t len = 64 << 20;
	void *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CUdeviceptr d = dev_alloc(4096);
	ck_assert_int_eq(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
	kvs_gpu_register_region(g, region, len, 0, NULL, NULL);
	usleep(100000);
	ck_assert_uint_eq(kvs_gpu_registered_bytes(g), 0);
	struct kvs_gpu_ptr ptr;
	ck_assert_int_eq(kvs_gpu_classify(g, d, 16, &ptr), 0); /* now it knows one */
	ck_assert(wait_registered(g, len));
	kvs_gpu_close(g);
}
END_TEST

/* A registration the driver keeps refusing: reported, the rest of the region pageable. */
START_TEST(register_failure_reported)
{
	setenv("FAKECUDA_FAIL", "cuMemHostRegister_v2:2=2", 1);
	struct kvs_gpu *g = setup(true);
	size_t len = 4 * (64 << 20);
	void *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	kvs_gpu_register_region(g, region, len, 0, NULL, NULL);
	for (int i = 0; i < 500 && kvs_gpu_register_error(g) == 0; i++)
		usleep(10000);
	ck_assert_int_eq(kvs_gpu_register_error(g), -ENOMEM);
	ck_assert_uint_eq(kvs_gpu_registered_bytes(g), 64 << 20);
	/* Only the first chunk is pinned: a copy from the rest is read when it is enqueued. */
	ck_assert(kvs_gpu_pinned(g, region, 64 << 20));
	ck_assert(!kvs_gpu_pinned(g, (char *)region + (64 << 20) - 4096, 8192));
	ck_assert(!kvs_gpu_pinned(g, (char *)region + (64 << 20), 4096));
	ck_assert_uint_eq(counter("host_register_calls"),
			  1); /* an injected failure is not counted */
	unsetenv("FAKECUDA_FAIL");
	kvs_gpu_close(g);
	ck_assert_uint_eq(counter("registered_bytes"), 0);
}
END_TEST

/* A refusal is transient (memory pressure, a page gone): the chunk is tried again, with a
 * backoff, and the whole region ends up registered; the error is cleared then. */
START_TEST(register_retries)
{
	setenv("FAKECUDA_FAIL", "cuMemHostRegister_v2:2-3=2", 1); /* calls 2 and 3 refused */
	struct kvs_gpu *g = setup(true);
	size_t len = 4 * (64 << 20);
	void *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	kvs_gpu_register_region(g, region, len, 0, NULL, NULL);
	for (int i = 0; i < 500 && kvs_gpu_register_error(g) == 0; i++)
		usleep(10000);
	ck_assert_int_eq(kvs_gpu_register_error(g), -ENOMEM); /* seen while it lasts */
	ck_assert(wait_registered(g, len));		      /* 0.5 s, then 1 s of backoff */
	ck_assert_int_eq(kvs_gpu_register_error(g), 0);
	for (int i = 0; i < 4; i++)
		ck_assert(kvs_gpu_pinned(g, (char *)region + i * (64 << 20), 64 << 20));
	ck_assert_uint_eq(counter("host_register_calls"), 4); /* refusals are not counted */
	unsetenv("FAKECUDA_FAIL");
	kvs_gpu_close(g);
}
END_TEST

/* Frames of 3 MiB, which do not divide 64 MiB: a registration is 66 MiB (22 frames), so the
 * frame at 63 MiB lies inside the first one.  With 64 MiB registrations it would straddle a
 * registered and an unregistered range, and the driver refuses such a copy (INVALID_VALUE). */
START_TEST(register_whole_frames)
{
	struct kvs_gpu *g = setup(true);
	size_t frame = 3 << 20, len = 44 * frame; /* two registrations of 22 frames */
	char *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ck_assert_ptr_ne(region, MAP_FAILED);
	atomic_store(&chunk_ready[0], true); /* ready_chunks counts in 64 MiB: [0, 64 MiB) */
	atomic_store(&chunk_ready[1], true); /* and [64, 128 MiB): covers the first 66 MiB */
	kvs_gpu_register_region(g, region, len, frame, ready_chunks, NULL);
	ck_assert(wait_registered(g, 22 * frame));
	char *slot21 = region + 21 * frame; /* [63 MiB, 66 MiB) */
	ck_assert(kvs_gpu_pinned(g, slot21, frame));
	ck_assert(!kvs_gpu_pinned(g, slot21, 2 * frame)); /* into the second registration */
	memset(slot21, 's', frame);
	CUdeviceptr d = dev_alloc(frame);
	struct kvs_gpu_ptr dst;
	struct kvs_gpu_copy cp;
	ck_assert_int_eq(kvs_gpu_classify(g, d, frame, &dst), 0);
	ck_assert_int_eq(kvs_gpu_copy_begin(g, &dst, &cp), 0);
	ck_assert_int_eq(kvs_gpu_copy(&cp, 0, slot21, frame), 0);
	ck_assert_int_eq(kvs_gpu_fence(&cp), 0);
	unsigned char *view = fakecuda_host_view(d, frame);
	ck_assert_int_eq(view[0], 's');
	ck_assert_int_eq(view[frame - 1], 's');
	ck_assert_uint_eq(counter("mixed_copies"), 0);
	ck_assert_uint_eq(counter("h2d_bytes_registered"), frame);
	kvs_gpu_close(g);
}
END_TEST

/* At exit: the thread stops and is joined, nothing is registered after, and copies from the
 * region still work (other threads may still be serving while exit runs). */
START_TEST(register_quiesce)
{
	struct kvs_gpu *g = setup(true);
	size_t len = 4 * (64 << 20);
	char *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	atomic_store(&chunk_ready[0], true);
	kvs_gpu_register_region(g, region, len, 0, ready_chunks, NULL);
	ck_assert(wait_registered(g, 64 << 20));
	kvs_gpu_quiesce(g);
	kvs_gpu_quiesce(g); /* idempotent */
	atomic_store(&chunk_ready[1], true);
	usleep(1200000); /* two rescans would have registered it */
	ck_assert_uint_eq(kvs_gpu_registered_bytes(g), 64 << 20);
	ck_assert(kvs_gpu_pinned(g, region, 4096));
	CUdeviceptr d = dev_alloc(4096);
	struct kvs_gpu_ptr dst;
	struct kvs_gpu_copy cp;
	memset(region, 'q', 4096);
	ck_assert_int_eq(kvs_gpu_classify(g, d, 4096, &dst), 0);
	ck_assert_int_eq(kvs_gpu_copy_begin(g, &dst, &cp), 0);
	ck_assert_int_eq(kvs_gpu_copy(&cp, 0, region, 4096), 0);
	ck_assert_int_eq(kvs_gpu_fence(&cp), 0);
	ck_assert_int_eq(*(char *)fakecuda_host_view(d, 1), 'q');
	kvs_gpu_close(g);
	ck_assert_uint_eq(counter("registered_bytes"), 0);
}
END_TEST

/* The program resets its primary context (cudaDeviceReset) and carries on in the new one, at
 * the same address: the module's stream and the registrations died with the old one.  The
 * next session makes a new stream, and the registration starts over. */
START_TEST(context_reset)
{
	struct kvs_gpu *g = setup(true);
	size_t len = 64 << 20;
	char *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CUdeviceptr d = dev_alloc(4096);
	struct kvs_gpu_ptr dst;
	struct kvs_gpu_copy cp;
	ck_assert_int_eq(kvs_gpu_classify(g, d, 4096, &dst), 0);
	ck_assert_int_eq(kvs_gpu_copy_begin(g, &dst, &cp), 0);
	kvs_gpu_register_region(g, region, len, 0, NULL, NULL);
	ck_assert(wait_registered(g, len));
	ck_assert(kvs_gpu_pinned(g, region, 4096));

	ck_assert_int_eq(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
	CUcontext again;
	ck_assert_int_eq(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
	ck_assert_ptr_eq(again, ctx0); /* the same handle, another context */
	ck_assert_uint_eq(counter("registered_bytes"), 0);
	d = dev_alloc(4096);
	ck_assert_int_eq(kvs_gpu_classify(g, d, 4096, &dst), 0);
	ck_assert_int_eq(kvs_gpu_copy_begin(g, &dst, &cp), 0);
	/* Pinned only if the driver agrees in the new context: the old registration must not count,
	 * and the registration thread may already have made a new one (it starts over at once). */
	CUdeviceptr mapped;
	ck_assert(!kvs_gpu_pinned(g, region, 4096) ||
		  cuMemHostGetDevicePointer(&mapped, region, 0) == CUDA_SUCCESS);
	memset(region, 'r', 4096);
	ck_assert_int_eq(kvs_gpu_copy(&cp, 0, region, 4096), 0);
	ck_assert_int_eq(kvs_gpu_fence(&cp), 0);
	ck_assert_int_eq(*(char *)fakecuda_host_view(d, 1), 'r');
	/* Registered again, in the new context (the module's own byte count may still show the
	 * old registration's: wait for the chunk itself). */
	bool again_pinned = false;
	for (int i = 0; i < 500 && !again_pinned; i++) {
		again_pinned = kvs_gpu_pinned(g, region, 4096);
		if (!again_pinned)
			usleep(10000);
	}
	ck_assert(again_pinned);
	ck_assert_uint_eq(counter("registered_bytes"), len);
	kvs_gpu_close(g);
}
END_TEST

static void sleep_fn(void *arg)
{
	usleep(*(unsigned *)arg);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A cuFileWrite's device bytes are copied on the module's stream: a program's blocking stream
 * that is busy is not waited for (the legacy default stream would wait for it). */
START_TEST(copy_to_host_own_stream)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "0", 1);
	struct kvs_gpu *g = setup(false);
	CUdeviceptr d = dev_alloc(8192);
	ck_assert_int_eq(cuMemsetD8(d, 'w', 8192), CUDA_SUCCESS);
	CUstream busy;
	ck_assert_int_eq(cuStreamCreate(&busy, CU_STREAM_DEFAULT), CUDA_SUCCESS); /* blocking */
	unsigned us = 400000;
	ck_assert_int_eq(cuLaunchHostFunc(busy, sleep_fn, &us), CUDA_SUCCESS);
	struct kvs_gpu_ptr src;
	ck_assert_int_eq(kvs_gpu_classify(g, d, 8192, &src), 0);
	char buf[4096] = {0};
	double t0 = now_s();
	ck_assert_int_eq(kvs_gpu_copy_to_host(g, &src, 4096, buf, sizeof(buf)), 0);
	double took = now_s() - t0;
	ck_assert_int_eq(buf[0], 'w');
	ck_assert_int_eq(buf[4095], 'w');
	ck_assert_msg(took < 0.2, "copy_to_host waited %.3f s for the program's stream", took);
	ck_assert_uint_eq(counter("legacy_waits"), 0);
	ck_assert_int_eq(cuStreamSynchronize(busy), CUDA_SUCCESS);
	kvs_gpu_close(g);
}
END_TEST

struct raiser {
	struct kvs_gpu_gate gate;
	unsigned us;
};

static void *raise_later(void *arg)
{
	struct raiser *r = arg;
	usleep(r->us);
	kvs_gpu_gate_raise(&r->gate);
	return NULL;
}

struct release_arg {
	struct kvs_gpu *g;
	struct kvs_gpu_gate gate;
	int ran;
};

static void release_fn(void *arg)
{
	struct release_arg *a = arg;
	kvs_gpu_gate_release(a->g, &a->gate);
	a->ran = 1;
}

/* A gate holds the work behind it on the stream until the host raises it; a batch behind it
 * that reads its source in stream order reads it after the raise (a pageable source). */
START_TEST(gate_holds_stream)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "0", 1);
	struct kvs_gpu *g = setup(false);
	CUdeviceptr d = dev_alloc(4096);
	CUstream s;
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	struct kvs_gpu_ptr dst;
	ck_assert_int_eq(kvs_gpu_classify(g, d, 4096, &dst), 0);
	static char src[4096];
	memset(src, 'o', sizeof(src)); /* old bytes: what the slot holds before its load */
	struct raiser r = {.us = 200000};
	ck_assert_int_eq(kvs_gpu_gate_wait(g, s, &dst, &r.gate), 0);
	const uint64_t off[1] = {0};
	const void *srcs[1] = {src};
	const size_t lens[1] = {sizeof(src)};
	ck_assert_int_eq(
	    kvs_gpu_copy_many_on_stream(g, s, &dst, 1, off, srcs, lens, KVS_GPU_READ_IN_ORDER), 0);
	struct release_arg rel = {.g = g, .gate = r.gate};
	ck_assert_int_eq(kvs_gpu_host_func(g, s, &dst, release_fn, &rel), 0);
	pthread_t th;
	pthread_create(&th, NULL, raise_later, &r);
	usleep(50000);
	ck_assert_int_eq(cuStreamQuery(s), CUDA_ERROR_NOT_READY); /* held */
	memset(src, 'n', sizeof(src));				  /* the load lands */
	pthread_join(th, NULL);
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	ck_assert_int_eq(rel.ran, 1);
	ck_assert_int_eq(*(char *)fakecuda_host_view(d, 1), 'n');
	/* Every gate can be taken and given back; taken, none is left. */
	struct kvs_gpu_gate all[1024], extra;
	for (int i = 0; i < 1024; i++) {
		ck_assert_int_eq(kvs_gpu_gate_wait(g, s, &dst, &all[i]), 0);
		kvs_gpu_gate_raise(&all[i]);
	}
	ck_assert_int_eq(kvs_gpu_gate_wait(g, s, &dst, &extra), -ENOSPC);
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	for (int i = 0; i < 1024; i++)
		kvs_gpu_gate_release(g, &all[i]);
	ck_assert_int_eq(kvs_gpu_gate_wait(g, s, &dst, &extra), 0);
	kvs_gpu_gate_raise(&extra);
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	kvs_gpu_close(g);
}
END_TEST

/* A batch on a caller's stream: in order reads a pageable source when the stream reaches it,
 * at the call reads it during the call and never waits for the stream. */
START_TEST(batch_on_stream_order)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "0", 1);
	struct kvs_gpu *g = setup(false);
	ck_assert(kvs_gpu_has_batch(g));
	CUdeviceptr d = dev_alloc(8192);
	CUstream s;
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	struct kvs_gpu_ptr dst;
	ck_assert_int_eq(kvs_gpu_classify(g, d, 8192, &dst), 0);
	static char a[4096], b[4096];
	memset(a, 'a', sizeof(a));
	memset(b, 'b', sizeof(b));
	unsigned us = 200000;
	ck_assert_int_eq(cuLaunchHostFunc(s, sleep_fn, &us), CUDA_SUCCESS);
	const uint64_t off[2] = {0, 4096};
	const void *srcs[2] = {a, b};
	const size_t lens[2] = {4096, 4096};
	double t0 = now_s();
	ck_assert_int_eq(
	    kvs_gpu_copy_many_on_stream(g, s, &dst, 1, off, srcs, lens, KVS_GPU_READ_IN_ORDER), 0);
	ck_assert_int_eq(kvs_gpu_copy_many_on_stream(g, s, &dst, 1, off + 1, srcs + 1, lens + 1,
						     KVS_GPU_READ_AT_CALL),
			 0);
	ck_assert_msg(now_s() - t0 < 0.1, "the batches waited for the stream");
	memset(a, 'A', sizeof(a)); /* before the stream gets there: read in order */
	memset(b, 'B', sizeof(b)); /* read at the call already */
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	ck_assert_int_eq(*(char *)fakecuda_host_view(d, 1), 'A');
	ck_assert_int_eq(*(char *)fakecuda_host_view(d + 4096, 1), 'b');
	ck_assert_int_eq(
	    kvs_gpu_copy_many_on_stream(g, s, &dst, 65, off, srcs, lens, KVS_GPU_READ_AT_CALL),
	    -E2BIG);
	kvs_gpu_close(g);
}
END_TEST

/* A capturing stream is told apart; a device pointer's context made current and back. */
START_TEST(capture_and_push)
{
	struct kvs_gpu *g = setup(false);
	CUdeviceptr d = dev_alloc(4096);
	CUstream s;
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	struct kvs_gpu_ptr dst;
	ck_assert_int_eq(kvs_gpu_classify(g, d, 4096, &dst), 0);
	ck_assert_int_eq(kvs_gpu_stream_capturing(g, s, &dst), 0);
	ck_assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	ck_assert_int_eq(kvs_gpu_stream_capturing(g, s, &dst), 1);
	CUgraph graph;
	ck_assert_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
	ck_assert_int_eq(kvs_gpu_stream_capturing(g, s, &dst), 0);

	ck_assert_int_eq(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
	CUcontext cur = (CUcontext)1;
	ck_assert_int_eq(kvs_gpu_ctx_push(g, &dst), 0);
	ck_assert_int_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	ck_assert_ptr_eq(cur, ctx0);
	kvs_gpu_ctx_pop(g);
	ck_assert_int_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	ck_assert_ptr_null(cur);
	struct kvs_gpu_ptr host = {.kind = KVS_MEM_HOST};
	ck_assert_int_eq(kvs_gpu_ctx_push(g, &host), -EINVAL);
	kvs_gpu_close(g);
}
END_TEST

/* Wait (5 s at most) until every other thread of this process sleeps, twice 1 ms apart.  A
 * thread that has just been created allocates as it starts (ASan's set-up does): a fork then
 * can leave the allocator's lock held for ever in the child (docs/testing.md, "Fork only from
 * a process with one thread").  Asleep in the fake driver's delay, it holds none. */
static void await_others_asleep(void)
{
	for (int i = 0, calm = 0; i < 5000 && calm < 2; i++) {
		DIR *d = opendir("/proc/self/task");
		struct dirent *t;
		int awake = 0;

		while (d && (t = readdir(d)))
			if (t->d_name[0] != '.' && atoi(t->d_name) != (int)gettid()) {
				char path[300], st[256], *p;
				FILE *f;

				snprintf(path, sizeof(path), "/proc/self/task/%s/stat", t->d_name);
				f = fopen(path, "r");
				if (f && fgets(st, sizeof(st), f) && (p = strrchr(st, ')')) &&
				    p[1] == ' ' && p[2] != 'S')
					awake = 1;
				if (f)
					fclose(f);
			}
		if (d)
			closedir(d);
		calm = awake ? 0 : calm + 1;
		usleep(1000);
	}
}

/* The fork child forgets without a single driver call, even mid-registration. */
START_TEST(forget_after_fork)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "20000", 1);
	struct kvs_gpu *g = setup(true);
	size_t len = 64 << 20;
	void *region = mmap(NULL, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	kvs_gpu_register_region(g, region, len, 0, NULL, NULL);
	CUdeviceptr d = dev_alloc(4096);
	struct kvs_gpu_ptr dst;
	struct kvs_gpu_copy cp;
	ck_assert_int_eq(kvs_gpu_classify(g, d, 4096, &dst), 0);
	ck_assert_int_eq(kvs_gpu_copy_begin(g, &dst, &cp), 0);
	await_others_asleep(); /* the registration sleeps in the driver's call: mid-registration */
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		kvs_gpu_forget(g);
		struct kvs_gpu_ptr p2;
		int bad = kvs_gpu_classify(g, d, 16, &p2) != -ENODEV;
		kvs_gpu_close(g);
		unsigned long long n = 99;
		fakecuda_counter("forked_calls", &n);
		_exit(bad ? 2 : (n == 0 ? 0 : 1));
	}
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st));
	ck_assert_int_eq(WEXITSTATUS(st), 0);
	/* The parent goes on. */
	char src[8] = "parent";
	ck_assert_int_eq(kvs_gpu_copy(&cp, 0, src, sizeof(src)), 0);
	ck_assert_int_eq(kvs_gpu_fence(&cp), 0);
	ck_assert_str_eq(fakecuda_host_view(d, 8), "parent");
	kvs_gpu_close(g);
}
END_TEST

/* concurrency: threads share the context's stream; each fence covers its own copies. */
struct worker {
	struct kvs_gpu *g;
	struct kvs_gpu_ptr dst;
	unsigned char fill;
	int rc;
};

static void *copy_worker(void *arg)
{
	struct worker *w = arg;
	unsigned char buf[4096];
	memset(buf, w->fill, sizeof(buf));
	struct kvs_gpu_copy cp;
	w->rc = kvs_gpu_copy_begin(w->g, &w->dst, &cp);
	for (int i = 0; i < 4 && w->rc == 0; i++)
		w->rc = kvs_gpu_copy(&cp, (uint64_t)i * sizeof(buf), buf, sizeof(buf));
	int f = kvs_gpu_fence(&cp);
	if (w->rc == 0)
		w->rc = f;
	/* buf goes out of scope here: the fence must have finished every read of it. */
	return NULL;
}

/* One stream per context: copies into two devices' memory each go through a stream of their
 * own context, and a second session on a context finds its stream again. */
START_TEST(streams_per_context)
{
	setenv("FAKECUDA_DEVICES", "2", 1);
	struct kvs_gpu *g = setup(false);
	CUdeviceptr d[2];
	CUcontext ctx1, got;
	struct kvs_gpu_ptr dst[2];
	struct kvs_gpu_copy cp[2], again;
	unsigned char src[4096];

	memset(src, 'k', sizeof(src));
	d[0] = dev_alloc(sizeof(src));
	ck_assert_int_eq(cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
	ck_assert_int_eq(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
	d[1] = dev_alloc(sizeof(src));
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(kvs_gpu_classify(g, d[i], sizeof(src), &dst[i]), 0);
		ck_assert_int_eq(kvs_gpu_copy_begin(g, &dst[i], &cp[i]), 0);
		ck_assert_int_eq(cuStreamGetCtx(cp[i].stream, &got), CUDA_SUCCESS);
		ck_assert_ptr_eq(got, dst[i].ctx);
	}
	ck_assert_ptr_ne(dst[0].ctx, dst[1].ctx);
	ck_assert_ptr_ne(cp[0].stream, cp[1].stream);
	ck_assert_int_eq(kvs_gpu_copy_begin(g, &dst[0], &again), 0);
	ck_assert_ptr_eq(again.stream, cp[0].stream);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(kvs_gpu_copy(&cp[i], 0, src, sizeof(src)), 0);
		ck_assert_int_eq(kvs_gpu_fence(&cp[i]), 0);
		ck_assert_int_eq(memcmp(fakecuda_host_view(d[i], sizeof(src)), src, sizeof(src)),
				 0);
	}
	ck_assert_int_eq(kvs_gpu_fence(&again), 0);
	kvs_gpu_close(g);
}
END_TEST

START_TEST(threads_share_stream)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "1000", 1);
	struct kvs_gpu *g = setup(false);
	enum { N = 4 };
	CUdeviceptr d = dev_alloc(N * 4 * 4096);
	pthread_t th[N];
	struct worker w[N];
	for (int i = 0; i < N; i++) {
		w[i] = (struct worker){.g = g, .fill = (unsigned char)('A' + i)};
		ck_assert_int_eq(
		    kvs_gpu_classify(g, d + (uint64_t)i * 4 * 4096, 4 * 4096, &w[i].dst), 0);
		pthread_create(&th[i], NULL, copy_worker, &w[i]);
	}
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(w[i].rc, 0);
	}
	unsigned char *view = fakecuda_host_view(d, N * 4 * 4096);
	for (int i = 0; i < N; i++)
		for (int k = 0; k < 4 * 4096; k += 4095)
			ck_assert_int_eq(view[i * 4 * 4096 + k], 'A' + i);
	kvs_gpu_close(g);
}
END_TEST

static Suite *gpu_suite(void)
{
	Suite *s = suite_create("gpu");
	TCase *core = tcase_create("core");
	tcase_add_test(core, open_errors);
	tcase_add_test(core, classify);
	tcase_add_test(core, copies_land_after_fence);
	tcase_add_test(core, failed_copy_still_fenced);
	tcase_add_test(core, caller_stream);
	tcase_add_test(core, register_background);
	tcase_add_test(core, register_follows_pages);
	tcase_add_test(core, register_follows_page_size);
	tcase_add_test(core, register_waits_for_context);
	tcase_add_test(core, register_failure_reported);
	tcase_add_test(core, register_retries);
	tcase_add_test(core, register_whole_frames);
	tcase_add_test(core, register_quiesce);
	tcase_add_test(core, context_reset);
	tcase_add_test(core, copy_to_host_own_stream);
	tcase_add_test(core, gate_holds_stream);
	tcase_add_test(core, batch_on_stream_order);
	tcase_add_test(core, capture_and_push);
	tcase_add_test(core, streams_per_context);
	suite_add_tcase(s, core);
	TCase *conc = tcase_create("concurrency");
	tcase_add_test(conc, threads_share_stream);
	suite_add_tcase(s, conc);
	TCase *crash = tcase_create("crash");
	tcase_add_test(crash, forget_after_fork);
	suite_add_tcase(s, crash);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(gpu_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
