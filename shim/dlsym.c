/*
 * dlsym: the C half of the shim's dlsym and dlvsym (see dlsym.h; the entry points are in
 * hooks/dlsym_stub.S).
 *
 * The hooks run inside every dlsym of the process, before anything else of the shim: they take
 * no lock, allocate nothing, and answer in a few compares for any name that does not start with
 * "cuFile".  glibc's functions are found once by reading libc's symbol table (elfsym.c), never
 * through dlsym or dlvsym, which are ours; two threads may both resolve, and both store the
 * same values.  The stub reads kvs_real_dlsym_fn only after the hook returned, and the hook
 * stores it (release) before it returns.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "dlsym.h"
#include "elfsym.h"

/* Read by hooks/dlsym_stub.S. */
void *(*kvs_real_dlsym_fn)(void *, const char *);
void *(*kvs_real_dlvsym_fn)(void *, const char *, const char *);

static void *no_dlsym(void *handle, const char *name)
{
	return NULL; /* glibc without a dlsym we can find: nothing can be looked up */
}

static void *no_dlvsym(void *handle, const char *name, const char *version)
{
	return NULL;
}

void kvs_dlsym_resolve(void)
{
	if (__atomic_load_n(&kvs_real_dlsym_fn, __ATOMIC_ACQUIRE)) /* pairs below */
		return;
	/* glibc 2.34 moved dlsym into libc; before, it lived in libdl. */
	void *s = kvs_elf_symbol("libc.so.", "dlsym", NULL);
	void *v = kvs_elf_symbol("libc.so.", "dlvsym", NULL);
	if (!s)
		s = kvs_elf_symbol("libdl.so.", "dlsym", NULL);
	if (!v)
		v = kvs_elf_symbol("libdl.so.", "dlvsym", NULL);
	__atomic_store_n(&kvs_real_dlvsym_fn, v ? v : (void *)no_dlvsym, __ATOMIC_RELAXED);
	__atomic_store_n(&kvs_real_dlsym_fn, s ? s : (void *)no_dlsym, __ATOMIC_RELEASE);
}

void *kvs_dlsym_real(void *handle, const char *name)
{
	kvs_dlsym_resolve();
	return kvs_real_dlsym_fn(handle, name);
}

void *kvs_dlvsym_real(void *handle, const char *name, const char *version)
{
	kvs_dlsym_resolve();
	return kvs_real_dlvsym_fn(handle, name, version);
}

int kvs_dlsym_in_shim(const void *p)
{
	Dl_info a, b;

	return p && dladdr(p, &a) && dladdr((void *)kvs_dlsym_resolve, &b) &&
	       a.dli_fbase == b.dli_fbase;
}

int kvs_dlclose_real(void *handle)
{
	static int (*_Atomic fn)(void *);
	int (*f)(void *) = atomic_load_explicit(&fn, memory_order_relaxed);

	if (!f) {
		f = (int (*)(void *))kvs_elf_symbol("libc.so.", "dlclose", NULL);
		if (!f)
			f = (int (*)(void *))kvs_elf_symbol("libdl.so.", "dlclose", NULL);
		if (!f) {
			void *p = kvs_dlsym_real(RTLD_NEXT, "dlclose");

			f = kvs_dlsym_in_shim(p) ? NULL : (int (*)(void *))p;
		}
		atomic_store_explicit(&fn, f, memory_order_relaxed);
	}
	return f ? f(handle) : -1;
}
