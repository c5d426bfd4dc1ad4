/*
 * real: see real.h.  Every pointer starts at a raw-syscall fallback, so a hook called before
 * (or during) resolution still reaches the kernel; dlsym then replaces what it finds.
 *
 * No pthread_once: dlsym may itself call a hooked function (it reads files, and once the shim
 * interposes dlsym it re-enters the shim), and a thread that waited on a once-control its own
 * stack holds would deadlock.  Instead one thread resolves (state RESOLVING, taken by CAS) while
 * any other caller, the resolving thread's own re-entries included, goes on with whatever
 * pointers are set: each is a raw system call or the real function, both right.  The pointers
 * are stored whole by one thread, so a racing reader sees the old value or the new one.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dlsym.h"
#include "raw.h"
#include "real.h"

#define LO(off) ((unsigned long)(off))
#define HI(off) ((unsigned long)((uint64_t)(off) >> 32))

static ssize_t sys_read(int fd, void *b, size_t n)
{
	return kvs_syscall(SYS_read, fd, b, n);
}
static ssize_t sys_pread(int fd, void *b, size_t n, off_t o)
{
	return kvs_syscall(SYS_pread64, fd, b, n, o);
}
static ssize_t sys_readv(int fd, const struct iovec *v, int c)
{
	return kvs_syscall(SYS_readv, fd, v, c);
}
static ssize_t sys_preadv(int fd, const struct iovec *v, int c, off_t o)
{
	return kvs_syscall(SYS_preadv, fd, v, c, LO(o), HI(o));
}
static ssize_t sys_preadv2(int fd, const struct iovec *v, int c, off_t o, int f)
{
	return kvs_syscall(SYS_preadv2, fd, v, c, LO(o), HI(o), f);
}
static ssize_t sys_read_chk(int fd, void *b, size_t n, size_t len)
{
	return n > len ? (errno = EFAULT, -1) : sys_read(fd, b, n);
}
static ssize_t sys_pread_chk(int fd, void *b, size_t n, off_t o, size_t len)
{
	return n > len ? (errno = EFAULT, -1) : sys_pread(fd, b, n, o);
}
static ssize_t sys_write(int fd, const void *b, size_t n)
{
	return kvs_syscall(SYS_write, fd, b, n);
}
static ssize_t sys_pwrite(int fd, const void *b, size_t n, off_t o)
{
	return kvs_syscall(SYS_pwrite64, fd, b, n, o);
}
static ssize_t sys_writev(int fd, const struct iovec *v, int c)
{
	return kvs_syscall(SYS_writev, fd, v, c);
}
static ssize_t sys_pwritev(int fd, const struct iovec *v, int c, off_t o)
{
	return kvs_syscall(SYS_pwritev, fd, v, c, LO(o), HI(o));
}
static ssize_t sys_pwritev2(int fd, const struct iovec *v, int c, off_t o, int f)
{
	return kvs_syscall(SYS_pwritev2, fd, v, c, LO(o), HI(o), f);
}

static void *sys_mmap(void *a, size_t n, int prot, int flags, int fd, off_t o)
{
	return (void *)kvs_syscall(SYS_mmap, a, n, prot, flags, fd, o);
}

static int sys_munmap(void *a, size_t n)
{
	return (int)kvs_syscall(SYS_munmap, a, n);
}
static void *sys_mremap(void *a, size_t o, size_t n, int flags, ...)
{
	va_list ap;

	va_start(ap, flags);
	void *to = (flags & MREMAP_FIXED) ? va_arg(ap, void *) : NULL;
	va_end(ap);
	return (void *)kvs_syscall(SYS_mremap, a, o, n, flags, to);
}

static int sys_close(int fd)
{
	return (int)kvs_syscall(SYS_close, fd);
}
static int sys_fcntl(int fd, int cmd, ...)
{
	va_list ap;

	va_start(ap, cmd);
	void *arg = va_arg(ap, void *); /* glibc's own fcntl reads every argument so */
	va_end(ap);
	return (int)kvs_syscall(SYS_fcntl, fd, cmd, arg);
}
/* lockf has no system call: F_TEST/F_TLOCK/F_LOCK/F_ULOCK are fcntl record locks of
 * [position, position + len), as glibc builds them. */
static int sys_lockf(int fd, int cmd, off_t len)
{
	struct flock fl = {.l_whence = SEEK_CUR, .l_start = 0, .l_len = len};

	switch (cmd) {
	case F_TEST:
		fl.l_type = F_RDLCK;
		if (kvs_syscall(SYS_fcntl, fd, F_GETLK, &fl) < 0)
			return -1;
		if (fl.l_type == F_UNLCK || fl.l_pid == getpid())
			return 0;
		errno = EACCES;
		return -1;
	case F_ULOCK:
		fl.l_type = F_UNLCK;
		return (int)kvs_syscall(SYS_fcntl, fd, F_SETLK, &fl);
	case F_TLOCK:
		fl.l_type = F_WRLCK;
		return (int)kvs_syscall(SYS_fcntl, fd, F_SETLK, &fl);
	case F_LOCK:
		fl.l_type = F_WRLCK;
		return (int)kvs_syscall(SYS_fcntl, fd, F_SETLKW, &fl);
	default:
		errno = EINVAL;
		return -1;
	}
}
static int sys_fsync(int fd)
{
	return (int)kvs_syscall(SYS_fsync, fd);
}
static int sys_fdatasync(int fd)
{
	return (int)kvs_syscall(SYS_fdatasync, fd);
}
static int sys_ftruncate(int fd, off_t len)
{
	return (int)kvs_syscall(SYS_ftruncate, fd, len);
}
static int sys_renameat2(int od, const char *o, int nd, const char *n, unsigned int flags)
{
	return (int)kvs_syscall(SYS_renameat2, od, o, nd, n, flags);
}
static int sys_renameat(int od, const char *o, int nd, const char *n)
{
	return sys_renameat2(od, o, nd, n, 0);
}
static int sys_rename(const char *o, const char *n)
{
	return sys_renameat2(AT_FDCWD, o, AT_FDCWD, n, 0);
}

static int sys_utimensat(int dirfd, const char *path, const struct timespec *ts, int flags)
{
	return (int)kvs_syscall(SYS_utimensat, dirfd, path, ts, flags);
}
static int sys_futimens(int fd, const struct timespec *ts)
{
	return sys_utimensat(fd, NULL, ts, 0);
}
/* The timeval and utimbuf forms, as utimensat: tv NULL means now. */
static int sys_utimes_at(int dirfd, const char *path, const struct timeval *tv, int flags)
{
	struct timespec ts[2];

	if (!tv)
		return sys_utimensat(dirfd, path, NULL, flags);
	for (int i = 0; i < 2; i++) {
		if (tv[i].tv_usec < 0 || tv[i].tv_usec >= 1000000) {
			errno = EINVAL;
			return -1;
		}
		ts[i].tv_sec = tv[i].tv_sec;
		ts[i].tv_nsec = tv[i].tv_usec * 1000;
	}
	return sys_utimensat(dirfd, path, ts, flags);
}
static int sys_utimes(const char *path, const struct timeval *tv)
{
	return sys_utimes_at(AT_FDCWD, path, tv, 0);
}
static int sys_futimes(int fd, const struct timeval *tv)
{
	return sys_utimes_at(fd, NULL, tv, 0);
}
static int sys_lutimes(const char *path, const struct timeval *tv)
{
	return sys_utimes_at(AT_FDCWD, path, tv, AT_SYMLINK_NOFOLLOW);
}
static int sys_futimesat(int dirfd, const char *path, const struct timeval *tv)
{
	return sys_utimes_at(dirfd, path, tv, 0);
}
static int sys_utime(const char *path, const struct utimbuf *b)
{
	struct timeval tv[2];

	if (!b)
		return sys_utimes(path, NULL);
	tv[0] = (struct timeval){b->actime, 0};
	tv[1] = (struct timeval){b->modtime, 0};
	return sys_utimes(path, tv);
}
static int sys_dup3(int o, int n, int flags)
{
	return (int)kvs_syscall(SYS_dup3, o, n, flags);
}
static int sys_dup2(int o, int n)
{
	if (o == n) /* dup3 refuses it; dup2 answers n when it is open */
		return (int)kvs_syscall(SYS_fcntl, o, F_GETFD) < 0 ? -1 : n;
	return sys_dup3(o, n, 0);
}
static int sys_close_range(unsigned int lo, unsigned int hi, int flags)
{
#ifdef SYS_close_range
	return (int)kvs_syscall(SYS_close_range, lo, hi, flags);
#else
	(void)lo;
	(void)hi;
	(void)flags;
	errno = ENOSYS;
	return -1;
#endif
}

static int sys_openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;

	va_start(ap, flags);
	mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, unsigned int) : 0;
	va_end(ap);
	return (int)kvs_syscall(SYS_openat, dirfd, path, flags, mode);
}
static int sys_open(const char *path, int flags, ...)
{
	va_list ap;

	va_start(ap, flags);
	mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, unsigned int) : 0;
	va_end(ap);
	return sys_openat(AT_FDCWD, path, flags, mode);
}
static int sys_creat(const char *path, mode_t mode)
{
	return sys_openat(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}
static int sys_open_2(const char *path, int flags)
{
	return sys_openat(AT_FDCWD, path, flags);
}
static int sys_openat_2(int dirfd, const char *path, int flags)
{
	return sys_openat(dirfd, path, flags);
}
static int sys_fallocate(int fd, int mode, off_t off, off_t len)
{
	return (int)kvs_syscall(SYS_fallocate, fd, mode, off, len);
}
static ssize_t sys_copy_file_range(int in, off64_t *ioff, int out, off64_t *ooff, size_t n,
				   unsigned int flags)
{
	return kvs_syscall(SYS_copy_file_range, in, ioff, out, ooff, n, flags);
}
static ssize_t sys_sendfile(int out, int in, off_t *off, size_t n)
{
	return kvs_syscall(SYS_sendfile, out, in, off, n);
}
static ssize_t sys_splice(int in, off64_t *ioff, int out, off64_t *ooff, size_t n,
			  unsigned int flags)
{
	return kvs_syscall(SYS_splice, in, ioff, out, ooff, n, flags);
}
static int sys_truncate(const char *path, off_t len)
{
	return (int)kvs_syscall(SYS_truncate, path, len);
}

/* glibc exports fread, fwrite and fclose under these names too; the fallbacks while RTLD_NEXT
 * is being resolved. */
extern size_t _IO_fread(void *ptr, size_t size, size_t n, FILE *f);
extern size_t _IO_fwrite(const void *ptr, size_t size, size_t n, FILE *f);
extern int _IO_fclose(FILE *f);
extern FILE *_IO_fopen(const char *path, const char *mode);

/* freopen has no alias and no system call: until resolved, looked up at the call (the
 * dynamic linker's own dlsym, never the shim's). */
static FILE *freopen_late(const char *path, const char *mode, FILE *f)
{
	FILE *(*fn)(const char *, const char *, FILE *) =
	    (FILE * (*)(const char *, const char *, FILE *)) kvs_dlsym_real(RTLD_NEXT, "freopen");

	if (!fn || kvs_dlsym_in_shim((void *)fn)) {
		errno = ENOSYS;
		return NULL;
	}
	return fn(path, mode, f);
}

/* Each pointer starts at its row's fallback (exports.def): a raw system call, glibc's _IO_ alias
 * for stdio, which has none, or freopen_late. */
struct kvs_real kvs_real = {
#define KVS_HOOK(field, symbol, ret, params, fallback) .field = fallback,
#define KVS_DOOR(symbol)
#include "exports.def"
#undef KVS_HOOK
#undef KVS_DOOR
};

enum { UNRESOLVED, RESOLVING, RESOLVED };
static _Atomic int state = UNRESOLVED;

/*
 * The lookups use glibc's own dlsym, found in libc's symbol table (dlsym.c), not the dlsym the
 * shim exports or one interposed ahead of the shim (a profiler's, say): RTLD_NEXT is relative
 * to the caller, and a forwarding dlsym makes itself the caller, so "the next read" would be
 * the shim's own hook: a loop, not a read.  Anything that still resolves into the shim itself
 * is refused, and the raw system call stays.
 */
static void *(*real_dlsym)(void *, const char *);
static Dl_info self;

static void *next_symbol(const char *name)
{
	Dl_info in;
	void *p = real_dlsym(RTLD_NEXT, name);

	if (!p || (dladdr(p, &in) && in.dli_fbase == self.dli_fbase))
		return NULL;
	return p;
}

#define RESOLVE(field, name)                                                                       \
	do {                                                                                       \
		void *p = next_symbol(name);                                                       \
		if (p)                                                                             \
			__atomic_store_n((void **)&kvs_real.field, p, __ATOMIC_RELAXED);           \
	} while (0)

static void resolve(void)
{
	real_dlsym = kvs_dlsym_real;
	if (!dladdr((void *)resolve, &self))
		self.dli_fbase = NULL;
#define KVS_HOOK(field, symbol, ret, params, fallback) RESOLVE(field, #symbol);
#define KVS_DOOR(symbol)
#include "exports.def"
#undef KVS_HOOK
#undef KVS_DOOR
}

void kvs_real_init(void)
{
	int s =
	    atomic_load_explicit(&state, memory_order_acquire); /* pairs with the release below */

	if (s != UNRESOLVED || !atomic_compare_exchange_strong(&state, &s, RESOLVING))
		return; /* resolved, or being resolved: the fallbacks serve meanwhile */
	resolve();
	atomic_store_explicit(&state, RESOLVED, memory_order_release);
}
