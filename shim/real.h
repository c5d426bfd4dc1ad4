/*
 * real: the libc functions the shim interposes (exports.def's KVS_HOOK rows), as the next object
 * in the lookup order provides them (dlsym(RTLD_NEXT)), resolved once.  A name that cannot be
 * resolved falls back to the raw system call where one exists, so a hook can always make "the
 * real call".
 */
#ifndef KVS_SHIM_REAL_H
#define KVS_SHIM_REAL_H

#include <stdio.h>
#include <sys/time.h>
#include <time.h>
#include <utime.h>
#include <sys/types.h>
#include <sys/uio.h>

/* One function pointer per KVS_HOOK row of exports.def. */
struct kvs_real {
#define KVS_HOOK(field, symbol, ret, params, fallback) ret(*field) params;
#define KVS_DOOR(symbol)
#include "exports.def"
#undef KVS_HOOK
#undef KVS_DOOR
};

extern struct kvs_real kvs_real;

/* Resolve every pointer (once; later calls return at once).  Never fails. */
void kvs_real_init(void);

#endif
