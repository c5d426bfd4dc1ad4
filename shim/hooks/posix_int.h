/*
 * posix_int: what the two files of the POSIX doors (hooks/posix.c, hooks/posix_fd.c) share,
 * and nothing else includes.
 */
#ifndef KVS_SHIM_POSIX_INT_H
#define KVS_SHIM_POSIX_INT_H

#include "real.h"
#include "shim.h"

/* The first line of the hook of a function POSIX lists as async-signal-safe: inside the shim
 * (its own call, or a signal handler that interrupted it), the real call and nothing more
 * (guard.h, kvs_shim_inside). */
#define REAL_IF_INSIDE(call)                                                                       \
	do {                                                                                       \
		if (kvs_shim_inside()) {                                                           \
			kvs_real_init();                                                           \
			return (call);                                                             \
		}                                                                                  \
	} while (0)

#endif
