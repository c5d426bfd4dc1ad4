/*
 * kvshim-gpu-probe: what the CUDA driver of this machine does where kvshim depends on it, for
 * scripts/gpu-check.sh --run (issue 27).  It reaches libcuda.so.1 through dlopen only (built
 * against cuda.h for its types; the driver is never linked), so the same binary runs against
 * a real driver and against tests/fake_cuda.c.
 *
 *   kvshim-gpu-probe env             the driver, the device, the attributes that matter
 *   kvshim-gpu-probe probes [MIB]    the behaviours, one after the other (MIB: the size of the
 *                                    /dev/shm file registered for the rate, default 1024)
 *   kvshim-gpu-probe cufile PATH     can libcufile at PATH be loaded and opened here?
 *
 * Every line is "STATUS name: text", printed (and flushed) as soon as it is known, STATUS one
 * of PASS (what kvshim relies on holds), FAIL (it does not), INFO (a fact measured; nothing
 * relies on it), SKIP (cannot be measured here, and why).  Before each probe its name is
 * printed as "... name", so that a probe that hangs is named by the last line.  Exit 0 unless
 * the driver could not be used at all (1) or the usage is wrong (2); FAIL lines do not change
 * it (the caller counts them).
 *
 * What is probed, and why (the review's findings):
 *   mixed_copy          a copy over registered + unregistered memory (documented: INVALID_VALUE)
 *   two_registrations   a copy over two adjacent registrations (not documented)
 *   pageable_async      a pageable cuMemcpyHtoDAsync behind a busy stream: does the call wait,
 *                       and does it read the source at the call?
 *   gate                a stream waits on a word of registered host memory until the host
 *                       raises it (cuStreamWaitValue32): kvshim's gated cuFileReadAsync
 *   batch_in_order      a batch with CU_MEMCPY_SRC_ACCESS_ORDER_STREAM from pageable memory
 *                       behind a gate reads the source after the raise (kvshim relies on it)
 *   batch_at_call       a batch with ORDER_DURING_API_CALL behind a busy stream: returns at
 *                       once, reads during the call
 *   host_functions      two host functions on two streams, the first sleeping 200 ms:
 *                       serialized?
 *   dtoh_busy           cuMemcpyDtoH while a blocking stream is busy 200 ms, against
 *                       cuMemcpyDtoHAsync on a non-blocking stream (what write-through uses)
 *   register_rate       a fallocated /dev/shm file registered in 64 MiB chunks: GiB/s, and the
 *                       latency of small copies on another stream meanwhile
 *   context_reset       after cuDevicePrimaryCtxReset: the same handle?  a new cuCtxGetId?
 *                       registrations gone?  (kvshim notices a reset by the id)
 */
#include <cuda.h>
#include <dlfcn.h>

#include "cufile_types.h"
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MIB (1u << 20)

static struct {
	CUresult (*init)(unsigned);
	CUresult (*driver_version)(int *);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*device_count)(int *);
	CUresult (*device_name)(char *, int, CUdevice);
	CUresult (*device_attr)(int *, CUdevice_attribute, CUdevice);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*primary_reset)(CUdevice);
	CUresult (*ctx_set_current)(CUcontext);
	CUresult (*ctx_get_id)(CUcontext, unsigned long long *);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_host_alloc)(void **, size_t, unsigned);
	CUresult (*host_register)(void *, size_t, unsigned);
	CUresult (*host_unregister)(void *);
	CUresult (*host_dptr)(CUdeviceptr *, void *, unsigned);
	CUresult (*stream_create)(CUstream *, unsigned);
	CUresult (*stream_sync)(CUstream);
	CUresult (*stream_query)(CUstream);
	CUresult (*stream_is_capturing)(CUstream, CUstreamCaptureStatus *);
	CUresult (*wait_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
	CUresult (*launch_host_func)(CUstream, CUhostFn, void *);
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*htod_async)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*error_name)(CUresult, const char **);
	/* cuMemcpyBatchAsync: 13.0's signature, or 12.8's with failIdx; NULL before 12.8 */
	CUresult (*batch_v2)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *,
			     size_t *, size_t, CUstream);
	CUresult (*batch_v1)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *,
			     size_t *, size_t, size_t *, CUstream);
} cu;

static void *lib;
static int driver_version;
static CUcontext ctx;
static CUdevice dev;

static void line(const char *status, const char *name, const char *fmt, ...)
{
	va_list ap;

	printf("%s %s: ", status, name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static void start(const char *name)
{
	printf("... %s\n", name);
	fflush(stdout);
}

static const char *errname(CUresult r)
{
	const char *s = NULL;

	if (cu.error_name && cu.error_name(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "?";
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double ms_since(double t0)
{
	return (now() - t0) * 1e3;
}

/* Resolve the entry points by their exported names (the ABI cuda.h gives the plain names). */
static int resolve(void)
{
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		line("FAIL", "driver", "dlopen libcuda.so.1: %s", dlerror());
		return -1;
	}
#define REQ(field, name)                                                                           \
	if (!(*(void **)&cu.field = dlsym(lib, name))) {                                           \
		line("FAIL", "driver", "libcuda.so.1 lacks %s", name);                             \
		return -1;                                                                         \
	}
#define OPT(field, name) *(void **)&cu.field = dlsym(lib, name);
	REQ(init, "cuInit");
	REQ(driver_version, "cuDriverGetVersion");
	REQ(device_get, "cuDeviceGet");
	REQ(device_count, "cuDeviceGetCount");
	REQ(device_name, "cuDeviceGetName");
	REQ(device_attr, "cuDeviceGetAttribute");
	REQ(primary_retain, "cuDevicePrimaryCtxRetain");
	REQ(ctx_set_current, "cuCtxSetCurrent");
	REQ(mem_alloc, "cuMemAlloc_v2");
	REQ(mem_host_alloc, "cuMemHostAlloc");
	REQ(host_register, "cuMemHostRegister_v2");
	REQ(host_unregister, "cuMemHostUnregister");
	REQ(host_dptr, "cuMemHostGetDevicePointer_v2");
	REQ(stream_create, "cuStreamCreate");
	REQ(stream_sync, "cuStreamSynchronize");
	REQ(stream_query, "cuStreamQuery");
	REQ(launch_host_func, "cuLaunchHostFunc");
	REQ(htod, "cuMemcpyHtoD_v2");
	REQ(htod_async, "cuMemcpyHtoDAsync_v2");
	REQ(dtoh, "cuMemcpyDtoH_v2");
	REQ(dtoh_async, "cuMemcpyDtoHAsync_v2");
	OPT(primary_reset, "cuDevicePrimaryCtxReset_v2");
	OPT(ctx_get_id, "cuCtxGetId");
	OPT(stream_is_capturing, "cuStreamIsCapturing");
	OPT(wait_value32, "cuStreamWaitValue32_v2");
	OPT(error_name, "cuGetErrorName");
#undef REQ
#undef OPT
	CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
	    (CUresult(*)(const char *, void **, int, cuuint64_t,
			 CUdriverProcAddressQueryResult *))dlsym(lib, "cuGetProcAddress_v2");
	CUresult r = cu.init(0);
	if (r != CUDA_SUCCESS) {
		line("FAIL", "driver", "cuInit: %d %s", r, errname(r));
		return -1;
	}
	cu.driver_version(&driver_version);
	void *fn = NULL;
	if (gpa && driver_version >= 13000 &&
	    gpa("cuMemcpyBatchAsync", &fn, 13000, 0, NULL) == CUDA_SUCCESS)
		*(void **)&cu.batch_v2 = fn;
	else if (gpa && driver_version >= 12080 &&
		 gpa("cuMemcpyBatchAsync", &fn, 12080, 0, NULL) == CUDA_SUCCESS)
		*(void **)&cu.batch_v1 = fn;
	int n = 0;
	if ((r = cu.device_count(&n)) != CUDA_SUCCESS || n < 1 ||
	    (r = cu.device_get(&dev, 0)) != CUDA_SUCCESS ||
	    (r = cu.primary_retain(&ctx, dev)) != CUDA_SUCCESS ||
	    (r = cu.ctx_set_current(ctx)) != CUDA_SUCCESS) {
		line("FAIL", "driver", "no device 0 with a context: %d %s (%d devices)", r,
		     errname(r), n);
		return -1;
	}
	return 0;
}

static int attr(CUdevice_attribute a)
{
	int v = -1;

	return cu.device_attr(&v, a, dev) == CUDA_SUCCESS ? v : -1;
}

static int cmd_env(void)
{
	char name[256] = "?", path[4096] = "?";
	struct link_map *lm = NULL;
	int n = 0;

	if (dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name)
		snprintf(path, sizeof(path), "%s", lm->l_name);
	cu.device_name(name, sizeof(name), dev);
	cu.device_count(&n);
	line("INFO", "env", "driver %d.%d (cuDriverGetVersion %d), libcuda.so.1 at %s",
	     driver_version / 1000, driver_version % 1000 / 10, driver_version, path);
	line("INFO", "env", "%d device(s); device 0: %s, compute %d.%d, PCI bus %d", n, name,
	     attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
	     attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
	     attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID));
	line("INFO", "env",
	     "unified addressing %d, host pointer for registered memory %d, host register "
	     "supported %d, pageable access through host page tables %d, GPUDirect RDMA %d",
	     attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING),
	     attr(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM),
	     attr(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED),
	     attr(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES),
	     attr(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED));
	line("INFO", "env", "cuMemcpyBatchAsync %s, cuStreamWaitValue32 %s, cuCtxGetId %s",
	     cu.batch_v2   ? "13.0"
	     : cu.batch_v1 ? "12.8"
			   : "no",
	     cu.wait_value32 ? "yes" : "no", cu.ctx_get_id ? "yes" : "no");
	return 0;
}

/* ---- helpers for the probes ---- */

static void sleep_fn(void *arg)
{
	usleep(*(unsigned *)arg);
}

struct stamp {
	unsigned us;
	double at;
};

static void stamp_fn(void *arg)
{
	struct stamp *s = arg;

	usleep(s->us);
	s->at = now();
}

static CUstream stream(unsigned flags)
{
	CUstream s = NULL;

	if (cu.stream_create(&s, flags) != CUDA_SUCCESS)
		return NULL;
	return s;
}

static void *pages(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static CUresult batch1(CUdeviceptr dst, const void *src, size_t len, CUmemcpySrcAccessOrder order,
		       CUstream s)
{
	CUdeviceptr d[1] = {dst}, sp[1] = {(CUdeviceptr)(uintptr_t)src};
	size_t sz[1] = {len}, idx = 0, fail = 0;
	CUmemcpyAttributes a = {.srcAccessOrder = order};

	if (cu.batch_v2)
		return cu.batch_v2(d, sp, sz, 1, &a, &idx, 1, s);
	return cu.batch_v1(d, sp, sz, 1, &a, &idx, 1, &fail, s);
}

/* A gate: a word of a registered DEVICEMAP page that s waits on; 0 or the CUresult. */
struct gate {
	uint32_t *word;
	CUdeviceptr dptr;
};

static CUresult gate_wait(struct gate *g, CUstream s)
{
	static uint32_t *page;
	CUresult r;

	if (!cu.wait_value32)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (!page) {
		page = pages(4096);
		if (!page)
			return CUDA_ERROR_OUT_OF_MEMORY;
		r = cu.host_register(page, 4096,
				     CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
		if (r != CUDA_SUCCESS)
			return r;
	}
	g->word = &page[0];
	__atomic_store_n(g->word, 0, __ATOMIC_RELAXED);
	if ((r = cu.host_dptr(&g->dptr, g->word, 0)) != CUDA_SUCCESS)
		return r;
	return cu.wait_value32(s, g->dptr, 1, CU_STREAM_WAIT_VALUE_GEQ);
}

static void gate_raise(struct gate *g)
{
	__atomic_store_n(g->word, 1, __ATOMIC_RELEASE);
}

/* cuStreamSynchronize, but giving up after ms: CUDA_ERROR_NOT_READY then (a stream that never
 * gets past a gate must not hang the probe). */
static CUresult sync_within(CUstream s, unsigned ms)
{
	double t0 = now();
	CUresult r;

	while ((r = cu.stream_query(s)) == CUDA_ERROR_NOT_READY && ms_since(t0) < ms)
		usleep(200);
	return r;
}

/* ---- the probes ---- */

static CUdeviceptr dbuf; /* 64 MiB of device memory shared by the probes */

static void probe_mixed(void)
{
	start("mixed_copy");
	char *h = pages(4 * MIB);
	CUstream s = stream(CU_STREAM_NON_BLOCKING);
	if (!h || !s || cu.host_register(h, MIB, 0) != CUDA_SUCCESS) {
		line("SKIP", "mixed_copy", "no registered buffer");
		return;
	}
	CUresult r = cu.htod_async(dbuf, h + MIB / 2, MIB, s);
	cu.stream_sync(s);
	line("INFO", "mixed_copy",
	     "cuMemcpyHtoDAsync over registered + unregistered memory: %d %s (documented: "
	     "CUDA_ERROR_INVALID_VALUE; kvshim registers whole frames and never makes one)",
	     r, errname(r));

	start("two_registrations");
	if (cu.host_register(h + MIB, MIB, 0) != CUDA_SUCCESS) {
		line("SKIP", "two_registrations", "second registration refused");
		return;
	}
	memset(h, 'x', 2 * MIB);
	double t0 = now();
	r = cu.htod_async(dbuf, h + MIB / 2, MIB, s);
	memset(h + MIB / 2, 'y', MIB); /* after the call: a staged copy keeps 'x' */
	CUresult sy = cu.stream_sync(s);
	char got = 0;
	cu.dtoh(&got, dbuf, 1);
	line("INFO", "two_registrations",
	     "cuMemcpyHtoDAsync over two adjacent registrations: %d %s, sync %d, %.2f ms, read %s "
	     "(not documented; kvs_gpu_pinned never counts on it)",
	     r, errname(r), sy, ms_since(t0),
	     r != CUDA_SUCCESS ? "-"
	     : got == 'x'      ? "at the call (staged: pageable)"
			       : "in stream order (pinned)");
	cu.host_unregister(h);
	cu.host_unregister(h + MIB);
}

static void probe_pageable(void)
{
	start("pageable_async");
	char *h = malloc(MIB);
	CUstream s = stream(CU_STREAM_NON_BLOCKING);
	unsigned busy = 200000;
	if (!h || !s) {
		line("SKIP", "pageable_async", "no memory");
		return;
	}
	memset(h, 'o', MIB);
	cu.launch_host_func(s, sleep_fn, &busy);
	double t0 = now();
	CUresult r = cu.htod_async(dbuf, h, MIB, s);
	double call = ms_since(t0);
	memset(h, 'n', MIB);
	cu.stream_sync(s);
	char got = 0;
	cu.dtoh(&got, dbuf, 1);
	line("INFO", "pageable_async",
	     "cuMemcpyHtoDAsync of pageable memory behind a stream busy 200 ms: %d %s, the call "
	     "took %.1f ms (%s), source read %s",
	     r, errname(r), call, call > 150 ? "it waited for the stream" : "no wait",
	     got == 'o'	  ? "at the call"
	     : got == 'n' ? "in stream order"
			  : "?");
	free(h);
}

static void probe_gate_and_batch(void)
{
	start("gate");
	CUstream s = stream(CU_STREAM_NON_BLOCKING);
	struct gate g;
	struct stamp after = {0};
	CUresult r = s ? gate_wait(&g, s) : CUDA_ERROR_OUT_OF_MEMORY;
	if (r != CUDA_SUCCESS) {
		line("FAIL", "gate",
		     "cuStreamWaitValue32 on registered host memory: %d %s (kvshim's gated "
		     "cuFileReadAsync then settles on the calling thread)",
		     r, errname(r));
		return;
	}
	cu.launch_host_func(s, stamp_fn, &after);
	usleep(100000);
	CUresult held = cu.stream_query(s);
	double t0 = now();
	gate_raise(&g);
	CUresult sy = sync_within(s, 5000);
	double pass = (after.at - t0) * 1e3;
	if (held == CUDA_ERROR_NOT_READY && sy == CUDA_SUCCESS && after.at > 0 && pass < 1000)
		line("PASS", "gate",
		     "the stream waited at the gate, and went on %.2f ms after the raise", pass);
	else
		line("FAIL", "gate", "stream held: %s, sync %d %s, went on %.2f ms after the raise",
		     held == CUDA_ERROR_NOT_READY ? "yes" : "NO", sy, errname(sy), pass);
	if (sy != CUDA_SUCCESS) {
		line("SKIP", "batch_in_order", "the gate's stream is stuck");
		return;
	}

	start("batch_in_order");
	if (!cu.batch_v1 && !cu.batch_v2) {
		line("SKIP", "batch_in_order", "no cuMemcpyBatchAsync (driver %d < 12080)",
		     driver_version);
		return;
	}
	char *h = malloc(MIB);
	memset(h, 'o', MIB);
	if ((r = gate_wait(&g, s)) != CUDA_SUCCESS) {
		line("SKIP", "batch_in_order", "no gate: %d %s", r, errname(r));
		free(h);
		return;
	}
	t0 = now();
	r = batch1(dbuf, h, MIB, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, s);
	double call = ms_since(t0);
	memset(h, 'n', MIB); /* the load lands before the raise */
	gate_raise(&g);
	sy = sync_within(s, 5000);
	char got = 0;
	cu.dtoh(&got, dbuf, 1);
	if (r == CUDA_SUCCESS && sy == CUDA_SUCCESS && got == 'n')
		line("PASS", "batch_in_order",
		     "a pageable source behind a gate was read after the raise; the call took %.1f "
		     "ms",
		     call);
	else
		line("FAIL", "batch_in_order",
		     "batch %d %s, sync %d, source read %s (kvshim's gated reads need it read in "
		     "stream order); the call took %.1f ms",
		     r, errname(r), sy, got == 'o' ? "at the call" : "?", call);

	start("batch_at_call");
	unsigned busy = 200000;
	memset(h, 'o', MIB);
	cu.launch_host_func(s, sleep_fn, &busy);
	t0 = now();
	r = batch1(dbuf, h, MIB, CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL, s);
	call = ms_since(t0);
	memset(h, 'n', MIB);
	sy = cu.stream_sync(s);
	cu.dtoh(&got, dbuf, 1);
	line(r == CUDA_SUCCESS && call < 150 ? "PASS" : "FAIL", "batch_at_call",
	     "a pageable batch read during the call, behind a stream busy 200 ms: %d %s, the call "
	     "took %.1f ms (kvshim's settled reads count on no wait), source read %s",
	     r, errname(r), call,
	     got == 'o'	  ? "during the call"
	     : got == 'n' ? "later"
			  : "?");
	free(h);
}

static void probe_host_functions(void)
{
	start("host_functions");
	CUstream a = stream(CU_STREAM_NON_BLOCKING), b = stream(CU_STREAM_NON_BLOCKING);
	struct stamp slow = {.us = 200000}, quick = {.us = 0};
	double t0 = now();
	cu.launch_host_func(a, stamp_fn, &slow);
	usleep(20000);
	cu.launch_host_func(b, stamp_fn, &quick);
	cu.stream_sync(b);
	cu.stream_sync(a);
	double q = (quick.at - t0) * 1e3;
	line("INFO", "host_functions",
	     "stream b's host function ran %.1f ms after a's 200 ms one started: %s (kvshim's host "
	     "functions never block)",
	     q, q > 180 ? "serialized" : "in parallel");
}

static void probe_dtoh(void)
{
	start("dtoh_busy");
	CUstream busy = stream(CU_STREAM_DEFAULT), own = stream(CU_STREAM_NON_BLOCKING);
	char *h = malloc(MIB);
	unsigned us = 200000;
	cu.launch_host_func(busy, sleep_fn, &us);
	double t0 = now();
	CUresult r1 = cu.dtoh(h, dbuf, MIB);
	double legacy = ms_since(t0);
	cu.stream_sync(busy);
	cu.launch_host_func(busy, sleep_fn, &us);
	t0 = now();
	CUresult r2 = cu.dtoh_async(h, dbuf, MIB, own);
	if (r2 == CUDA_SUCCESS)
		r2 = cu.stream_sync(own);
	double mine = ms_since(t0);
	cu.stream_sync(busy);
	line(r2 == CUDA_SUCCESS && mine < 100 ? "PASS" : "FAIL", "dtoh_busy",
	     "a blocking stream busy 200 ms: cuMemcpyDtoH (legacy stream) %d took %.1f ms; "
	     "cuMemcpyDtoHAsync on a non-blocking stream + its sync (write-through's) %d took "
	     "%.1f ms",
	     r1, legacy, r2, mine);
	free(h);
}

struct reg_job {
	char *base;
	size_t len, chunk;
	double secs;
	CUresult err;
	volatile int done;
};

static void *reg_thread(void *arg)
{
	struct reg_job *j = arg;

	cu.ctx_set_current(ctx);
	double t0 = now();
	for (size_t off = 0; off < j->len && j->err == CUDA_SUCCESS; off += j->chunk)
		j->err = cu.host_register(j->base + off, j->chunk, CU_MEMHOSTREGISTER_PORTABLE);
	j->secs = now() - t0;
	j->done = 1;
	return NULL;
}

/* Median and max latency (ms) of n 4 KiB pinned copies + sync on stream s, while keep(). */
static void copy_latency(CUstream s, const void *src, int n, volatile int *stop, double *med,
			 double *max)
{
	double v[4096];
	int k = 0;

	for (int i = 0; i < n && k < 4096 && !(stop && *stop); i++) {
		double t0 = now();
		cu.htod_async(dbuf, src, 4096, s);
		cu.stream_sync(s);
		v[k++] = ms_since(t0);
	}
	*med = *max = 0;
	for (int i = 0; i < k; i++)
		for (int m = i + 1; m < k; m++)
			if (v[m] < v[i]) {
				double t = v[i];
				v[i] = v[m];
				v[m] = t;
			}
	if (k) {
		*med = v[k / 2];
		*max = v[k - 1];
	}
}

static void probe_register(size_t mib)
{
	start("register_rate");
	char path[128];
	snprintf(path, sizeof(path), "/dev/shm/kvshim-gpu-probe.%d", (int)getpid());
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	size_t len = mib * MIB;
	char *base = MAP_FAILED;
	if (fd >= 0) {
		unlink(path);
		if (posix_fallocate(fd, 0, (off_t)len) == 0)
			base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
	}
	if (base == MAP_FAILED) {
		line("SKIP", "register_rate", "cannot map %zu MiB of /dev/shm", mib);
		return;
	}
	CUstream s = stream(CU_STREAM_NON_BLOCKING);
	void *src;
	cu.mem_host_alloc(&src, 4096, 0);
	double med0, max0, med1, max1;
	copy_latency(s, src, 200, NULL, &med0, &max0);
	struct reg_job j = {.base = base, .len = len, .chunk = 64 * MIB};
	pthread_t th;
	pthread_create(&th, NULL, reg_thread, &j);
	copy_latency(s, src, 100000, &j.done, &med1, &max1);
	pthread_join(th, NULL);
	if (j.err != CUDA_SUCCESS) {
		line("FAIL", "register_rate", "cuMemHostRegister of /dev/shm memory: %d %s", j.err,
		     errname(j.err));
	} else {
		line(
		    "PASS", "register_rate",
		    "%zu MiB of /dev/shm registered in 64 MiB chunks in %.3f s: %.2f GiB/s, %.3f s "
		    "per GiB",
		    mib, j.secs, (double)len / (1u << 30) / j.secs,
		    j.secs / ((double)len / (1u << 30)));
		line("INFO", "register_rate",
		     "4 KiB copies on another stream: median %.3f ms, max %.3f ms idle; median "
		     "%.3f ms, max %.3f ms while registering",
		     med0, max0, med1, max1);
	}
	for (size_t off = 0; off < len; off += 64 * MIB)
		cu.host_unregister(base + off);
	munmap(base, len);
}

static void probe_reset(void)
{
	start("context_reset");
	if (!cu.primary_reset || !cu.ctx_get_id) {
		line("SKIP", "context_reset",
		     "no cuDevicePrimaryCtxReset_v2 or cuCtxGetId (driver %d)", driver_version);
		return;
	}
	char *h = pages(MIB);
	unsigned long long id0 = 0, id1 = 0;
	cu.ctx_get_id(ctx, &id0);
	CUresult r = cu.host_register(h, MIB, CU_MEMHOSTREGISTER_PORTABLE);
	CUresult rr = cu.primary_reset(dev);
	CUcontext again = NULL;
	cu.primary_retain(&again, dev);
	cu.ctx_set_current(again);
	cu.ctx_get_id(again, &id1);
	CUresult re = cu.host_register(h, MIB, CU_MEMHOSTREGISTER_PORTABLE);
	bool same = again == ctx;
	bool noticed = !same || id0 != id1;
	line(noticed ? "PASS" : "FAIL", "context_reset",
	     "register %d, reset %d; after it: the same handle %s, id %llu -> %llu, registering "
	     "again %d %s (%s)",
	     r, rr, same ? "yes" : "no", id0, id1, re, errname(re),
	     re == CUDA_SUCCESS ? "the registration went with the context"
				: "the registration outlived the context");
	ctx = again;
}

static int cmd_probes(size_t mib)
{
	CUresult r = cu.mem_alloc(&dbuf, 64 * MIB);
	if (r != CUDA_SUCCESS) {
		line("FAIL", "probes", "cuMemAlloc 64 MiB: %d %s", r, errname(r));
		return 1;
	}
	probe_mixed();
	probe_pageable();
	probe_gate_and_batch();
	probe_host_functions();
	probe_dtoh();
	probe_register(mib);
	probe_reset(); /* last: everything of the context is gone after it */
	return 0;
}

static int cmd_cufile(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		line("FAIL", "cufile", "dlopen %s: %s", path, dlerror());
		return 1;
	}
	kvs_cufile_driver_open_fn open_fn = (kvs_cufile_driver_open_fn)dlsym(h, "cuFileDriverOpen");
	kvs_cufile_error_t (*version)(int *) =
	    (kvs_cufile_error_t(*)(int *))dlsym(h, "cuFileGetVersion");
	int v = 0;
	if (version)
		version(&v);
	if (!open_fn) {
		line("FAIL", "cufile", "%s has no cuFileDriverOpen", path);
		return 1;
	}
	kvs_cufile_error_t e = open_fn();
	line(e.err == 0 ? "PASS" : "FAIL", "cufile",
	     "%s loads, version %d, cuFileDriverOpen: %d (CUresult %d)", path, v, e.err, e.cu_err);
	return e.err == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc < 2 ||
	    (strcmp(argv[1], "env") && strcmp(argv[1], "probes") && strcmp(argv[1], "cufile")) ||
	    (strcmp(argv[1], "cufile") == 0 && argc < 3)) {
		fprintf(stderr, "usage: %s env | probes [MIB] | cufile PATH\n", argv[0]);
		return 2;
	}
	if (strcmp(argv[1], "cufile") == 0) {
		if (resolve()) /* a context current, as libcufile wants */
			return 1;
		return cmd_cufile(argv[2]);
	}
	if (resolve())
		return 1;
	if (strcmp(argv[1], "env") == 0)
		return cmd_env();
	return cmd_probes(argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 1024);
}
