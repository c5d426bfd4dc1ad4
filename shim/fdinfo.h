/*
 * fdinfo: is this descriptor a KV file, which block is it, and which descriptor may the shim
 * read it through?
 *
 * A descriptor is a KV file when fstat says it is a regular file and its path (from
 * /proc/self/fd) lies under one of files.roots.  The verdict, the block id and the file's
 * O_DIRECT alignment are cached per descriptor number together with the identity they were
 * computed for (st_dev, st_ino, st_size, st_mtim, st_ctim); every call re-runs fstat and
 * recomputes on any difference, so dup, close, descriptor reuse and fork need no hooks.
 *
 * The descriptors the loader reads through are anchor.h's.
 */
#ifndef KVS_SHIM_FDINFO_H
#define KVS_SHIM_FDINFO_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"

struct kvs_fdinfo {
	bool kv;
	bool direct;		/* O_DIRECT is set on the descriptor now */
	bool append;		/* O_APPEND is set on the descriptor now */
	bool readable;		/* opened for reading (not O_WRONLY, not O_PATH) */
	struct kvs_key block;	/* valid when kv */
	uint64_t dev, ino;	/* st_dev, st_ino */
	uint64_t size;		/* st_size now */
	uint64_t changed_ns;	/* the later of st_mtim and st_ctim, ns since the epoch */
	uint64_t settle_ns;	/* files.settle for this file: how long its times stay suspect */
	bool node_clock;	/* its file system's stamps may come from another machine's clock */
	uint32_t dio_mem_align; /* O_DIRECT alignment of buffers */
	uint32_t dio_off_align; /* O_DIRECT alignment of offsets and lengths */
	bool dio_zero_tail;	/* a short O_DIRECT read zeroes the rest of the buffers */
};

/* Set the roots (colon-separated directories; each is canonicalised, missing ones dropped).
 * Returns the number of usable roots. */
int kvs_fdinfo_set_roots(const char *roots);

/* Set files.settle in milliseconds, or -1 for the default of each file system type
 * (docs/operations.md has the table). */
void kvs_fdinfo_set_settle(int64_t ms);

/* Describe fd.  Returns 0, or -errno when fstat/fcntl fail (then the caller passes through). */
int kvs_fdinfo_get(int fd, struct kvs_fdinfo *out);

/* Describe fd only if a recent read found it to be a KV file (one fstat, no path lookup).
 * Returns 0 when fd is a known KV file, -ENOENT otherwise. */
int kvs_fdinfo_known(int fd, struct kvs_fdinfo *out);

/* Did the last look at fd find a KV file?  One load, no system call: a hint for counting reads
 * the shim passes through (stale after a close or dup2 until the next look). */
bool kvs_fdinfo_hint_kv(int fd);

#endif
