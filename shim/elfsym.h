/*
 * elfsym: find a function in an object already loaded, without dlsym (which the shim
 * interposes; see dlsym.c).
 */
#ifndef KVS_ELFSYM_H
#define KVS_ELFSYM_H

#include <stdint.h>

/* The address of function name, defined with version (NULL: its default version) by the
 * first loaded object whose file name starts with lib ("libc.so."), or NULL.  IFUNCs are
 * not found.  Safe at any time after ld.so has loaded the program's libraries, before a
 * sanitizer runtime is initialised too; allocates nothing, calls nothing, takes no lock. */
void *kvs_elf_symbol(const char *lib, const char *name, const char *version);

/* The same in one object, loaded at base with its dynamic section at dynamic (what
 * dl_iterate_phdr gives: dlpi_addr, and its PT_DYNAMIC); the caller keeps the object loaded
 * meanwhile. */
void *kvs_elf_object_symbol(uintptr_t base, const void *dynamic, const char *name,
			    const char *version);

#endif
