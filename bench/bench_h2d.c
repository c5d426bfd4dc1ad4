/*
 * kvshim-bench-h2d: host-to-device bandwidth through gpu/ from three kinds of source, in one
 * run, copied the way the shim copies: a region in /dev/shm registered by
 * kvs_gpu_register_region in whole frames (as the cache's region is), memory from
 * cuMemHostAlloc, and pageable malloc memory.
 *
 *   kvshim-bench-h2d [-l LIBCUDA] [-n PASSES] [-r REGION_MIB] [-S SHARD_KIB] [-d DEVICE]
 *                    [-f FILE]
 *
 * Two copy sizes: the shard size (-S, default 1024 KiB; a fence every 16 copies, as the shim
 * fences a piece of up to 16 shards) and 64 MiB (a fence per copy).  Each pass copies the
 * whole region (-r, default 256 MiB) from consecutive offsets, a copy never spanning two
 * registrations.  It prints, one line each:
 *   register R MiB in S s: G GiB/s            (the region's registration, fully populated)
 *   registered|host_alloc|pageable SIZE G GB/s
 *   verify ok|MISMATCH                         (the last registered copy read back)
 * Exits 0, 1 when something failed (a copy, the registration, the check).  Against the fake
 * libcuda the figures mean nothing.  The program makes its own allocations through the driver
 * (gpu/ has no allocator), then copies only through gpu/.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuda_types.h"
#include "gpu.h"

#define PIECE 16 /* shards per fence, as the loader's tasks */

struct drv {
	kvs_cu_result (*primary_retain)(kvs_cu_context *, kvs_cu_device);
	kvs_cu_result (*set_current)(kvs_cu_context);
	kvs_cu_result (*mem_alloc)(kvs_cu_deviceptr *, size_t);
	kvs_cu_result (*host_alloc)(void **, size_t, unsigned int);
	kvs_cu_result (*dtoh)(void *, kvs_cu_deviceptr, size_t);
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* GB/s of passes over [src, src+total) in copies of len bytes every step bytes into dst
 * (which holds len), a fence every per_fence copies. */
static int measure(struct kvs_gpu *g, const struct kvs_gpu_ptr *dst, const char *src, size_t total,
		   size_t len, size_t step, int per_fence, int passes, double *gbs)
{
	struct kvs_gpu_copy cp;
	int r = kvs_gpu_copy_begin(g, dst, &cp);
	if (r < 0)
		return r;
	r = kvs_gpu_copy(&cp, 0, src, len); /* warm-up */
	if (r == 0)
		r = kvs_gpu_fence(&cp);
	double t0 = now();
	size_t bytes = 0;
	for (int p = 0; p < passes && r == 0; p++) {
		int queued = 0;
		for (size_t off = 0; off + len <= total && r == 0; off += step) {
			r = kvs_gpu_copy(&cp, 0, src + off, len);
			bytes += len;
			if (++queued == per_fence) {
				int f = kvs_gpu_fence(&cp);
				r = r ? r : f;
				queued = 0;
			}
		}
		int f = kvs_gpu_fence(&cp);
		r = r ? r : f;
	}
	double t = now() - t0;
	*gbs = t > 0 ? (double)bytes / t / 1e9 : 0;
	return r;
}

int main(int argc, char **argv)
{
	const char *lib = "libcuda.so.1";
	char path[256] = "";
	int passes = 4, dev = 0, c;
	size_t total = 256u << 20, shard = 1u << 20;
	while ((c = getopt(argc, argv, "l:n:r:S:d:f:")) != -1) {
		switch (c) {
		case 'l':
			lib = optarg;
			break;
		case 'n':
			passes = atoi(optarg);
			break;
		case 'r':
			total = (size_t)atol(optarg) << 20;
			break;
		case 'S':
			shard = (size_t)atol(optarg) << 10;
			break;
		case 'd':
			dev = atoi(optarg);
			break;
		case 'f':
			snprintf(path, sizeof(path), "%s", optarg);
			break;
		default:
			fprintf(stderr,
				"usage: %s [-l LIBCUDA] [-n PASSES] [-r REGION_MIB] [-S SHARD_KIB] "
				"[-d DEVICE] [-f FILE]\n",
				argv[0]);
			return 2;
		}
	}
	const size_t big = 64u << 20;
	if (passes <= 0 || shard == 0 || shard % 4096 || total < big || total % shard)
		return 2;
	if (!path[0])
		snprintf(path, sizeof(path), "/dev/shm/kvshim-bench-h2d.%d", (int)getpid());

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
	    .dtoh = (kvs_cu_result(*)(void *, kvs_cu_deviceptr, size_t))dlsym(h, "cuMemcpyDtoH_v2"),
	};
	kvs_cu_context ctx;
	kvs_cu_deviceptr dptr;
	void *pinned = NULL;
	if (!d.primary_retain || !d.set_current || !d.mem_alloc || !d.host_alloc || !d.dtoh ||
	    d.primary_retain(&ctx, dev) != KVS_CU_SUCCESS || d.set_current(ctx) != KVS_CU_SUCCESS ||
	    d.mem_alloc(&dptr, big) != KVS_CU_SUCCESS || d.host_alloc(&pinned, big, 0) != 0) {
		fprintf(stderr, "kvshim-bench-h2d: cannot allocate %zu bytes on device %d\n", big,
			dev);
		return 1;
	}
	struct kvs_gpu_ptr dst;
	r = kvs_gpu_classify(g, dptr, big, &dst);
	if (r < 0 || dst.kind != KVS_MEM_DEVICE) {
		fprintf(stderr, "kvshim-bench-h2d: classify: %s\n", strerror(r < 0 ? -r : EINVAL));
		return 1;
	}

	/* The region: a /dev/shm file with every page allocated, mapped shared, as the cache's. */
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	char *shm = MAP_FAILED;
	if (fd >= 0) {
		unlink(path);
		if (posix_fallocate(fd, 0, (off_t)total) == 0)
			shm = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
	}
	char *pageable = malloc(big);
	if (shm == MAP_FAILED || !pageable) {
		fprintf(stderr, "kvshim-bench-h2d: %s: cannot map %zu MiB (/dev/shm full?)\n", path,
			total >> 20);
		return 1;
	}
	for (size_t i = 0; i < total; i += 4096)
		shm[i] = (char)(i / 4096 * 7 + 1);
	memset(pinned, 2, big);
	memset(pageable, 3, big);

	double t0 = now();
	kvs_gpu_register_region(g, shm, total, shard, NULL, NULL);
	for (int i = 0; i < 120000 && kvs_gpu_registered_bytes(g) < total; i++)
		usleep(500);
	double treg = now() - t0;
	int rc = 0;
	if (kvs_gpu_registered_bytes(g) < total) {
		fprintf(stderr,
			"kvshim-bench-h2d: registration incomplete: %llu of %zu bytes (%s)\n",
			(unsigned long long)kvs_gpu_registered_bytes(g), total,
			strerror(-kvs_gpu_register_error(g)));
		rc = 1;
	} else {
		printf("register %zu MiB in %.3f s: %.2f GiB/s\n", total >> 20, treg,
		       treg > 0 ? (double)total / (1u << 30) / treg : 0);
	}

	const struct {
		const char *name;
		const char *src;
		size_t span; /* bytes of source to walk */
	} kinds[] = {
	    {"registered", shm, total}, {"host_alloc", pinned, big}, {"pageable", pageable, big}};
	/* A 64 MiB copy from the region starts where a registration does: gpu/ registers 64 MiB
	 * rounded up to whole shards, and a copy over two registrations is not promised. */
	const size_t chunk = (big + shard - 1) / shard * shard;
	const struct {
		size_t len, step;
		int per_fence;
	} sizes[] = {{shard, shard, PIECE}, {big, chunk, 1}};
	for (size_t s = 0; s < 2; s++) {
		for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
			double gbs = 0;
			r = measure(g, &dst, kinds[i].src, kinds[i].span, sizes[s].len,
				    i == 0 ? sizes[s].step : sizes[s].len, sizes[s].per_fence,
				    passes, &gbs);
			if (r < 0) {
				fprintf(stderr, "kvshim-bench-h2d: %s %zuK: %s\n", kinds[i].name,
					sizes[s].len >> 10, strerror(-r));
				rc = 1;
				continue;
			}
			printf("%-10s %zuK %.2f GB/s\n", kinds[i].name, sizes[s].len >> 10, gbs);
		}
	}

	/* The last registered copy of a shard, read back: the copies moved the right bytes. */
	struct kvs_gpu_copy cp;
	char *back = malloc(shard);
	const char *want = shm + total - shard;
	r = kvs_gpu_copy_begin(g, &dst, &cp);
	if (r == 0)
		r = kvs_gpu_copy(&cp, 0, want, shard);
	int f = kvs_gpu_fence(&cp);
	r = r ? r : f;
	if (r == 0 && back && d.dtoh(back, dptr, shard) == KVS_CU_SUCCESS &&
	    memcmp(back, want, shard) == 0) {
		printf("verify ok\n");
	} else {
		printf("verify MISMATCH\n");
		rc = 1;
	}
	free(back);
	kvs_gpu_close(g);
	return rc;
}
