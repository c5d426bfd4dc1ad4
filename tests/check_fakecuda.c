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
	suite_add_tcase(s, core);
	TCase *conc = tcase_create("concurrency");
	tcase_add_test(conc, stream_order);
	suite_add_tcase(s, conc);
	TCase *crash = tcase_create("crash");
	tcase_add_test(crash, fork_and_stats);
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
