/*
 * fdinfo: is this descriptor a KV file, and which block is it?
 *
 * A descriptor is a KV file when fstat says it is a regular file and its path (from
 * /proc/self/fd) lies under one of files.roots.  The verdict, the block id and the file's
 * O_DIRECT alignment are cached per descriptor number together with the identity they were
 * computed for (st_dev, st_ino, st_size, st_mtim, st_ctim); every call re-runs fstat and
 * recomputes on any difference, so dup, close, descriptor reuse and fork need no hooks.
 */
#ifndef KVS_SHIM_FDINFO_H
#define KVS_SHIM_FDINFO_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"

struct kvs_fdinfo {
	bool kv;
	bool direct;		/* O_DIRECT is set on the descriptor now */
	bool readable;		/* opened for reading */
	struct kvs_key block;	/* valid when kv */
	uint64_t size;		/* st_size now */
	uint32_t dio_mem_align; /* O_DIRECT alignment of buffers */
	uint32_t dio_off_align; /* O_DIRECT alignment of offsets and lengths */
	bool dio_zero_tail;	/* a short O_DIRECT read zeroes the rest of the buffers */
};

/* Set the roots (colon-separated directories; each is canonicalised, missing ones dropped).
 * Returns the number of usable roots. */
int kvs_fdinfo_set_roots(const char *roots);

/* Describe fd.  Returns 0, or -errno when fstat/fcntl fail (then the caller passes through). */
int kvs_fdinfo_get(int fd, struct kvs_fdinfo *out);

/* Describe fd only if a recent read found it to be a KV file (one fstat, no path lookup).
 * Returns 0 when fd is a known KV file, -ENOENT otherwise. */
int kvs_fdinfo_known(int fd, struct kvs_fdinfo *out);

#endif
