/*
 * dlsym: the shim's dlsym and dlvsym (hooks/dlsym_stub.S, dlsym.c).  Callers that look cuFile
 * functions up on a libcufile handle (kvikio, Python ctypes, NIXL's plugins) get the shim's
 * hooks; every other lookup keeps its exact meaning, RTLD_NEXT included, because the stub
 * jumps to glibc's function with the caller's return address.
 */
#ifndef KVS_SHIM_DLSYM_H
#define KVS_SHIM_DLSYM_H

/* The hook's answer "return NULL" (dlerror already set), apart from NULL = "pass through". */
#define KVS_DLSYM_NULL ((void *)1)

/* glibc's dlsym and dlvsym, for the shim's own lookups (RTLD_NEXT is then relative to the
 * shim).  Never NULL once kvs_dlsym_resolve has run; resolving is idempotent and lock-free. */
void *kvs_dlsym_real(void *handle, const char *name);
void *kvs_dlvsym_real(void *handle, const char *name, const char *version);

/* glibc's dlclose, from libc's symbol table (2.34 and later) or libdl's, never the shim's:
 * the shim's own handles (RTLD_NOLOAD lookups) are closed through it.  -1 when there is none
 * (nothing the shim can call). */
int kvs_dlclose_real(void *handle);

/* Find glibc's functions (kvs_elf_symbol); called by every hook and by kvs_real_init. */
void kvs_dlsym_resolve(void);

/* Is p inside the shim's own object? */
int kvs_dlsym_in_shim(const void *p);

#endif
