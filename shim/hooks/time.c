/*
 * hooks_time: the interposed timestamp calls (utime, utimes, futimes, lutimes, futimesat,
 * utimensat, futimens).  Each is the real call between kvs_touch_before and kvs_touch_after
 * (touch.h), which keep a KV file's cached shards under the identity the call gives it.  The
 * real call is made exactly as without the shim, outside the shim's guard; its result and
 * errno are the caller's.  The syscall() door (hooks/syscall.c) sends SYS_utime, SYS_utimes,
 * SYS_futimesat and SYS_utimensat here too (kvs_time_syscall).
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <utime.h>

#include "raw.h"
#include "real.h"
#include "shim.h"
#include "touch.h"

/* The real call wrapped: before, call, after, for what tg_ names. */
#define AROUND_TOUCH(tg_, call)                                                                    \
	do {                                                                                       \
		struct kvs_touch t_;                                                               \
		struct kvs_touch_target target_ = tg_;                                             \
		bool on_ = kvs_touch_before(&t_, &target_);                                        \
		kvs_real_init();                                                                   \
		int r_ = (call);                                                                   \
		if (on_)                                                                           \
			kvs_touch_after(&t_, r_);                                                  \
		return r_;                                                                         \
	} while (0)

/* A path (on_fd false) or a descriptor (on_fd true, path NULL). */
#define AT_PATH(dirfd, path, nofollow, times)                                                      \
	((struct kvs_touch_target){dirfd, path, false, nofollow, times})
#define AT_FD(fd, times) ((struct kvs_touch_target){fd, NULL, true, false, times})

KVS_EXPORT int utime(const char *path, const struct utimbuf *times)
{
	AROUND_TOUCH(AT_PATH(AT_FDCWD, path, false, NULL), kvs_real.utime(path, times));
}

KVS_EXPORT int utimes(const char *path, const struct timeval times[2])
{
	AROUND_TOUCH(AT_PATH(AT_FDCWD, path, false, NULL), kvs_real.utimes(path, times));
}

KVS_EXPORT int futimes(int fd, const struct timeval times[2])
{
	AROUND_TOUCH(AT_FD(fd, NULL), kvs_real.futimes(fd, times));
}

KVS_EXPORT int lutimes(const char *path, const struct timeval times[2])
{
	AROUND_TOUCH(AT_PATH(AT_FDCWD, path, true, NULL), kvs_real.lutimes(path, times));
}

/*
 * futimesat and utimensat with a NULL path act on dirfd itself (a Linux extension glibc passes
 * on), and utimensat with AT_EMPTY_PATH and "" too.  Whether a path is "" is asked of the
 * kernel (an open of it, which fails on ""), never by reading the caller's pointer, which may
 * be bad (then the call is the kernel's: EFAULT).  An empty path without AT_EMPTY_PATH is the
 * kernel's ENOENT either way.
 */
static struct kvs_touch_target at(int dirfd, const char *path, int flags,
				  const struct timespec *times)
{
	bool nofollow = (flags & AT_SYMLINK_NOFOLLOW) != 0;

	if (!path)
		return AT_FD(dirfd, times);
	if (flags & AT_EMPTY_PATH) {
		int fd =
		    kvs_sys_openat(dirfd, path, O_PATH | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));

		if (fd < 0 && errno == ENOENT)
			return AT_FD(dirfd, times); /* "": the descriptor itself */
		if (fd >= 0) {
			kvs_real_init();
			kvs_real.close(fd);
		}
	}
	return AT_PATH(dirfd, path, nofollow, times);
}

KVS_EXPORT int futimesat(int dirfd, const char *path, const struct timeval times[2])
{
	AROUND_TOUCH(at(dirfd, path, 0, NULL), kvs_real.futimesat(dirfd, path, times));
}

KVS_EXPORT int utimensat(int dirfd, const char *path, const struct timespec times[2], int flags)
{
	int saved = errno;
	struct kvs_touch_target tg = at(dirfd, path, flags, times);

	errno = saved;
	AROUND_TOUCH(tg, kvs_real.utimensat(dirfd, path, times, flags));
}

KVS_EXPORT int futimens(int fd, const struct timespec times[2])
{
	AROUND_TOUCH(AT_FD(fd, times), kvs_real.futimens(fd, times));
}

long kvs_time_syscall(long number, const long *a, long (*raw)(long, const long *))
{
	struct kvs_touch_target tg;
	struct kvs_touch t;
	int saved = errno;

	switch (number) {
#ifdef SYS_utime
	case SYS_utime:
#endif
#ifdef SYS_utimes
	case SYS_utimes:
#endif
		tg = AT_PATH(AT_FDCWD, (const char *)a[0], false, NULL);
		break;
#ifdef SYS_futimesat
	case SYS_futimesat:
		tg = at((int)a[0], (const char *)a[1], 0, NULL);
		break;
#endif
	case SYS_utimensat:
		tg = at((int)a[0], (const char *)a[1], (int)a[3], (const struct timespec *)a[2]);
		break;
	default:
		return raw(number, a);
	}
	errno = saved;
	bool on = kvs_touch_before(&t, &tg);
	long r = raw(number, a);
	if (on)
		kvs_touch_after(&t, r < 0 && r > -4096 ? -1 : 0);
	return r;
}
