/*
 * touch: a timestamp call by this process on a KV file keeps the file's cached shards.
 *
 * A file keyed by change (cache.h, struct kvs_ident) gets a new block id whenever its mtime or
 * ctime moves, and every timestamp call moves ctime: UCM's store calls utime(path, NULL) on
 * every block a lookup finds, llm-d's sets atime on every read.  Without help each touch
 * orphans the file's warm shards.  So the timestamp hooks (hooks/time.c, and the syscall()
 * door) wrap the real call: kvs_touch_before takes the file's identity and its write-sequence
 * mark, and kvs_touch_after, if the call succeeded and nothing else can have changed the file
 * (same inode and size, the mtime a call that leaves it left as it was, no write under the
 * shim began or ended in between), moves each cached shard to the identity the call left
 * (kvs_cache_rekey_until, which keeps each shard's expiry; on a file system whose stamps
 * another machine may write, at most until files.settle from now).
 *
 * What it cannot see: a write between the look before and the call that the call's own stamps
 * cover up (by a process outside the shim, or one under it that the write sequence does not
 * follow: touch.c has the list); docs/operations.md says so.  A touch by a process outside the
 * shim still moves the identity: a miss, never a stale byte.  Files keyed by birth
 * (files.write_once) keep their id through a touch and need none of this.
 *
 * Both functions never fail the caller's call and leave errno as they found it.
 */
#ifndef KVS_SHIM_TOUCH_H
#define KVS_SHIM_TOUCH_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "cache.h"

/* What a timestamp call names: the descriptor dirfd itself (on_fd), or the file at path
 * relative to dirfd; a final symbolic link followed unless nofollow.  times: the call's
 * utimensat pair, or NULL for a call that sets mtime (utime, utimes, a NULL pair).  No pointer
 * of the caller's is read but through the kernel, so a bad one makes the call the kernel's
 * alone (EFAULT). */
struct kvs_touch_target {
	int dirfd;
	const char *path;
	bool on_fd;
	bool nofollow;
	const struct timespec *times;
};

/* One timestamp call in progress, on the caller's stack. */
struct kvs_touch {
	bool on;	  /* kvs_touch_after has work to do */
	int fd;		  /* the descriptor the identity is read through */
	bool own_fd;	  /* fd is the shim's own (O_PATH), closed by kvs_touch_after */
	bool keeps_mtime; /* the call leaves mtime as it is (UTIME_OMIT) */
	uint64_t cap_ns;  /* the moved shards are kept at most until then (0: as they were) */
	struct kvs_cache *c;
	struct kvs_ident pre;
	uint64_t mark; /* the write-sequence mark before the call */
};

/* Before a timestamp call on what tg names.  Returns false when there is nothing to do after
 * the call (the shim is off, not a regular KV file keyed by change, no region, a write of it
 * in flight); then kvs_touch_after need not be called. */
bool kvs_touch_before(struct kvs_touch *t, const struct kvs_touch_target *tg);

/* After the real call returned ret (0 or -1). */
void kvs_touch_after(struct kvs_touch *t, int ret);

/* The syscall() door's timestamp numbers (SYS_utime, SYS_utimes, SYS_futimesat,
 * SYS_utimensat; a[] the call's arguments), made with raw (the kernel's answer, -errno) between
 * kvs_touch_before and kvs_touch_after.  Returns raw's answer.  hooks/time.c. */
long kvs_time_syscall(long number, const long *a, long (*raw)(long, const long *));

#endif
