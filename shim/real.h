/*
 * real: the libc functions the shim interposes, as the next object in the lookup order
 * provides them (dlsym(RTLD_NEXT)), resolved once.  A name that cannot be resolved falls back
 * to the raw system call where one exists, so a hook can always make "the real call".
 */
#ifndef KVS_SHIM_REAL_H
#define KVS_SHIM_REAL_H

#include <stdio.h>
#include <sys/time.h>
#include <time.h>
#include <utime.h>
#include <sys/types.h>
#include <sys/uio.h>

struct kvs_real {
	ssize_t (*read)(int, void *, size_t);
	ssize_t (*pread)(int, void *, size_t, off_t);
	ssize_t (*pread64)(int, void *, size_t, off64_t);
	ssize_t (*readv)(int, const struct iovec *, int);
	ssize_t (*preadv)(int, const struct iovec *, int, off_t);
	ssize_t (*preadv64)(int, const struct iovec *, int, off64_t);
	ssize_t (*preadv2)(int, const struct iovec *, int, off_t, int);
	ssize_t (*preadv64v2)(int, const struct iovec *, int, off64_t, int);
	ssize_t (*read_chk)(int, void *, size_t, size_t);
	ssize_t (*pread_chk)(int, void *, size_t, off_t, size_t);
	ssize_t (*pread64_chk)(int, void *, size_t, off64_t, size_t);
	size_t (*fread)(void *, size_t, size_t, FILE *);
	size_t (*fwrite)(const void *, size_t, size_t, FILE *);
	int (*fclose)(FILE *);
	ssize_t (*write)(int, const void *, size_t);
	ssize_t (*pwrite)(int, const void *, size_t, off_t);
	ssize_t (*pwrite64)(int, const void *, size_t, off64_t);
	ssize_t (*writev)(int, const struct iovec *, int);
	ssize_t (*pwritev)(int, const struct iovec *, int, off_t);
	ssize_t (*pwritev64)(int, const struct iovec *, int, off64_t);
	ssize_t (*pwritev2)(int, const struct iovec *, int, off_t, int);
	ssize_t (*pwritev64v2)(int, const struct iovec *, int, off64_t, int);
	void *(*mmap)(void *, size_t, int, int, int, off_t);
	void *(*mmap64)(void *, size_t, int, int, int, off64_t);
	int (*munmap)(void *, size_t);
	int (*close)(int);
	int (*fcntl)(int, int, ...);
	int (*fcntl64)(int, int, ...);
	int (*lockf)(int, int, off_t);
	int (*lockf64)(int, int, off64_t);
	int (*fsync)(int);
	int (*fdatasync)(int);
	int (*ftruncate)(int, off_t);
	int (*ftruncate64)(int, off64_t);
	int (*rename)(const char *, const char *);
	int (*renameat)(int, const char *, int, const char *);
	int (*renameat2)(int, const char *, int, const char *, unsigned int);
	int (*utime)(const char *, const struct utimbuf *);
	int (*utimes)(const char *, const struct timeval *);
	int (*futimes)(int, const struct timeval *);
	int (*lutimes)(const char *, const struct timeval *);
	int (*futimesat)(int, const char *, const struct timeval *);
	int (*utimensat)(int, const char *, const struct timespec *, int);
	int (*futimens)(int, const struct timespec *);
	int (*dup2)(int, int);
	int (*dup3)(int, int, int);
	int (*close_range)(unsigned int, unsigned int, int);
	int (*open)(const char *, int, ...);
	int (*open64)(const char *, int, ...);
	int (*openat)(int, const char *, int, ...);
	int (*openat64)(int, const char *, int, ...);
	int (*creat)(const char *, mode_t);
	int (*creat64)(const char *, mode_t);
	int (*open_2)(const char *, int);
	int (*open64_2)(const char *, int);
	int (*openat_2)(int, const char *, int);
	int (*openat64_2)(int, const char *, int);
	FILE *(*fopen)(const char *, const char *);
	FILE *(*fopen64)(const char *, const char *);
	FILE *(*freopen)(const char *, const char *, FILE *);
	FILE *(*freopen64)(const char *, const char *, FILE *);
	int (*fallocate)(int, int, off_t, off_t);
	int (*fallocate64)(int, int, off64_t, off64_t);
	ssize_t (*copy_file_range)(int, off64_t *, int, off64_t *, size_t, unsigned int);
	ssize_t (*sendfile)(int, int, off_t *, size_t);
	ssize_t (*sendfile64)(int, int, off64_t *, size_t);
	ssize_t (*splice)(int, off64_t *, int, off64_t *, size_t, unsigned int);
	int (*truncate)(const char *, off_t);
	int (*truncate64)(const char *, off64_t);
};

extern struct kvs_real kvs_real;

/* Resolve every pointer (once; later calls return at once).  Never fails. */
void kvs_real_init(void);

#endif
