/*
 * The fake libcuda.so.1 (tests/fake_cuda.c) is itself a test tool: these cases prove that it
 * catches what it is meant to catch.  Each case runs in its own Check fork, so each starts
 * with a fake that has not seen cuInit and reads the environment the case sets.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

void *fakecuda_host_view(CUdeviceptr p, size_t len);
int fakecuda_counter(const char *name, unsigned long long *out);
/* Not declared by cuda.h outside the driver's own build. */
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
				unsigned int flags, CUdevice dev);

static unsigned long long counter(const char *name)
{
	unsigned long long v = 0;
	ck_assert_int_eq(fakecuda_counter(name, &v), 0);
	return v;
}

static CUcontext setup(void)
{
	CUcontext ctx;
	ck_assert_int_eq(cuInit(0), CUDA_SUCCESS);
	ck_assert_int_eq(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	ck_assert_int_eq(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
	return ctx;
}

/* core: device memory is not host memory: a memcpy into it kills the process. */
START_TEST(device_not_host_accessible)
{
	setup();
	CUdeviceptr d;
	ck_assert_int_eq(cuMemAlloc(&d, 1 << 20), CUDA_SUCCESS);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		memset((void *)(uintptr_t)d, 1, 4096);
		_exit(0);
	}
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFSIGNALED(st));
	ck_assert_int_eq(WTERMSIG(st), SIGSEGV);
	/* ...while the driver's copies and the shadow work. */
	char buf[4096];
	memset(buf, 7, sizeof(buf));
	ck_assert_int_eq(cuMemcpyHtoD(d + 4096, buf, sizeof(buf)), CUDA_SUCCESS);
	unsigned char *v = fakecuda_host_view(d + 4096, sizeof(buf));
	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(v[0], 7);
	ck_assert_int_eq(v[4095], 7);
	ck_assert_ptr_null(fakecuda_host_view(d + (1 << 20) - 8, 16)); /* past the allocation */
	ck_assert_ptr_null(fakecuda_host_view((CUdeviceptr)(uintptr_t)buf, 16));
	/* A copy past the allocation's end is refused. */
	ck_assert_int_eq(cuMemcpyHtoD(d + (1 << 20) - 8, buf, 16), CUDA_ERROR_INVALID_VALUE);
}
END_TEST

/* core: an asynchronous copy reads its source only later; synchronize waits for it. */
START_TEST(async_copies_delayed)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "50000", 1);
	setup();
	CUdeviceptr d;
	CUstream s;
	ck_assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	/* A pinned source is read when the stream reaches the copy. */
	char *src = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(src, MAP_FAILED);
	ck_assert_int_eq(cuMemHostRegister(src, 4096, 0), CUDA_SUCCESS);
	memset(src, 'a', 64);
	ck_assert_int_eq(cuMemcpyHtoDAsync(d, src, 64, s), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
	unsigned char *v = fakecuda_host_view(d, 128);
	ck_assert_int_eq(v[0], 0);
	memset(src, 'b', 64); /* the caller's bug: reusing the source too early */
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamQuery(s), CUDA_SUCCESS);
	ck_assert_int_eq(v[0], 'b'); /* the copy saw the late bytes: the bug is visible */
	ck_assert_uint_eq(counter("stream_syncs"), 1);
	/* A pageable source is staged at the call, as the driver documents: what the caller
	 * writes afterwards (a host function queued before the copy, say) never reaches it. */
	char page[64];
	memset(page, 'c', sizeof(page));
	ck_assert_int_eq(cuMemcpyHtoDAsync(d + 64, page, sizeof(page), s), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemcpyAsync(d + 100, (CUdeviceptr)(uintptr_t)page, 8, s), CUDA_SUCCESS);
	memset(page, 'd', sizeof(page));
	ck_assert_int_eq(v[64], 0); /* still asynchronous */
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	ck_assert_int_eq(v[64], 'c');
	ck_assert_int_eq(v[107], 'c');
	ck_assert_int_eq(cuMemHostUnregister(src), CUDA_SUCCESS);
	munmap(src, 4096);
	ck_assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
END_TEST

/* core: counters tell pinned from pageable sources. */
START_TEST(counters)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "0", 1);
	setup();
	CUdeviceptr d;
	ck_assert_int_eq(cuMemAlloc(&d, 1 << 20), CUDA_SUCCESS);
	size_t len = 1 << 20;
	void *pageable = malloc(len), *pinned, *reg;
	ck_assert_int_eq(cuMemHostAlloc(&pinned, len, 0), CUDA_SUCCESS);
	reg = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert_int_eq(cuMemHostRegister(reg, len, CU_MEMHOSTREGISTER_PORTABLE), CUDA_SUCCESS);
	ck_assert_uint_eq(counter("registered_bytes"), len);
	ck_assert_int_eq(cuMemHostRegister(reg, 4096, 0),
			 CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	ck_assert_uint_eq(counter("host_register_calls"), 2);
	ck_assert_int_eq(cuMemcpyHtoD(d, pageable, 1000), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemcpyHtoD(d, pinned, 2000), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemcpyHtoD(d, reg, 3000), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemcpyDtoH(pageable, d, 500), CUDA_SUCCESS);
	ck_assert_uint_eq(counter("h2d_copies"), 3);
	ck_assert_uint_eq(counter("h2d_bytes"), 6000);
	ck_assert_uint_eq(counter("h2d_bytes_pageable"), 1000);
	ck_assert_uint_eq(counter("h2d_bytes_registered"), 5000);
	ck_assert_uint_eq(counter("d2h_bytes"), 500);
	ck_assert_int_eq(cuMemHostUnregister(reg), CUDA_SUCCESS);
	ck_assert_uint_eq(counter("registered_bytes"), 0);
	unsigned long long x;
	ck_assert_int_eq(fakecuda_counter("nonesuch", &x), -ENOENT);

	/* The batch call, both versions. */
	CUstream s;
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	memset(pinned, 'q', 64);
	CUdeviceptr dsts[2] = {d, d + 100},
		    srcs[2] = {(CUdeviceptr)(uintptr_t)pinned, (CUdeviceptr)(uintptr_t)pinned};
	size_t sizes[2] = {10, 10}, idx = 0;
	CUmemcpyAttributes a = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
	ck_assert_int_eq(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &a, &idx, 1, s), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &a, &idx, 1, NULL),
			 CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	ck_assert_uint_eq(counter("batch_copies"), 2);
	ck_assert_int_eq(((char *)fakecuda_host_view(d + 100, 1))[0], 'q');
}
END_TEST

/* core: FAKECUDA_FAIL makes chosen calls fail, from the chosen call on. */
START_TEST(fail_syntax)
{
	setup();
	CUdeviceptr d, e;
	char b[16] = {0};
	setenv("FAKECUDA_FAIL", "cuMemAlloc_v2:2=2,cuMemcpyHtoD", 1);
	ck_assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemAlloc(&e, 4096), CUDA_ERROR_OUT_OF_MEMORY);
	ck_assert_int_eq(cuMemAlloc(&e, 4096), CUDA_ERROR_OUT_OF_MEMORY);
	ck_assert_int_eq(cuMemcpyHtoD(d, b, sizeof(b)), CUDA_ERROR_UNKNOWN); /* plain name */
	setenv("FAKECUDA_FAIL", "", 1); /* a new value starts again */
	ck_assert_int_eq(cuMemAlloc(&e, 4096), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemcpyHtoD(d, b, sizeof(b)), CUDA_SUCCESS);
	setenv("FAKECUDA_FAIL", "cuMemcpyHtoD:2-3=1", 1); /* calls 2 and 3 only */
	ck_assert_int_eq(cuMemcpyHtoD(d, b, sizeof(b)), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemcpyHtoD(d, b, sizeof(b)), CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(cuMemcpyHtoD(d, b, sizeof(b)), CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(cuMemcpyHtoD(d, b, sizeof(b)), CUDA_SUCCESS);
	unsetenv("FAKECUDA_FAIL");
	setenv("FAKECUDA_MISSING", "1", 1);
	ck_assert_int_eq(cuInit(0), CUDA_ERROR_NO_DEVICE);
}
END_TEST

/* core: pointer attributes follow the real driver's rules. */
START_TEST(pointer_attributes)
{
	CUcontext ctx = setup();
	char host[64];
	unsigned int type = 99;
	ck_assert_int_eq(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
					       (CUdeviceptr)(uintptr_t)host),
			 CUDA_ERROR_INVALID_VALUE);
	CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
				     CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_CONTEXT};
	unsigned int managed = 99;
	CUcontext c = (CUcontext)1;
	void *data[3] = {&type, &managed, &c};
	ck_assert_int_eq(cuPointerGetAttributes(3, at, data, (CUdeviceptr)(uintptr_t)host),
			 CUDA_SUCCESS);
	ck_assert_uint_eq(type, 0);
	ck_assert_uint_eq(managed, 0);
	ck_assert_ptr_null(c);

	CUdeviceptr m, d;
	ck_assert_int_eq(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
	memset((void *)(uintptr_t)m, 1, 4096); /* managed memory is host-writable */
	ck_assert_int_eq(cuPointerGetAttributes(3, at, data, m), CUDA_SUCCESS);
	ck_assert_uint_eq(type, CU_MEMORYTYPE_DEVICE);
	ck_assert_uint_eq(managed, 1);
	ck_assert_int_eq(cuMemAlloc(&d, 8192), CUDA_SUCCESS);
	ck_assert_int_eq(cuPointerGetAttributes(3, at, data, d + 100), CUDA_SUCCESS);
	ck_assert_uint_eq(type, CU_MEMORYTYPE_DEVICE);
	ck_assert_uint_eq(managed, 0);
	ck_assert_ptr_eq(c, ctx);
	CUdeviceptr start = 0;
	size_t size = 0;
	ck_assert_int_eq(
	    cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 100),
	    CUDA_SUCCESS);
	ck_assert_int_eq(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 100),
			 CUDA_SUCCESS);
	ck_assert_uint_eq(start, d);
	ck_assert_uint_ge(size, 8192);
	/* cuMemGetAddressRange (kvikio splits reads with it) agrees; host memory: not found. */
	CUdeviceptr base = 0;
	size_t range = 0;
	ck_assert_int_eq(cuMemGetAddressRange(&base, &range, d + 100), CUDA_SUCCESS);
	ck_assert_uint_eq(base, d);
	ck_assert_uint_eq(range, size);
	ck_assert_int_eq(cuMemGetAddressRange(&base, NULL, d + 8191), CUDA_SUCCESS);
	ck_assert_uint_eq(base, d);
	ck_assert_int_eq(cuMemGetAddressRange(&base, &range, (CUdeviceptr)(uintptr_t)host),
			 CUDA_ERROR_NOT_FOUND);
	ck_assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemGetAddressRange(&base, &range, d), CUDA_ERROR_NOT_FOUND);
	ck_assert_int_eq(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d),
			 CUDA_ERROR_INVALID_VALUE);
	/* Without a current context, allocations are refused. */
	ck_assert_int_eq(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemAlloc(&d, 4096), CUDA_ERROR_INVALID_CONTEXT);
}
END_TEST

/* core: cuGetProcAddress picks the version the caller's CUDA version asks for. */
START_TEST(proc_address)
{
	setup();
	void *fn = NULL;
	CUdriverProcAddressQueryResult st = 99;
	ck_assert_int_eq(cuGetProcAddress("cuMemcpyHtoDAsync", &fn, 12000, 0, &st), CUDA_SUCCESS);
	ck_assert_int_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
	ck_assert_ptr_eq(fn, (void *)cuMemcpyHtoDAsync_v2);
	ck_assert_int_eq(cuGetProcAddress("cuCtxCreate", &fn, 12000, 0, &st), CUDA_SUCCESS);
	ck_assert_ptr_eq(fn, (void *)cuCtxCreate_v3);
	ck_assert_int_eq(cuGetProcAddress("cuMemcpyBatchAsync", &fn, 13000, 0, &st), CUDA_SUCCESS);
	ck_assert_ptr_eq(fn, (void *)cuMemcpyBatchAsync_v2);
	ck_assert_int_eq(cuGetProcAddress("cuMemcpyBatchAsync", &fn, 12080, 0, &st), CUDA_SUCCESS);
	ck_assert_ptr_ne(fn, (void *)cuMemcpyBatchAsync_v2);
	ck_assert_int_eq(cuGetProcAddress("cuMemcpyBatchAsync", &fn, 12000, 0, &st),
			 CUDA_ERROR_NOT_FOUND);
	ck_assert_int_eq(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
	ck_assert_int_eq(cuGetProcAddress("cuNothing", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
	ck_assert_int_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	ck_assert_int_eq(cuGetProcAddress("cuGetProcAddress", &fn, 13000, 0, &st), CUDA_SUCCESS);
	ck_assert_ptr_eq(fn, (void *)cuGetProcAddress_v2);
}
END_TEST

static void host_fn(void *arg)
{
	*(int *)arg = 1;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_fn(void *arg)
{
	usleep(*(unsigned *)arg);
}

/* core: a copy over registered and unregistered host memory, or over two registrations, is
 * refused with CUDA_ERROR_INVALID_VALUE, every way a copy can be made; inside one is pinned. */
START_TEST(mixed_registration)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "0", 1);
	setup();
	size_t chunk = 1 << 20;
	char *h = mmap(NULL, 3 * chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CUdeviceptr d;
	CUstream s;
	ck_assert_int_eq(cuMemAlloc(&d, 2 * chunk), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemHostRegister(h, chunk, 0), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemHostRegister(h + chunk, chunk, 0), CUDA_SUCCESS);
	char *over_two = h + chunk - 4096, *mixed = h + 2 * chunk - 4096;
	ck_assert_int_eq(cuMemcpyHtoDAsync(d, over_two, 8192, s), CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(cuMemcpyHtoDAsync(d, mixed, 8192, s), CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(cuMemcpyHtoD(d, mixed, 8192), CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(cuMemcpyDtoH(mixed, d, 8192), CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(cuMemcpyDtoHAsync(over_two, d, 8192, s), CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(cuMemcpyAsync(d, (CUdeviceptr)(uintptr_t)mixed, 8192, s),
			 CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr dsts[1] = {d}, srcs[1] = {(CUdeviceptr)(uintptr_t)mixed};
	size_t sizes[1] = {8192}, idx = 0;
	CUmemcpyAttributes a = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
	ck_assert_int_eq(cuMemcpyBatchAsync(dsts, srcs, sizes, 1, &a, &idx, 1, s),
			 CUDA_ERROR_INVALID_VALUE);
	ck_assert_uint_eq(counter("mixed_copies"), 7);
	/* Inside one registration, or wholly outside: fine. */
	ck_assert_int_eq(cuMemcpyHtoDAsync(d, h + chunk, chunk, s), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemcpyHtoDAsync(d, h + 2 * chunk, chunk, s), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	ck_assert_uint_eq(counter("h2d_bytes_registered"), chunk);
	ck_assert_uint_eq(counter("h2d_bytes_pageable"), chunk);
	ck_assert_uint_eq(counter("mixed_copies"), 7);
}
END_TEST

/* core: the legacy default stream waits for the context's blocking streams, not for its
 * non-blocking ones. */
START_TEST(legacy_stream_waits)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "0", 1);
	setup();
	CUdeviceptr d;
	CUstream blocking, nonblocking;
	char b[64];
	unsigned us = 300000;
	ck_assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamCreate(&blocking, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(cuLaunchHostFunc(nonblocking, sleep_fn, &us), CUDA_SUCCESS);
	double t0 = now_s();
	ck_assert_int_eq(cuMemcpyDtoH(b, d, sizeof(b)), CUDA_SUCCESS);
	ck_assert_msg(now_s() - t0 < 0.15, "waited for a non-blocking stream");
	ck_assert_int_eq(cuStreamSynchronize(nonblocking), CUDA_SUCCESS);
	ck_assert_int_eq(cuLaunchHostFunc(blocking, sleep_fn, &us), CUDA_SUCCESS);
	t0 = now_s();
	ck_assert_int_eq(cuMemcpyDtoH(b, d, sizeof(b)), CUDA_SUCCESS);
	ck_assert_msg(now_s() - t0 > 0.25, "did not wait for the blocking stream");
	ck_assert_uint_eq(counter("legacy_waits"), 1);
	/* An asynchronous copy on a non-blocking stream of the program's does not wait. */
	ck_assert_int_eq(cuLaunchHostFunc(blocking, sleep_fn, &us), CUDA_SUCCESS);
	t0 = now_s();
	ck_assert_int_eq(cuMemcpyDtoHAsync(b, d, sizeof(b), nonblocking), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamSynchronize(nonblocking), CUDA_SUCCESS);
	ck_assert_msg(now_s() - t0 < 0.15, "a non-blocking stream waited");
}
END_TEST

struct hf {
	unsigned us;
	double at;
};

static void timed_fn(void *arg)
{
	struct hf *h = arg;
	usleep(h->us);
	h->at = now_s();
}

/* concurrency: host functions of independent streams may be serialized, and are here: one
 * that blocks holds up another stream's; the longest is counted. */
START_TEST(host_functions_serialized)
{
	setup();
	CUstream a, b;
	ck_assert_int_eq(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	struct hf slow = {.us = 300000}, quick = {.us = 0};
	double t0 = now_s();
	ck_assert_int_eq(cuLaunchHostFunc(a, timed_fn, &slow), CUDA_SUCCESS);
	usleep(20000);
	ck_assert_int_eq(cuLaunchHostFunc(b, timed_fn, &quick), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamSynchronize(b), CUDA_SUCCESS);
	ck_assert_msg(quick.at - t0 > 0.28, "stream b's host function ran at %.3f s",
		      quick.at - t0);
	ck_assert_int_eq(cuStreamSynchronize(a), CUDA_SUCCESS);
	ck_assert_uint_ge(counter("hostfn_max_us"), 290000);
}
END_TEST

struct raiser {
	volatile uint32_t *word;
	unsigned us;
};

static void *raise_later(void *arg)
{
	struct raiser *r = arg;
	usleep(r->us);
	__atomic_store_n(r->word, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* core: cuStreamWaitValue32 on mapped host memory holds the stream until the host writes. */
START_TEST(wait_value)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "0", 1);
	setup();
	CUstream s;
	uint32_t *word;
	CUdeviceptr dw;
	int ran = 0;
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemHostAlloc((void **)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP),
			 CUDA_SUCCESS);
	ck_assert_int_eq(cuMemHostGetDevicePointer(&dw, word, 0), CUDA_SUCCESS);
	*word = 0;
	uint32_t pageable = 0;
	ck_assert_int_eq(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)&pageable, 1, 0),
			 CUDA_ERROR_INVALID_VALUE); /* not mapped */
	ck_assert_int_eq(cuStreamWaitValue32(s, dw, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	ck_assert_int_eq(cuLaunchHostFunc(s, host_fn, &ran), CUDA_SUCCESS);
	usleep(100000);
	ck_assert_int_eq(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
	ck_assert_int_eq(ran, 0);
	struct raiser r = {.word = word, .us = 50000};
	pthread_t th;
	pthread_create(&th, NULL, raise_later, &r);
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	ck_assert_int_eq(ran, 1);
	pthread_join(th, NULL);
}
END_TEST

/* core: FAKECUDA_PAGEABLE_SYNC=1: a pageable async copy waits for the stream's earlier work
 * ("may synchronize with the stream"); pinned ones and stream-ordered batches do not. */
START_TEST(pageable_may_sync)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "0", 1);
	setenv("FAKECUDA_PAGEABLE_SYNC", "1", 1);
	setup();
	CUdeviceptr d;
	CUstream s;
	static char src[4096];
	void *pinned;
	unsigned us = 300000;
	ck_assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemAllocHost(&pinned, 4096), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(cuLaunchHostFunc(s, sleep_fn, &us), CUDA_SUCCESS);
	double t0 = now_s();
	ck_assert_int_eq(cuMemcpyHtoDAsync(d, pinned, 4096, s), CUDA_SUCCESS);
	CUdeviceptr dsts[1] = {d}, srcs[1] = {(CUdeviceptr)(uintptr_t)src};
	size_t sizes[1] = {4096}, idx = 0;
	CUmemcpyAttributes a = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
	ck_assert_int_eq(cuMemcpyBatchAsync(dsts, srcs, sizes, 1, &a, &idx, 1, s), CUDA_SUCCESS);
	ck_assert_msg(now_s() - t0 < 0.15, "a pinned copy or an ordered batch waited");
	ck_assert_int_eq(cuMemcpyHtoDAsync(d, src, 4096, s), CUDA_SUCCESS);
	ck_assert_msg(now_s() - t0 > 0.25, "the pageable copy did not wait for the stream");
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
}
END_TEST

/* crash: a reset primary context takes its streams, memory and registrations with it; the
 * handle stays, with a new id.  Work queued behind a wait that never ends is dropped. */
START_TEST(context_reset)
{
	CUcontext ctx = setup();
	unsigned long long id0 = 0, id1 = 0;
	ck_assert_int_eq(cuCtxGetId(ctx, &id0), CUDA_SUCCESS);
	CUdeviceptr d;
	CUstream s;
	uint32_t *word;
	CUdeviceptr dw;
	char *h = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemHostRegister(h, 1 << 20, 0), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemHostAlloc((void **)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP),
			 CUDA_SUCCESS);
	ck_assert_int_eq(cuMemHostGetDevicePointer(&dw, word, 0), CUDA_SUCCESS);
	*word = 0;
	ck_assert_int_eq(cuStreamWaitValue32(s, dw, 1, 0), CUDA_SUCCESS); /* never raised */
	ck_assert_uint_eq(counter("registered_bytes"), 1 << 20);
	ck_assert_int_eq(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
	ck_assert_int_eq(cuCtxGetId(ctx, &id1), CUDA_SUCCESS);
	ck_assert_uint_ne(id0, id1);
	ck_assert_uint_eq(counter("registered_bytes"), 0);
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
	char b[16];
	ck_assert_int_eq(cuMemcpyHtoD(d, b, sizeof(b)), CUDA_ERROR_INVALID_VALUE);
	ck_assert_int_eq(cuMemHostUnregister(h), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	/* A context created and destroyed: its id is asked in vain. */
	CUcontext c2;
	ck_assert_int_eq(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
	ck_assert_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	ck_assert_int_eq(cuCtxGetId(c2, &id1), CUDA_ERROR_INVALID_CONTEXT);
}
END_TEST

/* core: work enqueued on a capturing stream does not run. */
START_TEST(capture_drops_work)
{
	setup();
	CUstream s;
	int ran = 0;
	CUstreamCaptureStatus st = 99;
	CUgraph g;
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
	ck_assert_int_eq(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	ck_assert_int_eq(cuLaunchHostFunc(s, host_fn, &ran), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
	ck_assert_int_eq(st, CU_STREAM_CAPTURE_STATUS_NONE);
	ck_assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	ck_assert_int_eq(ran, 0);
}
END_TEST

/* concurrency: host functions and events run in stream order. */
START_TEST(stream_order)
{
	setenv("FAKECUDA_ASYNC_DELAY_US", "20000", 1);
	setup();
	CUdeviceptr d;
	CUstream s;
	CUevent ev;
	int ran = 0;
	char src[8] = "abcdefg";
	ck_assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(cuEventCreate(&ev, 0), CUDA_SUCCESS);
	ck_assert_int_eq(cuMemcpyHtoDAsync(d, src, 8, s), CUDA_SUCCESS);
	ck_assert_int_eq(cuLaunchHostFunc(s, host_fn, &ran), CUDA_SUCCESS);
	ck_assert_int_eq(cuEventRecord(ev, s), CUDA_SUCCESS);
	ck_assert_int_eq(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
	ck_assert_int_eq(cuEventSynchronize(ev), CUDA_SUCCESS);
	ck_assert_int_eq(ran, 1);
	ck_assert_str_eq(fakecuda_host_view(d, 8), "abcdefg");
	ck_assert_int_eq(cuEventDestroy(ev), CUDA_SUCCESS);
	ck_assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
END_TEST

/* crash: a fork child of an initialised process is cut off, and FAKECUDA_STATS writes a file
 * per process at exit. */
START_TEST(fork_and_stats)
{
	char dir[] = "/tmp/fakecuda-stats-XXXXXX";
	ck_assert_ptr_nonnull(mkdtemp(dir));
	setenv("FAKECUDA_STATS", dir, 1);
	setup();
	CUdeviceptr d;
	ck_assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		char b[4];
		int bad = cuMemcpyHtoD(d, b, 4) != CUDA_ERROR_NOT_INITIALIZED;
		unsigned long long n = 0;
		fakecuda_counter("forked_calls", &n);
		exit(bad || n != 1); /* exit, not _exit: the destructor writes the stats */
	}
	int st;
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st));
	ck_assert_int_eq(WEXITSTATUS(st), 0);
	char path[128], line[128];
	snprintf(path, sizeof(path), "%s/fakecuda.%d", dir, (int)pid);
	FILE *f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	bool found = false;
	while (fgets(line, sizeof(line), f))
		if (strcmp(line, "forked_calls 1\n") == 0)
			found = true;
	fclose(f);
	ck_assert(found);
	unlink(path);
	rmdir(dir);
}
END_TEST

static Suite *fakecuda_suite(void)
{
	Suite *s = suite_create("fakecuda");
	TCase *core = tcase_create("core");
	tcase_add_test(core, device_not_host_accessible);
	tcase_add_test(core, async_copies_delayed);
	tcase_add_test(core, counters);
	tcase_add_test(core, fail_syntax);
	tcase_add_test(core, pointer_attributes);
	tcase_add_test(core, proc_address);
	tcase_add_test(core, mixed_registration);
	tcase_add_test(core, legacy_stream_waits);
	tcase_add_test(core, wait_value);
	tcase_add_test(core, pageable_may_sync);
	tcase_add_test(core, capture_drops_work);
	suite_add_tcase(s, core);
	TCase *conc = tcase_create("concurrency");
	tcase_add_test(conc, stream_order);
	tcase_add_test(conc, host_functions_serialized);
	suite_add_tcase(s, conc);
	TCase *crash = tcase_create("crash");
	tcase_add_test(crash, fork_and_stats);
	tcase_add_test(crash, context_reset);
	suite_add_tcase(s, crash);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(fakecuda_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
