/*
 * cufile: the interposed cuFile calls (docs/design.md, "The GPU path: cuFile, dlsym and device
 * copies").  The hooks are exported under libcufile's own names, for programs that link it
 * (NEEDED), and answered by the shim's dlsym for programs that dlopen it (kvs_cufile_dlsym).
 * Reads the cache can serve are served; everything else, and every failure inside the shim,
 * goes to the real libcufile.
 */
#ifndef KVS_SHIM_CUFILE_H
#define KVS_SHIM_CUFILE_H

#include <stdbool.h>

#include "cufile_types.h"

/*
 * The dlsym hook's answer for a name that starts with "cuFile" (dlsym.h): the shim's hook when
 * handle is a libcufile handle and the library defines name (version: dlvsym's, "" for none
 * given, NULL for dlsym); KVS_DLSYM_NULL when the library lacks it; NULL (pass through) for a
 * name the shim does not hook, another library, RTLD_NEXT, or a shim that is off.  Takes no
 * lock other than ld.so's.
 */
void *kvs_cufile_dlsym(void *handle, const char *name, const char *version);

/* Indices of the real functions the hooks call (the hooked names, and the driver calls the
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
 * NULL when there is none.  Forgotten when its library is unloaded (the shim's dlclose). */
void *kvs_cufile_real(enum kvs_cufile_fn fn);

/* Whether fd is the descriptor of a handle registered through the shim: fdinfo.h,
 * kvs_fdinfo_cufile_registered (the ground floor's, since serve.c asks it). */
/* The descriptor registered for fh (OPAQUE_FD handles registered through the shim), or -1. */
int kvs_cufile_fd(kvs_cufile_handle_t fh);

#endif
