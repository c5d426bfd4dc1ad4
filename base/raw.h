/*
 * raw: system calls made by the kernel's own instruction, never through a name the shim
 * exports.
 *
 * Why.  libkvshim.so exports close, fcntl, mmap, read, rename, syscall and the other names of
 * shim/exports.map, and is not linked -Bsymbolic: inside it, a plain close() from cache/ binds
 * to the shim's own close hook, which then has to recognise its own call (the recursion guard)
 * and pass it on.  Every call below reaches the kernel directly instead, so the libraries under
 * the shim (base/, config/, cache/, loader/, gpu/) never call up into it, in the shim or in a
 * program that links them alone (the tools, the tests).  scripts/check_layers.sh keeps it so:
 * none of their objects may name an exported function.
 *
 * Contract.  kvs_raw6 returns the kernel's answer, -errno on failure, and leaves errno alone:
 * it may run in a signal handler.  The kvs_sys_* functions and kvs_syscall behave as the
 * glibc functions of the same names do (-1, or MAP_FAILED, with errno set) so that a call site
 * changes its name and nothing else.  No cancellation point, no lock, no allocation.
 *
 * Architectures: x86_64 and aarch64, the two the shim is written for (shim/hooks/dlsym_stub.S).
 */
#ifndef KVS_BASE_RAW_H
#define KVS_BASE_RAW_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>

#if defined(__x86_64__)
static inline long kvs_raw6(long n, long a, long b, long c, long d, long e, long f)
{
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	long ret;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}
#elif defined(__aarch64__)
static inline long kvs_raw6(long n, long a, long b, long c, long d, long e, long f)
{
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	register long x5 __asm__("x5") = f;

	__asm__ volatile("svc 0"
			 : "+r"(x0)
			 : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
			 : "memory", "cc");
	return x0;
}
#else
#error "base/raw.h: system calls are written for x86_64 and aarch64 only"
#endif

/* A kernel answer in glibc's convention: -1 and errno for -4095..-1, else the value. */
static inline long kvs_raw_errno(long r)
{
	if ((unsigned long)r > -4096ul) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

static inline long kvs_syscall6(long n, long a, long b, long c, long d, long e, long f)
{
	return kvs_raw_errno(kvs_raw6(n, a, b, c, d, e, f));
}

/* kvs_syscall(SYS_x, args...): glibc's syscall(), up to six arguments, each cast to long. */
#define kvs_syscall(...) KVS_SYSCALL_PAD_(__VA_ARGS__, 0, 0, 0, 0, 0, 0, 0)
#define KVS_SYSCALL_PAD_(n, a, b, c, d, e, f, ...)                                                 \
	kvs_syscall6((long)(n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

/* open, openat and fcntl take their last argument or not, as glibc's do. */
static inline int kvs_sys_openat_(int dirfd, const char *path, int flags, mode_t mode)
{
	return (int)kvs_syscall(SYS_openat, dirfd, path, flags, mode);
}
#define kvs_sys_openat(...) KVS_OPENAT_PAD_(__VA_ARGS__, 0, 0)
#define KVS_OPENAT_PAD_(dirfd, path, flags, mode, ...)                                             \
	kvs_sys_openat_(dirfd, path, flags, (mode_t)(mode))
#define kvs_sys_open(...)		      KVS_OPEN_PAD_(__VA_ARGS__, 0, 0)
#define KVS_OPEN_PAD_(path, flags, mode, ...) kvs_sys_openat_(AT_FDCWD, path, flags, (mode_t)(mode))
static inline int kvs_sys_fcntl_(int fd, int cmd, long arg)
{
	return (int)kvs_syscall(SYS_fcntl, fd, cmd, arg);
}
#define kvs_sys_fcntl(...)		  KVS_FCNTL_PAD_(__VA_ARGS__, 0, 0)
#define KVS_FCNTL_PAD_(fd, cmd, arg, ...) kvs_sys_fcntl_(fd, cmd, (long)(arg))

static inline int kvs_sys_close(int fd)
{
	return (int)kvs_syscall(SYS_close, fd);
}

static inline ssize_t kvs_sys_read(int fd, void *buf, size_t len)
{
	return kvs_syscall(SYS_read, fd, buf, len);
}

static inline ssize_t kvs_sys_pread(int fd, void *buf, size_t len, off_t off)
{
	return kvs_syscall(SYS_pread64, fd, buf, len, off);
}

static inline void *kvs_sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	long r = kvs_raw6(SYS_mmap, (long)addr, (long)len, prot, flags, fd, (long)off);

	if ((unsigned long)r > -4096ul) {
		errno = (int)-r;
		return MAP_FAILED;
	}
	return (void *)r;
}

static inline int kvs_sys_munmap(void *addr, size_t len)
{
	return (int)kvs_syscall(SYS_munmap, addr, len);
}

static inline int kvs_sys_ftruncate(int fd, off_t len)
{
	return (int)kvs_syscall(SYS_ftruncate, fd, len);
}

static inline int kvs_sys_fallocate(int fd, int mode, off_t off, off_t len)
{
	return (int)kvs_syscall(SYS_fallocate, fd, mode, off, len);
}

static inline int kvs_sys_renameat2(int olddir, const char *oldpath, int newdir,
				    const char *newpath, unsigned flags)
{
	return (int)kvs_syscall(SYS_renameat2, olddir, oldpath, newdir, newpath, flags);
}

static inline int kvs_sys_rename(const char *oldpath, const char *newpath)
{
	return kvs_sys_renameat2(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0);
}

#endif
