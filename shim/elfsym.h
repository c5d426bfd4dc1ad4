/*
 * elfsym: find a function in an object already loaded, without dlsym (which the shim
 * interposes; see dlsym.c).
 */
#ifndef KVS_ELFSYM_H
#define KVS_ELFSYM_H

/* The address of function name, defined with version (NULL: its default version) by the
 * first loaded object whose file name starts with lib ("libc.so."), or NULL.  IFUNCs are
 * not found.  Safe at any time after ld.so has loaded the program's libraries, before a
 * sanitizer runtime is initialised too; allocates nothing, calls nothing, takes no lock. */
void *kvs_elf_symbol(const char *lib, const char *name, const char *version);

#endif
