/*
 * hooks_posix: the interposed POSIX read and write family (docs/design.md, "One read, step by
 * step" and "Write-through: what a writer saves is kept").
 *
 * Each read hook asks kvs_shim_wants() (one branch once initialised) and, for a candidate,
 * kvs_shim_read(); anything it declines goes to the real function, which then sets errno and
 * the file position exactly as it always would.  Write hooks invalidate first, stage the bytes
 * for write-through, then write; close, fsync, fdatasync and the renames publish what was
 * staged (wthru.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sendfile.h>
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

#include "anchor.h"
#include "fanout.h"
#include "fdinfo.h"
#include "paio.h"
#include "real.h"
#include "shim.h"
#include "shmap.h"
#include "uring.h"
#include "wonce.h"
#include "wthru.h"

/* Serve count bytes into buf at off (or the position); -1 means "make the real call".  These
 * hooks stand for cancellation points: a cancel already pending is acted on here, where the
 * real call would act on it, before the shim takes anything (it then runs with cancellation
 * disabled). */
static ssize_t serve1(int fd, void *buf, size_t count, off_t off, bool use_pos)
{
	struct iovec v = {buf, count};

	if (!kvs_shim_wants(count)) {
		kvs_shim_note_small(fd, count);
		return -1;
	}
	pthread_testcancel();
	return kvs_shim_read(fd, &v, 1, off, use_pos);
}

/* A vector read: the program's iovec array is read only for a KV file, and as the kernel reads
 * it (kvs_shim_readv): one the kernel refuses is the real call's to refuse. */
static ssize_t servev(int fd, const struct iovec *iov, int iovcnt, off_t off, bool use_pos)
{
	if (!kvs_shim_wants(SIZE_MAX))
		return -1;
	pthread_testcancel();
	return kvs_shim_readv(fd, iov, iovcnt, off, use_pos);
}

KVS_EXPORT ssize_t read(int fd, void *buf, size_t count)
{
	ssize_t n = serve1(fd, buf, count, 0, true);

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.read(fd, buf, count);
}

KVS_EXPORT ssize_t pread(int fd, void *buf, size_t count, off_t off)
{
	ssize_t n = off >= 0 ? serve1(fd, buf, count, off, false) : -1;

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.pread(fd, buf, count, off);
}

KVS_EXPORT ssize_t pread64(int fd, void *buf, size_t count, off64_t off)
{
	ssize_t n = off >= 0 ? serve1(fd, buf, count, (off_t)off, false) : -1;

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.pread64(fd, buf, count, off);
}

KVS_EXPORT ssize_t readv(int fd, const struct iovec *iov, int iovcnt)
{
	ssize_t n = servev(fd, iov, iovcnt, 0, true);

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.readv(fd, iov, iovcnt);
}

KVS_EXPORT ssize_t preadv(int fd, const struct iovec *iov, int iovcnt, off_t off)
{
	ssize_t n = off >= 0 ? servev(fd, iov, iovcnt, off, false) : -1;

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.preadv(fd, iov, iovcnt, off);
}

KVS_EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int iovcnt, off64_t off)
{
	ssize_t n = off >= 0 ? servev(fd, iov, iovcnt, (off_t)off, false) : -1;

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.preadv64(fd, iov, iovcnt, off);
}

/* preadv2 with flags (RWF_NOWAIT, RWF_HIPRI, ...) asks for behaviour we do not emulate. */
KVS_EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int iovcnt, off_t off, int flags)
{
	ssize_t n = flags == 0 && off >= -1 ? servev(fd, iov, iovcnt, off, off == -1) : -1;

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.preadv2(fd, iov, iovcnt, off, flags);
}

KVS_EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int iovcnt, off64_t off, int flags)
{
	ssize_t n = flags == 0 && off >= -1 ? servev(fd, iov, iovcnt, (off_t)off, off == -1) : -1;

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.preadv64v2(fd, iov, iovcnt, off, flags);
}

/* The fortified variants: an overlong request is libc's to abort on, not ours to serve. */
KVS_EXPORT ssize_t __read_chk(int fd, void *buf, size_t count, size_t buflen)
{
	ssize_t n = count <= buflen ? serve1(fd, buf, count, 0, true) : -1;

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.read_chk(fd, buf, count, buflen);
}

KVS_EXPORT ssize_t __pread_chk(int fd, void *buf, size_t count, off_t off, size_t buflen)
{
	ssize_t n = count <= buflen && off >= 0 ? serve1(fd, buf, count, off, false) : -1;

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.pread_chk(fd, buf, count, off, buflen);
}

KVS_EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t count, off64_t off, size_t buflen)
{
	ssize_t n = count <= buflen && off >= 0 ? serve1(fd, buf, count, (off_t)off, false) : -1;

	if (n >= 0)
		return n;
	kvs_real_init();
	return kvs_real.pread64_chk(fd, buf, count, off, buflen);
}

/*
 * glibc's fread reads through its own buffer, not through read().  A large fread is served
 * around it, as glibc would read: the bytes buffered already ([_IO_read_ptr, _IO_read_end))
 * are copied out and consumed, the rest is served from the descriptor's position (glibc keeps
 * it at the end of what it buffered), and the stream is moved there with fseeko (which drops
 * the buffer and keeps glibc's offset right).  A short count (end of file) or a read the cache
 * refuses lets the real fread go on from there, so the EOF and error flags are set as usual.
 * Not served, and counted (unserved_stdio): a stream with bytes waiting to be written, one
 * reading back ungetc'd bytes (glibc's backup area), a wide-oriented one.  A read that the
 * buffer holds, or whose rest is below files.min_read, is glibc's own.
 */
#define KVS_IO_IN_BACKUP 0x100 /* glibc's _IO_IN_BACKUP (libio.h): reading ungetc'd bytes */

KVS_EXPORT size_t fread(void *ptr, size_t size, size_t nmemb, FILE *f)
{
	size_t total, done = 0, have;
	ssize_t n = -1;
	off_t pos;

	kvs_real_init();
	if (!f || size == 0 || nmemb == 0 || __builtin_mul_overflow(size, nmemb, &total) ||
	    !kvs_shim_wants(total))
		return kvs_real.fread(ptr, size, nmemb, f);
	flockfile(f);
	have = f->_IO_read_end > f->_IO_read_ptr ? (size_t)(f->_IO_read_end - f->_IO_read_ptr) : 0;
	if (f->_IO_write_ptr > f->_IO_write_base || (f->_flags & KVS_IO_IN_BACKUP) ||
	    f->_mode > 0) {
		kvs_shim_note_stdio(fileno_unlocked(f), total);
	} else if (have < total && kvs_shim_wants(total - have)) {
		int fd = fileno_unlocked(f), saved = errno;

		pos = fd >= 0 ? lseek(fd, 0, SEEK_CUR) : -1;
		errno = saved; /* a pipe's ESPIPE is not the program's */
		if (pos >= 0) {
			struct iovec v = {(char *)ptr + have, total - have};

			if (have) { /* a stream that has read nothing yet has no buffer at all */
				memcpy(ptr, f->_IO_read_ptr, have);
				f->_IO_read_ptr =
				    f->_IO_read_end; /* consumed, as glibc's copy would */
			}
			done = have;
			n = kvs_shim_read(fd, &v, 1, pos, false);
			if (n >= 0 && fseeko(f, pos + n, SEEK_SET) != 0)
				n = -1; /* cannot happen; the real call rereads the rest */
		}
	}
	if (n < 0) {
		/* From where the copy above left the stream: its buffer is consumed, the
		 * descriptor's position is the next byte. */
		done += kvs_real.fread((char *)ptr + done, 1, total - done, f);
		funlockfile(f);
		return done / size;
	}
	done += (size_t)n;
	if (done < total)
		done += kvs_real.fread((char *)ptr + done, 1, total - done, f);
	funlockfile(f);
	return done / size;
}

/*
 * fwrite puts bytes in the stream's buffer; they reach the file at the stream's position when
 * it flushes.  For write-through they are staged at that position (ftello, under the stream's
 * lock) and kept once fclose has flushed them (below).  A stream in append mode (O_APPEND on
 * its descriptor) keeps nothing: its position is not where the bytes go.  A stream found
 * elsewhere than the last fwrite left it, here or at fclose, keeps nothing either: stdio calls
 * the shim does not hook (fputc, fprintf, fwrite_unlocked, putc_unlocked) wrote or moved it.
 */
KVS_EXPORT size_t fwrite(const void *ptr, size_t size, size_t nmemb, FILE *f)
{
	size_t total, done;
	struct kvs_wthru_op op;
	bool staged = false;

	kvs_real_init();
	/* A stream on a descriptor known not to be a KV file (stdout, a log) is glibc's, for a
	 * load; the first fwrite of one finds out (no ftello before that). */
	if (kvs_fdinfo_not_kv(fileno_unlocked(f)))
		return kvs_real.fwrite(ptr, size, nmemb, f);
	kvs_shim_wants(0); /* the configuration, loaded once */
	if (size == 0 || nmemb == 0 || __builtin_mul_overflow(size, nmemb, &total) ||
	    (!kvs_wthru_on() && !kvs_fdinfo_any_write_once()) ||
	    !kvs_shim_is_kv(fileno_unlocked(f)))
		return kvs_real.fwrite(ptr, size, nmemb, f);
	flockfile(f);
	int fd = fileno_unlocked(f), saved = errno;
	off_t pos = fd >= 0 ? ftello(f) : -1;
	errno = saved; /* a pipe's ESPIPE is not the program's */
	struct iovec v = {(void *)ptr, total};
	if (pos >= 0) {
		kvs_shim_invalidate(fd, pos, total, false, 0);
		staged = kvs_shim_write_before(&op, fd, &v, 1, total, pos, true);
	}
	done = kvs_real.fwrite(ptr, size, nmemb, f);
	if (pos >= 0 && done > 0) { /* taken by the stream: a rewrite counts now */
		saved = errno;
		kvs_shim_invalidate(fd, pos, done * size, false, -(off_t)(done * size));
		errno = saved;
	}
	if (staged) {
		saved = errno;
		/* Short: the stream has an error now, and fclose will say so. */
		kvs_shim_write_after(&op, fd, done == nmemb ? (ssize_t)total : -1);
		errno = saved;
	}
	funlockfile(f);
	return done;
}

KVS_EXPORT int fclose(FILE *f)
{
	int dupfd, fd = fileno(f);
	int64_t pos = -1;

	if (kvs_wthru_busy()) { /* where the stream stands, for write-through (wthru.h) */
		int saved = errno;

		pos = ftello(f);
		errno = saved;
	}
	struct wt_file *w = kvs_shim_fclosing(fd, pos, &dupfd);

	kvs_shim_fd_gone(fd); /* glibc closes it inside, past the close hook */
	kvs_real_init();
	int r = kvs_real.fclose(f);
	kvs_shim_fd_gone(fd);
	if (w) {
		int saved = errno;

		kvs_shim_fclosed(w, dupfd, r);
		errno = saved;
	}
	return r;
}

/* The first line of the hook of a function POSIX lists as async-signal-safe: inside the shim
 * (its own call, or a signal handler that interrupted it), the real call and nothing more
 * (shim.h, kvs_shim_inside). */
#define REAL_IF_INSIDE(call)                                                                       \
	do {                                                                                       \
		if (kvs_shim_inside()) {                                                           \
			kvs_real_init();                                                           \
			return (call);                                                             \
		}                                                                                  \
	} while (0)

/* Around a write: invalidate before it the shards as they were, stage its bytes for
 * write-through (wthru.h), make the real call, then keep what it wrote and invalidate any
 * shard another process loaded while it was landing.  iov/iovcnt describe the bytes; off is
 * the offset, ignored with use_pos (the file position).  errno is the real call's. */
#define AROUND_WRITE(fd, iov, iovcnt, off, len, use_pos, call)                                     \
	do {                                                                                       \
		struct kvs_wthru_op op_;                                                           \
		REAL_IF_INSIDE(call);                                                              \
		kvs_shim_invalidate(fd, off, len, use_pos, 0);                                     \
		bool staged_ = kvs_shim_write_before(&op_, fd, iov, iovcnt, len,                   \
						     (use_pos) ? -1 : (off), false);               \
		kvs_real_init();                                                                   \
		ssize_t ret_ = (call);                                                             \
		int saved_ = errno;                                                                \
		if (staged_)                                                                       \
			kvs_shim_write_after(&op_, fd, ret_);                                      \
		if (ret_ > 0)                                                                      \
			kvs_shim_invalidate(fd, off, (size_t)ret_, use_pos, -(off_t)ret_);         \
		errno = saved_;                                                                    \
		return ret_;                                                                       \
	} while (0)

/* A vector write: AROUND_WRITE with the program's iovec array read only for a KV file, and as
 * the kernel reads it (kvs_shim_write_iov); any other, and one the kernel refuses, is the real
 * call alone.  plain: its bytes can be kept (else only invalidated and followed). */
#define AROUND_WRITEV(fd, iov, iovcnt, off, use_pos, plain, call)                                  \
	do {                                                                                       \
		struct iovec local_[KVS_IOV_LOCAL];                                                \
		uint64_t len_ = 0;                                                                 \
		REAL_IF_INSIDE(call);                                                              \
		const struct iovec *v_ = kvs_shim_write_iov(fd, iov, iovcnt, local_, &len_);       \
		if (!v_) {                                                                         \
			kvs_real_init();                                                           \
			return (call);                                                             \
		}                                                                                  \
		AROUND_WRITE(fd, (plain) ? v_ : NULL, iovcnt, off, (size_t)len_, use_pos, call);   \
	} while (0)

/* pwritev2 flags that leave a write a plain one at its offset (RWF_APPEND does not). */
#define PLAIN_RWF (RWF_HIPRI | RWF_DSYNC | RWF_SYNC)

KVS_EXPORT ssize_t write(int fd, const void *buf, size_t count)
{
	struct iovec v = {(void *)buf, count};

	AROUND_WRITE(fd, &v, 1, 0, count, true, kvs_real.write(fd, buf, count));
}

KVS_EXPORT ssize_t pwrite(int fd, const void *buf, size_t count, off_t off)
{
	struct iovec v = {(void *)buf, count};

	AROUND_WRITE(fd, &v, 1, off, count, false, kvs_real.pwrite(fd, buf, count, off));
}

KVS_EXPORT ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t off)
{
	struct iovec v = {(void *)buf, count};

	AROUND_WRITE(fd, &v, 1, (off_t)off, count, false, kvs_real.pwrite64(fd, buf, count, off));
}

KVS_EXPORT ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
	AROUND_WRITEV(fd, iov, iovcnt, 0, true, true, kvs_real.writev(fd, iov, iovcnt));
}

KVS_EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t off)
{
	AROUND_WRITEV(fd, iov, iovcnt, off, false, true, kvs_real.pwritev(fd, iov, iovcnt, off));
}

KVS_EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off64_t off)
{
	AROUND_WRITEV(fd, iov, iovcnt, (off_t)off, false, true,
		      kvs_real.pwritev64(fd, iov, iovcnt, off));
}

/* Where a pwritev2 with flags lands: RWF_APPEND writes at the end of the file, whatever off
 * says (followed there: an append is never a rewrite in place); -1, at the file position. */
static off_t pwritev2_at(int fd, off_t off, int flags)
{
	struct stat st;

	if (!(flags & RWF_APPEND) || !kvs_shim_wants(SIZE_MAX))
		return off;
	int saved = errno;
	off_t end = fstat(fd, &st) == 0 ? st.st_size : off;
	errno = saved;
	return end;
}

KVS_EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int iovcnt, off_t off, int flags)
{
	off_t at = pwritev2_at(fd, off, flags);

	/* A write with other flags is not staged (no iovecs given): invalidated and followed. */
	AROUND_WRITEV(fd, iov, iovcnt, at, at == -1, !(flags & ~PLAIN_RWF),
		      kvs_real.pwritev2(fd, iov, iovcnt, off, flags));
}

KVS_EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int iovcnt, off64_t off, int flags)
{
	off_t at = pwritev2_at(fd, (off_t)off, flags);

	AROUND_WRITEV(fd, iov, iovcnt, at, at == -1, !(flags & ~PLAIN_RWF),
		      kvs_real.pwritev64v2(fd, iov, iovcnt, off, flags));
}

/* The end of a writer's use of a descriptor publishes what it wrote through it (write-
 * through), and retires the descriptor's anchor (anchor.h); a load or two when there is
 * neither.  close is async-signal-safe: inside the shim (its own close, or a handler that
 * interrupted it) it is the real call alone; else it takes only the shim's own locks, under
 * its guard, and allocates nothing (shim.h, kvs_shim_inside). */
KVS_EXPORT int close(int fd)
{
	kvs_shim_fd_gone(fd); /* before: a racing look must not keep the old file's class */
	kvs_shim_fds_closing((unsigned int)fd, (unsigned int)fd);
	REAL_IF_INSIDE(kvs_real.close(fd));
	kvs_aio_closing(fd); /* aio writes never asked about: their result unknown, kept nothing */
	struct wt_file *f = kvs_shim_closing(fd);

	kvs_anchor_closing(fd);
	kvs_uring_closed(fd);

	int r = kvs_real.close(fd);
	kvs_shim_fd_gone(fd); /* and after: the number may be another file's now */
	if (f) {
		int saved = errno;

		kvs_shim_closed(f, r);
		errno = saved;
	}
	return r;
}

/* dup2, dup3 and close_range close what they replace: what fdinfo knew of those numbers
 * goes, before the call and after it (fdinfo.h). */
KVS_EXPORT int dup2(int oldfd, int newfd)
{
	kvs_shim_fd_gone(newfd);
	kvs_shim_dup_closing(oldfd, newfd, 0);
	kvs_real_init();
	int r = kvs_real.dup2(oldfd, newfd);
	kvs_shim_fd_gone(newfd);
	return r;
}

KVS_EXPORT int dup3(int oldfd, int newfd, int flags)
{
	kvs_shim_fd_gone(newfd);
	kvs_shim_dup_closing(oldfd, newfd, flags);
	kvs_real_init();
	int r = kvs_real.dup3(oldfd, newfd, flags);
	kvs_shim_fd_gone(newfd);
	return r;
}

KVS_EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
	kvs_shim_fds_gone(first, last);
	kvs_shim_range_closing(first, last, (unsigned int)flags);
	kvs_real_init();
	int r = kvs_real.close_range(first, last, flags);
	kvs_shim_fds_gone(first, last);
	return r;
}

KVS_EXPORT int fsync(int fd)
{
	REAL_IF_INSIDE(kvs_real.fsync(fd));
	kvs_real_init();
	int r = kvs_real.fsync(fd);
	if (r == 0)
		kvs_shim_synced(fd);
	return r;
}

KVS_EXPORT int fdatasync(int fd)
{
	REAL_IF_INSIDE(kvs_real.fdatasync(fd));
	kvs_real_init();
	int r = kvs_real.fdatasync(fd);
	if (r == 0)
		kvs_shim_synced(fd);
	return r;
}

/* A POSIX record lock taken by the program: the shim must not close a descriptor of that file
 * behind its back (closing any drops them all), so it notes the file (anchor.h).  Every other
 * command goes straight through.  Like glibc's, the hooks read one argument of pointer size. */
static bool locks(int cmd)
{
	return cmd == F_SETLK || cmd == F_SETLKW;
}

static void note_lock(int fd, int cmd, void *arg)
{
	const struct flock *fl = arg;

	if (locks(cmd) && fl && fl->l_type != F_UNLCK)
		kvs_anchor_note_lock(fd);
}

KVS_EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;

	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	REAL_IF_INSIDE(kvs_real.fcntl(fd, cmd, arg));
	note_lock(fd, cmd, arg);
	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
		kvs_shim_fd_duped(fd);
	kvs_real_init();
	return kvs_real.fcntl(fd, cmd, arg);
}

KVS_EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;

	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	REAL_IF_INSIDE(kvs_real.fcntl64(fd, cmd, arg));
	note_lock(fd, cmd, arg);
	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
		kvs_shim_fd_duped(fd);
	kvs_real_init();
	return kvs_real.fcntl64(fd, cmd, arg);
}

KVS_EXPORT int lockf(int fd, int cmd, off_t len)
{
	if (cmd == F_LOCK || cmd == F_TLOCK)
		kvs_anchor_note_lock(fd);
	kvs_real_init();
	return kvs_real.lockf(fd, cmd, len);
}

KVS_EXPORT int lockf64(int fd, int cmd, off64_t len)
{
	if (cmd == F_LOCK || cmd == F_TLOCK)
		kvs_anchor_note_lock(fd);
	kvs_real_init();
	return kvs_real.lockf64(fd, cmd, len);
}

/*
 * Changes whose bytes write-through does not copy: each is followed from before the real call
 * to after it (kvs_shim_change_before), so that the shards it touches are dropped from the
 * cache and no staged copy of the file, this process's or another's, keeps them.  Every
 * descriptor but a KV file's costs what kvs_fdinfo_get costs, once.
 */
#ifndef FALLOC_FL_COLLAPSE_RANGE
#define FALLOC_FL_COLLAPSE_RANGE 0x08
#endif
#ifndef FALLOC_FL_INSERT_RANGE
#define FALLOC_FL_INSERT_RANGE 0x20
#endif

/* A collapse or an insert moves every byte past off. */
static uint64_t falloc_len(int mode, off64_t len)
{
	return mode & (FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE) ? UINT64_MAX
									  : (uint64_t)len;
}

KVS_EXPORT int fallocate(int fd, int mode, off_t off, off_t len)
{
	struct kvs_shim_change ch;
	bool on = off >= 0 && len > 0 &&
		  kvs_shim_change_before(&ch, fd, off, NULL, falloc_len(mode, len), true);

	kvs_real_init();
	int r = kvs_real.fallocate(fd, mode, off, len);
	if (on)
		kvs_shim_change_after(&ch, r); /* keeps errno */
	return r;
}

KVS_EXPORT int fallocate64(int fd, int mode, off64_t off, off64_t len)
{
	struct kvs_shim_change ch;
	bool on = off >= 0 && len > 0 &&
		  kvs_shim_change_before(&ch, fd, off, NULL, falloc_len(mode, len), true);

	kvs_real_init();
	int r = kvs_real.fallocate64(fd, mode, off, len);
	if (on)
		kvs_shim_change_after(&ch, r);
	return r;
}

KVS_EXPORT ssize_t copy_file_range(int in, off64_t *in_off, int out, off64_t *out_off, size_t len,
				   unsigned int flags)
{
	struct kvs_shim_change ch;
	bool on =
	    kvs_shim_change_before(&ch, out, KVS_WT_AT_POS, (const int64_t *)out_off, len, true);

	kvs_real_init();
	ssize_t r = kvs_real.copy_file_range(in, in_off, out, out_off, len, flags);
	if (on)
		kvs_shim_change_after(&ch, r);
	return r;
}

/* sendfile writes at out's position (its offset argument is in's). */
KVS_EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	struct kvs_shim_change ch;
	bool on = kvs_shim_change_before(&ch, out, KVS_WT_AT_POS, NULL, count, true);

	kvs_real_init();
	ssize_t r = kvs_real.sendfile(out, in, off, count);
	if (on)
		kvs_shim_change_after(&ch, r);
	return r;
}

KVS_EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t count)
{
	struct kvs_shim_change ch;
	bool on = kvs_shim_change_before(&ch, out, KVS_WT_AT_POS, NULL, count, true);

	kvs_real_init();
	ssize_t r = kvs_real.sendfile64(out, in, off, count);
	if (on)
		kvs_shim_change_after(&ch, r);
	return r;
}

KVS_EXPORT ssize_t splice(int in, off64_t *in_off, int out, off64_t *out_off, size_t len,
			  unsigned int flags)
{
	struct kvs_shim_change ch;
	bool on =
	    kvs_shim_change_before(&ch, out, KVS_WT_AT_POS, (const int64_t *)out_off, len, true);

	kvs_real_init();
	ssize_t r = kvs_real.splice(in, in_off, out, out_off, len, flags);
	if (on)
		kvs_shim_change_after(&ch, r);
	return r;
}

KVS_EXPORT int truncate(const char *path, off_t len)
{
	struct kvs_shim_change ch;

	kvs_real_init();
	int fd = kvs_shim_truncate_path_before(&ch, path, len);
	int r = kvs_real.truncate(path, len);
	kvs_shim_truncate_path_after(&ch, fd, r);
	return r;
}

KVS_EXPORT int truncate64(const char *path, off64_t len)
{
	struct kvs_shim_change ch;

	kvs_real_init();
	int fd = kvs_shim_truncate_path_before(&ch, path, len);
	int r = kvs_real.truncate64(path, len);
	kvs_shim_truncate_path_after(&ch, fd, r);
	return r;
}

/* A writer's own truncation of a file it stages is one of its writes (wthru.h); any other of a
 * KV file is a change of its bytes from the lesser of the old and the new size on. */
#define AROUND_FTRUNCATE(fd, len, call)                                                            \
	do {                                                                                       \
		struct kvs_wtok tok_;                                                              \
		struct kvs_shim_change ch_;                                                        \
		REAL_IF_INSIDE(call);                                                              \
		struct wt_file *f_ = kvs_shim_truncating(fd, &tok_);                               \
		bool on_ = !f_ && kvs_shim_truncate_before(&ch_, fd, (int64_t)(len));              \
		kvs_real_init();                                                                   \
		int r_ = (call);                                                                   \
		if (f_)                                                                            \
			kvs_shim_truncated(f_, fd, &tok_, r_); /* keeps errno */                   \
		if (on_)                                                                           \
			kvs_shim_change_after(&ch_, r_); /* keeps errno */                         \
		return r_;                                                                         \
	} while (0)

KVS_EXPORT int ftruncate(int fd, off_t len)
{
	AROUND_FTRUNCATE(fd, len, kvs_real.ftruncate(fd, len));
}

KVS_EXPORT int ftruncate64(int fd, off64_t len)
{
	AROUND_FTRUNCATE(fd, len, kvs_real.ftruncate64(fd, len));
}

/* A rename moves the file's ctime: what this process published under the old identity moves
 * to the new one (tmp + rename, as vLLM's tiering fs, UCM and LMCache save a block). */
KVS_EXPORT int rename(const char *from, const char *to)
{
	REAL_IF_INSIDE(kvs_real.rename(from, to));
	kvs_real_init();
	int r = kvs_real.rename(from, to);
	if (r == 0)
		kvs_shim_renamed(AT_FDCWD, to);
	return r;
}

KVS_EXPORT int renameat(int fromdir, const char *from, int todir, const char *to)
{
	REAL_IF_INSIDE(kvs_real.renameat(fromdir, from, todir, to));
	kvs_real_init();
	int r = kvs_real.renameat(fromdir, from, todir, to);
	if (r == 0)
		kvs_shim_renamed(todir, to);
	return r;
}

KVS_EXPORT int renameat2(int fromdir, const char *from, int todir, const char *to,
			 unsigned int flags)
{
	kvs_real_init();
	int r = kvs_real.renameat2(fromdir, from, todir, to, flags);
	if (r == 0) {
		kvs_shim_renamed(todir, to);
		if (flags & RENAME_EXCHANGE) /* the other file moved too */
			kvs_shim_renamed(fromdir, from);
	}
	return r;
}

/* Mappings are not served (the kernel's page faults read the file), but one of a KV file is
 * counted and said once, so that an operator sees why the cache stays cold; one shared and
 * writable keeps the file out of write-through, and is a write in flight on the node, while it
 * lives (until munmap: shmap.h); an io_uring's rings mapped are noted (api/uring.c). */
static void mapped(void *p, size_t len, int prot, int flags, int fd, off64_t off)
{
	if (fd < 0 || (flags & MAP_ANONYMOUS) || p == MAP_FAILED)
		return;
	int saved = errno;
	kvs_shim_mapped(p, fd, prot, flags, (int64_t)off, (uint64_t)len);
	kvs_uring_mapped(fd, (long)off, p);
	errno = saved;
}

KVS_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (fd >= 0 && !(flags & MAP_ANONYMOUS))
		kvs_shim_note_mmap(fd, len);
	kvs_real_init();
	void *p = kvs_real.mmap(addr, len, prot, flags, fd, off);
	mapped(p, len, prot, flags, fd, off);
	return p;
}

KVS_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t off)
{
	if (fd >= 0 && !(flags & MAP_ANONYMOUS))
		kvs_shim_note_mmap(fd, len);
	kvs_real_init();
	void *p = kvs_real.mmap64(addr, len, prot, flags, fd, off);
	mapped(p, len, prot, flags, fd, off);
	return p;
}

KVS_EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	void *to = NULL;
	va_list ap;

	if (flags & MREMAP_FIXED) {
		va_start(ap, flags);
		to = va_arg(ap, void *);
		va_end(ap);
	}
	kvs_real_init();
	uint64_t before = kvs_shmap_now();
	void *p = kvs_real.mremap(old, old_len, new_len, flags, to);
	if (p != MAP_FAILED) {
		int saved = errno;

		kvs_shmap_remapped(old, old_len, new_len, before);
		errno = saved;
	}
	return p;
}

KVS_EXPORT int munmap(void *addr, size_t len)
{
	kvs_real_init();
	uint64_t before = kvs_shmap_now();
	int r = kvs_real.munmap(addr, len);
	if (r == 0) {
		int saved = errno;

		kvs_shmap_unmapped(addr, len, before);
		errno = saved;
	}
	return r;
}
