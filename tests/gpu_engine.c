/*
 * gpu_engine: reads KV files into device memory through cuFile the way inference engines do,
 * then checks every byte against a plain pread of the file.  Built twice:
 *   kvshim-gpu-engine-dl  reaches libcufile.so.0 only through dlopen + dlsym (as kvikio does);
 *   kvshim-gpu-engine-ln  links libcufile (NEEDED), built with KVS_ENGINE_LINKED.
 * Both dlopen("libcuda.so.1") for the driver API (names as cuda.h binds them: cuMemAlloc_v2,
 * cuMemcpyDtoH_v2, ...), so the fakes of tests/fake/ or the real libraries serve them alike.
 *   kvshim-gpu-engine [--api read|batch|async|write|pread] [--block BYTES]
 *                     [--dest device|unknown] [--host alloc|register] [--warm FILE]
 *                     [--pause-ms MS] [--busy-ms MS] [--capture 1] [--report FILE] FILE...
 * --api write saves instead, as an engine offloads KV from the GPU: each FILE's bytes are put
 * in device memory, then written back over it with one cuFileWrite per block from there
 * (the file keeps its bytes; its identity is new).
 * --api pread reads each FILE with POSIX O_DIRECT preads into host memory the driver pinned
 * (--host alloc: cuMemHostAlloc, the default; register: malloc'd pages cuMemHostRegister'd),
 * copies it to device memory and checks it there.
 * --warm FILE: first one cuFileRead of FILE's first block (the driver opened, the region's
 * registration started, under a shim), then --pause-ms MS (default 0) before the reads.
 * --busy-ms MS (async): before each file's reads, a host function that sleeps MS on the
 * stream keeps it busy; the time the cuFileReadAsync calls took is reported.
 * --capture 1 (async): the first block of each file is read with the stream capturing into a
 * graph (never launched): the read must not run, and the engine then reads as usual.
 * --report FILE: write "storage_bytes N" (what /proc/self/io says the reads took from storage,
 * the checks' own preads left out), "async_call_us N" (the cuFileReadAsync calls, summed) and
 * "captured_result N" (what the captured read left in its byte count) to FILE.
 * Exit 0 when every byte matches, 1 on the first mismatch (file and offset on stderr), 2 on
 * any other failure.  stdout carries one line: "engine: N files, B bytes, api A, ok".
 * --dest unknown (for fault tests) makes one cuFileRead of the first block of each file into a
 * PROT_NONE mapping, memory neither the driver nor the process can write, and prints what it
 * returned ("engine: FILE: cuFileRead into unknown memory: RET errno E") instead of checking
 * bytes: the caller compares that line with and without an interposer.
 */
#include "cufile_types.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BATCH_MAX 16

/* The driver API types used here, as cuda.h declares them (CUresult 0 is CUDA_SUCCESS). */
typedef unsigned long long cu_deviceptr;
typedef int cu_device;
typedef struct CUctx_st *cu_context;

static struct {
	int (*init)(unsigned flags);
	int (*device_get)(cu_device *dev, int ordinal);
	int (*primary_ctx_retain)(cu_context *ctx, cu_device dev);
	int (*ctx_create)(cu_context *ctx, unsigned flags, cu_device dev); /* cuCtxCreate_v2 */
	int (*ctx_set_current)(cu_context ctx);
	int (*mem_alloc)(cu_deviceptr *dptr, size_t size);
	int (*mem_free)(cu_deviceptr dptr);
	int (*memcpy_dtoh)(void *dst, cu_deviceptr src, size_t size);
	int (*memcpy_htod)(cu_deviceptr dst, const void *src, size_t size);
	int (*stream_create)(kvs_cu_stream_t *stream, unsigned flags);
	int (*stream_synchronize)(kvs_cu_stream_t stream);
	int (*launch_host_func)(kvs_cu_stream_t stream, void (*fn)(void *), void *arg);
	int (*host_alloc)(void **pp, size_t size, unsigned flags);
	int (*host_register)(void *p, size_t size, unsigned flags); /* cuMemHostRegister_v2 */
	int (*begin_capture)(kvs_cu_stream_t stream, int mode);	    /* cuStreamBeginCapture_v2 */
	int (*end_capture)(kvs_cu_stream_t stream, void **graph);
} cu;

/* The cuFile entry points, from dlsym or from the linked library. */
static struct {
#define FIELD(name, type) type name;
	KVS_CUFILE_API(FIELD)
#undef FIELD
} cf;

#ifdef KVS_ENGINE_LINKED
/* Declarations of the linked library's functions, from the pointer types. */
#define DECLARE(name, type) extern __typeof__(*(type)0) name;
KVS_CUFILE_API(DECLARE)
#undef DECLARE
#endif

static const char *api = "read";
static size_t block = 1 << 20;
static const char *dest = "device";
static const char *host_kind = "alloc";
static unsigned busy_ms;
static int capture;
static unsigned long long storage_bytes, async_call_us;
static long long captured_result = -12345;

/* Bytes this process has had read from storage so far (/proc/self/io read_bytes: every
 * thread's, the shim's loader included). */
static unsigned long long io_read_bytes(void)
{
	FILE *f = fopen("/proc/self/io", "r");
	unsigned long long v = 0;
	char line[128];

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "read_bytes: %llu", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

static unsigned long long now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
}

static void sleep_fn(void *arg)
{
	usleep(*(unsigned *)arg * 1000u);
}

/* Print "engine: ..." on stderr and exit with code. */
__attribute__((noreturn, format(printf, 2, 3))) static void die(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("engine: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(code);
}

/* Resolve the driver API from libcuda.so.1, create a context, make it current. */
static void cuda_setup(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	cu_context ctx;
	cu_device dev;
	int rc;

	if (!h)
		die(2, "dlopen libcuda.so.1: %s", dlerror());
#define SYM(field, name)                                                                           \
	if (!(*(void **)&cu.field = dlsym(h, name)))                                               \
		die(2, "libcuda.so.1 lacks %s", name);
	SYM(init, "cuInit");
	SYM(device_get, "cuDeviceGet");
	SYM(ctx_set_current, "cuCtxSetCurrent");
	SYM(mem_alloc, "cuMemAlloc_v2");
	SYM(mem_free, "cuMemFree_v2");
	SYM(memcpy_dtoh, "cuMemcpyDtoH_v2");
	SYM(memcpy_htod, "cuMemcpyHtoD_v2");
	SYM(stream_create, "cuStreamCreate");
	SYM(stream_synchronize, "cuStreamSynchronize");
	SYM(launch_host_func, "cuLaunchHostFunc");
	SYM(host_alloc, "cuMemHostAlloc");
	SYM(host_register, "cuMemHostRegister_v2");
	SYM(begin_capture, "cuStreamBeginCapture_v2");
	SYM(end_capture, "cuStreamEndCapture");
#undef SYM
	/* The primary context, as the CUDA runtime uses; else a context of its own. */
	*(void **)&cu.primary_ctx_retain = dlsym(h, "cuDevicePrimaryCtxRetain");
	*(void **)&cu.ctx_create = dlsym(h, "cuCtxCreate_v2");
	if (!cu.primary_ctx_retain && !cu.ctx_create)
		die(2, "libcuda.so.1 lacks cuDevicePrimaryCtxRetain and cuCtxCreate_v2");
	if ((rc = cu.init(0)) != 0 || (rc = cu.device_get(&dev, 0)) != 0)
		die(2, "CUDA initialisation failed: CUresult %d", rc);
	if (cu.primary_ctx_retain)
		rc = cu.primary_ctx_retain(&ctx, dev);
	else
		rc = cu.ctx_create(&ctx, 0, dev);
	if (rc != 0 || (rc = cu.ctx_set_current(ctx)) != 0)
		die(2, "CUDA context set-up failed: CUresult %d", rc);
}

/* Resolve every cuFile entry point: dlopen + dlsym, or the linked library's symbols. */
static void cufile_setup(void)
{
#ifdef KVS_ENGINE_LINKED
#define TAKE(name, type) cf.name = &name;
	KVS_CUFILE_API(TAKE)
#undef TAKE
#else
	void *h = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);

	if (!h)
		die(2, "dlopen libcufile.so.0: %s", dlerror());
#define LOOK(name, type)                                                                           \
	if (!(*(void **)&cf.name = dlsym(h, #name)))                                               \
		die(2, "libcufile.so.0 lacks %s", #name);
	KVS_CUFILE_API(LOOK)
#undef LOOK
#endif
}

/* Die unless e is CU_FILE_SUCCESS. */
static void cf_check(kvs_cufile_error_t e, const char *what, const char *path)
{
	if (e.err != KVS_CU_FILE_SUCCESS)
		die(2, "%s %s: cuFile error %d (CUresult %d)", what, path, (int)e.err, e.cu_err);
}

/* Bytes of the block at off of a file of size bytes. */
static size_t block_len(off_t off, size_t size)
{
	size_t left = size - (size_t)off;

	return left < block ? left : block;
}

/* One cuFileRead per block. */
static void read_blocks(kvs_cufile_handle_t fh, cu_deviceptr d, size_t size, const char *path)
{
	for (off_t off = 0; (size_t)off < size; off += (off_t)block) {
		size_t len = block_len(off, size);
		ssize_t n = cf.cuFileRead(fh, (void *)(uintptr_t)d, len, off, off);

		if (n < 0)
			die(2, "cuFileRead %s at %lld: %zd (errno %d)", path, (long long)off, n,
			    n == -1 ? errno : 0);
		if ((size_t)n != len)
			die(2, "cuFileRead %s at %lld: %zd bytes of %zu", path, (long long)off, n,
			    len);
	}
}

/* Batches of up to BATCH_MAX blocks: submit, then collect every entry's status. */
static void batch_blocks(kvs_cufile_handle_t fh, cu_deviceptr d, size_t size, const char *path)
{
	kvs_cufile_io_params_t io[BATCH_MAX];
	kvs_cufile_io_events_t ev[BATCH_MAX];
	kvs_cufile_batch_handle_t b;
	off_t off = 0;

	cf_check(cf.cuFileBatchIOSetUp(&b, BATCH_MAX), "cuFileBatchIOSetUp", path);
	while ((size_t)off < size) {
		unsigned n = 0, done = 0;

		for (; n < BATCH_MAX && (size_t)off < size; n++, off += (off_t)block) {
			memset(&io[n], 0, sizeof(io[n]));
			io[n].mode = KVS_CUFILE_BATCH;
			io[n].opcode = KVS_CUFILE_READ;
			io[n].fh = fh;
			io[n].u.batch.devPtr_base = (void *)(uintptr_t)d;
			io[n].u.batch.file_offset = off;
			io[n].u.batch.devPtr_offset = off;
			io[n].u.batch.size = block_len(off, size);
			io[n].cookie = &io[n];
		}
		cf_check(cf.cuFileBatchIOSubmit(b, n, io, 0), "cuFileBatchIOSubmit", path);
		while (done < n) {
			struct timespec timeout = {.tv_sec = 30};
			unsigned got = n - done;

			cf_check(cf.cuFileBatchIOGetStatus(b, n - done, &got, ev, &timeout),
				 "cuFileBatchIOGetStatus", path);
			if (got == 0)
				die(2, "cuFileBatchIOGetStatus %s: nothing finished in 30 s", path);
			for (unsigned k = 0; k < got; k++) {
				kvs_cufile_io_params_t *p = ev[k].cookie;

				if (p < io || p >= io + n)
					die(2, "batch %s: unknown cookie %p", path, ev[k].cookie);
				if (ev[k].status != KVS_CUFILE_COMPLETE ||
				    ev[k].ret != p->u.batch.size)
					die(2, "batch %s at %lld: status %#x ret %zd", path,
					    (long long)p->u.batch.file_offset,
					    (unsigned)ev[k].status, (ssize_t)ev[k].ret);
			}
			done += got;
		}
	}
	cf.cuFileBatchIODestroy(b);
}

/* One cuFileReadAsync per block on a stream registered with fixed sizes and offsets. */
static void async_blocks(kvs_cufile_handle_t fh, cu_deviceptr d, size_t size, const char *path,
			 kvs_cu_stream_t stream)
{
	size_t nblocks = (size + block - 1) / block;
	size_t *sizes = calloc(nblocks, sizeof(*sizes));
	off_t *offs = calloc(nblocks, sizeof(*offs));
	ssize_t *got = calloc(nblocks, sizeof(*got));
	int rc;

	if (!sizes || !offs || !got)
		die(2, "out of memory");
	if (capture && nblocks) {
		/* Read while the stream captures into a graph that is never launched: nothing may
		 * run, and the byte count stays as it was. */
		size_t csize = block_len(0, size);
		off_t coff = 0;
		ssize_t cgot = -12345;

		if ((rc = cu.begin_capture(stream, 0)) != 0)
			die(2, "cuStreamBeginCapture: CUresult %d", rc);
		kvs_cufile_error_t e = cf.cuFileReadAsync(fh, (void *)(uintptr_t)d, &csize, &coff,
							  &coff, &cgot, stream);
		void *graph = NULL;
		if ((rc = cu.end_capture(stream, &graph)) != 0)
			die(2, "cuStreamEndCapture: CUresult %d", rc);
		if ((rc = cu.stream_synchronize(stream)) != 0)
			die(2, "cuStreamSynchronize: CUresult %d", rc);
		captured_result = e.err == KVS_CU_FILE_SUCCESS ? (long long)cgot : -1000 - e.err;
	}
	if (busy_ms && (cu.launch_host_func(stream, sleep_fn, &busy_ms)) != 0)
		die(2, "cuLaunchHostFunc failed");
	unsigned long long t0 = now_us();
	for (size_t i = 0; i < nblocks; i++) {
		offs[i] = (off_t)(i * block);
		sizes[i] = block_len(offs[i], size);
		got[i] = -12345;
		/* The buffer offset equals the file offset: one pointer serves both. */
		cf_check(cf.cuFileReadAsync(fh, (void *)(uintptr_t)d, &sizes[i], &offs[i], &offs[i],
					    &got[i], stream),
			 "cuFileReadAsync", path);
	}
	async_call_us += now_us() - t0;
	if ((rc = cu.stream_synchronize(stream)) != 0)
		die(2, "cuStreamSynchronize: CUresult %d", rc);
	for (size_t i = 0; i < nblocks; i++)
		if (got[i] < 0 || (size_t)got[i] != sizes[i])
			die(2, "cuFileReadAsync %s at %lld: %zd bytes of %zu", path,
			    (long long)offs[i], got[i], sizes[i]);
	free(got);
	free(offs);
	free(sizes);
}

/* One cuFileRead of the first block of the file into a PROT_NONE mapping; print its result. */
static void read_unknown(kvs_cufile_handle_t fh, size_t size, const char *path)
{
	size_t len = size < block ? size : block;
	void *p = mmap(NULL, len ? len : 1, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ssize_t n;

	if (p == MAP_FAILED)
		die(2, "mmap: %s", strerror(errno));
	errno = 0;
	n = cf.cuFileRead(fh, p, len, 0, 0);
	printf("engine: %s: cuFileRead into unknown memory: %zd errno %d\n", path, n,
	       n == -1 ? errno : 0);
	munmap(p, len ? len : 1);
}

/* POSIX O_DIRECT preads, one per block, into host memory the driver pinned, then one copy to
 * device memory d. */
static void pread_blocks(int fd, cu_deviceptr d, size_t size, const char *path)
{
	size_t room = (size + 4095) & ~(size_t)4095;
	void *buf = NULL;
	int rc;

	if (!room)
		return;
	if (strcmp(host_kind, "register") == 0) {
		buf = mmap(NULL, room, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (buf == MAP_FAILED)
			die(2, "mmap: %s", strerror(errno));
		if ((rc = cu.host_register(buf, room, 0)) != 0)
			die(2, "cuMemHostRegister: CUresult %d", rc);
	} else if ((rc = cu.host_alloc(&buf, room, 0)) != 0) {
		die(2, "cuMemHostAlloc: CUresult %d", rc);
	}
	for (off_t off = 0; (size_t)off < size; off += (off_t)block) {
		size_t len = (block_len(off, size) + 4095) & ~(size_t)4095; /* O_DIRECT lengths */
		ssize_t n = pread(fd, (char *)buf + off, len, off);

		if (n < 0 || (size_t)n != block_len(off, size))
			die(2, "pread %s at %lld: %zd (%s)", path, (long long)off, n,
			    n < 0 ? strerror(errno) : "short");
	}
	if ((rc = cu.memcpy_htod(d, buf, size)) != 0)
		die(2, "cuMemcpyHtoD %s: CUresult %d", path, rc);
	/* The pinned buffer is left to the process's end: the driver unpins it then. */
}

/* Compare size bytes of device memory d with the file read by plain pread; 1 if they differ. */
static int verify(const char *path, cu_deviceptr d, size_t size)
{
	char *dev = malloc(size ? size : 1), *want = malloc(size ? size : 1);
	int fd = open(path, O_RDONLY), rc;
	size_t done = 0;

	if (!dev || !want)
		die(2, "out of memory");
	if (fd < 0)
		die(2, "open %s: %s", path, strerror(errno));
	while (done < size) {
		ssize_t n = pread(fd, want + done, size - done, (off_t)done);

		if (n <= 0)
			die(2, "pread %s: %s", path, n ? strerror(errno) : "short file");
		done += (size_t)n;
	}
	close(fd);
	if (size && (rc = cu.memcpy_dtoh(dev, d, size)) != 0)
		die(2, "cuMemcpyDtoH %s: CUresult %d", path, rc);
	for (size_t i = 0; i < size; i++) {
		if (dev[i] != want[i]) {
			fprintf(stderr, "engine: mismatch: %s offset %zu\n", path, i);
			free(want);
			free(dev);
			return 1;
		}
	}
	free(want);
	free(dev);
	return 0;
}

/* Save path: its bytes into device memory at d, then one cuFileWrite per block from there. */
static void write_blocks(const char *path, cu_deviceptr d, size_t size)
{
	kvs_cufile_descr_t descr = {.type = KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD};
	kvs_cufile_handle_t fh;
	char *host = malloc(size ? size : 1);
	int in = open(path, O_RDONLY), fd, rc;

	if (!host || in < 0 || pread(in, host, size, 0) != (ssize_t)size)
		die(2, "read %s: %s", path, strerror(errno));
	close(in);
	if ((rc = cu.memcpy_htod(d, host, size)) != 0)
		die(2, "cuMemcpyHtoD %s: CUresult %d", path, rc);
	fd = open(path, O_WRONLY | O_DIRECT);
	if (fd < 0)
		die(2, "open %s for writing: %s", path, strerror(errno));
	descr.handle.fd = fd;
	cf_check(cf.cuFileHandleRegister(&fh, &descr), "cuFileHandleRegister", path);
	for (off_t off = 0; (size_t)off < size; off += (off_t)block) {
		size_t len = block_len(off, size);
		ssize_t n = cf.cuFileWrite(fh, (void *)(uintptr_t)d, len, off, off);

		if (n < 0 || (size_t)n != len)
			die(2, "cuFileWrite %s at %lld: %zd", path, (long long)off, n);
	}
	cf.cuFileHandleDeregister(fh);
	if (close(fd))
		die(2, "close %s: %s", path, strerror(errno));
	free(host);
}

/* One cuFileRead of path's first block into device memory: the driver opened, and under a
 * shim the region's registration started. */
static void warm_up(const char *path)
{
	kvs_cufile_descr_t descr = {.type = KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD};
	kvs_cufile_handle_t fh;
	cu_deviceptr d;
	int fd = open(path, O_RDONLY | O_DIRECT), rc;
	ssize_t n;

	if (fd < 0)
		die(2, "open %s: %s", path, strerror(errno));
	descr.handle.fd = fd;
	cf_check(cf.cuFileHandleRegister(&fh, &descr), "cuFileHandleRegister", path);
	if ((rc = cu.mem_alloc(&d, block)) != 0)
		die(2, "cuMemAlloc: CUresult %d", rc);
	n = cf.cuFileRead(fh, (void *)(uintptr_t)d, block, 0, 0);
	if (n < 0)
		die(2, "cuFileRead %s: %zd", path, n);
	cf.cuFileHandleDeregister(fh);
	cu.mem_free(d);
	close(fd);
}

int main(int argc, char **argv)
{
	unsigned long long total = 0;
	kvs_cu_stream_t stream = NULL;
	const char *warm = NULL, *report = NULL;
	unsigned pause_ms = 0;
	int i, nfiles;

	for (i = 1; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
		if (i + 1 >= argc)
			die(2, "%s needs a value", argv[i]);
		if (strcmp(argv[i], "--api") == 0)
			api = argv[i + 1];
		else if (strcmp(argv[i], "--block") == 0)
			block = strtoull(argv[i + 1], NULL, 0);
		else if (strcmp(argv[i], "--dest") == 0)
			dest = argv[i + 1];
		else if (strcmp(argv[i], "--host") == 0)
			host_kind = argv[i + 1];
		else if (strcmp(argv[i], "--warm") == 0)
			warm = argv[i + 1];
		else if (strcmp(argv[i], "--pause-ms") == 0)
			pause_ms = (unsigned)strtoul(argv[i + 1], NULL, 0);
		else if (strcmp(argv[i], "--busy-ms") == 0)
			busy_ms = (unsigned)strtoul(argv[i + 1], NULL, 0);
		else if (strcmp(argv[i], "--capture") == 0)
			capture = atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--report") == 0)
			report = argv[i + 1];
		else
			die(2, "unknown option %s", argv[i]);
	}
	if (strcmp(api, "read") && strcmp(api, "batch") && strcmp(api, "async") &&
	    strcmp(api, "write") && strcmp(api, "pread"))
		die(2, "--api is read, batch, async, write or pread");
	if (strcmp(host_kind, "alloc") && strcmp(host_kind, "register"))
		die(2, "--host is alloc or register");
	if (strcmp(dest, "device") && strcmp(dest, "unknown"))
		die(2, "--dest is device or unknown");
	if (block == 0 || i >= argc)
		die(2,
		    "usage: %s [--api read|batch|async|write] [--block BYTES] "
		    "[--dest device|unknown] FILE...",
		    argv[0]);
	nfiles = argc - i;

	cuda_setup();
	cufile_setup();
	cf_check(cf.cuFileDriverOpen(), "cuFileDriverOpen", "");
	if (warm)
		warm_up(warm);
	if (pause_ms)
		usleep(pause_ms * 1000u);
	if (strcmp(api, "async") == 0) {
		int rc = cu.stream_create(&stream, 0);

		if (rc != 0)
			die(2, "cuStreamCreate: CUresult %d", rc);
		/* Twice, as a library that sets a stream's flags again does (the fake libcufile
		 * deregisters it first, through its own export).  A real library that refuses
		 * the second is told on stderr: the first holds. */
		cf_check(cf.cuFileStreamRegister(stream, 15), "cuFileStreamRegister", "");
		kvs_cufile_error_t again = cf.cuFileStreamRegister(stream, 15);
		if (again.err != KVS_CU_FILE_SUCCESS)
			fprintf(stderr,
				"engine: note: cuFileStreamRegister again: cuFile error %d\n",
				(int)again.err);
	}
	for (; i < argc; i++) {
		const char *path = argv[i];
		kvs_cufile_descr_t descr = {.type = KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD};
		kvs_cufile_handle_t fh;
		cu_deviceptr d = 0;
		struct stat st;
		int fd, rc;

		if (strcmp(api, "write") == 0) {
			if (stat(path, &st) != 0)
				die(2, "stat %s: %s", path, strerror(errno));
			if ((rc = cu.mem_alloc(&d, st.st_size ? (size_t)st.st_size : 1)) != 0)
				die(2, "cuMemAlloc %s: CUresult %d", path, rc);
			write_blocks(path, d, (size_t)st.st_size);
			cu.mem_free(d);
			total += (unsigned long long)st.st_size;
			continue;
		}
		fd = open(path, O_RDONLY | O_DIRECT);
		if (fd < 0 || fstat(fd, &st) != 0)
			die(2, "open %s: %s", path, strerror(errno));
		if (strcmp(api, "pread") == 0) {
			unsigned long long io0 = io_read_bytes();

			if ((rc = cu.mem_alloc(&d, st.st_size ? (size_t)st.st_size : 1)) != 0)
				die(2, "cuMemAlloc %s: CUresult %d", path, rc);
			pread_blocks(fd, d, (size_t)st.st_size, path);
			storage_bytes += io_read_bytes() - io0;
			if (verify(path, d, (size_t)st.st_size))
				return 1;
			cu.mem_free(d);
			close(fd);
			total += (unsigned long long)st.st_size;
			continue;
		}
		descr.handle.fd = fd;
		cf_check(cf.cuFileHandleRegister(&fh, &descr), "cuFileHandleRegister", path);
		if (strcmp(dest, "unknown") == 0) {
			read_unknown(fh, (size_t)st.st_size, path);
			cf.cuFileHandleDeregister(fh);
			close(fd);
			continue;
		}
		if ((rc = cu.mem_alloc(&d, st.st_size ? (size_t)st.st_size : 1)) != 0)
			die(2, "cuMemAlloc %s: CUresult %d", path, rc);
		/* The real library may refuse (compatibility mode without nvidia-fs): a buffer
		 * read without registration is read all the same, through a bounce buffer. */
		kvs_cufile_error_t br =
		    cf.cuFileBufRegister((void *)(uintptr_t)d, st.st_size ? st.st_size : 1, 0);
		if (br.err != KVS_CU_FILE_SUCCESS)
			fprintf(stderr, "engine: note: cuFileBufRegister %s: cuFile error %d\n",
				path, (int)br.err);
		unsigned long long io0 = io_read_bytes();
		if (strcmp(api, "read") == 0)
			read_blocks(fh, d, (size_t)st.st_size, path);
		else if (strcmp(api, "batch") == 0)
			batch_blocks(fh, d, (size_t)st.st_size, path);
		else
			async_blocks(fh, d, (size_t)st.st_size, path, stream);
		storage_bytes += io_read_bytes() - io0;
		if (verify(path, d, (size_t)st.st_size))
			return 1;
		if (br.err == KVS_CU_FILE_SUCCESS)
			cf_check(cf.cuFileBufDeregister((void *)(uintptr_t)d),
				 "cuFileBufDeregister", path);
		cf.cuFileHandleDeregister(fh);
		cu.mem_free(d);
		close(fd);
		total += (unsigned long long)st.st_size;
	}
	if (stream)
		cf_check(cf.cuFileStreamDeregister(stream), "cuFileStreamDeregister", "");
	cf_check(cf.cuFileDriverClose_v2(), "cuFileDriverClose", "");
	if (report) {
		FILE *f = fopen(report, "w");

		if (!f ||
		    fprintf(f, "storage_bytes %llu\nasync_call_us %llu\ncaptured_result %lld\n",
			    storage_bytes, async_call_us, captured_result) < 0 ||
		    fclose(f))
			die(2, "%s: cannot write the report", report);
	}
	if (strcmp(dest, "device") == 0)
		printf("engine: %d files, %llu bytes, api %s, ok\n", nfiles, total, api);
	return 0;
}
