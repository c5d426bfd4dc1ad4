/*
 * hooks_open: the interposed opens (open, open64, openat, openat64, creat, creat64, their
 * fortified __open*_2 forms, fopen, fopen64, freopen, freopen64).  Around each real call (made
 * exactly as without the shim; its result and errno are the caller's): before it, an O_TRUNC of a
 * file on a files.write_once root that held bytes is a rewrite in place (wonce.h: its shards
 * dropped while the size that names them is known); after it (kvs_shim_opened), the number's
 * earlier life is forgotten, a writable open's class is set by its path (one readlink: its writes
 * to a file outside the roots then cost no system call), a write-once file opened for writing has
 * its size noted (the bytes it held: a later write over them is a rewrite in place), and an
 * O_DIRECT open of a KV file is marked (unseen.h).  A read-only open costs no system call.
 * The opens through libc's syscall() take the same two steps (hooks/syscall.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "real.h"
#include "fanout.h"
#include "shim.h"
#include "wonce.h"

/* The mode argument of an open that takes one (O_CREAT, O_TMPFILE), as glibc reads it. */
#define MODE_ARG(flags, last)                                                                      \
	({                                                                                         \
		mode_t m_ = 0;                                                                     \
		if ((flags) & (O_CREAT | O_TMPFILE)) {                                             \
			va_list ap_;                                                               \
			va_start(ap_, last);                                                       \
			m_ = (mode_t)va_arg(ap_, unsigned int);                                    \
			va_end(ap_);                                                               \
		}                                                                                  \
		m_;                                                                                \
	})

/* The real open wrapped: note before, call, record after. */
#define AROUND_OPEN(dirfd, path, flags, call)                                                      \
	do {                                                                                       \
		struct kvs_wonce_open o_;                                                          \
		kvs_shim_opening(&o_, dirfd, path, flags);                                         \
		kvs_real_init();                                                                   \
		int fd_ = (call);                                                                  \
		kvs_shim_opened(&o_, fd_, flags);                                                  \
		return fd_;                                                                        \
	} while (0)

KVS_EXPORT int open(const char *path, int flags, ...)
{
	mode_t mode = MODE_ARG(flags, flags);

	AROUND_OPEN(AT_FDCWD, path, flags, kvs_real.open(path, flags, mode));
}

KVS_EXPORT int open64(const char *path, int flags, ...)
{
	mode_t mode = MODE_ARG(flags, flags);

	AROUND_OPEN(AT_FDCWD, path, flags, kvs_real.open64(path, flags, mode));
}

KVS_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = MODE_ARG(flags, flags);

	AROUND_OPEN(dirfd, path, flags, kvs_real.openat(dirfd, path, flags, mode));
}

KVS_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = MODE_ARG(flags, flags);

	AROUND_OPEN(dirfd, path, flags, kvs_real.openat64(dirfd, path, flags, mode));
}

KVS_EXPORT int creat(const char *path, mode_t mode)
{
	AROUND_OPEN(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, kvs_real.creat(path, mode));
}

KVS_EXPORT int creat64(const char *path, mode_t mode)
{
	AROUND_OPEN(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, kvs_real.creat64(path, mode));
}

/* _FORTIFY_SOURCE's forms of open without a mode. */
KVS_EXPORT int __open_2(const char *path, int flags)
{
	AROUND_OPEN(AT_FDCWD, path, flags, kvs_real.open_2(path, flags));
}

KVS_EXPORT int __open64_2(const char *path, int flags)
{
	AROUND_OPEN(AT_FDCWD, path, flags, kvs_real.open64_2(path, flags));
}

KVS_EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
	AROUND_OPEN(dirfd, path, flags, kvs_real.openat_2(dirfd, path, flags));
}

KVS_EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
	AROUND_OPEN(dirfd, path, flags, kvs_real.openat64_2(dirfd, path, flags));
}

/* fopen's mode as open flags, as far as writing goes ("r" reads only). */
static int stdio_flags(const char *mode)
{
	if (!mode)
		return O_RDONLY;
	bool plus = strchr(mode, '+') != NULL;
	switch (mode[0]) {
	case 'w':
		return (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_TRUNC |
		       (strchr(mode, 'x') ? O_EXCL : 0);
	case 'a':
		return (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_APPEND;
	default:
		return plus ? O_RDWR : O_RDONLY;
	}
}

/* fopen opens inside glibc, past the open hooks. */
#define AROUND_FOPEN(path, mode, call)                                                             \
	do {                                                                                       \
		struct kvs_wonce_open o_;                                                          \
		kvs_shim_opening(&o_, AT_FDCWD, path, stdio_flags(mode));                          \
		kvs_real_init();                                                                   \
		FILE *f_ = (call);                                                                 \
		if (f_)                                                                            \
			kvs_shim_opened(&o_, fileno(f_), stdio_flags(mode));                       \
		return f_;                                                                         \
	} while (0)

KVS_EXPORT FILE *fopen(const char *path, const char *mode)
{
	AROUND_FOPEN(path, mode, kvs_real.fopen(path, mode));
}

KVS_EXPORT FILE *fopen64(const char *path, const char *mode)
{
	AROUND_FOPEN(path, mode, kvs_real.fopen64(path, mode));
}

/* freopen closes the stream's descriptor inside glibc, past the close hooks, and opens path,
 * most often on the same number: told as a close, then followed as fopen's open.  A NULL path
 * (a new mode on the same file) opens nothing new. */
#define AROUND_FREOPEN(path, mode, stream, call)                                                   \
	do {                                                                                       \
		int old_ = (path) && (stream) ? fileno(stream) : -1;                               \
		if (old_ >= 0) {                                                                   \
			kvs_shim_fd_gone(old_);                                                    \
			kvs_shim_fds_closing((unsigned int)old_, (unsigned int)old_);              \
		}                                                                                  \
		AROUND_FOPEN(path, mode, call);                                                    \
	} while (0)

KVS_EXPORT FILE *freopen(const char *path, const char *mode, FILE *stream)
{
	AROUND_FREOPEN(path, mode, stream, kvs_real.freopen(path, mode, stream));
}

KVS_EXPORT FILE *freopen64(const char *path, const char *mode, FILE *stream)
{
	AROUND_FREOPEN(path, mode, stream, kvs_real.freopen64(path, mode, stream));
}
