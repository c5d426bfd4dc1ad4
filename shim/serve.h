/*
 * serve: the steps every served read takes, whatever its API (serve.c: the synchronous POSIX
 * read; serve_async.c: POSIX aio, kernel AIO, cuFile; serve_stream.c: cuFileReadAsync).  In
 * order: admit the descriptor, check O_DIRECT's alignment and the buffers, attach and take the
 * anchor, make the loader's read, and after it report what went wrong; a read the cache hands
 * back is counted (fell_back) and made by the caller with the real call.  Every function is
 * called with the guard held.
 */
#ifndef KVS_SHIM_SERVE_H
#define KVS_SHIM_SERVE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "fdinfo.h"
#include "loader.h"
#include "shim.h"

/* The position locks (serve.c, initialised statically), made anew in a fork child (a parent's
 * thread may have held one). */
void kvs_serve_pos_init(void);

/* Does a read path serve fd, which kvs_fdinfo_get described as fi with result r?  Says why not.
 * any_mode: cuFile, which serves a descriptor whether it has O_DIRECT or not. */
bool kvs_serve_admit(int fd, int r, const struct kvs_fdinfo *fi, bool any_mode, uint64_t off,
		     uint64_t len);

/* May the read of fd (described as fi) write its buffers (progmem.h)?  Else counted and said:
 * the real call answers EFAULT or a short count. */
bool kvs_serve_buffers_fit(int fd, const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt,
			   uint64_t off, uint64_t len);

/* An O_DIRECT read must be aligned as O_DIRECT needs or the real call fails: true when fi's
 * read may be served; else counted and said. */
bool kvs_serve_direct_fits(int fd, const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt,
			   off_t off);

/* Attach the region and take fd's anchor (anchor.h).  The anchor, referenced (kvs_anchor_put
 * it once the read is over), or -1 having said why not.  A position lock, if any, is taken
 * before (neither attach_mu nor the anchors' lock is held while taking one). */
int kvs_serve_attach_anchor(int fd, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len);

/* The kvs_read of a served read of fi's file through anchor, destination left to the caller.
 * A read the cache serves does not reach the file: its atime is kept by atime.c. */
struct kvs_read kvs_serve_make_read(const struct kvs_fdinfo *fi, int anchor, uint64_t off,
				    uint64_t len);

/* After a loader call that returned n: report a stuck region, and a read that fell back, once
 * each. */
void kvs_serve_after_read(int64_t n);

/* What an unserved count needs of rd's file: its size and root. */
struct kvs_fdinfo kvs_serve_fi_of(const struct kvs_read *rd);

/* The cache handed back rd, a read of fd it had taken (n < 0): counted with its bytes and said
 * at debug; the caller makes the real call. */
void kvs_serve_fell_back(int fd, const struct kvs_read *rd, int64_t n);

/* Zero the request's bytes from pos to its end, as the kernel does for a short O_DIRECT read on
 * some file systems. */
void kvs_serve_zero_tail(const struct iovec *iov, int iovcnt, uint64_t pos);

/* shim.mode = observe: a POSIX read of fd (described as fi) that would be served, keyed and
 * counted, unless fd is a cuFile handle's descriptor (libcufile's own read of a cuFile read
 * observed already).  The caller then makes the real call. */
void kvs_serve_observe_posix(int fd, const struct kvs_fdinfo *fi, uint64_t off, uint64_t len);

/* A cuFile read's common part (for serve_async.c and serve_stream.c): fd a KV file (O_DIRECT
 * or not: cuFile reads are served either way), the destination classified and ready, the region
 * attached, the anchor taken (in a->rd.fd: the caller puts it once the read is over).  Fills
 * a->rd and a->tg.  Returns 0, or -1 to pass through (nothing held). */
int kvs_serve_cufile_prepare(struct kvs_shim_async *a, int fd, uint64_t ptr, size_t size,
			     off_t off);

/* serve_stream.c's fork child: the parent's queue of stream reads and its settler thread are
 * forgotten (the child has neither). */
void kvs_stream_atfork_child(void);

#endif
