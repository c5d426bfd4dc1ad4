/*
 * gpu_prereg: a cuFile handle the shim never saw registered.  Reads FILE_A through a handle
 * registered with the *real* cuFileHandleRegister, reached without the shim's dlsym: glibc's
 * own dlsym is taken with dlvsym(libc, "dlsym", "GLIBC_2.34") (a name the shim passes
 * through) and asked for libcufile's symbol.  The shim's cuFileRead hook then meets a handle
 * it does not know and must pass the read to the real library.  FILE_B is read through a
 * handle registered the ordinary way (dlsym of the libcufile handle), which the shim serves.
 * Both land in (fake) device memory, block by block, and are copied back and compared.
 *   kvshim-gpu-prereg BLOCK FILE_A FILE_B
 * stdout: "prereg: A_BYTES unknown-handle bytes, B_BYTES ordinary bytes, ok".  Exit 0 ok,
 * 1 mismatch, 2 any other failure.  Works with or without LD_PRELOAD.
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
#include <unistd.h>

typedef unsigned long long cu_deviceptr;
typedef struct CUctx_st *cu_context;

static struct {
	int (*init)(unsigned);
	int (*device_get)(int *, int);
	int (*ctx_create)(cu_context *, unsigned, int);
	int (*mem_alloc)(cu_deviceptr *, size_t);
	int (*memcpy_dtoh)(void *, cu_deviceptr, size_t);
} cu;

static size_t block;

/* Read path into fresh device memory through fh, block by block, and compare; exit on error. */
static size_t load(const char *path, kvs_cufile_read_fn rd, kvs_cufile_handle_t fh, int fd)
{
	struct stat st;
	cu_deviceptr d;
	char *got, *want;

	if (fstat(fd, &st) || st.st_size == 0)
		exit((fprintf(stderr, "prereg: %s: empty or unreadable\n", path), 2));
	size_t size = (size_t)st.st_size;
	if (cu.mem_alloc(&d, size))
		exit((fprintf(stderr, "prereg: cuMemAlloc failed\n"), 2));
	for (size_t off = 0; off < size; off += block) {
		size_t len = size - off < block ? size - off : block;
		ssize_t n = rd(fh, (void *)(uintptr_t)d, len, (off_t)off, (off_t)off);

		if (n != (ssize_t)len)
			exit((fprintf(stderr, "prereg: cuFileRead %s at %zu: %zd (errno %d)\n",
				      path, off, n, errno),
			      2));
	}
	got = malloc(size);
	want = malloc(size);
	int plain = open(path, O_RDONLY);
	if (!got || !want || plain < 0 || pread(plain, want, size, 0) != (ssize_t)size ||
	    cu.memcpy_dtoh(got, d, size))
		exit((fprintf(stderr, "prereg: cannot check %s\n", path), 2));
	close(plain);
	if (memcmp(got, want, size))
		exit((fprintf(stderr, "prereg: mismatch in %s\n", path), 1));
	free(got);
	free(want);
	return size;
}

int main(int argc, char **argv)
{
	void *(*glibc_dlsym)(void *, const char *);
	kvs_cufile_handle_register_fn real_register, hook_register;
	kvs_cufile_read_fn rd;
	kvs_cufile_descr_t da = {.type = KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD}, db = da;
	kvs_cufile_handle_t fa, fb;
	void *libc, *libcuda, *libcufile;
	cu_context ctx;
	int dev;

	if (argc != 4 || (block = strtoull(argv[1], NULL, 0)) == 0) {
		fprintf(stderr, "usage: %s BLOCK FILE_A FILE_B\n", argv[0]);
		return 2;
	}
	libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
	libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	libcufile = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
	if (!libc || !libcuda || !libcufile) {
		fprintf(stderr, "prereg: dlopen: %s\n", dlerror());
		return 2;
	}
	*(void **)&glibc_dlsym = dlvsym(libc, "dlsym", "GLIBC_2.34");
	if (!glibc_dlsym) {
		fprintf(stderr, "prereg: no dlsym@GLIBC_2.34 in libc.so.6 (glibc < 2.34?)\n");
		return 2;
	}
	*(void **)&cu.init = dlsym(libcuda, "cuInit");
	*(void **)&cu.device_get = dlsym(libcuda, "cuDeviceGet");
	*(void **)&cu.ctx_create = dlsym(libcuda, "cuCtxCreate_v2");
	*(void **)&cu.mem_alloc = dlsym(libcuda, "cuMemAlloc_v2");
	*(void **)&cu.memcpy_dtoh = dlsym(libcuda, "cuMemcpyDtoH_v2");
	*(void **)&real_register = glibc_dlsym(libcufile, "cuFileHandleRegister");
	*(void **)&hook_register = dlsym(libcufile, "cuFileHandleRegister");
	*(void **)&rd = dlsym(libcufile, "cuFileRead");
	if (!cu.init || !cu.device_get || !cu.ctx_create || !cu.mem_alloc || !cu.memcpy_dtoh ||
	    !real_register || !hook_register || !rd) {
		fprintf(stderr, "prereg: a symbol is missing\n");
		return 2;
	}
	if (cu.init(0) || cu.device_get(&dev, 0) || cu.ctx_create(&ctx, 0, dev)) {
		fprintf(stderr, "prereg: CUDA set-up failed\n");
		return 2;
	}
	da.handle.fd = open(argv[2], O_RDONLY | O_DIRECT);
	db.handle.fd = open(argv[3], O_RDONLY | O_DIRECT);
	if (da.handle.fd < 0 || db.handle.fd < 0) {
		fprintf(stderr, "prereg: open: %s\n", strerror(errno));
		return 2;
	}
	if (real_register(&fa, &da).err || hook_register(&fb, &db).err) {
		fprintf(stderr, "prereg: cuFileHandleRegister failed\n");
		return 2;
	}
	size_t a = load(argv[2], rd, fa, da.handle.fd);
	size_t b = load(argv[3], rd, fb, db.handle.fd);
	printf("prereg: %zu unknown-handle bytes, %zu ordinary bytes, ok\n", a, b);
	return 0;
}
