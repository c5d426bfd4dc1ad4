/*
 * wthru: write-through.  The bytes a process under the shim writes to a KV file are copied,
 * as they are written, into slots of the region staged for it (invisible to readers), and
 * published under the file's identity once the process is done with it (close of the last
 * descriptor it wrote through, fsync, fdatasync), so that the first read after a save is a
 * hit.  A rename of the file by the same process then moves what it published to the
 * identity the rename gives the file (rename moves ctime): the tmp + rename of vLLM's tiering
 * fs, UCM and LMCache.  The protocol, and what is kept, is the essay at the top of wthru.c.
 *
 * Every function here is called by writes.c with the shim's guard held, never fails the
 * caller's call, and leaves errno as it found it.  c is the region (mapped by the caller).
 */
#ifndef KVS_SHIM_WTHRU_H
#define KVS_SHIM_WTHRU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "cache.h"
#include "fdinfo.h"
#include "wthru_op.h"

struct kvs_config;
struct wt_file;

/* One write in progress: struct kvs_wthru_op (wthru_op.h). */

/* files.write_through and what it needs of the configuration; called once by init. */
void kvs_wthru_configure(const struct kvs_config *cfg);

/* Is write-through on in this process at all (one load)? */
bool kvs_wthru_on(void);

/* Does any staged file exist now (one load, for close's fast path)? */
bool kvs_wthru_busy(void);

/*
 * Before the real write of len bytes from iov to fd (fi: fd's description, a KV file), at
 * off, or at the file position when off < 0: stage it, and start copying the bytes into the
 * staged slots (on the copier thread for large writes, so that the copy overlaps the write);
 * each shard is staged as the copy reaches it, and the copy stops at the first byte it cannot
 * read (the write then keeps nothing).  how: KVS_WT_DEFERRED, an asynchronous write (POSIX aio,
 * kernel AIO; off >= 0) whose completion is seen later: its bytes are copied now, before it is
 * submitted, and accounted by kvs_wthru_after once its result is seen; KVS_WT_STREAM, an fwrite
 * at the stream's position off: a stream found elsewhere than the last fwrite left it (bytes
 * written or a position moved by stdio calls the shim does not see), here or at fclose, keeps
 * the file from being published.  Copies never crash on a bad buffer: they fail, and the file keeps
 * nothing.  src_copy (NULL: iov is host memory) copies the bytes from elsewhere (device memory,
 * cuFileWrite), with src_ctx.
 * Returns false (nothing staged; kvs_wthru_after need not be called) or true.
 */
#define KVS_WT_DEFERRED 1u
#define KVS_WT_STREAM	2u
bool kvs_wthru_before(struct kvs_cache *c, struct kvs_wthru_op *op, int fd,
		      const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt,
		      uint64_t len, int64_t off, unsigned how,
		      int (*src_copy)(void *ctx, uint64_t pos, void *dst, size_t n), void *src_ctx);

/*
 * A change of fi's file through fd whose bytes write-through does not copy (a write it does not
 * stage, fallocate, copy_file_range, sendfile, splice, a truncation, an io_uring write): it is
 * followed as a write without bytes, from here to kvs_wthru_after, so that it ends any
 * publication of what it touches: [off, off + len) (len UINT64_MAX: to any end), at the file
 * position for KVS_WT_AT_POS (the end of the file, that is anywhere, on an O_APPEND
 * descriptor), or anywhere (KVS_WT_ANYWHERE: the file keeps nothing).  named: fd is the
 * program's (its staged file is made if need be), else a descriptor of the shim's own for a
 * change by path (only a file staged already is followed).  Returns false when it is not
 * followed (nothing to call after; the caller moves the write sequence itself).
 */
#define KVS_WT_AT_POS	(-1)
#define KVS_WT_ANYWHERE (-2)
bool kvs_wthru_change(struct kvs_cache *c, struct kvs_wthru_op *op, int fd,
		      const struct kvs_fdinfo *fi, int64_t off, uint64_t len, bool named);

/* After the real write returned ret (or, deferred, once its result is seen): wait for the
 * copy, then keep what was written (ret bytes), or mark what the copy overwrote and storage
 * did not get as not kept. */
void kvs_wthru_after(struct kvs_cache *c, struct kvs_wthru_op *op, int fd, ssize_t ret);

/* close(fd) is about to be called: if fd is the last descriptor a staged file was written
 * through, take the file (returned) for kvs_wthru_closed, which publishes it when the real
 * close returned 0 (else drops it).  NULL: nothing to do.  stream_pos: KVS_WT_CLOSE for
 * close(), else fclose's stream position (ftello, -1 unknown) before its flush. */
#define KVS_WT_CLOSE INT64_MIN
struct wt_file *kvs_wthru_closing(struct kvs_cache *c, int fd, int64_t stream_pos);
void kvs_wthru_closed(struct kvs_cache *c, struct wt_file *f, int ret);

/* ftruncate(fd) is about to be called / returned ret: a truncation of a staged file by its
 * writer is one of its writes (the identity it leaves is the one publication expects); tok
 * lives on the caller's stack between the two.  kvs_wthru_truncating returns the staged file
 * (NULL: nothing to do), which kvs_wthru_truncated must then get. */
struct wt_file *kvs_wthru_truncating(struct kvs_cache *c, int fd, struct kvs_wtok *tok);
void kvs_wthru_truncated(struct kvs_cache *c, struct wt_file *f, int fd, struct kvs_wtok *tok,
			 int ret);

/* The stream fclose is about to close was written through fd (fwrite: its bytes reach the
 * file only at fclose's flush): as kvs_wthru_closing, but publication sees the identity the
 * flush leaves, through dupfd (a descriptor of the file the caller took before the real
 * fclose, closed here), as long as nothing but the flush moved it since the last fwrite. */
void kvs_wthru_stream_closed(struct kvs_cache *c, struct wt_file *f, int dupfd, int ret);

/* fsync(fd) or fdatasync(fd) returned 0: publish what fd's file has staged, and go on staging
 * its later writes. */
void kvs_wthru_synced(struct kvs_cache *c, int fd);

/* rename() returned 0 and the file is now at path (relative to dirfd): if this process
 * published it, move what it published to the identity the rename gave it. */
void kvs_wthru_renamed(struct kvs_cache *c, int dirfd, const char *path);

/* The program mapped (dev, ino), a KV file, MAP_SHARED through a descriptor that can write
 * (the mmap hook): stores through the mapping change it unseen, so it keeps nothing while the
 * mapping lives (the essay at "shared mappings" in wthru_map.c).  Not async-signal-safe (mmap is
 * not): it reads /proc/self/maps. */
void kvs_wthru_mapped(uint64_t dev, uint64_t ino);

/* The fork child: forget the parent's staging (its slots are the parent's) and copier. */
void kvs_wthru_atfork_child(void);

#endif
