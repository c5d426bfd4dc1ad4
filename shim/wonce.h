/*
 * wonce: the rule of a files.write_once root, kept for this process's writes.
 *
 * A file there is keyed by birth (cache.h, struct kvs_ident): its block id does not move when
 * it is written, so a rewrite in place would leave old bytes under its key.  The declaration
 * says it never happens; when a process under the shim does it anyway, the shim sees it: an
 * open for writing with O_TRUNC of a file that held bytes, a truncation, or a write that
 * overlaps bytes the file held (data, not holes) when this process opened it (or, for a
 * descriptor opened where the shim did not see it, when it first wrote to it) is a rewrite in
 * place.  The file's shards are then dropped (the caller invalidates them all, before the write
 * and after it), and the first one per file and open is counted (write_once_violations) and
 * said (the declaration was wrong for that file).  A new file written in any order (through
 * several descriptors, filling holes: UCM's dump), appended to, or patched over its own new
 * bytes (a header written last) is no violation.
 *
 * What a process outside the shim does is not seen: docs/operations.md says what goes wrong
 * when a declared root is rewritten in place.
 *
 * kvs_wonce_opening/_opened and kvs_wonce_rewrites run with the shim's guard held and take a
 * mutex for a few loads and stores; kvs_wonce_closed takes no lock (close may be called from a
 * signal handler).
 */
#ifndef KVS_SHIM_WONCE_H
#define KVS_SHIM_WONCE_H

#include <stdbool.h>
#include <stdint.h>

#include "fdinfo.h"

struct kvs_cache;

/* An open for writing in progress (hooks/open.c), on the caller's stack. */
struct kvs_wonce_open {
	bool on;	    /* an existing file of a write-once root: kvs_wonce_opened records it */
	bool truncates;	    /* O_TRUNC of bytes it held: a rewrite, counted once the open is made */
	uint64_t dev, ino;  /* the file */
	uint64_t open_size; /* its size before the open (before O_TRUNC) */
	struct kvs_cache *c; /* the region, where truncates dropped the shards */
};

/* Before open/openat/creat of path (relative to dirfd) with flags: if it names an existing
 * file of a write-once root and the open may write it, note its size; with O_TRUNC on a file
 * that held bytes, drop its shards now (region() maps the region for it) and count the rewrite
 * once the open is made.  Returns false when nothing is to be done after the open. */
bool kvs_wonce_opening(struct kvs_wonce_open *o, struct kvs_cache *(*region)(void), int dirfd,
		       const char *path, int flags);

/* The open returned fd (>= 0): record the file's size at the open for its later writes. */
void kvs_wonce_opened(const struct kvs_wonce_open *o, int fd);

/* A write of len bytes at off to fd, which fi describes (a KV file keyed by birth), is about
 * to be made, or was just made and returned bytes (after: called again after it): true when it
 * rewrites bytes in place (bytes the file held, not a hole), and the caller must drop every
 * shard of the file.  Only a write that was made counts (write_once_violations, in c, which may
 * be NULL) and is said: the call after it, or kvs_wonce_made for a change whose caller calls
 * nothing else after it (an asynchronous write, whose result comes later: at its submission;
 * an fwrite: once the stream took the bytes); a write that failed (EBADF on a read-only descriptor)
 * or went to the end (O_APPEND, RWF_APPEND) never does.  Before the write, a write below the file's
 * size costs an open of /proc/self/fd/N, an lseek(SEEK_DATA) and a close. */
bool kvs_wonce_rewrites(struct kvs_cache *c, int fd, const struct kvs_fdinfo *fi, uint64_t off,
			uint64_t len, bool after);
void kvs_wonce_made(struct kvs_cache *c, int fd, const struct kvs_fdinfo *fi);

/* The program closed fd, or every number of [lo, hi]: this process's records of files opened
 * through them end.  Atomics only, async-signal-safe. */
void kvs_wonce_closed(int fd);
void kvs_wonce_closed_range(unsigned int lo, unsigned int hi);

/* The fork child: the parent's records are the parent's. */
void kvs_wonce_atfork_child(void);

#endif
