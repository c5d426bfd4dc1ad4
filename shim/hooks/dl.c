/*
 * dl: the dlsym and dlvsym doors' C half (the entry points are dlsym_stub.S, which jumps to
 * glibc's function with the caller's return address when these answer "pass through"): a
 * lookup of a cuFile name is answered with the shim's hook for it (cufile.c), every other one
 * keeps its exact meaning.  Built without sanitizers, as dlsym.c (shim/CMakeLists.txt): it runs
 * inside the first dlsym of the process.
 */
#include <stdbool.h>
#include <stddef.h>

#include "dlsym.h"
#include "hooks_cufile.h"

/* Does name start with "cuFile"?  No libc: see the top of elfsym.c (this file is built without
 * sanitizers for the same reason). */
static bool cufile_name(const char *name)
{
	static const char p[] = "cuFile";

	if (!name)
		return false;
	for (int i = 0; p[i]; i++)
		if (name[i] != p[i])
			return false;
	return true;
}

/* Called by the stub's dlsym.  NULL: pass through; KVS_DLSYM_NULL: answer NULL; else the
 * address to answer. */
void *kvs_dlsym_hook(void *handle, const char *name);
void *kvs_dlsym_hook(void *handle, const char *name)
{
	kvs_dlsym_resolve();
	if (!cufile_name(name))
		return NULL;
	return kvs_cufile_dlsym(handle, name, NULL);
}

void *kvs_dlvsym_hook(void *handle, const char *name, const char *version);
void *kvs_dlvsym_hook(void *handle, const char *name, const char *version)
{
	kvs_dlsym_resolve();
	if (!cufile_name(name))
		return NULL;
	return kvs_cufile_dlsym(handle, name, version ? version : "");
}
