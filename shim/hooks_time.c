/*
 * hooks_time: the interposed timestamp calls (utime, utimes, futimes, lutimes, futimesat,
 * utimensat, futimens).  Each is the real call between kvs_touch_before and kvs_touch_after
 * (touch.h), which keep a KV file's cached shards under the identity the call gives it.  The
 * real call is made exactly as without the shim, outside the shim's guard; its result and
 * errno are the caller's.  The syscall() door (hooks_kaio.c) sends SYS_utime, SYS_utimes,
 * SYS_futimesat and SYS_utimensat here too (kvs_time_syscall).
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <utime.h>

#include "real.h"
#include "shim.h"
#include "touch.h"

/* The real call wrapped: before, call, after.  dirfd/path/nofollow name the file (path NULL:
 * the descriptor dirfd). */
#define AROUND_TOUCH(dirfd, path, nofollow, call)                                                  \
	do {                                                                                       \
		struct kvs_touch t_;                                                               \
		bool on_ = kvs_touch_before(&t_, dirfd, path, nofollow);                           \
		kvs_real_init();                                                                   \
		int r_ = (call);                                                                   \
		if (on_)                                                                           \
			kvs_touch_after(&t_, r_);                                                  \
		return r_;                                                                         \
	} while (0)

KVS_EXPORT int utime(const char *path, const struct utimbuf *times)
{
	AROUND_TOUCH(AT_FDCWD, path, false, kvs_real.utime(path, times));
}

KVS_EXPORT int utimes(const char *path, const struct timeval times[2])
{
	AROUND_TOUCH(AT_FDCWD, path, false, kvs_real.utimes(path, times));
}

KVS_EXPORT int futimes(int fd, const struct timeval times[2])
{
	AROUND_TOUCH(fd, NULL, false, kvs_real.futimes(fd, times));
}

KVS_EXPORT int lutimes(const char *path, const struct timeval times[2])
{
	AROUND_TOUCH(AT_FDCWD, path, true, kvs_real.lutimes(path, times));
}

/* futimesat and utimensat with a NULL path act on dirfd itself (a Linux extension glibc
 * passes on), and utimensat with "" and AT_EMPTY_PATH too. */
static bool on_fd(const char *path, int flags)
{
	return !path || (!path[0] && (flags & AT_EMPTY_PATH));
}

KVS_EXPORT int futimesat(int dirfd, const char *path, const struct timeval times[2])
{
	AROUND_TOUCH(dirfd, on_fd(path, 0) ? NULL : path, false,
		     kvs_real.futimesat(dirfd, path, times));
}

KVS_EXPORT int utimensat(int dirfd, const char *path, const struct timespec times[2], int flags)
{
	AROUND_TOUCH(dirfd, on_fd(path, flags) ? NULL : path, (flags & AT_SYMLINK_NOFOLLOW) != 0,
		     kvs_real.utimensat(dirfd, path, times, flags));
}

KVS_EXPORT int futimens(int fd, const struct timespec times[2])
{
	AROUND_TOUCH(fd, NULL, false, kvs_real.futimens(fd, times));
}

long kvs_time_syscall(long number, const long *a, long (*raw)(long, const long *))
{
	struct kvs_touch t;
	bool on = false;

	switch (number) {
#ifdef SYS_utime
	case SYS_utime:
#endif
#ifdef SYS_utimes
	case SYS_utimes:
#endif
		on = kvs_touch_before(&t, AT_FDCWD, (const char *)a[0], false);
		break;
#ifdef SYS_futimesat
	case SYS_futimesat:
		on = kvs_touch_before(
		    &t, (int)a[0], on_fd((const char *)a[1], 0) ? NULL : (const char *)a[1], false);
		break;
#endif
	case SYS_utimensat:
		on = kvs_touch_before(
		    &t, (int)a[0], on_fd((const char *)a[1], (int)a[3]) ? NULL : (const char *)a[1],
		    (a[3] & AT_SYMLINK_NOFOLLOW) != 0);
		break;
	default:
		break;
	}
	long r = raw(number, a);
	if (on)
		kvs_touch_after(&t, r < 0 && r > -4096 ? -1 : 0);
	return r;
}
