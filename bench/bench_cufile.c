/*
 * kvshim-bench-cufile: the cost of a cached 1 MiB cuFileRead into device memory against the
 * same cached read into host memory through pread, for the goal "at most 10 us more".
 *
 *   kvshim-bench-cufile [-n CALLS] [-b BYTES] FILE
 *
 * Run it under LD_PRELOAD=libkvshim.so with FILE under the cache's roots.  It first reads FILE
 * whole both ways (warming the cache), then times CALLS cuFileRead calls of BYTES (default
 * 1 MiB) into one cuMemAlloc buffer, and CALLS preads of BYTES on an O_DIRECT descriptor into
 * an aligned host buffer, at offsets cycling over the file, and prints µs per call for each
 * and the difference.  On the fake driver, use FAKECUDA_ASYNC_DELAY_US=0 so that a copy costs
 * a memcpy.  Exit 0 when the runs completed (the goal is reported, not enforced), 2 on error.
 */
#include "cufile_types.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef unsigned long long cu_deviceptr;
typedef struct CUctx_st *cu_context;

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median of n values (sorts v). */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return v[n / 2];
}

static int fail(const char *what)
{
	fprintf(stderr, "bench-cufile: %s\n", what);
	return 2;
}

int main(int argc, char **argv)
{
	int (*cu_init)(unsigned), (*cu_device_get)(int *, int);
	int (*cu_ctx_create)(cu_context *, unsigned, int), (*cu_mem_alloc)(cu_deviceptr *, size_t);
	kvs_cufile_handle_register_fn handle_register;
	kvs_cufile_read_fn cufile_read;
	kvs_cufile_descr_t descr = {.type = KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD};
	kvs_cufile_handle_t fh;
	size_t bytes = 1 << 20, calls = 2000;
	void *cuda, *cufile, *host;
	cu_deviceptr d;
	cu_context ctx;
	struct stat st;
	int opt, dev, fd;

	while ((opt = getopt(argc, argv, "n:b:")) != -1) {
		if (opt == 'n')
			calls = strtoull(optarg, NULL, 0);
		else if (opt == 'b')
			bytes = strtoull(optarg, NULL, 0);
		else
			return fail("usage: kvshim-bench-cufile [-n CALLS] [-b BYTES] FILE");
	}
	if (optind + 1 != argc || calls == 0 || bytes == 0 || bytes % 4096)
		return fail(
		    "usage: kvshim-bench-cufile [-n CALLS] [-b BYTES, a multiple of 4096] FILE");
	cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	cufile = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
	if (!cuda || !cufile)
		return fail(dlerror());
	*(void **)&cu_init = dlsym(cuda, "cuInit");
	*(void **)&cu_device_get = dlsym(cuda, "cuDeviceGet");
	*(void **)&cu_ctx_create = dlsym(cuda, "cuCtxCreate_v2");
	*(void **)&cu_mem_alloc = dlsym(cuda, "cuMemAlloc_v2");
	*(void **)&handle_register = dlsym(cufile, "cuFileHandleRegister");
	*(void **)&cufile_read = dlsym(cufile, "cuFileRead");
	if (!cu_init || !cu_device_get || !cu_ctx_create || !cu_mem_alloc || !handle_register ||
	    !cufile_read)
		return fail("a driver or cuFile symbol is missing");
	if (cu_init(0) || cu_device_get(&dev, 0) || cu_ctx_create(&ctx, 0, dev) ||
	    cu_mem_alloc(&d, bytes))
		return fail("CUDA set-up failed");
	fd = open(argv[optind], O_RDONLY | O_DIRECT);
	if (fd < 0 || fstat(fd, &st) || (size_t)st.st_size < bytes ||
	    posix_memalign(&host, 4096, bytes))
		return fail("cannot open FILE (O_DIRECT, at least BYTES long) or allocate");
	descr.handle.fd = fd;
	if (handle_register(&fh, &descr).err)
		return fail("cuFileHandleRegister failed");

	size_t nblocks = (size_t)st.st_size / bytes;
	/* Warm-up: every block both ways (fills the cache).  Then ROUNDS rounds, each timing
	 * calls / ROUNDS reads of one kind and then of the other, so that the machine's drift
	 * touches both alike; the figures are the medians over rounds. */
	enum { ROUNDS = 21 };
	double t_dev[ROUNDS], t_host[ROUNDS], diff[ROUNDS];
	size_t per = calls / ROUNDS ? calls / ROUNDS : 1;
	for (size_t i = 0; i < nblocks; i++) {
		off_t off = (off_t)(i * bytes);

		if (cufile_read(fh, (void *)(uintptr_t)d, bytes, off, 0) != (ssize_t)bytes ||
		    pread(fd, host, bytes, off) != (ssize_t)bytes)
			return fail("warm-up read failed or was short");
	}
	for (int r = 0; r < ROUNDS; r++) {
		double t0 = now_us();

		for (size_t i = 0; i < per; i++) {
			off_t off = (off_t)((i % nblocks) * bytes);

			if (cufile_read(fh, (void *)(uintptr_t)d, bytes, off, 0) != (ssize_t)bytes)
				return fail("cuFileRead failed or was short");
		}
		double t1 = now_us();
		for (size_t i = 0; i < per; i++) {
			off_t off = (off_t)((i % nblocks) * bytes);

			if (pread(fd, host, bytes, off) != (ssize_t)bytes)
				return fail("pread failed or was short");
		}
		t_dev[r] = (t1 - t0) / (double)per;
		t_host[r] = (now_us() - t1) / (double)per;
		diff[r] = t_dev[r] - t_host[r];
	}
	double md = median(t_dev, ROUNDS), mh = median(t_host, ROUNDS),
	       mdiff = median(diff, ROUNDS);
	printf("cuFileRead to device %.2f us/call (median of %d rounds of %zu)\n", md, ROUNDS, per);
	printf("pread to host        %.2f us/call\n", mh);
	printf("difference           %.2f us/call, median of the rounds' differences (goal <= 10: "
	       "%s)\n",
	       mdiff, mdiff <= 10.0 ? "met" : "NOT met");
	return 0;
}
