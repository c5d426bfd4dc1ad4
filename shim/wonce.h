/*
 * wonce: the rule of a files.write_once root, kept for this process's writes.
 *
 * A file there is keyed by birth (cache.h, struct kvs_ident): its block id does not move when
 * it is written, so a rewrite in place would leave old bytes under its key.  The declaration
 * says it never happens; when a process under the shim does it anyway, the shim sees it:
 * a write that overlaps bytes the file held (data, not holes) when this process first wrote to
 * it (since it last closed it) is a rewrite in place.  The file's shards are then dropped around
 * each such write (the caller invalidates them all, before the write and after it), and the first
 * one per file is counted (write_once_violations) and said once (the declaration was wrong for that
 * file).  A new file written in any order, appended to, or patched over its own new bytes (a header
 * written last) is no violation.
 *
 * What a process outside the shim does is not seen: docs/operations.md says what goes wrong
 * when a declared root is rewritten in place.
 *
 * Called with the shim's guard held; takes a mutex for a few loads and stores.
 */
#ifndef KVS_SHIM_WONCE_H
#define KVS_SHIM_WONCE_H

#include <stdbool.h>
#include <stdint.h>

#include "fdinfo.h"

struct kvs_cache;

/* A write of len bytes at off to fd, which fi describes (a KV file keyed by birth), is about
 * to be made, or was just made (after: called again after it): true when it rewrites bytes
 * in place (bytes the file held, not a hole), and the caller must drop every shard of the
 * file.  c (may be NULL) counts it.  Before the write, a write below the file's size costs an
 * open of /proc/self/fd/N, an lseek(SEEK_DATA) and a close. */
bool kvs_wonce_rewrites(struct kvs_cache *c, int fd, const struct kvs_fdinfo *fi, uint64_t off,
			uint64_t len, bool after);

/* The program closed fd: this process's record of a file written through it ends. */
void kvs_wonce_closed(int fd);

/* The fork child: the parent's records are the parent's. */
void kvs_wonce_atfork_child(void);

#endif
