/*
 * elfsym: find a function in an object already loaded, without dlsym (which the shim
 * interposes; see dlsym.c).
 */
#ifndef KVS_ELFSYM_H
#define KVS_ELFSYM_H

/* The address of function name, defined with version (NULL: its default version) by the
 * first loaded object whose file name starts with lib ("libc.so."), or NULL.  IFUNCs are
 * not found.  Safe at any time after the program has started; allocates
 * nothing; takes ld.so's lock for the walk (dl_iterate_phdr). */
void *kvs_elf_symbol(const char *lib, const char *name, const char *version);

#endif
