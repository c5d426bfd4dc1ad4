/*
 * fake_cuda: a libcuda.so.1 for tests on machines without a GPU.  It implements the part of
 * the driver API that kvshim's gpu/ module, its tests and kvikio (tests/clients_test.sh) call,
 * with the real exported names (the `_v2` names that cuda.h maps the plain ones to, and the
 * plain names as aliases of the same code; NOTE: in the real driver the plain names are the
 * legacy 32-bit ABI, here they are the `_v2` ABI, so a caller that dlsym()s a plain name works
 * here and not there: gpu/ never does), compiled against the real cuda.h so that every type
 * is exact.
 *
 * What makes it a useful fake:
 *  - Device memory is a range the host cannot touch: a large memfd is mapped twice, once
 *    PROT_NONE (the device addresses cuMemAlloc hands out: a memcpy into them crashes, as on a
 *    GPU) and once read-write (the shadow, where the fake's copies land).
 *    fakecuda_host_view() gives the shadow address of a device range (for a fake libcufile).
 *  - Copies on a stream other than 0 / CU_STREAM_LEGACY / CU_STREAM_PER_THREAD are really
 *    asynchronous: a worker thread per stream runs its FIFO and sleeps
 *    FAKECUDA_ASYNC_DELAY_US before each copy.  A pinned host source (cuMemHostAlloc, or
 *    registered with cuMemHostRegister) is read only then, so a caller that frees or rewrites
 *    it before synchronising is caught.  A pageable host source of cuMemcpyHtoDAsync or
 *    cuMemcpyAsync is read at the call, as the driver documents ("host memory is copied to a
 *    staging buffer immediately"), so a caller that counts on the copy reading pageable
 *    memory in stream order (after a host function before it has filled it) is caught too.
 *  - Managed memory (cuMemAllocManaged) is ordinary host memory; like the real driver,
 *    cuPointerGetAttribute reports it as CU_MEMORYTYPE_DEVICE with IS_MANAGED = 1.
 *  - A fork child of a process that called cuInit gets CUDA_ERROR_NOT_INITIALIZED from every
 *    entry point, and the call is counted as forked_calls (its other counters start at zero).
 *  - What NVIDIA documents and a test here must not pass without:
 *    . "Memory regions spanning over allocations that are both registered and not registered
 *      with CUDA are not supported and will return CUDA_ERROR_INVALID_VALUE" (the memcpy
 *      note of cuda.h): a copy whose host side is partly inside a registration (or
 *      cuMemHostAlloc memory) fails so.  A copy over two registrations is not documented; the
 *      fake refuses it the same way, so that nothing that passes here can depend on it.
 *      Counted as mixed_copies.
 *    . The legacy default stream (stream 0, CU_STREAM_LEGACY, and the synchronous copies)
 *      "first waits on all blocking streams" of the context: work on it runs inline only once
 *      every stream created without CU_STREAM_NON_BLOCKING in the current context is idle.
 *    . "Host functions without a mandated order (such as in independent streams) execute in
 *      undefined order and may be serialized": every host function of the process runs on one
 *      callback thread, one at a time, so one that blocks holds up every stream's.  The
 *      longest one run is counted as hostfn_max_us.
 *    . A context reset (cuDevicePrimaryCtxReset) or destroyed takes its streams, allocations
 *      and registrations with it; the primary context keeps its handle (the address may be
 *      reused) but gets a new cuCtxGetId.
 *    . Stream capture (cuStreamBeginCapture ... cuStreamEndCapture): work enqueued on a
 *      capturing stream is not run (it would run when a graph is launched, which the fake has
 *      not); cuStreamIsCapturing says so.
 *    . cuStreamWaitValue32 on mapped host memory: the stream waits until the word is >= the
 *      value (cyclic), as the host writes it.
 *    . With FAKECUDA_PAGEABLE_SYNC=1, a pageable asynchronous copy first waits for the
 *      stream's earlier work, then stages ("the driver may synchronize with the stream and
 *      stage the copy into pinned memory"); by default it stages at once without waiting, the
 *      other permitted behaviour, which catches code that counts on stream order instead.
 *
 * Environment:
 *  FAKECUDA_DEVICES=N          devices (default 1)
 *  FAKECUDA_MEM=BYTES          device memory per process, all devices together (default 64 GiB;
 *                              halved until the reservation succeeds)
 *  FAKECUDA_ASYNC_DELAY_US=US  delay before each asynchronous copy (default 2000), read by cuInit
 *  FAKECUDA_MISSING=1          cuInit returns CUDA_ERROR_NO_DEVICE
 *  FAKECUDA_FAIL=RULE[,RULE..] RULE is NAME[:FROM[-TO]][=CODE]: calls of entry point NAME
 *                              fail with CUresult CODE (default 999, CUDA_ERROR_UNKNOWN) from
 *                              its FROM-th call on (1-based, default 1), up to its TO-th call
 *                              (default: for ever).  NAME is the exported name
 *                              (cuMemcpyHtoDAsync_v2); a plain name (cuMemcpyHtoDAsync) also
 *                              matches its versions.  Read at every call: a changed value
 *                              starts the counts again.
 *                              Example: "cuMemcpyHtoDAsync_v2,cuMemHostRegister_v2:3-4=2".
 *  FAKECUDA_PAGEABLE_SYNC=1    see above: a pageable async copy waits for its stream first
 *  FAKECUDA_STACK_KB=KB        every entry point uses KB KiB of its caller's stack first (a
 *                              real driver's call chains are deep): a thread with a small stack
 *                              faults
 *  FAKECUDA_STATS=DIR          at exit, write DIR/fakecuda.<pid>: one "name value" per counter
 *
 * Exported helpers (dlsym them): fakecuda_host_view(dptr, len), fakecuda_counter(name, &v).
 * Counters: see COUNTERS below; batch_copies counts the copies made through
 * cuMemcpyBatchAsync, registered_bytes the bytes registered now.
 *
 * DESIGN.  One mutex (lk) guards the allocation table, contexts, streams list, events, the
 * fail rules and the arena; it is never held while a copy runs or a host function is called.
 * Each stream has its own mutex and condition for its FIFO and its count of operations not yet
 * finished (queued or running); the worker pops an operation under the stream's lock, runs it
 * unlocked, then decrements the count and broadcasts.  Event completion is written under lk and
 * waited for on ev_cv.  Counters are relaxed atomics.  The current-context stack is
 * thread-local.  Lock order: lk before a stream's lock (never the other way).  A memory range
 * freed while a copy into it is in flight is the caller's bug, as on a GPU.
 */
#include <limits.h>
#include <cuda.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAKE_DRIVER_VERSION 13000
#define MAX_DEVICES	    16
#define DEV_ALIGN	    (64u << 10)

#define COUNTERS(X)                                                                                \
	X(h2d_copies)                                                                              \
	X(h2d_bytes)                                                                               \
	X(h2d_bytes_registered)                                                                    \
	X(h2d_bytes_pageable)                                                                      \
	X(d2h_bytes)                                                                               \
	X(host_register_calls)                                                                     \
	X(registered_bytes)                                                                        \
	X(stream_syncs)                                                                            \
	X(batch_copies)                                                                            \
	X(forked_calls)                                                                            \
	X(mixed_copies)                                                                            \
	X(hostfn_max_us)                                                                           \
	X(legacy_waits)

enum {
#define X(n) C_##n,
	COUNTERS(X)
#undef X
	    NCOUNTERS
};
static const char *const counter_names[] = {
#define X(n) #n,
    COUNTERS(X)
#undef X
};
static _Atomic unsigned long long counters[NCOUNTERS];

static void count(int c, unsigned long long v)
{
	atomic_fetch_add_explicit(&counters[c], v, memory_order_relaxed);
}

enum akind { A_DEVICE, A_HOSTALLOC, A_MANAGED, A_REGISTERED };

struct alloc {
	uintptr_t base;
	size_t size;
	enum akind kind;
	CUcontext ctx;
	int device;
	unsigned long long id;
};

#define CTX_MAGIC    0x43545846u
#define STREAM_MAGIC 0x53545246u
#define EVENT_MAGIC  0x45565446u

struct CUctx_st {
	uint32_t magic;
	int device;
	bool primary;
	int refs;
	unsigned long long id; /* cuCtxGetId: new after a reset */
	struct CUctx_st *next;
};

struct CUevent_st {
	uint32_t magic;
	bool done; /* under lk */
	struct CUevent_st *next;
};

enum optype { OP_COPY, OP_HOSTFN, OP_RECORD, OP_WAIT, OP_WAITVAL };

struct op {
	struct op *next;
	enum optype type;
	void *dst;
	const void *src;
	size_t len;
	void *owned; /* a snapshot of the source, freed after the copy */
	CUhostFn fn;
	void *arg;
	struct CUevent_st *ev;
	volatile uint32_t *word; /* OP_WAITVAL: wait until the condition holds */
	uint32_t value;
	unsigned flags;
};

struct CUstream_st {
	uint32_t magic;
	CUcontext ctx;
	unsigned flags;		/* CU_STREAM_NON_BLOCKING or not */
	_Atomic bool capturing; /* between cuStreamBeginCapture and cuStreamEndCapture */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct op *head, *tail;
	unsigned pending; /* queued or running, under mu */
	bool worker, stop;
	_Atomic bool killed; /* its context went away: queued work is dropped */
	pthread_t th;
	struct CUstream_st *next;
};

struct rule {
	char name[64];
	unsigned from, to; /* to 0: no end */
	CUresult code;
	unsigned calls;
};

static pthread_mutex_t lk = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;
static bool initialized, forked;
static int ndevices = 1;
static unsigned delay_us = 2000;
static struct alloc *allocs;
static size_t nallocs, allocs_cap;
static unsigned long long next_id = 1;
static unsigned long long next_ctx_id = 1; /* under lk */
static bool pageable_sync;		   /* FAKECUDA_PAGEABLE_SYNC=1, read by cuInit */
static unsigned char *dev_base, *shadow;
static size_t arena_size, arena_used;
static struct CUctx_st *ctxs;
static struct CUctx_st *primary[MAX_DEVICES];
static struct CUstream_st *streams;
static struct CUevent_st *events;
static char fail_spec[512];
static struct rule rules[16];
static int nrules;

static _Thread_local CUcontext ctx_stack[32];
static _Thread_local int ctx_depth;

/* ---- entry checks and failure injection ---- */

static void parse_rules(const char *spec)
{
	nrules = 0;
	snprintf(fail_spec, sizeof(fail_spec), "%s", spec);
	char buf[512];
	snprintf(buf, sizeof(buf), "%s", spec);
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok && nrules < 16;
	     tok = strtok_r(NULL, ",", &save)) {
		struct rule *r = &rules[nrules];
		memset(r, 0, sizeof(*r));
		r->from = 1;
		r->code = CUDA_ERROR_UNKNOWN;
		char *eq = strchr(tok, '=');
		if (eq) {
			*eq = 0;
			r->code = (CUresult)atoi(eq + 1);
		}
		char *colon = strchr(tok, ':');
		if (colon) {
			*colon = 0;
			r->from = (unsigned)atoi(colon + 1);
			char *dash = strchr(colon + 1, '-');
			if (dash)
				r->to = (unsigned)atoi(dash + 1);
		}
		snprintf(r->name, sizeof(r->name), "%s", tok);
		if (r->name[0])
			nrules++;
	}
}

static bool rule_matches(const char *rule, const char *fn)
{
	size_t n = strlen(rule);
	if (strncmp(rule, fn, n) != 0)
		return false;
	return fn[n] == 0 || (fn[n] == '_' && fn[n + 1] == 'v');
}

static unsigned long long env_ull(const char *name, unsigned long long def);

/* Use kb KiB of the calling thread's stack, as a real driver's entry points may (they
 * run deep call chains, create threads, take locks): a thread with a small stack faults. */
static __attribute__((noinline)) unsigned deep(unsigned kb)
{
	volatile unsigned char a[1024];

	a[0] = (unsigned char)kb;
	a[sizeof(a) - 1] = a[0];
	return kb > 1 ? deep(kb - 1) + a[sizeof(a) - 1] : a[0];
}

/* The common prologue: the driver's stack use, fork child, initialisation, injected
 * failure. */
static CUresult enter(const char *fn, bool need_init)
{
	static unsigned stack_kb = UINT_MAX;

	if (stack_kb == UINT_MAX) /* racy but idempotent: every thread reads the same value */
		stack_kb = (unsigned)env_ull("FAKECUDA_STACK_KB", 0);
	if (stack_kb)
		(void)deep(stack_kb);
	if (forked) {
		count(C_forked_calls, 1);
		return CUDA_ERROR_NOT_INITIALIZED;
	}
	CUresult rc = CUDA_SUCCESS;
	const char *spec = getenv("FAKECUDA_FAIL");
	pthread_mutex_lock(&lk);
	if (need_init && !initialized)
		rc = CUDA_ERROR_NOT_INITIALIZED;
	if (!spec)
		spec = "";
	if (strcmp(spec, fail_spec) != 0)
		parse_rules(spec);
	for (int i = 0; i < nrules && rc == CUDA_SUCCESS; i++) {
		if (!rule_matches(rules[i].name, fn))
			continue;
		++rules[i].calls;
		if (rules[i].calls >= rules[i].from &&
		    (!rules[i].to || rules[i].calls <= rules[i].to))
			rc = rules[i].code;
	}
	pthread_mutex_unlock(&lk);
	return rc;
}

#define ENTER(name)                                                                                \
	do {                                                                                       \
		CUresult enter_rc_ = enter(name, true);                                            \
		if (enter_rc_ != CUDA_SUCCESS)                                                     \
			return enter_rc_;                                                          \
	} while (0)

static CUcontext current(void)
{
	return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

#define NEED_CTX()                                                                                 \
	do {                                                                                       \
		if (!current())                                                                    \
			return CUDA_ERROR_INVALID_CONTEXT;                                         \
	} while (0)

/* ---- allocation table (under lk) ---- */

static struct alloc *find_locked(uintptr_t p)
{
	for (size_t i = 0; i < nallocs; i++)
		if (p >= allocs[i].base && p - allocs[i].base < allocs[i].size)
			return &allocs[i];
	return NULL;
}

static bool overlaps_locked(uintptr_t p, size_t len, int kind_a, int kind_b)
{
	for (size_t i = 0; i < nallocs; i++) {
		struct alloc *a = &allocs[i];
		if ((int)a->kind != kind_a && (int)a->kind != kind_b)
			continue;
		if (p < a->base + a->size && a->base < p + len)
			return true;
	}
	return false;
}

static int add_locked(uintptr_t base, size_t size, enum akind kind, CUcontext ctx)
{
	if (nallocs == allocs_cap) {
		size_t cap = allocs_cap ? allocs_cap * 2 : 64;
		struct alloc *n = realloc(allocs, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		allocs = n;
		allocs_cap = cap;
	}
	allocs[nallocs++] = (struct alloc){base, size, kind, ctx, ctx ? ctx->device : 0, next_id++};
	return 0;
}

static void remove_locked(struct alloc *a)
{
	*a = allocs[--nallocs];
}

static bool in_arena(uintptr_t p)
{
	return dev_base && p >= (uintptr_t)dev_base && p - (uintptr_t)dev_base < arena_size;
}

/* The shadow of device range [p, p+len), or NULL when it is not inside one allocation. */
static void *dev_shadow(uintptr_t p, size_t len)
{
	void *r = NULL;
	pthread_mutex_lock(&lk);
	struct alloc *a = in_arena(p) ? find_locked(p) : NULL;
	if (a && a->kind == A_DEVICE && len <= a->size - (p - a->base))
		r = shadow + (p - (uintptr_t)dev_base);
	pthread_mutex_unlock(&lk);
	return r;
}

enum host_state { H_PAGEABLE, H_PINNED, H_MIXED };

/* Host range [p, p+len): pageable (no registration or cuMemHostAlloc memory touches it),
 * pinned (all inside one), or mixed (partly inside one, or over two: the driver refuses the
 * copy with CUDA_ERROR_INVALID_VALUE). */
static enum host_state host_state(uintptr_t p, size_t len)
{
	enum host_state r = H_PAGEABLE;
	int touching = 0;
	pthread_mutex_lock(&lk);
	for (size_t i = 0; i < nallocs; i++) {
		struct alloc *a = &allocs[i];
		if (a->kind != A_REGISTERED && a->kind != A_HOSTALLOC)
			continue;
		if (!(p < a->base + a->size && a->base < p + (len ? len : 1)))
			continue;
		touching++;
		r = p >= a->base && len <= a->size - (p - a->base) ? H_PINNED : H_MIXED;
	}
	pthread_mutex_unlock(&lk);
	return touching > 1 ? H_MIXED : r;
}

static bool host_pinned(uintptr_t p, size_t len)
{
	return host_state(p, len) == H_PINNED;
}

/* Resolve a unified address for cuMemcpy: device memory to its shadow, anything else as is. */
static CUresult resolve(uintptr_t p, size_t len, void **out, bool *device)
{
	*device = in_arena(p);
	if (!*device) {
		*out = (void *)p;
		return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	}
	*out = dev_shadow(p, len);
	return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

void *fakecuda_host_view(CUdeviceptr p, size_t len)
{
	return dev_shadow((uintptr_t)p, len);
}

int fakecuda_counter(const char *name, unsigned long long *out)
{
	for (int i = 0; i < NCOUNTERS; i++)
		if (strcmp(name, counter_names[i]) == 0) {
			*out = atomic_load_explicit(&counters[i], memory_order_relaxed);
			return 0;
		}
	return -ENOENT;
}

/* ---- process life ---- */

/* Only a child of a process that initialised the driver is cut off (as with the real one):
 * test runners that fork before any CUDA call keep a working fake. */
static void atfork_child(void)
{
	if (!initialized)
		return;
	forked = true;
	pthread_mutex_init(&lk, NULL);
	for (int i = 0; i < NCOUNTERS; i++)
		atomic_store_explicit(&counters[i], 0, memory_order_relaxed);
}

__attribute__((constructor)) static void fake_init(void)
{
	pthread_atfork(NULL, NULL, atfork_child);
}

__attribute__((destructor)) static void fake_fini(void)
{
	const char *dir = getenv("FAKECUDA_STATS");
	if (!dir || !*dir)
		return;
	char path[4096];
	snprintf(path, sizeof(path), "%s/fakecuda.%d", dir, (int)getpid());
	FILE *f = fopen(path, "we");
	if (!f)
		return;
	for (int i = 0; i < NCOUNTERS; i++)
		fprintf(f, "%s %llu\n", counter_names[i],
			atomic_load_explicit(&counters[i], memory_order_relaxed));
	fclose(f);
}

static unsigned long long env_ull(const char *name, unsigned long long def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	unsigned long long x = strtoull(v, &end, 0);
	return *end ? def : x;
}

static int arena_map(void)
{
	size_t want = (size_t)env_ull("FAKECUDA_MEM", 64ull << 30);
	int fd = memfd_create("fakecuda-device", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (; want >= (64u << 20); want /= 2) {
		if (ftruncate(fd, (off_t)want) != 0)
			continue;
		void *d = mmap(NULL, want, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
		if (d == MAP_FAILED)
			continue;
		void *s =
		    mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
		if (s == MAP_FAILED) {
			munmap(d, want);
			continue;
		}
		dev_base = d;
		shadow = s;
		arena_size = want;
		close(fd);
		return 0;
	}
	close(fd);
	return -ENOMEM;
}

/* ---- init, version, errors, symbols ---- */

CUresult CUDAAPI cuInit(unsigned int Flags)
{
	CUresult rc = enter("cuInit", false);
	if (rc != CUDA_SUCCESS)
		return rc;
	const char *m = getenv("FAKECUDA_MISSING");
	if (m && strcmp(m, "1") == 0)
		return CUDA_ERROR_NO_DEVICE;
	pthread_mutex_lock(&lk);
	if (!initialized) {
		ndevices = (int)env_ull("FAKECUDA_DEVICES", 1);
		if (ndevices > MAX_DEVICES)
			ndevices = MAX_DEVICES;
		delay_us = (unsigned)env_ull("FAKECUDA_ASYNC_DELAY_US", 2000);
		pageable_sync = env_ull("FAKECUDA_PAGEABLE_SYNC", 0) == 1;
		if (ndevices > 0 && arena_map() == 0)
			initialized = true;
		rc = ndevices <= 0 ? CUDA_ERROR_NO_DEVICE
				   : (initialized ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
	}
	pthread_mutex_unlock(&lk);
	return rc;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
	CUresult rc = enter("cuDriverGetVersion", false);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = FAKE_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

static const struct {
	CUresult code;
	const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int error_index(CUresult e)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].code == e)
			return (int)i;
	return -1;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
	int i = error_index(error);
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	*pStr = i < 0 ? NULL : errors[i].text;
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
	int i = error_index(error);
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	*pStr = i < 0 ? NULL : errors[i].name;
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- devices and contexts ---- */

static CUresult check_dev(CUdevice dev)
{
	return dev >= 0 && dev < ndevices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
	ENTER("cuDeviceGet");
	if (!device || check_dev(ordinal) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *n)
{
	ENTER("cuDeviceGetCount");
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	*n = ndevices;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
	ENTER("cuDeviceGetName");
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_dev(dev) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "Fake CUDA Device %d", dev);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	ENTER("cuDeviceGetAttribute");
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_dev(dev) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_DEVICE;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
	case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
		*pi = 1;
		break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		*pi = 9;
		break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
		*pi = 132;
		break;
	case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
		*pi = 2;
		break;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
		*pi = dev + 1;
		break;
	default:
		*pi = 0;
	}
	return CUDA_SUCCESS;
}

static CUcontext ctx_new_locked(int dev, bool prim)
{
	struct CUctx_st *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->magic = CTX_MAGIC;
	c->device = dev;
	c->primary = prim;
	c->id = next_ctx_id++;
	c->next = ctxs;
	ctxs = c;
	return c;
}

static bool ctx_valid_locked(CUcontext c)
{
	for (struct CUctx_st *x = ctxs; x; x = x->next)
		if (x == c)
			return true;
	return false;
}

static bool ctx_valid(CUcontext c)
{
	pthread_mutex_lock(&lk);
	bool r = ctx_valid_locked(c);
	pthread_mutex_unlock(&lk);
	return r;
}

static void stream_kill(struct CUstream_st *s);

/* Context c goes away (destroyed, or reset): its streams are killed (their queued work
 * dropped) and freed, its allocations and registrations are gone.  Not under lk. */
static void ctx_teardown(CUcontext c)
{
	for (;;) {
		struct CUstream_st *victim = NULL;
		pthread_mutex_lock(&lk);
		for (struct CUstream_st **pp = &streams; *pp; pp = &(*pp)->next) {
			if ((*pp)->ctx == c) {
				victim = *pp;
				*pp = victim->next;
				break;
			}
		}
		pthread_mutex_unlock(&lk);
		if (!victim)
			break;
		stream_kill(victim);
	}
	pthread_mutex_lock(&lk);
	for (size_t i = 0; i < nallocs;) {
		struct alloc *a = &allocs[i];
		if (a->ctx != c) {
			i++;
			continue;
		}
		if (a->kind == A_DEVICE) {
			arena_used -= a->size;
			madvise(shadow + (a->base - (uintptr_t)dev_base), a->size, MADV_REMOVE);
		} else if (a->kind == A_REGISTERED) {
			atomic_fetch_sub_explicit(&counters[C_registered_bytes], a->size,
						  memory_order_relaxed);
		} else {
			munmap((void *)a->base, a->size); /* cuMemHostAlloc'd, managed */
		}
		remove_locked(a);
	}
	pthread_mutex_unlock(&lk);
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxRetain");
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_dev(dev) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_DEVICE;
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&lk);
	if (!primary[dev])
		primary[dev] = ctx_new_locked(dev, true);
	if (primary[dev]) {
		primary[dev]->refs++;
		*pctx = primary[dev];
	} else {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_unlock(&lk);
	return rc;
}

/* The primary context stays allocated when its count drops to zero: handles to it stay valid,
 * as the real driver's do (it only releases the device's resources). */
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxRelease_v2");
	if (check_dev(dev) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_DEVICE;
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&lk);
	if (!primary[dev] || primary[dev]->refs == 0)
		rc = CUDA_ERROR_INVALID_CONTEXT;
	else
		primary[dev]->refs--;
	pthread_mutex_unlock(&lk);
	return rc;
}

/* The primary context of dev loses everything it had (cudaDeviceReset): the handle stays
 * valid, with a new id, as a context made again at the same address would be. */
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
	ENTER("cuDevicePrimaryCtxReset_v2");
	if (check_dev(dev) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&lk);
	CUcontext c = primary[dev];
	if (c) {
		c->id = next_ctx_id++;
		c->refs = 0;
	}
	pthread_mutex_unlock(&lk);
	if (c)
		ctx_teardown(c);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
	ENTER("cuCtxGetId");
	if (!ctxId)
		return CUDA_ERROR_INVALID_VALUE;
	if (!ctx)
		ctx = current();
	CUresult rc = CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lk);
	if (ctx && ctx_valid_locked(ctx)) {
		*ctxId = ctx->id;
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lk);
	return rc;
}

static CUresult ctx_create(const char *fn, CUcontext *pctx, CUdevice dev)
{
	ENTER(fn);
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_dev(dev) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_DEVICE;
	if (ctx_depth == 32)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&lk);
	CUcontext c = ctx_new_locked(dev, false);
	pthread_mutex_unlock(&lk);
	if (!c)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = c;
	*pctx = c;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
			     unsigned int flags, CUdevice dev)
{
	return ctx_create("cuCtxCreate_v4", pctx, dev);
}

CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
				unsigned int flags, CUdevice dev)
{
	return ctx_create("cuCtxCreate_v3", pctx, dev);
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	return ctx_create("cuCtxCreate_v2", pctx, dev);
}

/* A destroyed context's memory is not freed: the address must not come back as another
 * context's in the tests (the real driver may reuse it; a reset shows that case). */
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx)
{
	ENTER("cuCtxDestroy_v2");
	CUresult rc = CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lk);
	for (struct CUctx_st **pp = &ctxs; *pp; pp = &(*pp)->next) {
		if (*pp != ctx || ctx->primary)
			continue;
		*pp = ctx->next;
		ctx->magic = 0;
		rc = CUDA_SUCCESS;
		break;
	}
	pthread_mutex_unlock(&lk);
	if (rc == CUDA_SUCCESS)
		ctx_teardown(ctx);
	if (rc == CUDA_SUCCESS) {
		int j = 0;
		for (int i = 0; i < ctx_depth; i++)
			if (ctx_stack[i] != ctx)
				ctx_stack[j++] = ctx_stack[i];
		ctx_depth = j;
	}
	return rc;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	ENTER("cuCtxSetCurrent");
	if (ctx && !ctx_valid(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!ctx) {
		if (ctx_depth > 0)
			ctx_depth--;
		return CUDA_SUCCESS;
	}
	if (ctx_depth == 0)
		ctx_depth = 1;
	ctx_stack[ctx_depth - 1] = ctx;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
	ENTER("cuCtxGetCurrent");
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = current();
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
	ENTER("cuCtxPushCurrent_v2");
	if (!ctx || !ctx_valid(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth == 32)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
	ENTER("cuCtxPopCurrent_v2");
	if (ctx_depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUcontext c = ctx_stack[--ctx_depth];
	if (pctx)
		*pctx = c;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
	ENTER("cuCtxGetDevice");
	NEED_CTX();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	*device = current()->device;
	return CUDA_SUCCESS;
}

static void stream_drain(struct CUstream_st *s);

CUresult CUDAAPI cuCtxSynchronize(void)
{
	ENTER("cuCtxSynchronize");
	NEED_CTX();
	CUcontext c = current();
	/* Streams are only freed by cuStreamDestroy, which the caller does not run concurrently
	 * with a synchronisation of the same context. */
	pthread_mutex_lock(&lk);
	struct CUstream_st *list[256];
	int n = 0;
	for (struct CUstream_st *s = streams; s && n < 256; s = s->next)
		if (s->ctx == c)
			list[n++] = s;
	pthread_mutex_unlock(&lk);
	for (int i = 0; i < n; i++)
		stream_drain(list[i]);
	return CUDA_SUCCESS;
}

/* ---- memory ---- */

CUresult CUDAAPI cuMemGetInfo(size_t *free_, size_t *total)
{
	ENTER("cuMemGetInfo_v2");
	NEED_CTX();
	pthread_mutex_lock(&lk);
	if (free_)
		*free_ = arena_size - arena_used;
	if (total)
		*total = arena_size;
	pthread_mutex_unlock(&lk);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	ENTER("cuMemAlloc_v2");
	NEED_CTX();
	if (!dptr || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	size_t size = (bytesize + DEV_ALIGN - 1) & ~(size_t)(DEV_ALIGN - 1);
	CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&lk);
	/* First fit: move the candidate past every allocation it overlaps until none does. */
	uintptr_t cand = (uintptr_t)dev_base, end = (uintptr_t)dev_base + arena_size;
	for (bool moved = true; moved && cand + size <= end;) {
		moved = false;
		for (size_t i = 0; i < nallocs; i++) {
			struct alloc *a = &allocs[i];
			if (a->kind == A_DEVICE && cand < a->base + a->size &&
			    a->base < cand + size) {
				cand = a->base + a->size;
				moved = true;
			}
		}
	}
	if (cand + size <= end && add_locked(cand, size, A_DEVICE, current()) == 0) {
		arena_used += size;
		*dptr = cand;
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lk);
	return rc;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	ENTER("cuMemFree_v2");
	if (dptr == 0)
		return CUDA_SUCCESS;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	uintptr_t base = 0;
	size_t size = 0;
	pthread_mutex_lock(&lk);
	struct alloc *a = in_arena(dptr) ? find_locked(dptr) : NULL;
	if (a && a->kind == A_DEVICE && a->base == dptr) {
		base = a->base;
		size = a->size;
		arena_used -= size;
		remove_locked(a);
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lk);
	if (rc == CUDA_SUCCESS) /* give the pages back; a later allocation reads zeros */
		madvise(shadow + (base - (uintptr_t)dev_base), size, MADV_REMOVE);
	return rc;
}

/* The allocation by cuMemAlloc (or cuMemAllocManaged) that holds dptr: its base and its size
 * (as the fake rounded it, to DEV_ALIGN); CUDA_ERROR_NOT_FOUND for any other address, host
 * memory included, as the driver does.  kvikio calls it to split a device read into tasks. */
CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	ENTER("cuMemGetAddressRange_v2");
	NEED_CTX();
	CUresult rc = CUDA_ERROR_NOT_FOUND;
	pthread_mutex_lock(&lk);
	const struct alloc *a = find_locked(dptr);
	if (a && (a->kind == A_DEVICE || a->kind == A_MANAGED)) {
		if (pbase)
			*pbase = a->base;
		if (psize)
			*psize = a->size;
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lk);
	return rc;
}

static CUresult host_alloc(void **pp, size_t bytesize, enum akind kind)
{
	if (!pp || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&lk);
	int r = add_locked((uintptr_t)p, bytesize, kind, current());
	pthread_mutex_unlock(&lk);
	if (r != 0) {
		munmap(p, bytesize);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*pp = p;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocHost(void **pp, size_t bytesize)
{
	ENTER("cuMemAllocHost_v2");
	NEED_CTX();
	return host_alloc(pp, bytesize, A_HOSTALLOC);
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	ENTER("cuMemHostAlloc");
	NEED_CTX();
	return host_alloc(pp, bytesize, A_HOSTALLOC);
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	ENTER("cuMemAllocManaged");
	NEED_CTX();
	if (!dptr)
		return CUDA_ERROR_INVALID_VALUE;
	void *p;
	CUresult rc = host_alloc(&p, bytesize, A_MANAGED);
	if (rc == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)(uintptr_t)p;
	return rc;
}

static CUresult host_free(uintptr_t p, enum akind kind)
{
	size_t size = 0;
	pthread_mutex_lock(&lk);
	struct alloc *a = find_locked(p);
	if (a && a->kind == kind && a->base == p) {
		size = a->size;
		remove_locked(a);
	}
	pthread_mutex_unlock(&lk);
	if (!size)
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)p, size);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
	ENTER("cuMemFreeHost");
	return host_free((uintptr_t)p, A_HOSTALLOC);
}

CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
	ENTER("cuMemHostRegister_v2");
	NEED_CTX();
	count(C_host_register_calls, 1);
	if (!p || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&lk);
	if (in_arena((uintptr_t)p))
		rc = CUDA_ERROR_INVALID_VALUE;
	else if (overlaps_locked((uintptr_t)p, bytesize, A_REGISTERED, A_HOSTALLOC))
		rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	else if (add_locked((uintptr_t)p, bytesize, A_REGISTERED, current()) != 0)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_unlock(&lk);
	if (rc == CUDA_SUCCESS)
		count(C_registered_bytes, bytesize);
	return rc;
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
	ENTER("cuMemHostUnregister");
	NEED_CTX();
	size_t size = 0;
	pthread_mutex_lock(&lk);
	struct alloc *a = find_locked((uintptr_t)p);
	if (a && a->kind == A_REGISTERED && a->base == (uintptr_t)p) {
		size = a->size;
		remove_locked(a);
	}
	pthread_mutex_unlock(&lk);
	if (!size)
		return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
	atomic_fetch_sub_explicit(&counters[C_registered_bytes], size, memory_order_relaxed);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
	ENTER("cuMemHostGetDevicePointer_v2");
	NEED_CTX();
	if (!pdptr || Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lk);
	struct alloc *a = find_locked((uintptr_t)p);
	if (a && (a->kind == A_REGISTERED || a->kind == A_HOSTALLOC)) {
		*pdptr = (CUdeviceptr)(uintptr_t)p;
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&lk);
	return rc;
}

/* One attribute of a known allocation a (NULL: not a CUDA pointer).  strict: the
 * cuPointerGetAttribute behaviour (an error for unknown pointers) rather than
 * cuPointerGetAttributes' (zeros). */
static CUresult attribute_locked(void *data, CUpointer_attribute attr, uintptr_t ptr,
				 const struct alloc *a, bool strict)
{
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	if (!a && strict)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = a ? a->ctx : NULL;
		break;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned *)data = !a ? 0u
				       : (a->kind == A_DEVICE || a->kind == A_MANAGED
					      ? (unsigned)CU_MEMORYTYPE_DEVICE
					      : (unsigned)CU_MEMORYTYPE_HOST);
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		*(CUdeviceptr *)data = a ? (CUdeviceptr)ptr : 0;
		break;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		if (a && a->kind == A_DEVICE) {
			if (strict)
				return CUDA_ERROR_INVALID_VALUE;
			*(void **)data = NULL;
		} else {
			*(void **)data = a ? (void *)ptr : NULL;
		}
		break;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data =
		    attr == CU_POINTER_ATTRIBUTE_MAPPED ? a != NULL : (a && a->kind == A_MANAGED);
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = a ? a->device : -2;
		break;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		*(unsigned long long *)data = a ? a->id : 0;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = a ? a->base : 0;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = a ? a->size : 0;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	ENTER("cuPointerGetAttribute");
	pthread_mutex_lock(&lk);
	CUresult rc = attribute_locked(data, attribute, ptr, find_locked(ptr), true);
	pthread_mutex_unlock(&lk);
	return rc;
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
					void **data, CUdeviceptr ptr)
{
	ENTER("cuPointerGetAttributes");
	if (!attributes || !data)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&lk);
	const struct alloc *a = find_locked(ptr);
	for (unsigned i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++)
		rc = attribute_locked(data[i], attributes[i], ptr, a, false);
	pthread_mutex_unlock(&lk);
	return rc;
}

/* ---- streams and events ---- */

static bool sync_stream(CUstream s)
{
	return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

static bool stream_valid(CUstream s)
{
	bool r = false;
	pthread_mutex_lock(&lk);
	for (struct CUstream_st *x = streams; x; x = x->next)
		if (x == s)
			r = true;
	pthread_mutex_unlock(&lk);
	return r;
}

static bool event_valid_locked(CUevent e)
{
	for (struct CUevent_st *x = events; x; x = x->next)
		if (x == e)
			return true;
	return false;
}

static void sleep_us(unsigned us)
{
	struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* ---- the callback thread: every host function of the process, one at a time ---- */

struct cb_job {
	CUhostFn fn;
	void *arg;
	bool done; /* under cb_mu */
	struct cb_job *next;
};

static pthread_mutex_t cb_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cb_cv = PTHREAD_COND_INITIALIZER;	  /* a job queued */
static pthread_cond_t cb_done = PTHREAD_COND_INITIALIZER; /* a job done */
static struct cb_job *cb_head, *cb_tail;
static bool cb_started;

static uint64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void *cb_thread(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&cb_mu);
	for (;;) {
		while (!cb_head)
			pthread_cond_wait(&cb_cv, &cb_mu);
		struct cb_job *j = cb_head;
		cb_head = j->next;
		if (!cb_head)
			cb_tail = NULL;
		pthread_mutex_unlock(&cb_mu);
		uint64_t t0 = mono_us();
		j->fn(j->arg);
		unsigned long long took = mono_us() - t0;
		unsigned long long max = atomic_load(&counters[C_hostfn_max_us]);
		while (took > max &&
		       !atomic_compare_exchange_weak(&counters[C_hostfn_max_us], &max, took))
			;
		pthread_mutex_lock(&cb_mu);
		j->done = true;
		pthread_cond_broadcast(&cb_done);
	}
	return NULL;
}

/* Run fn(arg) on the callback thread and wait for it (a stream worker: stream order). */
static void run_host_fn(CUhostFn fn, void *arg)
{
	struct cb_job j = {.fn = fn, .arg = arg};
	pthread_mutex_lock(&cb_mu);
	if (!cb_started) {
		pthread_t th;
		cb_started = pthread_create(&th, NULL, cb_thread, NULL) == 0;
		if (cb_started)
			pthread_detach(th);
	}
	if (!cb_started) { /* no thread to be had: run it here */
		pthread_mutex_unlock(&cb_mu);
		fn(arg);
		return;
	}
	if (cb_tail)
		cb_tail->next = &j;
	else
		cb_head = &j;
	cb_tail = &j;
	pthread_cond_signal(&cb_cv);
	while (!j.done)
		pthread_cond_wait(&cb_done, &cb_mu);
	pthread_mutex_unlock(&cb_mu);
}

/* Does the condition of cuStreamWaitValue32 hold for the word now? */
static bool value_ok(const struct op *o)
{
	uint32_t v = __atomic_load_n(o->word, __ATOMIC_ACQUIRE);
	switch (o->flags & 3u) {
	case CU_STREAM_WAIT_VALUE_EQ:
		return v == o->value;
	case CU_STREAM_WAIT_VALUE_AND:
		return (v & o->value) != 0;
	case CU_STREAM_WAIT_VALUE_NOR:
		return ~(v | o->value) != 0;
	default: /* GEQ, cyclic */
		return (int32_t)(v - o->value) >= 0;
	}
}

static void op_run(struct op *o, struct CUstream_st *s)
{
	switch (o->type) {
	case OP_COPY:
		if (s && delay_us)
			sleep_us(delay_us);
		memmove(o->dst, o->owned ? o->owned : o->src, o->len);
		free(o->owned);
		break;
	case OP_HOSTFN:
		if (s)
			run_host_fn(o->fn, o->arg);
		else
			o->fn(o->arg);
		break;
	case OP_RECORD:
		pthread_mutex_lock(&lk);
		o->ev->done = true;
		pthread_cond_broadcast(&ev_cv);
		pthread_mutex_unlock(&lk);
		break;
	case OP_WAIT:
		pthread_mutex_lock(&lk);
		while (!o->ev->done)
			pthread_cond_wait(&ev_cv, &lk);
		pthread_mutex_unlock(&lk);
		break;
	case OP_WAITVAL: /* the GPU polls host memory; a killed stream stops waiting */
		while (!value_ok(o) && !(s && atomic_load(&s->killed)))
			sleep_us(50);
		break;
	}
}

static void *stream_worker(void *arg)
{
	struct CUstream_st *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		if (!s->head)
			break;
		struct op *o = s->head;
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		pthread_mutex_unlock(&s->mu);
		if (atomic_load(&s->killed)) /* its context is gone: so is its work */
			free(o->owned);
		else
			op_run(o, s);
		free(o);
		pthread_mutex_lock(&s->mu);
		s->pending--;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* The legacy default stream first waits for every blocking stream of the current context. */
static void legacy_wait(void)
{
	CUcontext c = current();
	struct CUstream_st *list[256];
	int n = 0;
	if (!c)
		return;
	pthread_mutex_lock(&lk);
	for (struct CUstream_st *x = streams; x && n < 256; x = x->next)
		if (x->ctx == c && !(x->flags & CU_STREAM_NON_BLOCKING))
			list[n++] = x;
	pthread_mutex_unlock(&lk);
	for (int i = 0; i < n; i++) {
		pthread_mutex_lock(&list[i]->mu);
		bool busy = list[i]->pending != 0;
		pthread_mutex_unlock(&list[i]->mu);
		if (busy) {
			count(C_legacy_waits, 1);
			stream_drain(list[i]);
		}
	}
}

/* Run o now on a synchronous stream, else queue it behind the stream's earlier work; drop it
 * on a capturing stream (it belongs to a graph the fake never launches). */
static CUresult submit(CUstream hs, struct op o)
{
	if (sync_stream(hs)) {
		if (hs != CU_STREAM_PER_THREAD)
			legacy_wait();
		op_run(&o, NULL);
		return CUDA_SUCCESS;
	}
	struct CUstream_st *s = hs;
	if (atomic_load(&s->capturing)) {
		free(o.owned);
		return CUDA_SUCCESS;
	}
	struct op *q = malloc(sizeof(*q));
	if (!q) {
		free(o.owned);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*q = o;
	q->next = NULL;
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&s->mu);
	if (!s->worker) {
		if (pthread_create(&s->th, NULL, stream_worker, s) == 0)
			s->worker = true;
		else
			rc = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (rc == CUDA_SUCCESS) {
		if (s->tail)
			s->tail->next = q;
		else
			s->head = q;
		s->tail = q;
		s->pending++;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	if (rc != CUDA_SUCCESS) {
		free(q->owned);
		free(q);
	}
	return rc;
}

static void stream_drain(struct CUstream_st *s)
{
	pthread_mutex_lock(&s->mu);
	while (s->pending)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

static CUresult stream_create(CUstream *ph, unsigned flags)
{
	NEED_CTX();
	if (!ph)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *s = calloc(1, sizeof(*s));
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->magic = STREAM_MAGIC;
	s->flags = flags;
	s->ctx = current();
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_mutex_lock(&lk);
	s->next = streams;
	streams = s;
	pthread_mutex_unlock(&lk);
	*ph = s;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	ENTER("cuStreamCreate");
	return stream_create(phStream, Flags);
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
	ENTER("cuStreamCreateWithPriority");
	return stream_create(phStream, flags);
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
	ENTER("cuStreamGetCtx");
	if (!pctx || sync_stream(hStream) || !stream_valid(hStream))
		return CUDA_ERROR_INVALID_HANDLE;
	*pctx = hStream->ctx;
	return CUDA_SUCCESS;
}

/* Stop s's worker, dropping its queued work (its context is gone), and free s. */
static void stream_kill(struct CUstream_st *s)
{
	pthread_mutex_lock(&s->mu);
	atomic_store(&s->killed, true);
	s->stop = true;
	pthread_cond_broadcast(&s->cv);
	bool joinable = s->worker;
	pthread_mutex_unlock(&s->mu);
	if (joinable)
		pthread_join(s->th, NULL);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	s->magic = 0;
	free(s);
}

/* Unlike the real driver, which returns at once and lets queued work finish, this waits for
 * the queue to drain: the worker must not outlive the stream. */
CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
	ENTER("cuStreamDestroy_v2");
	struct CUstream_st *s = NULL;
	pthread_mutex_lock(&lk);
	for (struct CUstream_st **pp = &streams; *pp; pp = &(*pp)->next)
		if (*pp == hStream) {
			s = *pp;
			*pp = s->next;
			break;
		}
	pthread_mutex_unlock(&lk);
	if (!s)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	pthread_cond_broadcast(&s->cv);
	bool joinable = s->worker;
	pthread_mutex_unlock(&s->mu);
	if (joinable)
		pthread_join(s->th, NULL);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	s->magic = 0;
	free(s);
	return CUDA_SUCCESS;
}

#define CHECK_STREAM(s)                                                                            \
	do {                                                                                       \
		if (!sync_stream(s) && !stream_valid(s))                                           \
			return CUDA_ERROR_INVALID_HANDLE;                                          \
	} while (0)

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
	ENTER("cuStreamSynchronize");
	CHECK_STREAM(hStream);
	count(C_stream_syncs, 1);
	if (!sync_stream(hStream))
		stream_drain(hStream);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
	ENTER("cuStreamQuery");
	CHECK_STREAM(hStream);
	if (sync_stream(hStream))
		return CUDA_SUCCESS;
	struct CUstream_st *s = hStream;
	pthread_mutex_lock(&s->mu);
	bool busy = s->pending != 0;
	pthread_mutex_unlock(&s->mu);
	return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode)
{
	ENTER("cuStreamBeginCapture_v2");
	if (sync_stream(hStream) || !stream_valid(hStream))
		return CUDA_ERROR_INVALID_HANDLE;
	if (atomic_exchange(&hStream->capturing, true))
		return CUDA_ERROR_ILLEGAL_STATE;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	ENTER("cuStreamEndCapture");
	if (!phGraph || sync_stream(hStream) || !stream_valid(hStream))
		return CUDA_ERROR_INVALID_VALUE;
	if (!atomic_exchange(&hStream->capturing, false))
		return CUDA_ERROR_ILLEGAL_STATE;
	*phGraph = NULL; /* the fake keeps no graph: what was captured is dropped */
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	ENTER("cuStreamIsCapturing");
	CHECK_STREAM(hStream);
	if (!captureStatus)
		return CUDA_ERROR_INVALID_VALUE;
	*captureStatus = !sync_stream(hStream) && atomic_load(&hStream->capturing)
			     ? CU_STREAM_CAPTURE_STATUS_ACTIVE
			     : CU_STREAM_CAPTURE_STATUS_NONE;
	return CUDA_SUCCESS;
}

/* addr must be mapped host memory (registered or cuMemHostAlloc'd: with unified addressing
 * its device pointer is its host address) or device memory. */
CUresult CUDAAPI cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
				     unsigned int flags)
{
	ENTER("cuStreamWaitValue32_v2");
	NEED_CTX();
	CHECK_STREAM(stream);
	if (addr % 4 || (flags & ~(3u | CU_STREAM_WAIT_VALUE_FLUSH)))
		return CUDA_ERROR_INVALID_VALUE;
	volatile uint32_t *word = dev_shadow(addr, 4);
	if (!word) {
		pthread_mutex_lock(&lk);
		struct alloc *a = find_locked(addr);
		if (a && (a->kind == A_REGISTERED || a->kind == A_HOSTALLOC) &&
		    4 <= a->size - (addr - a->base))
			word = (volatile uint32_t *)(uintptr_t)addr;
		pthread_mutex_unlock(&lk);
	}
	if (!word)
		return CUDA_ERROR_INVALID_VALUE;
	return submit(
	    stream, (struct op){.type = OP_WAITVAL, .word = word, .value = value, .flags = flags});
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
	ENTER("cuLaunchHostFunc");
	NEED_CTX();
	CHECK_STREAM(hStream);
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	return submit(hStream, (struct op){.type = OP_HOSTFN, .fn = fn, .arg = userData});
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	ENTER("cuEventCreate");
	NEED_CTX();
	if (!phEvent)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUevent_st *e = calloc(1, sizeof(*e));
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->magic = EVENT_MAGIC;
	e->done = true; /* an event never recorded is complete */
	pthread_mutex_lock(&lk);
	e->next = events;
	events = e;
	pthread_mutex_unlock(&lk);
	*phEvent = e;
	return CUDA_SUCCESS;
}

static CUresult event_reset(CUevent e)
{
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&lk);
	if (event_valid_locked(e))
		e->done = false;
	else
		rc = CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_unlock(&lk);
	return rc;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
	ENTER("cuEventRecord");
	CHECK_STREAM(hStream);
	CUresult rc = event_reset(hEvent);
	if (rc != CUDA_SUCCESS)
		return rc;
	return submit(hStream, (struct op){.type = OP_RECORD, .ev = hEvent});
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
	ENTER("cuEventQuery");
	CUresult rc;
	pthread_mutex_lock(&lk);
	if (!event_valid_locked(hEvent))
		rc = CUDA_ERROR_INVALID_HANDLE;
	else
		rc = hEvent->done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
	pthread_mutex_unlock(&lk);
	return rc;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
	ENTER("cuEventSynchronize");
	CUresult rc = CUDA_SUCCESS;
	pthread_mutex_lock(&lk);
	if (!event_valid_locked(hEvent))
		rc = CUDA_ERROR_INVALID_HANDLE;
	else
		while (!hEvent->done)
			pthread_cond_wait(&ev_cv, &lk);
	pthread_mutex_unlock(&lk);
	return rc;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	ENTER("cuStreamWaitEvent");
	CHECK_STREAM(hStream);
	pthread_mutex_lock(&lk);
	bool ok = event_valid_locked(hEvent);
	pthread_mutex_unlock(&lk);
	if (!ok)
		return CUDA_ERROR_INVALID_HANDLE;
	return submit(hStream, (struct op){.type = OP_WAIT, .ev = hEvent});
}

/* Events are never freed: a worker may still hold one it is about to complete. */
CUresult CUDAAPI cuEventDestroy(CUevent hEvent)
{
	ENTER("cuEventDestroy_v2");
	CUresult rc = CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&lk);
	for (struct CUevent_st **pp = &events; *pp; pp = &(*pp)->next)
		if (*pp == hEvent) {
			*pp = hEvent->next;
			hEvent->magic = 0;
			rc = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lk);
	return rc;
}

/* ---- copies ---- */

static void count_h2d(const void *src, size_t len)
{
	count(C_h2d_copies, 1);
	count(C_h2d_bytes, len);
	count(host_pinned((uintptr_t)src, len) ? C_h2d_bytes_registered : C_h2d_bytes_pageable,
	      len);
}

/* The host side of a copy, refused when it is over registered and unregistered memory. */
static CUresult check_host(const void *p, size_t len)
{
	if (len && host_state((uintptr_t)p, len) == H_MIXED) {
		count(C_mixed_copies, 1);
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

static CUresult copy_h2d(CUdeviceptr dst, const void *src, size_t len, CUstream s)
{
	NEED_CTX();
	CHECK_STREAM(s);
	void *sh = dev_shadow(dst, len);
	if (!sh || (!src && len))
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = check_host(src, len);
	if (rc != CUDA_SUCCESS)
		return rc;
	count_h2d(src, len);
	void *owned = NULL;
	if (!sync_stream(s) && len && !host_pinned((uintptr_t)src, len)) {
		if (pageable_sync)
			stream_drain(s); /* "may synchronize with the stream", then stage */
		owned = malloc(len); /* staged now: the driver reads pageable memory at the call */
		if (!owned)
			return CUDA_ERROR_OUT_OF_MEMORY;
		memcpy(owned, src, len);
	}
	return submit(
	    s, (struct op){.type = OP_COPY, .dst = sh, .src = src, .len = len, .owned = owned});
}

static CUresult copy_d2h(void *dst, CUdeviceptr src, size_t len, CUstream s)
{
	NEED_CTX();
	CHECK_STREAM(s);
	void *sh = dev_shadow(src, len);
	if (!sh || (!dst && len))
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = check_host(dst, len);
	if (rc != CUDA_SUCCESS)
		return rc;
	count(C_d2h_bytes, len);
	return submit(s, (struct op){.type = OP_COPY, .dst = dst, .src = sh, .len = len});
}

/* Unified addressing: either side may be host or device memory.  owned: a buffer for a
 * snapshot of the source taken now (the caller asked for it); stage: a pageable host source
 * of a copy to the device is read now (cuMemcpyAsync), else in stream order (a batch whose
 * attributes say CU_MEMCPY_SRC_ACCESS_ORDER_STREAM). */
static CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, size_t len, CUstream s, void *owned,
			 bool stage)
{
	NEED_CTX();
	CHECK_STREAM(s);
	void *d, *sp;
	bool ddev, sdev;
	CUresult rc = resolve(dst, len, &d, &ddev);
	if (rc == CUDA_SUCCESS)
		rc = resolve(src, len, &sp, &sdev);
	if (rc == CUDA_SUCCESS && ddev != sdev)
		rc = check_host(ddev ? sp : d, len);
	if (rc != CUDA_SUCCESS) {
		free(owned);
		return rc;
	}
	if (ddev && !sdev)
		count_h2d(sp, len);
	else if (!ddev && sdev)
		count(C_d2h_bytes, len);
	if (stage && !owned && ddev && !sdev && len && !sync_stream(s) &&
	    !host_pinned((uintptr_t)sp, len)) {
		if (pageable_sync)
			stream_drain(s); /* as in copy_h2d */
		owned = malloc(len); /* pageable to device: staged at the call, as in copy_h2d */
		if (!owned)
			return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (owned)
		memcpy(owned, sp, len);
	return submit(
	    s, (struct op){.type = OP_COPY, .dst = d, .src = sp, .len = len, .owned = owned});
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	ENTER("cuMemcpyHtoD_v2");
	return copy_h2d(dstDevice, srcHost, ByteCount, NULL);
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
				   CUstream hStream)
{
	ENTER("cuMemcpyHtoDAsync_v2");
	return copy_h2d(dstDevice, srcHost, ByteCount, hStream);
}

CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	ENTER("cuMemcpyDtoH_v2");
	return copy_d2h(dstHost, srcDevice, ByteCount, NULL);
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
				   CUstream hStream)
{
	ENTER("cuMemcpyDtoHAsync_v2");
	return copy_d2h(dstHost, srcDevice, ByteCount, hStream);
}

CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	ENTER("cuMemcpyDtoD_v2");
	if (!in_arena(dstDevice) || !in_arena(srcDevice))
		return CUDA_ERROR_INVALID_VALUE;
	return copy_any(dstDevice, srcDevice, ByteCount, NULL, NULL, true);
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
				   CUstream hStream)
{
	ENTER("cuMemcpyDtoDAsync_v2");
	if (!in_arena(dstDevice) || !in_arena(srcDevice))
		return CUDA_ERROR_INVALID_VALUE;
	return copy_any(dstDevice, srcDevice, ByteCount, hStream, NULL, true);
}

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	ENTER("cuMemcpy");
	return copy_any(dst, src, ByteCount, NULL, NULL, true);
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	ENTER("cuMemcpyAsync");
	return copy_any(dst, src, ByteCount, hStream, NULL, true);
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	ENTER("cuMemsetD8_v2");
	NEED_CTX();
	void *sh = dev_shadow(dstDevice, N);
	if (!sh)
		return CUDA_ERROR_INVALID_VALUE;
	memset(sh, uc, N);
	return CUDA_SUCCESS;
}

static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count_,
		      CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
		      size_t *failIdx, CUstream hStream)
{
	NEED_CTX();
	if (failIdx)
		*failIdx = SIZE_MAX;
	if (!dsts || !srcs || !sizes || count_ == 0 || !attrs || !attrsIdxs || numAttrs == 0 ||
	    numAttrs > count_ || attrsIdxs[0] != 0 || hStream == NULL ||
	    hStream == CU_STREAM_LEGACY)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t k = 1; k < numAttrs; k++)
		if (attrsIdxs[k] <= attrsIdxs[k - 1] || attrsIdxs[k] >= count_)
			return CUDA_ERROR_INVALID_VALUE;
	size_t k = 0;
	for (size_t i = 0; i < count_; i++) {
		while (k + 1 < numAttrs && attrsIdxs[k + 1] <= i)
			k++;
		CUmemcpySrcAccessOrder order = attrs[k].srcAccessOrder;
		if (order != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM &&
		    order != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
		    order != CU_MEMCPY_SRC_ACCESS_ORDER_ANY) {
			if (failIdx)
				*failIdx = i;
			return CUDA_ERROR_INVALID_VALUE;
		}
		void *owned = NULL;
		if (order == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL && sizes[i]) {
			owned = malloc(sizes[i]);
			if (!owned)
				return CUDA_ERROR_OUT_OF_MEMORY;
		}
		CUresult rc = copy_any(dsts[i], srcs[i], sizes[i], hStream, owned, false);
		if (rc != CUDA_SUCCESS) {
			if (failIdx)
				*failIdx = i;
			return rc;
		}
		count(C_batch_copies, 1);
	}
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
				    size_t count_, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
				    size_t numAttrs, CUstream hStream)
{
	ENTER("cuMemcpyBatchAsync_v2");
	return batch(dsts, srcs, sizes, count_, attrs, attrsIdxs, numAttrs, NULL, hStream);
}

/* ---- the names cuda.h maps to versioned ones, and their older signatures ---- */

#undef cuMemcpyBatchAsync
CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
				    size_t count_, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
				    size_t numAttrs, size_t *failIdx, CUstream hStream);
CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
				    size_t count_, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
				    size_t numAttrs, size_t *failIdx, CUstream hStream)
{
	ENTER("cuMemcpyBatchAsync");
	return batch(dsts, srcs, sizes, count_, attrs, attrsIdxs, numAttrs, failIdx, hStream);
}

#undef cuCtxCreate
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	return ctx_create("cuCtxCreate", pctx, dev);
}

#define ALIAS(plain, target) __typeof__(target) plain __attribute__((alias(#target)))
#undef cuMemGetInfo
ALIAS(cuMemGetInfo, cuMemGetInfo_v2);
#undef cuMemAlloc
ALIAS(cuMemAlloc, cuMemAlloc_v2);
#undef cuMemFree
ALIAS(cuMemFree, cuMemFree_v2);
#undef cuMemGetAddressRange
ALIAS(cuMemGetAddressRange, cuMemGetAddressRange_v2);
#undef cuMemAllocHost
ALIAS(cuMemAllocHost, cuMemAllocHost_v2);
#undef cuMemHostGetDevicePointer
ALIAS(cuMemHostGetDevicePointer, cuMemHostGetDevicePointer_v2);
#undef cuMemHostRegister
ALIAS(cuMemHostRegister, cuMemHostRegister_v2);
#undef cuMemcpyHtoD
ALIAS(cuMemcpyHtoD, cuMemcpyHtoD_v2);
#undef cuMemcpyDtoH
ALIAS(cuMemcpyDtoH, cuMemcpyDtoH_v2);
#undef cuMemcpyDtoD
ALIAS(cuMemcpyDtoD, cuMemcpyDtoD_v2);
#undef cuMemcpyHtoDAsync
ALIAS(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2);
#undef cuMemcpyDtoHAsync
ALIAS(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2);
#undef cuMemcpyDtoDAsync
ALIAS(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2);
#undef cuMemsetD8
ALIAS(cuMemsetD8, cuMemsetD8_v2);
#undef cuCtxDestroy
ALIAS(cuCtxDestroy, cuCtxDestroy_v2);
#undef cuCtxPushCurrent
ALIAS(cuCtxPushCurrent, cuCtxPushCurrent_v2);
#undef cuCtxPopCurrent
ALIAS(cuCtxPopCurrent, cuCtxPopCurrent_v2);
#undef cuStreamDestroy
ALIAS(cuStreamDestroy, cuStreamDestroy_v2);
#undef cuEventDestroy
ALIAS(cuEventDestroy, cuEventDestroy_v2);
#undef cuDevicePrimaryCtxRelease
ALIAS(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2);
#undef cuDevicePrimaryCtxReset
ALIAS(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2);
#undef cuStreamWaitValue32
ALIAS(cuStreamWaitValue32, cuStreamWaitValue32_v2);
#undef cuStreamBeginCapture
ALIAS(cuStreamBeginCapture, cuStreamBeginCapture_v2);

/* ---- cuGetProcAddress ---- */

/* Every entry point by exported name, with the CUDA version that introduced that name (for
 * the plain aliases of `_v2` code: the original version, approximately). */
static const struct sym {
	const char *name;
	int since;
	void *fn;
} syms[] = {
#define S(n, v)                                                                                    \
	{                                                                                          \
#n, v, (void *)n                                                                   \
	}
    S(cuInit, 2000),
    S(cuDriverGetVersion, 2020),
    S(cuGetErrorString, 6000),
    S(cuGetErrorName, 6000),
    S(cuDeviceGet, 2000),
    S(cuDeviceGetCount, 2000),
    S(cuDeviceGetName, 2000),
    S(cuDeviceGetAttribute, 2000),
    S(cuDevicePrimaryCtxRetain, 7000),
    S(cuDevicePrimaryCtxRelease, 7000),
    S(cuDevicePrimaryCtxRelease_v2, 11000),
    S(cuDevicePrimaryCtxReset, 7000),
    S(cuDevicePrimaryCtxReset_v2, 11000),
    S(cuCtxGetId, 12000),
    S(cuStreamWaitValue32, 8000),
    S(cuStreamWaitValue32_v2, 11070),
    S(cuStreamBeginCapture, 10000),
    S(cuStreamBeginCapture_v2, 10010),
    S(cuStreamEndCapture, 10000),
    S(cuStreamIsCapturing, 10000),
    S(cuCtxCreate, 2000),
    S(cuCtxCreate_v2, 3020),
    S(cuCtxCreate_v3, 11040),
    S(cuCtxCreate_v4, 12050),
    S(cuCtxDestroy, 2000),
    S(cuCtxDestroy_v2, 4000),
    S(cuCtxSetCurrent, 4000),
    S(cuCtxGetCurrent, 4000),
    S(cuCtxPushCurrent, 2000),
    S(cuCtxPushCurrent_v2, 4000),
    S(cuCtxPopCurrent, 2000),
    S(cuCtxPopCurrent_v2, 4000),
    S(cuCtxGetDevice, 2000),
    S(cuCtxSynchronize, 2000),
    S(cuMemGetInfo, 2000),
    S(cuMemGetInfo_v2, 3020),
    S(cuMemAlloc, 2000),
    S(cuMemAlloc_v2, 3020),
    S(cuMemFree, 2000),
    S(cuMemFree_v2, 3020),
    S(cuMemGetAddressRange, 2000),
    S(cuMemGetAddressRange_v2, 3020),
    S(cuMemAllocHost, 2000),
    S(cuMemAllocHost_v2, 3020),
    S(cuMemFreeHost, 2000),
    S(cuMemHostAlloc, 2020),
    S(cuMemAllocManaged, 6000),
    S(cuMemHostRegister, 4000),
    S(cuMemHostRegister_v2, 6050),
    S(cuMemHostUnregister, 4000),
    S(cuMemHostGetDevicePointer, 2020),
    S(cuMemHostGetDevicePointer_v2, 3020),
    S(cuPointerGetAttribute, 4000),
    S(cuPointerGetAttributes, 7000),
    S(cuStreamCreate, 2000),
    S(cuStreamCreateWithPriority, 5050),
    S(cuStreamGetCtx, 9020),
    S(cuStreamDestroy, 2000),
    S(cuStreamDestroy_v2, 4000),
    S(cuStreamSynchronize, 2000),
    S(cuStreamQuery, 2000),
    S(cuStreamWaitEvent, 3020),
    S(cuLaunchHostFunc, 10000),
    S(cuEventCreate, 2000),
    S(cuEventRecord, 2000),
    S(cuEventQuery, 2000),
    S(cuEventSynchronize, 2000),
    S(cuEventDestroy, 2000),
    S(cuEventDestroy_v2, 4000),
    S(cuMemcpyHtoD, 2000),
    S(cuMemcpyHtoD_v2, 3020),
    S(cuMemcpyDtoH, 2000),
    S(cuMemcpyDtoH_v2, 3020),
    S(cuMemcpyDtoD, 2000),
    S(cuMemcpyDtoD_v2, 3020),
    S(cuMemcpyHtoDAsync, 2000),
    S(cuMemcpyHtoDAsync_v2, 3020),
    S(cuMemcpyDtoHAsync, 2000),
    S(cuMemcpyDtoHAsync_v2, 3020),
    S(cuMemcpyDtoDAsync, 3000),
    S(cuMemcpyDtoDAsync_v2, 3020),
    S(cuMemcpy, 4000),
    S(cuMemcpyAsync, 4000),
    S(cuMemsetD8, 2000),
    S(cuMemsetD8_v2, 3020),
    S(cuMemcpyBatchAsync, 12080),
    S(cuMemcpyBatchAsync_v2, 13000),
    {"cuGetProcAddress", 11030, NULL},
    {"cuGetProcAddress_v2", 12000, NULL},
#undef S
};

/* The symbol's base name matches entry e: e is the base itself or base + "_vN". */
static bool same_base(const char *base, const char *e)
{
	size_t n = strlen(base);
	return strncmp(base, e, n) == 0 && (e[n] == 0 || (e[n] == '_' && e[n + 1] == 'v' &&
							  e[n + 2] >= '0' && e[n + 2] <= '9'));
}

static CUresult gpa_plain(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

static CUresult proc_address(const char *symbol, void **pfn, int cudaVersion,
			     CUdriverProcAddressQueryResult *status)
{
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	const struct sym *best = NULL;
	bool seen = false;
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		if (!same_base(symbol, syms[i].name))
			continue;
		seen = true;
		if (syms[i].since <= cudaVersion && (!best || syms[i].since > best->since))
			best = &syms[i];
	}
	*pfn = NULL;
	if (best) {
		*pfn = best->fn;
		if (!*pfn) /* cuGetProcAddress itself */
			*pfn = strcmp(best->name, "cuGetProcAddress_v2") == 0
				   ? (void *)cuGetProcAddress_v2
				   : (void *)gpa_plain;
	}
	if (status)
		*status = best ? CU_GET_PROC_ADDRESS_SUCCESS
			       : (seen ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
				       : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
				  CUdriverProcAddressQueryResult *symbolStatus)
{
	CUresult rc = enter("cuGetProcAddress_v2", false);
	if (rc != CUDA_SUCCESS)
		return rc;
	return proc_address(symbol, pfn, cudaVersion, symbolStatus);
}

static CUresult gpa_plain(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	CUresult rc = enter("cuGetProcAddress", false);
	if (rc != CUDA_SUCCESS)
		return rc;
	return proc_address(symbol, pfn, cudaVersion, NULL);
}

#undef cuGetProcAddress
ALIAS(cuGetProcAddress, gpa_plain);
