/*
 * hooks_posix_fd: the interposed POSIX calls around a file that neither read nor write its
 * bytes (docs/design.md, "Write-through: what a writer saves is kept"): close, dup2, dup3 and
 * close_range; fsync and fdatasync; the record locks of fcntl and lockf; the changes
 * write-through does not copy (fallocate, copy_file_range, sendfile, splice, truncate,
 * ftruncate); the renames; the mappings (mmap, mmap64, mremap, munmap).  The reads and writes
 * are hooks/posix.c's.
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
#include "posix_int.h"

/* The end of a writer's use of a descriptor publishes what it wrote through it (write-
 * through), and retires the descriptor's anchor (anchor.h); a load or two when there is
 * neither.  close is async-signal-safe: inside the shim (its own close, or a handler that
 * interrupted it) it is the real call alone; else it takes only the shim's own locks, under
 * its guard, and allocates nothing (guard.h, kvs_shim_inside). */
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
 * lives (until munmap: shmap.h); an io_uring's rings mapped are noted (api/uring_rings.c). */
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
