/*
 * hooks_cufile: libcufile's names and dlclose, the doors of cuFile (their engine: api/cufile.c;
 * the batch doors: hooks/cufile_batch.c), one call each into kvs_cufile_*; and the doors the
 * dlsym door answers a cuFile name with (kvs_cufile_dlsym).
 */
#include <errno.h>
#include <stdbool.h>

#include "cufile.h"
#include "dlsym.h"
#include "hooks_cufile.h"
#include "hooks_uring.h"
#include "shim.h"

/* The real dlclose; then, if a library went, the real functions found in it are forgotten:
 * cuFile's (asked before the call, loads only) and liburing's. */
KVS_EXPORT int dlclose(void *handle)
{
	bool remembered = kvs_cufile_real_any();
	int r = kvs_dlclose_real(handle);
	if (r == 0) {
		int saved = errno;

		if (remembered)
			kvs_cufile_unloaded();
		kvs_uring_unloaded();
		errno = saved;
	}
	return r;
}

KVS_EXPORT kvs_cufile_error_t cuFileHandleRegister(kvs_cufile_handle_t *fh,
						   kvs_cufile_descr_t *descr)
{
	return kvs_cufile_handle_register(fh, descr);
}

KVS_EXPORT void cuFileHandleDeregister(kvs_cufile_handle_t fh)
{
	kvs_cufile_handle_deregister(fh);
}

KVS_EXPORT ssize_t cuFileRead(kvs_cufile_handle_t fh, void *buf, size_t size, off_t file_offset,
			      off_t buf_offset)
{
	return kvs_cufile_read(fh, buf, size, file_offset, buf_offset);
}

KVS_EXPORT ssize_t cuFileWrite(kvs_cufile_handle_t fh, const void *buf, size_t size,
			       off_t file_offset, off_t buf_offset)
{
	return kvs_cufile_write(fh, buf, size, file_offset, buf_offset);
}

KVS_EXPORT kvs_cufile_error_t cuFileStreamRegister(kvs_cu_stream_t stream, unsigned flags)
{
	return kvs_cufile_stream_register(stream, flags);
}

KVS_EXPORT kvs_cufile_error_t cuFileStreamDeregister(kvs_cu_stream_t stream)
{
	return kvs_cufile_stream_deregister(stream);
}

KVS_EXPORT kvs_cufile_error_t cuFileReadAsync(kvs_cufile_handle_t fh, void *buf, size_t *size_p,
					      off_t *file_offset_p, off_t *buf_offset_p,
					      ssize_t *bytes_read_p, kvs_cu_stream_t stream)
{
	return kvs_cufile_read_async(fh, buf, size_p, file_offset_p, buf_offset_p, bytes_read_p,
				     stream);
}

/* The doors the shim answers dlsym with; names not here are looked up as always. */
static void *const doors[KVS_CF_N] = {
    [KVS_CF_cuFileHandleRegister] = (void *)cuFileHandleRegister,
    [KVS_CF_cuFileHandleDeregister] = (void *)cuFileHandleDeregister,
    [KVS_CF_cuFileRead] = (void *)cuFileRead,
    [KVS_CF_cuFileWrite] = (void *)cuFileWrite,
    [KVS_CF_cuFileBatchIOSetUp] = (void *)cuFileBatchIOSetUp,
    [KVS_CF_cuFileBatchIOSubmit] = (void *)cuFileBatchIOSubmit,
    [KVS_CF_cuFileBatchIOGetStatus] = (void *)cuFileBatchIOGetStatus,
    [KVS_CF_cuFileBatchIOCancel] = (void *)cuFileBatchIOCancel,
    [KVS_CF_cuFileBatchIODestroy] = (void *)cuFileBatchIODestroy,
    [KVS_CF_cuFileReadAsync] = (void *)cuFileReadAsync,
    [KVS_CF_cuFileStreamRegister] = (void *)cuFileStreamRegister,
    [KVS_CF_cuFileStreamDeregister] = (void *)cuFileStreamDeregister,
};

void *kvs_cufile_dlsym(void *handle, const char *name, const char *version)
{
	return kvs_cufile_answer(handle, name, version, doors);
}
