/*
 * shim: the interposer's state and its one decision, "serve this read from the cache or make
 * the real call".  The hooks (hooks_posix.c) are thin wrappers over kvs_shim_read and
 * kvs_shim_before_write.
 *
 * Life of a process: nothing happens at load time.  The first hooked call loads the
 * configuration (pthread_once); the first cacheable read maps the region, attaches and starts
 * the loader.  After fork the child forgets the parent's mapping and threads and starts over
 * lazily.  A per-thread guard makes every libc call the shim itself makes go straight to the
 * real function.
 */
#ifndef KVS_SHIM_H
#define KVS_SHIM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define KVS_EXPORT __attribute__((visibility("default")))

/*
 * Serve a read of fd into iov from the cache.  use_pos: read at (and advance) the file
 * position, as read/readv do; else read at off, as pread does.  Returns the byte count the
 * real call would return, or -1 when the caller must make the real call (nothing was changed:
 * not the buffers' promised content, not the position, not errno).
 */
ssize_t kvs_shim_read(int fd, const struct iovec *iov, int iovcnt, off_t off, bool use_pos);

/* Invalidate the cached shards of fd's file that a write of len bytes at off changes; with
 * use_pos, at the file position plus pos_delta (0 before a write, minus the count after it).
 * Hooks call it before the write (the old identity's shards) and after it (shards another
 * process may have loaded while the write was landing).  Never fails; never changes errno. */
void kvs_shim_invalidate(int fd, off_t off, size_t len, bool use_pos, off_t pos_delta);

/* True when a read of len bytes could be served (the shim is on and len >= files.min_read);
 * the cheap test every hook makes before anything else. */
bool kvs_shim_wants(size_t len);

#endif
