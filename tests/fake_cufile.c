/*
 * fake_cufile: a libcufile.so.0 for machines without GPUDirect Storage, so that engines, the
 * shim's cuFile hooks and their tests run anywhere.  It exports the names the real library
 * exports (shim/cufile_types.h lists them; and the driver tunables cuFileDriverSet*, which
 * kvikio resolves), with cuFile's documented conventions: cuFileRead/cuFileWrite return the
 * bytes moved, -1 with errno for a system error, or -CU_FILE_x; calls returning CUfileError_t
 * report err (and cu_err for CUDA errors).  The driver is opened implicitly by the first call
 * that needs it, as the real one is.
 *
 * Memory: a buffer is fake device memory when the fake libcuda.so.1 (tests/fake_cuda.c)
 * knows it: fakecuda_host_view(dptr, len) gives the shadow mapping of the device range, and
 * the bytes are read into that.  Otherwise the pointer is taken as host memory.  Reads on an
 * O_DIRECT fd that the kernel refuses for alignment go through an aligned bounce buffer, as
 * cuFile's own compat path does.
 *
 * Environment:
 *   FAKECUFILE_STATS=DIR   at exit, write DIR/fakecufile.<pid>, one "name value" a line:
 *                          reads (cuFileRead calls), read_bytes (bytes read from files by
 *                          any path), batch_entries (batch reads run), async_reads
 *                          (cuFileReadAsync reads run), writes, write_bytes.
 *   FAKECUFILE_FAIL=LIST   make calls fail on demand.  LIST is comma-separated POINT[@N]:
 *                          POINT fails from its Nth use in the process on (default 1).
 *                            driver_open     cuFileDriverOpen: CU_FILE_DRIVER_NOT_INITIALIZED
 *                            handle_register cuFileHandleRegister: CU_FILE_IO_NOT_SUPPORTED
 *                            buf_register    cuFileBufRegister: CU_FILE_INTERNAL_BUF_REGISTER_ERROR
 *                            read, write     cuFileRead/cuFileWrite: -1, errno EIO
 *                            batch_setup     cuFileBatchIOSetUp: CU_FILE_INTERNAL_BATCH_SETUP_ERROR
 *                            batch_submit    cuFileBatchIOSubmit: CU_FILE_BATCH_SUBMIT_FAILED
 *                            batch_io        each batch entry: CUFILE_FAILED, ret -EIO
 *                            async           cuFileReadAsync/WriteAsync:
 * CU_FILE_ASYNC_NOT_SUPPORTED async_io        the async op when run: *bytes_read_p = -1
 *                            stream_register cuFileStreamRegister: CU_FILE_INVALID_VALUE
 *                            corrupt         any read succeeds with its first byte inverted
 *                                            (for tests that the caller's check can fail)
 *   FAKECUFILE_SUBMIT_DELAY_US=US  cuFileBatchIOSubmit sleeps US microseconds before it
 *                          answers (to widen a race for a test)
 *   FAKECUFILE_POSIX=1     compatibility mode: move file data with libc's pread/pwrite, which
 *                          an LD_PRELOAD interposer sees, as libcufile's compatibility mode
 *                          does ("using POSIX pread, pwrite").  A cuFileWrite then registers a
 *                          handle of its own for a duplicate of the descriptor, through its
 *                          exported cuFileHandleRegister, writes through it and deregisters it
 *                          the same way.  By default the data moves by raw system calls, as
 *                          GPUDirect's DMA is invisible to libc hooks: whatever the fake reads
 *                          bypassed the shim's cache.
 * Nothing is ever written to stdout; a malformed FAKECUFILE_FAIL is reported once on stderr.
 *
 * What the real libcufile does that callers must not be surprised by, modelled here:
 *  - "APIs with GPU buffers should be called in a valid CUDA context" (GDS best practices):
 *    cuFileRead, cuFileWrite, cuFileBatchIOSubmit and the async calls refuse a buffer in
 *    (fake) device memory with CU_FILE_INVALID_CONTEXT_ERROR when no context is current on
 *    the calling thread.  The library's own threads (batch workers, stream host functions)
 *    carry on with what was checked at the call.
 *  - libcufile 1.20 calls its own exported entry points through its PLT (objdump: calls of
 *    cuFileHandleRegister@plt, cuFileStreamDeregister@plt, cuFileDriverOpen@plt), which an
 *    interposer that exports those names receives: here cuFileStreamRegister of a stream
 *    registered already deregisters it first, cuFileDriverClose deregisters the streams
 *    still registered, the implicit open is a call of cuFileDriverOpen, and compatibility
 *    mode's cuFileWrite registers its own handle (above), all through the exported names.
 *    Which of the real library's calls make them is not known; that they happen is.
 *
 * DESIGN (threads).  File handles, registered buffers, batches and streams live in fixed
 * tables under one mutex each (`tables`), taken only to look up, add or remove; never across
 * I/O.  Each batch has its own mutex and a worker thread: Submit queues entries (state
 * PENDING) and signals `work`; the worker takes the oldest, marks it RUNNING, drops the lock
 * for the pread/pwrite, then stores its result, moves it to the done ring and signals `done`;
 * GetStatus waits on `done` and hands out each finished entry once.  Lock order: tables before
 * a batch's lock (Destroy takes the batch off the table first, then stops its worker).  The
 * counters are atomics, read only by the exit handler.  Async ops carry their own copy of
 * everything they need and run either on the fake libcuda's stream thread (cuLaunchHostFunc)
 * or synchronously in the caller.
 */
#include "cufile_types.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <stdbool.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

#define MAX_HANDLES	  1024
#define MAX_BUFS	  1024
#define MAX_BATCHES	  256
#define MAX_STREAMS	  64
#define MAX_BATCH_ENTRIES 128 /* cuFile's default properties.io_batchsize */
#define DIO_ALIGN	  4096
#define FAKE_VERSION	  1200 /* 1.20, as major * 1000 + minor * 10 */

/* --- counters --------------------------------------------------------------------------- */

enum counter {
	C_READS,
	C_READ_BYTES,
	C_BATCH_ENTRIES,
	C_ASYNC_READS,
	C_WRITES,
	C_WRITE_BYTES,
	C_BATCH_SUBMITS,
	C_N
};
static const char *const counter_names[C_N] = {"reads",	       "read_bytes", "batch_entries",
					       "async_reads",  "writes",     "write_bytes",
					       "batch_submits"};
static atomic_ullong counters[C_N];

/* Add v to counter c. */
static void count(enum counter c, unsigned long long v)
{
	atomic_fetch_add_explicit(&counters[c], v, memory_order_relaxed);
}

/* At exit, write the counters to $FAKECUFILE_STATS/fakecufile.<pid> when that is a folder. */
__attribute__((destructor)) static void write_stats(void)
{
	const char *dir = getenv("FAKECUFILE_STATS");
	char path[4096], tmp[4200];
	struct stat st;
	FILE *f;

	if (!dir || !*dir || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return;
	snprintf(path, sizeof(path), "%s/fakecufile.%d", dir, (int)getpid());
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return;
	for (int i = 0; i < C_N; i++)
		fprintf(
		    f, "%s %llu\n", counter_names[i],
		    (unsigned long long)atomic_load_explicit(&counters[i], memory_order_relaxed));
	if (fclose(f) == 0)
		rename(tmp, path);
	else
		unlink(tmp);
}

/* --- failure on demand ------------------------------------------------------------------ */

enum fail_point {
	F_DRIVER_OPEN,
	F_HANDLE_REGISTER,
	F_BUF_REGISTER,
	F_READ,
	F_WRITE,
	F_BATCH_SETUP,
	F_BATCH_SUBMIT,
	F_BATCH_IO,
	F_ASYNC,
	F_ASYNC_IO,
	F_STREAM_REGISTER,
	F_CORRUPT,
	F_N
};
static const char *const fail_names[F_N] = {
    "driver_open",  "handle_register", "buf_register", "read",	   "write",	      "batch_setup",
    "batch_submit", "batch_io",	       "async",	       "async_io", "stream_register", "corrupt"};
static unsigned long fail_from[F_N]; /* 0: never; set once under env_once */
static atomic_ulong fail_uses[F_N];
static int posix_io;		      /* FAKECUFILE_POSIX=1; set once under env_once */
static unsigned long submit_delay_us; /* FAKECUFILE_SUBMIT_DELAY_US; set once under env_once */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

/* Read FAKECUFILE_POSIX and parse FAKECUFILE_FAIL (once); a bad item is reported and skipped. */
static void env_parse(void)
{
	const char *env = getenv("FAKECUFILE_FAIL");
	const char *posix = getenv("FAKECUFILE_POSIX");
	char *copy, *save = NULL;

	const char *delay = getenv("FAKECUFILE_SUBMIT_DELAY_US");

	posix_io = posix && strcmp(posix, "1") == 0;
	submit_delay_us = delay ? strtoul(delay, NULL, 10) : 0;
	if (!env || !*env || !(copy = strdup(env)))
		return;
	for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *at = strchr(item, '@');
		unsigned long from = 1;
		int i;

		if (at) {
			char *end;

			*at = '\0';
			from = strtoul(at + 1, &end, 10);
			if (*end || from == 0)
				from = 0;
		}
		for (i = 0; i < F_N && strcmp(item, fail_names[i]) != 0; i++)
			;
		if (i == F_N || from == 0)
			fprintf(stderr, "fakecufile: FAKECUFILE_FAIL: ignoring '%s'\n", item);
		else
			fail_from[i] = from;
	}
	free(copy);
}

/* Count one use of point p; true when this use is to fail. */
static int should_fail(enum fail_point p)
{
	unsigned long n;

	pthread_once(&env_once, env_parse);
	n = atomic_fetch_add_explicit(&fail_uses[p], 1, memory_order_relaxed) + 1;
	return fail_from[p] && n >= fail_from[p];
}

/* --- the fake libcuda, when present ----------------------------------------------------- */

typedef void *(*host_view_fn)(unsigned long long dptr, size_t len);
typedef void (*host_fn)(void *user);
typedef int (*launch_host_func_fn)(kvs_cu_stream_t stream, host_fn fn, void *user);

/* Look sym up in an already loaded libcuda.so.1 (an engine dlopens it RTLD_LOCAL), else globally.
 */
static void *cuda_sym(const char *sym)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void *p = h ? dlsym(h, sym) : NULL;

	/* The NOLOAD reference is kept, not closed: the pointer must stay valid. */
	return p ? p : dlsym(RTLD_DEFAULT, sym);
}

static _Atomic(host_view_fn) host_view_ptr;
static _Atomic(launch_host_func_fn) launch_ptr;

/* fakecuda_host_view, or NULL while no fake libcuda is loaded (looked up again until found). */
static host_view_fn host_view(void)
{
	host_view_fn f = atomic_load_explicit(&host_view_ptr, memory_order_acquire);

	if (!f) {
		f = (host_view_fn)cuda_sym("fakecuda_host_view");
		atomic_store_explicit(&host_view_ptr, f,
				      memory_order_release); /* pairs: load above */
	}
	return f;
}

/* cuLaunchHostFunc of the loaded libcuda, or NULL. */
static launch_host_func_fn launch_host_func(void)
{
	launch_host_func_fn f = atomic_load_explicit(&launch_ptr, memory_order_acquire);

	if (!f) {
		f = (launch_host_func_fn)cuda_sym("cuLaunchHostFunc");
		atomic_store_explicit(&launch_ptr, f, memory_order_release); /* pairs: load above */
	}
	return f;
}

typedef int (*ctx_get_current_fn)(void **ctx);
static _Atomic(ctx_get_current_fn) ctx_current_ptr;

/* 0 when [base + off, +len) is host memory or a context is current on this thread, else
 * CU_FILE_INVALID_CONTEXT_ERROR: a GPU buffer needs the caller's context. */
static int need_context(const void *base, off_t off, size_t len)
{
	host_view_fn view = host_view();
	ctx_get_current_fn cur = atomic_load_explicit(&ctx_current_ptr, memory_order_acquire);
	void *ctx = NULL;

	if (!view || !base || off < 0 ||
	    !view((unsigned long long)(uintptr_t)base + (unsigned long long)off, len ? len : 1))
		return 0;
	if (!cur) {
		cur = (ctx_get_current_fn)cuda_sym("cuCtxGetCurrent");
		atomic_store_explicit(&ctx_current_ptr, cur,
				      memory_order_release); /* pairs: above */
	}
	if (!cur || cur(&ctx) != 0 || !ctx)
		return KVS_CU_FILE_INVALID_CONTEXT_ERROR;
	return 0;
}

/*
 * Point *out at the host bytes behind [base + off, +len): the shadow of fake device memory,
 * else base + off itself as host memory.  Returns 0 or a CU_FILE error code (positive).
 */
static int resolve_buf(const void *base, off_t off, size_t len, char **out)
{
	host_view_fn view = host_view();
	unsigned long long dptr = (unsigned long long)(uintptr_t)base + (unsigned long long)off;
	void *h;

	if (!base || off < 0)
		return KVS_CU_FILE_INVALID_VALUE;
	if (view) {
		h = view(dptr, len ? len : 1);
		if (h) {
			*out = h;
			return 0;
		}
		if (view((unsigned long long)(uintptr_t)base, 1))
			return KVS_CU_FILE_CUDA_POINTER_RANGE_ERROR; /* device memory, range too
									long */
	}
	*out = (char *)(uintptr_t)dptr;
	return 0;
}

/* --- the driver and file handles --------------------------------------------------------- */

struct fake_handle {
	int used;
	int fd;
	int direct; /* fd had O_DIRECT when registered */
};

static pthread_mutex_t tables = PTHREAD_MUTEX_INITIALIZER;
static struct fake_handle handles[MAX_HANDLES];
static struct {
	const void *base;
	size_t len;
} bufs[MAX_BUFS];
static atomic_long driver_users;

/* A CUfileError_t. */
static kvs_cufile_error_t cf_err(kvs_cufile_op_error_t e)
{
	return (kvs_cufile_error_t){.err = e, .cu_err = 0};
}

API kvs_cufile_error_t cuFileDriverOpen(void);

/* Open the driver implicitly on first use, as the real library does: through its exported
 * cuFileDriverOpen (an interposer sees the call). */
static void driver_need(void)
{
	if (atomic_load(&driver_users) == 0)
		cuFileDriverOpen();
}

static void streams_deregister_all(void);

/* Drop one open of the driver; CU_FILE_DRIVER_NOT_INITIALIZED when it is not open.  The last
 * close deregisters the streams still registered, through the exported name. */
static kvs_cufile_error_t driver_close(void)
{
	long n = atomic_load(&driver_users);

	while (n > 0 && !atomic_compare_exchange_weak(&driver_users, &n, n - 1))
		;
	if (n == 1)
		streams_deregister_all();
	return cf_err(n > 0 ? KVS_CU_FILE_SUCCESS : KVS_CU_FILE_DRIVER_NOT_INITIALIZED);
}

/* The fd and O_DIRECT flag of a registered handle; 0 or a CU_FILE error code. */
static int handle_get(kvs_cufile_handle_t fh, int *fd, int *direct)
{
	struct fake_handle *h = fh;
	int rc = KVS_CU_FILE_INVALID_VALUE;

	if (h < handles || h >= handles + MAX_HANDLES ||
	    ((char *)h - (char *)handles) % sizeof(*h) != 0)
		return rc;
	pthread_mutex_lock(&tables); /* pairs: unlock below */
	if (h->used) {
		*fd = h->fd;
		*direct = h->direct;
		rc = 0;
	}
	pthread_mutex_unlock(&tables);
	return rc;
}

/* Open the (fake) driver; a second open is counted, as cuFileUseCount reports. */
API kvs_cufile_error_t cuFileDriverOpen(void)
{
	if (should_fail(F_DRIVER_OPEN))
		return cf_err(KVS_CU_FILE_DRIVER_NOT_INITIALIZED);
	atomic_fetch_add(&driver_users, 1);
	return cf_err(KVS_CU_FILE_SUCCESS);
}

/* Close the driver (the name cufile.h's cuFileDriverClose macro binds callers to). */
API kvs_cufile_error_t cuFileDriverClose_v2(void)
{
	return driver_close();
}

/* The older name of cuFileDriverClose_v2, still exported by the real library. */
API kvs_cufile_error_t cuFileDriverClose(void)
{
	return driver_close();
}

/* How many opens of the driver are outstanding. */
API long cuFileUseCount(void)
{
	return atomic_load(&driver_users);
}

/* Fill *props: zero but for the batch limit and the largest direct I/O. */
API kvs_cufile_error_t cuFileDriverGetProperties(kvs_cufile_drv_props_t *props)
{
	if (!props)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	driver_need();
	memset(props, 0, sizeof(*props));
	props->nvfs.max_direct_io_size = 16u << 20;
	props->max_batch_io_size = MAX_BATCH_ENTRIES;
	return cf_err(KVS_CU_FILE_SUCCESS);
}

/*
 * The driver's tunables.  The fake has no poll mode, bounce-buffer cache or pinned-memory
 * pool to size, so each accepts its value and ignores it.  They are exported because
 * callers resolve them all before any I/O and give up on cuFile when one is missing
 * (kvikio's cuFileAPI dlsym()s every one of them).
 */
API kvs_cufile_error_t cuFileDriverSetPollMode(_Bool poll, size_t poll_threshold_size)
{
	(void)poll;
	(void)poll_threshold_size;
	return cf_err(KVS_CU_FILE_SUCCESS);
}

API kvs_cufile_error_t cuFileDriverSetMaxDirectIOSize(size_t max_direct_io_size)
{
	(void)max_direct_io_size;
	return cf_err(KVS_CU_FILE_SUCCESS);
}

API kvs_cufile_error_t cuFileDriverSetMaxCacheSize(size_t max_cache_size)
{
	(void)max_cache_size;
	return cf_err(KVS_CU_FILE_SUCCESS);
}

API kvs_cufile_error_t cuFileDriverSetMaxPinnedMemSize(size_t max_pinned_size)
{
	(void)max_pinned_size;
	return cf_err(KVS_CU_FILE_SUCCESS);
}

/* The library's version, major * 1000 + minor * 10. */
API kvs_cufile_error_t cuFileGetVersion(int *version)
{
	if (!version)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	*version = FAKE_VERSION;
	return cf_err(KVS_CU_FILE_SUCCESS);
}

/* Register a regular file's fd (OPAQUE_FD only); a second registration of one fd is refused. */
API kvs_cufile_error_t cuFileHandleRegister(kvs_cufile_handle_t *fh, kvs_cufile_descr_t *descr)
{
	struct stat st;
	int fl, slot = -1;

	if (!fh || !descr)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	if (descr->type != KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD)
		return cf_err(KVS_CU_FILE_IO_NOT_SUPPORTED);
	if (fstat(descr->handle.fd, &st) != 0 || (fl = fcntl(descr->handle.fd, F_GETFL)) < 0)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	if (!S_ISREG(st.st_mode))
		return cf_err(KVS_CU_FILE_INVALID_FILE_TYPE);
	if (should_fail(F_HANDLE_REGISTER))
		return cf_err(KVS_CU_FILE_IO_NOT_SUPPORTED);
	driver_need();
	pthread_mutex_lock(&tables); /* pairs: unlock below */
	for (int i = 0; i < MAX_HANDLES; i++) {
		if (handles[i].used && handles[i].fd == descr->handle.fd) {
			pthread_mutex_unlock(&tables);
			return cf_err(KVS_CU_FILE_HANDLE_ALREADY_REGISTERED);
		}
		if (!handles[i].used && slot < 0)
			slot = i;
	}
	if (slot >= 0)
		handles[slot] = (struct fake_handle){
		    .used = 1, .fd = descr->handle.fd, .direct = (fl & O_DIRECT) != 0};
	pthread_mutex_unlock(&tables);
	if (slot < 0)
		return cf_err(KVS_CU_FILE_NOMEM_ERROR);
	*fh = &handles[slot];
	return cf_err(KVS_CU_FILE_SUCCESS);
}

/* Forget a handle; the fd stays open (the caller owns it). */
API void cuFileHandleDeregister(kvs_cufile_handle_t fh)
{
	int fd, direct;

	if (handle_get(fh, &fd, &direct) != 0)
		return;
	pthread_mutex_lock(&tables); /* pairs: unlock below */
	((struct fake_handle *)fh)->used = 0;
	pthread_mutex_unlock(&tables);
}

/* Record a buffer as registered; registering one base twice is refused. */
API kvs_cufile_error_t cuFileBufRegister(const void *bufPtr_base, size_t length, int flags)
{
	int slot = -1, rc = KVS_CU_FILE_SUCCESS;

	if (!bufPtr_base || !length)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	if (should_fail(F_BUF_REGISTER))
		return cf_err(KVS_CU_FILE_INTERNAL_BUF_REGISTER_ERROR);
	driver_need();
	pthread_mutex_lock(&tables); /* pairs: unlock below */
	for (int i = 0; i < MAX_BUFS; i++) {
		if (bufs[i].base == bufPtr_base) {
			rc = KVS_CU_FILE_MEMORY_ALREADY_REGISTERED;
			break;
		}
		if (!bufs[i].base && slot < 0)
			slot = i;
	}
	if (rc == KVS_CU_FILE_SUCCESS && slot < 0)
		rc = KVS_CU_FILE_NOMEM_ERROR;
	if (rc == KVS_CU_FILE_SUCCESS) {
		bufs[slot].base = bufPtr_base;
		bufs[slot].len = length;
	}
	pthread_mutex_unlock(&tables);
	return cf_err(rc);
}

/* Forget a registered buffer; CU_FILE_INVALID_VALUE if it was not registered. */
API kvs_cufile_error_t cuFileBufDeregister(const void *bufPtr_base)
{
	int rc = KVS_CU_FILE_INVALID_VALUE;

	pthread_mutex_lock(&tables); /* pairs: unlock below */
	for (int i = 0; bufPtr_base && i < MAX_BUFS; i++) {
		if (bufs[i].base == bufPtr_base) {
			bufs[i].base = NULL;
			rc = KVS_CU_FILE_SUCCESS;
			break;
		}
	}
	pthread_mutex_unlock(&tables);
	return cf_err(rc);
}

/* --- reads and writes ------------------------------------------------------------------- */

/* One pread or pwrite: libc's under FAKECUFILE_POSIX=1, else the raw system call. */
static ssize_t prw(int fd, int write, char *buf, size_t size, off_t off)
{
	pthread_once(&env_once, env_parse);
	if (posix_io)
		return write ? pwrite(fd, buf, size, off) : pread(fd, buf, size, off);
	return syscall(write ? SYS_pwrite64 : SYS_pread64, fd, buf, size, off);
}

/* pread/pwrite all of [buf, +size) at off, stopping at EOF; bytes moved, or -1 with errno. */
static ssize_t move_all(int fd, int write, char *buf, size_t size, off_t off)
{
	size_t done = 0;

	while (done < size) {
		ssize_t n = prw(fd, write, buf + done, size - done, off + (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return done ? (ssize_t)done : -1;
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

/*
 * Read size bytes at off into buf through a 4 KiB-aligned bounce buffer, for an O_DIRECT fd
 * and a request the kernel refuses as unaligned.  Bytes read, or -1 with errno.
 */
static ssize_t read_bounced(int fd, char *buf, size_t size, off_t off)
{
	off_t start = off & ~(off_t)(DIO_ALIGN - 1);
	size_t span = ((size_t)(off - start) + size + DIO_ALIGN - 1) & ~(size_t)(DIO_ALIGN - 1);
	void *bounce;
	ssize_t n;

	if (posix_memalign(&bounce, DIO_ALIGN, span) != 0) {
		errno = ENOMEM;
		return -1;
	}
	n = move_all(fd, 0, bounce, span, start);
	if (n >= 0) {
		n -= off - start;
		n = n < 0 ? 0 : (size_t)n > size ? (ssize_t)size : n;
		memcpy(buf, (char *)bounce + (off - start), (size_t)n);
	}
	free(bounce);
	return n;
}

/*
 * One cuFile read or write of [base + buf_off, +size) at file_off on handle fh: bytes moved,
 * -1 with errno, or -CU_FILE_x.  Counts read_bytes/write_bytes; the caller counts the op.
 */
static ssize_t do_io(kvs_cufile_handle_t fh, int write, const void *base, size_t size,
		     off_t file_off, off_t buf_off)
{
	int fd, direct, rc;
	char *buf;
	ssize_t n;

	if ((rc = handle_get(fh, &fd, &direct)) != 0)
		return -rc;
	if (file_off < 0 || buf_off < 0)
		return -KVS_CU_FILE_INVALID_VALUE;
	if ((rc = resolve_buf(base, buf_off, size, &buf)) != 0)
		return -rc;
	if (size == 0)
		return 0;
	n = move_all(fd, write, buf, size, file_off);
	if (n < 0 && errno == EINVAL && direct && !write)
		n = read_bounced(fd, buf, size, file_off);
	if (n > 0)
		count(write ? C_WRITE_BYTES : C_READ_BYTES, (unsigned long long)n);
	if (n > 0 && !write && should_fail(F_CORRUPT))
		buf[0] = (char)~buf[0];
	return n;
}

/* Read size bytes at file_offset into device or host memory: bytes, -1 + errno, or -CU_FILE_x. */
API ssize_t cuFileRead(kvs_cufile_handle_t fh, void *bufPtr_base, size_t size, off_t file_offset,
		       off_t bufPtr_offset)
{
	int rc;

	count(C_READS, 1);
	if (should_fail(F_READ)) {
		errno = EIO;
		return -1;
	}
	if ((rc = need_context(bufPtr_base, bufPtr_offset, size)) != 0)
		return -rc;
	return do_io(fh, 0, bufPtr_base, size, file_offset, bufPtr_offset);
}

/* Write size bytes at file_offset from device or host memory, with cuFileRead's conventions.
 * Compatibility mode (FAKECUFILE_POSIX=1) writes through a handle of its own, registered and
 * deregistered through the exported names, of a duplicate of the descriptor. */
API ssize_t cuFileWrite(kvs_cufile_handle_t fh, const void *bufPtr_base, size_t size,
			off_t file_offset, off_t bufPtr_offset)
{
	kvs_cufile_descr_t descr = {.type = KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD};
	kvs_cufile_handle_t own;
	int fd, direct, rc;
	ssize_t n;

	count(C_WRITES, 1);
	if (should_fail(F_WRITE)) {
		errno = EIO;
		return -1;
	}
	if ((rc = need_context(bufPtr_base, bufPtr_offset, size)) != 0)
		return -rc;
	pthread_once(&env_once, env_parse);
	if (!posix_io || handle_get(fh, &fd, &direct) != 0 ||
	    (descr.handle.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return do_io(fh, 1, bufPtr_base, size, file_offset, bufPtr_offset);
	if (cuFileHandleRegister(&own, &descr).err != KVS_CU_FILE_SUCCESS) {
		close(descr.handle.fd);
		return do_io(fh, 1, bufPtr_base, size, file_offset, bufPtr_offset);
	}
	n = do_io(own, 1, bufPtr_base, size, file_offset, bufPtr_offset);
	cuFileHandleDeregister(own);
	close(descr.handle.fd);
	return n;
}

/* --- batches ---------------------------------------------------------------------------- */

enum slot_state { S_FREE, S_PENDING, S_RUNNING, S_DONE };

struct batch_slot {
	enum slot_state state;
	kvs_cufile_io_params_t p;
	kvs_cufile_status_t status; /* when S_DONE */
	ssize_t ret;
};

struct batch {
	pthread_mutex_t lock;
	pthread_cond_t work; /* worker waits: something PENDING, or stop */
	pthread_cond_t done; /* GetStatus and Cancel wait: an entry finished */
	pthread_t worker;
	int stop;
	unsigned max;
	struct batch_slot *slot;
	unsigned *todo; /* ring of PENDING slot indices in submission order */
	unsigned todo_head, todo_tail;
	unsigned *fin; /* ring of S_DONE slot indices not yet reported, in completion order */
	unsigned fin_head, fin_tail;
	unsigned used;	  /* slots not S_FREE */
	unsigned running; /* slots S_RUNNING */
};

static struct batch *batches[MAX_BATCHES];

/* Whether b is a live batch (under `tables`). */
static int batch_live(const struct batch *b)
{
	for (int i = 0; b && i < MAX_BATCHES; i++)
		if (batches[i] == b)
			return 1;
	return 0;
}

/* Finish slot i with status and ret (under b->lock) and queue it for GetStatus. */
static void slot_finish(struct batch *b, unsigned i, kvs_cufile_status_t status, ssize_t ret)
{
	b->slot[i].state = S_DONE;
	b->slot[i].status = status;
	b->slot[i].ret = ret;
	b->fin[b->fin_tail++ % b->max] = i;
	pthread_cond_broadcast(&b->done);
}

/* The worker: run PENDING entries in order, one at a time, without the lock during I/O. */
static void *batch_worker(void *arg)
{
	struct batch *b = arg;

	pthread_mutex_lock(&b->lock); /* pairs: unlock at the end */
	for (;;) {
		kvs_cufile_io_params_t p;
		unsigned i;
		ssize_t n;

		while (!b->stop && b->todo_head == b->todo_tail)
			pthread_cond_wait(&b->work, &b->lock);
		if (b->stop)
			break;
		i = b->todo[b->todo_head++ % b->max];
		if (b->slot[i].state != S_PENDING)
			continue; /* cancelled while queued */
		b->slot[i].state = S_RUNNING;
		b->running++;
		p = b->slot[i].p;
		pthread_mutex_unlock(&b->lock);
		if (should_fail(F_BATCH_IO)) {
			n = -EIO;
		} else {
			n = do_io(p.fh, p.opcode == KVS_CUFILE_WRITE, p.u.batch.devPtr_base,
				  p.u.batch.size, p.u.batch.file_offset, p.u.batch.devPtr_offset);
			if (n == -1)
				n = -errno;
		}
		if (p.opcode == KVS_CUFILE_READ)
			count(C_BATCH_ENTRIES, 1);
		pthread_mutex_lock(&b->lock);
		b->running--;
		slot_finish(b, i, n >= 0 ? KVS_CUFILE_COMPLETE : KVS_CUFILE_FAILED, n);
	}
	pthread_mutex_unlock(&b->lock);
	return NULL;
}

/* Create a batch of at most nr outstanding entries, with its worker thread. */
API kvs_cufile_error_t cuFileBatchIOSetUp(kvs_cufile_batch_handle_t *batch_idp, unsigned nr)
{
	struct batch *b;
	int slot = -1;

	if (!batch_idp || nr == 0 || nr > MAX_BATCH_ENTRIES)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	if (should_fail(F_BATCH_SETUP))
		return cf_err(KVS_CU_FILE_INTERNAL_BATCH_SETUP_ERROR);
	driver_need();
	b = calloc(1, sizeof(*b));
	if (!b)
		return cf_err(KVS_CU_FILE_NOMEM_ERROR);
	b->max = nr;
	b->slot = calloc(nr, sizeof(*b->slot));
	b->todo = calloc(nr, sizeof(*b->todo));
	b->fin = calloc(nr, sizeof(*b->fin));
	if (!b->slot || !b->todo || !b->fin)
		goto err_free;
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->work, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&b->done, &ca);
		pthread_condattr_destroy(&ca);
	}
	pthread_mutex_lock(&tables); /* pairs: unlock below */
	for (int i = 0; i < MAX_BATCHES && slot < 0; i++)
		if (!batches[i])
			slot = i;
	if (slot >= 0)
		batches[slot] = b;
	pthread_mutex_unlock(&tables);
	if (slot < 0)
		goto err_sync;
	if (pthread_create(&b->worker, NULL, batch_worker, b) != 0)
		goto err_table;
	*batch_idp = b;
	return cf_err(KVS_CU_FILE_SUCCESS);

err_table:
	pthread_mutex_lock(&tables);
	batches[slot] = NULL;
	pthread_mutex_unlock(&tables);
err_sync:
	pthread_cond_destroy(&b->done);
	pthread_cond_destroy(&b->work);
	pthread_mutex_destroy(&b->lock);
err_free:
	free(b->fin);
	free(b->todo);
	free(b->slot);
	free(b);
	return cf_err(KVS_CU_FILE_INTERNAL_BATCH_SETUP_ERROR);
}

/* Lock and return batch h if it is live, else NULL; the caller unlocks b->lock. */
static struct batch *batch_lock(kvs_cufile_batch_handle_t h)
{
	struct batch *b = h;

	pthread_mutex_lock(&tables); /* pairs: unlock below; order: tables, then b->lock */
	if (!batch_live(b))
		b = NULL;
	else
		pthread_mutex_lock(&b->lock);
	pthread_mutex_unlock(&tables);
	return b;
}

/* Queue nr entries; all are checked first, and none is queued if one is ill-formed. */
API kvs_cufile_error_t cuFileBatchIOSubmit(kvs_cufile_batch_handle_t batch_idp, unsigned nr,
					   kvs_cufile_io_params_t *iocbp, unsigned int flags)
{
	struct batch *b;
	int fd, direct;

	if (!iocbp || nr == 0)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	for (unsigned k = 0; k < nr; k++) {
		const kvs_cufile_io_params_t *p = &iocbp[k];
		int rc;

		if (p->mode != KVS_CUFILE_BATCH ||
		    (p->opcode != KVS_CUFILE_READ && p->opcode != KVS_CUFILE_WRITE) ||
		    !p->u.batch.devPtr_base || p->u.batch.file_offset < 0 ||
		    p->u.batch.devPtr_offset < 0 || handle_get(p->fh, &fd, &direct) != 0)
			return cf_err(KVS_CU_FILE_INVALID_VALUE);
		if ((rc = need_context(p->u.batch.devPtr_base, p->u.batch.devPtr_offset,
				       p->u.batch.size)) != 0)
			return cf_err(rc);
	}
	bool fails = should_fail(F_BATCH_SUBMIT); /* parses the environment first */
	if (submit_delay_us)
		usleep((useconds_t)submit_delay_us);
	if (fails)
		return cf_err(KVS_CU_FILE_BATCH_SUBMIT_FAILED);
	if (!(b = batch_lock(batch_idp)))
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	if (nr > b->max || nr > b->max - b->used) {
		pthread_mutex_unlock(&b->lock);
		return cf_err(nr > b->max ? KVS_CU_FILE_INVALID_VALUE : KVS_CU_FILE_BATCH_FULL);
	}
	count(C_BATCH_SUBMITS, 1);
	for (unsigned k = 0, i = 0; k < nr; k++) {
		while (b->slot[i].state != S_FREE)
			i++;
		b->slot[i].state = S_PENDING;
		b->slot[i].p = iocbp[k];
		b->todo[b->todo_tail++ % b->max] = i;
		b->used++;
	}
	pthread_cond_signal(&b->work);
	pthread_mutex_unlock(&b->lock);
	return cf_err(KVS_CU_FILE_SUCCESS);
}

/*
 * Report up to *nr finished entries, each once, waiting until min_nr are finished, the
 * timeout (relative; NULL waits without limit) passes, or nothing more can finish.
 */
API kvs_cufile_error_t cuFileBatchIOGetStatus(kvs_cufile_batch_handle_t batch_idp, unsigned min_nr,
					      unsigned *nr, kvs_cufile_io_events_t *iocbp,
					      struct timespec *timeout)
{
	struct timespec deadline;
	struct batch *b;
	unsigned got = 0;

	if (!nr || !iocbp || min_nr > *nr)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	if (timeout) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_sec += timeout->tv_sec;
		deadline.tv_nsec += timeout->tv_nsec;
		while (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
	}
	if (!(b = batch_lock(batch_idp)))
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	for (;;) {
		unsigned finished = b->fin_tail - b->fin_head;
		unsigned unfinished = b->used - finished;

		if (finished >= min_nr || unfinished == 0)
			break;
		if (!timeout)
			pthread_cond_wait(&b->done, &b->lock);
		else if (pthread_cond_timedwait(&b->done, &b->lock, &deadline) == ETIMEDOUT)
			break;
	}
	while (got < *nr && b->fin_head != b->fin_tail) {
		unsigned i = b->fin[b->fin_head++ % b->max];

		iocbp[got].cookie = b->slot[i].p.cookie;
		iocbp[got].status = b->slot[i].status;
		iocbp[got].ret = (size_t)b->slot[i].ret;
		b->slot[i].state = S_FREE;
		b->used--;
		got++;
	}
	pthread_mutex_unlock(&b->lock);
	*nr = got;
	return cf_err(KVS_CU_FILE_SUCCESS);
}

/* Cancel what has not started (reported as CUFILE_CANCELED) and wait for what has. */
static void batch_cancel_locked(struct batch *b)
{
	for (unsigned i = 0; i < b->max; i++)
		if (b->slot[i].state == S_PENDING)
			slot_finish(b, i, KVS_CUFILE_CANCELED, -ECANCELED);
	while (b->running)
		pthread_cond_wait(&b->done, &b->lock);
}

/* Cancel the batch's outstanding entries. */
API kvs_cufile_error_t cuFileBatchIOCancel(kvs_cufile_batch_handle_t batch_idp)
{
	struct batch *b = batch_lock(batch_idp);

	if (!b)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	batch_cancel_locked(b);
	pthread_mutex_unlock(&b->lock);
	return cf_err(KVS_CU_FILE_SUCCESS);
}

/* Cancel what is outstanding, stop the worker and free the batch. */
API void cuFileBatchIODestroy(kvs_cufile_batch_handle_t batch_idp)
{
	struct batch *b = batch_idp;
	int live = 0;

	pthread_mutex_lock(&tables); /* pairs: unlock below */
	for (int i = 0; b && i < MAX_BATCHES; i++) {
		if (batches[i] == b) {
			batches[i] = NULL;
			live = 1;
		}
	}
	pthread_mutex_unlock(&tables);
	if (!live)
		return;
	pthread_mutex_lock(&b->lock); /* pairs: unlock below */
	batch_cancel_locked(b);
	b->stop = 1;
	pthread_cond_signal(&b->work);
	pthread_mutex_unlock(&b->lock);
	pthread_join(b->worker, NULL);
	pthread_cond_destroy(&b->done);
	pthread_cond_destroy(&b->work);
	pthread_mutex_destroy(&b->lock);
	free(b->fin);
	free(b->todo);
	free(b->slot);
	free(b);
}

/* --- stream-ordered reads and writes ---------------------------------------------------- */

static struct {
	int used;
	kvs_cu_stream_t stream;
	unsigned flags;
} streams[MAX_STREAMS];

/* The flags stream was registered with, 0 if it was not. */
static unsigned stream_flags(kvs_cu_stream_t stream)
{
	unsigned flags = 0;

	pthread_mutex_lock(&tables); /* pairs: unlock below */
	for (int i = 0; i < MAX_STREAMS; i++)
		if (streams[i].used && streams[i].stream == stream)
			flags = streams[i].flags;
	pthread_mutex_unlock(&tables);
	return flags;
}

API kvs_cufile_error_t cuFileStreamDeregister(kvs_cu_stream_t stream);

/* Register stream (NULL is the default stream) with CU_FILE_STREAM_* flags; one registered
 * already is deregistered first, through the exported cuFileStreamDeregister. */
API kvs_cufile_error_t cuFileStreamRegister(kvs_cu_stream_t stream, unsigned flags)
{
	int slot = -1;

	if (flags > 15 || should_fail(F_STREAM_REGISTER))
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	driver_need();
	if (stream_flags(stream))
		cuFileStreamDeregister(stream);
	pthread_mutex_lock(&tables); /* pairs: unlock below */
	for (int i = 0; i < MAX_STREAMS; i++) {
		if (streams[i].used && streams[i].stream == stream) {
			slot = i;
			break;
		}
		if (!streams[i].used && slot < 0)
			slot = i;
	}
	if (slot >= 0) {
		streams[slot].used = 1;
		streams[slot].stream = stream;
		streams[slot].flags = flags;
	}
	pthread_mutex_unlock(&tables);
	return cf_err(slot >= 0 ? KVS_CU_FILE_SUCCESS : KVS_CU_FILE_NOMEM_ERROR);
}

/* Forget a registered stream; CU_FILE_INVALID_VALUE if it was not registered. */
API kvs_cufile_error_t cuFileStreamDeregister(kvs_cu_stream_t stream)
{
	int rc = KVS_CU_FILE_INVALID_VALUE;

	pthread_mutex_lock(&tables); /* pairs: unlock below */
	for (int i = 0; i < MAX_STREAMS; i++) {
		if (streams[i].used && streams[i].stream == stream) {
			streams[i].used = 0;
			rc = KVS_CU_FILE_SUCCESS;
		}
	}
	pthread_mutex_unlock(&tables);
	return cf_err(rc);
}

/* Deregister every stream still registered, each through the exported name. */
static void streams_deregister_all(void)
{
	kvs_cu_stream_t left[MAX_STREAMS];
	int n = 0;

	pthread_mutex_lock(&tables); /* pairs: unlock below */
	for (int i = 0; i < MAX_STREAMS; i++)
		if (streams[i].used)
			left[n++] = streams[i].stream;
	pthread_mutex_unlock(&tables);
	for (int i = 0; i < n; i++)
		cuFileStreamDeregister(left[i]);
}

/* An async op: the values fixed at submission, the pointers to read the others from later. */
struct async_op {
	int write;
	kvs_cufile_handle_t fh;
	void *base;
	unsigned flags; /* the stream's CU_FILE_STREAM_* flags at submission */
	size_t size;
	off_t file_off, buf_off;
	size_t *size_p;
	off_t *file_off_p, *buf_off_p;
	ssize_t *result_p;
};

/* Run an async op when its stream reaches it, store the result, free the op. */
static void async_run(void *arg)
{
	struct async_op *op = arg;
	size_t size = op->flags & KVS_CU_FILE_STREAM_FIXED_FILE_SIZE ? op->size : *op->size_p;
	off_t file_off =
	    op->flags & KVS_CU_FILE_STREAM_FIXED_FILE_OFFSET ? op->file_off : *op->file_off_p;
	off_t buf_off =
	    op->flags & KVS_CU_FILE_STREAM_FIXED_BUF_OFFSET ? op->buf_off : *op->buf_off_p;
	ssize_t n;

	if (should_fail(F_ASYNC_IO)) {
		errno = EIO;
		n = -1;
	} else {
		n = do_io(op->fh, op->write, op->base, size, file_off, buf_off);
	}
	if (!op->write)
		count(C_ASYNC_READS, 1);
	*op->result_p = n;
	free(op);
}

/* Queue an async read or write on stream (cuLaunchHostFunc of the fake libcuda, else now). */
static kvs_cufile_error_t async_submit(int write, kvs_cufile_handle_t fh, void *base,
				       size_t *size_p, off_t *file_off_p, off_t *buf_off_p,
				       ssize_t *result_p, kvs_cu_stream_t stream)
{
	launch_host_func_fn launch = launch_host_func();
	struct async_op *op;
	int fd, direct, rc;

	if (!base || !size_p || !file_off_p || !buf_off_p || !result_p ||
	    handle_get(fh, &fd, &direct) != 0)
		return cf_err(KVS_CU_FILE_INVALID_VALUE);
	if (should_fail(F_ASYNC))
		return cf_err(KVS_CU_FILE_ASYNC_NOT_SUPPORTED);
	if ((rc = need_context(base, *buf_off_p, *size_p)) != 0)
		return cf_err(rc);
	op = malloc(sizeof(*op));
	if (!op)
		return cf_err(KVS_CU_FILE_NOMEM_ERROR);
	*op = (struct async_op){.write = write,
				.fh = fh,
				.base = base,
				.flags = stream_flags(stream),
				.size = *size_p,
				.file_off = *file_off_p,
				.buf_off = *buf_off_p,
				.size_p = size_p,
				.file_off_p = file_off_p,
				.buf_off_p = buf_off_p,
				.result_p = result_p};
	if (!launch) {
		async_run(op);
		return cf_err(KVS_CU_FILE_SUCCESS);
	}
	rc = launch(stream, async_run, op);
	if (rc != 0) {
		free(op);
		return (kvs_cufile_error_t){.err = KVS_CU_FILE_CUDA_DRIVER_ERROR, .cu_err = rc};
	}
	return cf_err(KVS_CU_FILE_SUCCESS);
}

/* Read in stream order; *bytes_read_p gets bytes, -1 (errno) or -CU_FILE_x when it runs. */
API kvs_cufile_error_t cuFileReadAsync(kvs_cufile_handle_t fh, void *bufPtr_base, size_t *size_p,
				       off_t *file_offset_p, off_t *bufPtr_offset_p,
				       ssize_t *bytes_read_p, kvs_cu_stream_t stream)
{
	return async_submit(0, fh, bufPtr_base, size_p, file_offset_p, bufPtr_offset_p,
			    bytes_read_p, stream);
}

/* Write in stream order, with cuFileReadAsync's conventions. */
API kvs_cufile_error_t cuFileWriteAsync(kvs_cufile_handle_t fh, void *bufPtr_base, size_t *size_p,
					off_t *file_offset_p, off_t *bufPtr_offset_p,
					ssize_t *bytes_written_p, kvs_cu_stream_t stream)
{
	return async_submit(1, fh, bufPtr_base, size_p, file_offset_p, bufPtr_offset_p,
			    bytes_written_p, stream);
}
