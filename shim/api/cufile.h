/*
 * cufile: the engine of the interposed cuFile calls (api/cufile.c; the batch calls:
 * api/cufile_batch.c; docs/design.md, "The GPU path: cuFile, dlsym and device copies"), below
 * their doors (hooks/cufile.c, hooks/cufile_batch.c: libcufile's names, one call each into
 * kvs_cufile_*).  The doors are exported under libcufile's own names, for programs that link it
 * (NEEDED), and answered by the shim's dlsym for programs that dlopen it (kvs_cufile_answer).
 * Reads the cache can serve are served; everything else, and every failure inside the shim,
 * goes to the real libcufile.  Each entry point answers as libcufile's function of its name.
 */
#ifndef KVS_SHIM_CUFILE_H
#define KVS_SHIM_CUFILE_H

#include <stdbool.h>
#include <sys/types.h>
#include <time.h>

#include "cufile_types.h"

/* Indices of the real functions the engine calls (the hooked names, and the driver calls the
 * batch code uses). */
enum kvs_cufile_fn {
#define KVS_CF_ENUM(name, type) KVS_CF_##name,
	KVS_CUFILE_API(KVS_CF_ENUM)
#undef KVS_CF_ENUM
	    KVS_CF_N
};

/* The real libcufile's function, found on first use: the library a caller looked names up in,
 * else the next object after the shim (a NEEDED link), else a libcufile loaded anywhere
 * (RTLD_LOCAL), else cuda.cufile_library opened by the shim; never one of the shim's own.
 * NULL when there is none.  Forgotten when its library is unloaded (kvs_cufile_unloaded). */
void *kvs_cufile_real(enum kvs_cufile_fn fn);

/* Whether fd is the descriptor of a handle registered through the shim: fdinfo.h,
 * kvs_fdinfo_cufile_registered (the ground floor's, since serve.c asks it). */
/* The descriptor registered for fh (OPAQUE_FD handles registered through the shim), or -1. */
int kvs_cufile_fd(kvs_cufile_handle_t fh);

/* For the dlclose door: has any real function been found (loads only)?  Asked before the real
 * dlclose; if so, once it has unloaded a library, kvs_cufile_unloaded forgets every real
 * function that no loaded object contains any more (and the caller's library handle with them,
 * unless the shim opened it). */
bool kvs_cufile_real_any(void);
void kvs_cufile_unloaded(void);

/*
 * The dlsym door's answer for a name that starts with "cuFile" (dlsym.h): hooks[fn] (the shim's
 * door for each kvs_cufile_fn, NULL for a name it does not hook) when handle is a libcufile
 * handle and the library defines name (version: dlvsym's, "" for none given, NULL for dlsym);
 * KVS_DLSYM_NULL when the library lacks it; NULL (pass through) for a name the shim does not
 * hook, another library, RTLD_NEXT, or a shim that is off.  Takes no lock other than ld.so's.
 */
void *kvs_cufile_answer(void *handle, const char *name, const char *version,
			void *const hooks[KVS_CF_N]);

/* cuFileHandleRegister and Deregister: an OPAQUE_FD handle is recorded (kvs_cufile_fd). */
kvs_cufile_error_t kvs_cufile_handle_register(kvs_cufile_handle_t *fh, kvs_cufile_descr_t *descr);
void kvs_cufile_handle_deregister(kvs_cufile_handle_t fh);
/* cuFileRead, served when it can be; cuFileWrite, followed for invalidation and write-through. */
ssize_t kvs_cufile_read(kvs_cufile_handle_t fh, void *buf, size_t size, off_t file_offset,
			off_t buf_offset);
ssize_t kvs_cufile_write(kvs_cufile_handle_t fh, const void *buf, size_t size, off_t file_offset,
			 off_t buf_offset);
/* cuFileStreamRegister and Deregister: the streams with fixed sizes and offsets are recorded;
 * cuFileReadAsync on one of them may be served (serve_stream.c). */
kvs_cufile_error_t kvs_cufile_stream_register(kvs_cu_stream_t stream, unsigned flags);
kvs_cufile_error_t kvs_cufile_stream_deregister(kvs_cu_stream_t stream);
kvs_cufile_error_t kvs_cufile_read_async(kvs_cufile_handle_t fh, void *buf, size_t *size_p,
					 off_t *file_offset_p, off_t *buf_offset_p,
					 ssize_t *bytes_read_p, kvs_cu_stream_t stream);

/* The batch calls over a mixed batch (api/cufile_batch.c; docs/design.md, "Batches"). */
kvs_cufile_error_t kvs_cufile_batch_setup(kvs_cufile_batch_handle_t *batch_idp, unsigned nr);
kvs_cufile_error_t kvs_cufile_batch_submit(kvs_cufile_batch_handle_t batch_idp, unsigned nr,
					   kvs_cufile_io_params_t *iocbp, unsigned int flags);
kvs_cufile_error_t kvs_cufile_batch_get_status(kvs_cufile_batch_handle_t batch_idp, unsigned min_nr,
					       unsigned *nr, kvs_cufile_io_events_t *iocbp,
					       struct timespec *timeout);
kvs_cufile_error_t kvs_cufile_batch_cancel(kvs_cufile_batch_handle_t batch_idp);
void kvs_cufile_batch_destroy(kvs_cufile_batch_handle_t batch_idp);

#endif
