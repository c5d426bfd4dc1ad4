/*
 * real: see real.h.  Every pointer starts at a raw-syscall fallback, so a hook called before
 * (or during) resolution still reaches the kernel; dlsym then replaces what it finds.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "real.h"

#define LO(off) ((unsigned long)(off))
#define HI(off) ((unsigned long)((uint64_t)(off) >> 32))

static ssize_t sys_read(int fd, void *b, size_t n)
{
	return syscall(SYS_read, fd, b, n);
}
static ssize_t sys_pread(int fd, void *b, size_t n, off_t o)
{
	return syscall(SYS_pread64, fd, b, n, o);
}
static ssize_t sys_readv(int fd, const struct iovec *v, int c)
{
	return syscall(SYS_readv, fd, v, c);
}
static ssize_t sys_preadv(int fd, const struct iovec *v, int c, off_t o)
{
	return syscall(SYS_preadv, fd, v, c, LO(o), HI(o));
}
static ssize_t sys_preadv2(int fd, const struct iovec *v, int c, off_t o, int f)
{
	return syscall(SYS_preadv2, fd, v, c, LO(o), HI(o), f);
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
	return syscall(SYS_write, fd, b, n);
}
static ssize_t sys_pwrite(int fd, const void *b, size_t n, off_t o)
{
	return syscall(SYS_pwrite64, fd, b, n, o);
}
static ssize_t sys_writev(int fd, const struct iovec *v, int c)
{
	return syscall(SYS_writev, fd, v, c);
}
static ssize_t sys_pwritev(int fd, const struct iovec *v, int c, off_t o)
{
	return syscall(SYS_pwritev, fd, v, c, LO(o), HI(o));
}
static ssize_t sys_pwritev2(int fd, const struct iovec *v, int c, off_t o, int f)
{
	return syscall(SYS_pwritev2, fd, v, c, LO(o), HI(o), f);
}

struct kvs_real kvs_real = {
    .read = sys_read,
    .pread = sys_pread,
    .pread64 = sys_pread,
    .readv = sys_readv,
    .preadv = sys_preadv,
    .preadv64 = sys_preadv,
    .preadv2 = sys_preadv2,
    .preadv64v2 = sys_preadv2,
    .read_chk = sys_read_chk,
    .pread_chk = sys_pread_chk,
    .pread64_chk = sys_pread_chk,
    .fread = NULL, /* resolved below; stdio has no system call to fall back to */
    .write = sys_write,
    .pwrite = sys_pwrite,
    .pwrite64 = sys_pwrite,
    .writev = sys_writev,
    .pwritev = sys_pwritev,
    .pwritev64 = sys_pwritev,
    .pwritev2 = sys_pwritev2,
    .pwritev64v2 = sys_pwritev2,
};

static pthread_once_t once = PTHREAD_ONCE_INIT;

#define RESOLVE(field, name)                                                                       \
	do {                                                                                       \
		void *p = dlsym(RTLD_NEXT, name);                                                  \
		if (p)                                                                             \
			*(void **)&kvs_real.field = p;                                             \
	} while (0)

static void resolve(void)
{
	RESOLVE(read, "read");
	RESOLVE(pread, "pread");
	RESOLVE(pread64, "pread64");
	RESOLVE(readv, "readv");
	RESOLVE(preadv, "preadv");
	RESOLVE(preadv64, "preadv64");
	RESOLVE(preadv2, "preadv2");
	RESOLVE(preadv64v2, "preadv64v2");
	RESOLVE(read_chk, "__read_chk");
	RESOLVE(pread_chk, "__pread_chk");
	RESOLVE(pread64_chk, "__pread64_chk");
	RESOLVE(fread, "fread");
	RESOLVE(write, "write");
	RESOLVE(pwrite, "pwrite");
	RESOLVE(pwrite64, "pwrite64");
	RESOLVE(writev, "writev");
	RESOLVE(pwritev, "pwritev");
	RESOLVE(pwritev64, "pwritev64");
	RESOLVE(pwritev2, "pwritev2");
	RESOLVE(pwritev64v2, "pwritev64v2");
}

void kvs_real_init(void)
{
	pthread_once(&once, resolve);
}
