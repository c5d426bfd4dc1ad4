/*
 * cfplug_lib: a plugin linked to libcufile (NEEDED), as NIXL's GDS plugin is, for cfplug
 * local: the program dlopen()s it RTLD_LOCAL, so libcufile is loaded where a lookup through
 * the global scope (the shim's RTLD_NEXT) never finds it.
 */
#include "cufile_types.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

kvs_cufile_error_t cuFileDriverOpen(void);
kvs_cufile_error_t cuFileHandleRegister(kvs_cufile_handle_t *fh, kvs_cufile_descr_t *descr);
void cuFileHandleDeregister(kvs_cufile_handle_t fh);
ssize_t cuFileRead(kvs_cufile_handle_t fh, void *buf, size_t size, off_t file_offset,
		   off_t buf_offset);

/* Register path's descriptor and read len bytes into buf; print what each call answered. */
__attribute__((visibility("default"))) int plugin_read(const char *path, void *buf, size_t len)
{
	kvs_cufile_descr_t descr = {.type = KVS_CU_FILE_HANDLE_TYPE_OPAQUE_FD};
	kvs_cufile_handle_t fh = NULL;
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return -1;
	descr.handle.fd = fd;
	kvs_cufile_error_t e = cuFileHandleRegister(&fh, &descr);
	ssize_t n = e.err == KVS_CU_FILE_SUCCESS ? cuFileRead(fh, buf, len, 0, 0) : -2;
	printf("plugin: cuFileHandleRegister %d, cuFileRead %zd\n", (int)e.err, n);
	if (e.err == KVS_CU_FILE_SUCCESS)
		cuFileHandleDeregister(fh);
	close(fd);
	return n == (ssize_t)len ? 0 : 1;
}
