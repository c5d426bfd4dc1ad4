/*
 * kvshim-bench-h2d: host-to-device bandwidth through gpu/ from three kinds of source, in one
 * run: a memfd mapping registered by kvs_gpu_register_region (as the cache's region is), memory
 * from cuMemHostAlloc, and pageable malloc memory.
 *
 *   kvshim-bench-h2d [-l LIBCUDA] [-n ITERATIONS] [-s MIB] [-d DEVICE]
 *
 * Prints one line per source: "registered 24.1 GB/s".  Against the fake libcuda the figures
 * mean nothing.  The program makes its own allocations through the driver (gpu/ has no
 * allocator), then copies only through gpu/.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuda_types.h"
#include "gpu.h"

struct drv {
	kvs_cu_result (*primary_retain)(kvs_cu_context *, kvs_cu_device);
	kvs_cu_result (*set_current)(kvs_cu_context);
	kvs_cu_result (*mem_alloc)(kvs_cu_deviceptr *, size_t);
	kvs_cu_result (*host_alloc)(void **, size_t, unsigned int);
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* GB/s of n copies of len bytes from src into dst, one fence per copy. */
static int measure(struct kvs_gpu *g, const struct kvs_gpu_ptr *dst, const void *src, size_t len,
		   int n, double *gbs)
{
	struct kvs_gpu_copy cp;
	int r = kvs_gpu_copy_begin(g, dst, &cp);
	if (r < 0)
		return r;
	r = kvs_gpu_copy(&cp, 0, src, len); /* warm-up */
	if (r == 0)
		r = kvs_gpu_fence(&cp);
	double t0 = now();
	for (int i = 0; i < n && r == 0; i++) {
		r = kvs_gpu_copy(&cp, 0, src, len);
		int f = kvs_gpu_fence(&cp);
		if (r == 0)
			r = f;
	}
	double t = now() - t0;
	*gbs = t > 0 ? (double)len * n / t / 1e9 : 0;
	return r;
}

int main(int argc, char **argv)
{
	const char *lib = "libcuda.so.1";
	int n = 20, dev = 0, c;
	size_t len = 64u << 20;
	while ((c = getopt(argc, argv, "l:n:s:d:")) != -1) {
		switch (c) {
		case 'l':
			lib = optarg;
			break;
		case 'n':
			n = atoi(optarg);
			break;
		case 's':
			len = (size_t)atol(optarg) << 20;
			break;
		case 'd':
			dev = atoi(optarg);
			break;
		default:
			fprintf(stderr,
				"usage: %s [-l LIBCUDA] [-n ITERATIONS] [-s MIB] [-d DEVICE]\n",
				argv[0]);
			return 2;
		}
	}
	if (n <= 0 || len == 0)
		return 2;

	struct kvs_gpu_params p = {.library = lib, .register_host = true};
	struct kvs_gpu *g;
	int r = kvs_gpu_open(&p, &g);
	if (r < 0) {
		fprintf(stderr, "kvshim-bench-h2d: %s: %s\n", lib, strerror(-r));
		return 1;
	}
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	struct drv d = {
	    .primary_retain = (kvs_cu_result(*)(kvs_cu_context *, kvs_cu_device))dlsym(
		h, "cuDevicePrimaryCtxRetain"),
	    .set_current = (kvs_cu_result(*)(kvs_cu_context))dlsym(h, "cuCtxSetCurrent"),
	    .mem_alloc = (kvs_cu_result(*)(kvs_cu_deviceptr *, size_t))dlsym(h, "cuMemAlloc_v2"),
	    .host_alloc =
		(kvs_cu_result(*)(void **, size_t, unsigned int))dlsym(h, "cuMemHostAlloc"),
	};
	kvs_cu_context ctx;
	kvs_cu_deviceptr dptr;
	void *pinned = NULL;
	if (!d.primary_retain || !d.set_current || !d.mem_alloc || !d.host_alloc ||
	    d.primary_retain(&ctx, dev) != KVS_CU_SUCCESS || d.set_current(ctx) != KVS_CU_SUCCESS ||
	    d.mem_alloc(&dptr, len) != KVS_CU_SUCCESS || d.host_alloc(&pinned, len, 0) != 0) {
		fprintf(stderr, "kvshim-bench-h2d: cannot allocate %zu bytes on device %d\n", len,
			dev);
		return 1;
	}
	struct kvs_gpu_ptr dst;
	r = kvs_gpu_classify(g, dptr, len, &dst);
	if (r < 0 || dst.kind != KVS_MEM_DEVICE) {
		fprintf(stderr, "kvshim-bench-h2d: classify: %s\n", strerror(r < 0 ? -r : EINVAL));
		return 1;
	}

	int fd = memfd_create("kvshim-bench-h2d", MFD_CLOEXEC);
	void *shm = MAP_FAILED;
	if (fd >= 0 && ftruncate(fd, (off_t)len) == 0)
		shm = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	void *pageable = malloc(len);
	if (shm == MAP_FAILED || !pageable) {
		fprintf(stderr, "kvshim-bench-h2d: out of memory\n");
		return 1;
	}
	memset(shm, 1, len);
	memset(pinned, 2, len);
	memset(pageable, 3, len);
	kvs_gpu_register_region(g, shm, len, 0, NULL, NULL);
	for (int i = 0;
	     i < 60000 && kvs_gpu_registered_bytes(g) < len && !kvs_gpu_register_error(g); i++)
		usleep(1000);
	if (kvs_gpu_registered_bytes(g) < len)
		fprintf(stderr, "kvshim-bench-h2d: registration incomplete (%s)\n",
			strerror(-kvs_gpu_register_error(g)));

	const struct {
		const char *name;
		const void *src;
	} kinds[] = {{"registered", shm}, {"host_alloc", pinned}, {"pageable", pageable}};
	int rc = 0;
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		double gbs = 0;
		r = measure(g, &dst, kinds[i].src, len, n, &gbs);
		if (r < 0) {
			fprintf(stderr, "kvshim-bench-h2d: %s: %s\n", kinds[i].name, strerror(-r));
			rc = 1;
			continue;
		}
		printf("%-10s %.1f GB/s\n", kinds[i].name, gbs);
	}
	kvs_gpu_close(g);
	return rc;
}
