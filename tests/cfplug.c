/*
 * cfplug: libcufile reached the ways plugins and reloads reach it, under the shim (the cuFile
 * cases of harm2_test.sh):
 *
 *   cfplug local PLUGIN FILE     dlopen PLUGIN (tests/cfplug_lib.c, linked to libcufile)
 *                                RTLD_LOCAL and read FILE's first MiB through it: cuFile is the
 *                                process's first hooked call, libcufile is not in the global
 *                                scope
 *   cfplug reload LIBA LIBB FILE dlopen libcufile from LIBA, read FILE through it, dlclose it
 *                                (it unloads); then the same from LIBB, a copy at another
 *                                path, loaded at another address
 *
 * Each read is checked against a plain read of the file.  Prints what each call answered and
 * "ok" when every byte matched; exit 0 unless the command could not run (2).
 */
#include "cufile_types.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LEN (1 << 20)

static unsigned char want[LEN], got[LEN];

static int expect(const char *path)
{
	int fd = open(path, O_RDONLY);

	/* The raw system call: no hook sees it. */
	if (fd < 0 || syscall(SYS_pread64, fd, want, LEN, 0) != LEN)
		return -1;
	close(fd);
	return 0;
}

static int cmd_local(const char *plugin, const char *path)
{
	if (expect(path))
		return 2;
	void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
	int (*read_fn)(const char *, void *, size_t) = h ? dlsym(h, "plugin_read") : NULL;

	if (!read_fn) {
		fprintf(stderr, "cfplug: %s\n", dlerror());
		return 2;
	}
	int r = read_fn(path, got, LEN);
	printf("local: %s\n", r == 0 && !memcmp(want, got, LEN) ? "ok" : "WRONG");
	return 0;
}

/* One round through the library at lib: open, register, read, deregister, close. */
static void round_through(const char *lib, const char *path)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		printf("reload: dlopen %s: %s\n", lib, dlerror());
		return;
	}
	kvs_cufile_driver_open_fn open_fn = (kvs_cufile_driver_open_fn)dlsym(h, "cuFileDriverOpen");
	kvs_cufile_handle_register_fn reg =
	    (kvs_cufile_handle_register_fn)dlsym(h, "cuFileHandleRegister");
	kvs_cufile_read_fn rd = (kvs_cufile_read_fn)dlsym(h, "cuFileRead");
	kvs_cufile_handle_deregister_fn dereg =
	    (kvs_cufile_handle_deregister_fn)dlsym(h, "cuFileHandleDeregister");
	kvs_cufile_driver_close_fn close_fn =
	    (kvs_cufile_driver_close_fn)dlsym(h, "cuFileDriverClose");
	if (!open_fn || !reg || !rd || !dereg || !close_fn) {
		printf("reload: dlsym: %s\n", dlerror());
		return;
	}
	kvs_cufile_descr_t descr = {.type = KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD};
	kvs_cufile_handle_t fh = NULL;
	int fd = open(path, O_RDONLY);
	kvs_cufile_error_t o = open_fn();
	descr.handle.fd = fd;
	kvs_cufile_error_t e = reg(&fh, &descr);
	memset(got, 0, LEN);
	ssize_t n = e.err == KVS_CU_FILE_SUCCESS ? rd(fh, got, LEN, 0, 0) : -2;
	if (e.err == KVS_CU_FILE_SUCCESS)
		dereg(fh);
	close_fn();
	close(fd);
	printf("reload: %s: cuFileDriverOpen %d, cuFileHandleRegister %d, cuFileRead %zd, %s\n",
	       strrchr(lib, '/') ? strrchr(lib, '/') + 1 : lib, (int)o.err, (int)e.err, n,
	       n == LEN && !memcmp(want, got, LEN) ? "ok" : "WRONG");
	struct link_map *lm = NULL;
	uintptr_t base = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm ? (uintptr_t)lm->l_addr : 0;
	dlclose(h);
	void *still = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	printf("reload: after dlclose: %s\n", still ? "still loaded" : "unloaded");
	if (still)
		dlclose(still);
	/* The next library must load elsewhere: where this one was is kept unmapped (a call to
	 * a function remembered from it faults). */
	for (size_t len = 8u << 20; base && len >= 4096; len /= 2)
		if (mmap((void *)base, len, PROT_NONE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != MAP_FAILED)
			break;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "local"))
		return cmd_local(argv[2], argv[3]);
	if (argc == 5 && !strcmp(argv[1], "reload")) {
		if (expect(argv[4]))
			return 2;
		round_through(argv[2], argv[4]);
		round_through(argv[3], argv[4]);
		return 0;
	}
	fprintf(stderr, "usage: cfplug local PLUGIN FILE | cfplug reload LIBA LIBB FILE\n");
	return 2;
}
