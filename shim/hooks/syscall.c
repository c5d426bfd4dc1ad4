/*
 * hooks_syscall: libc's syscall(), the door through which programs make system calls by
 * number (UCM's AIO engine, fio's own io_uring code, a daemon's close loop).  Each number the
 * shim has a hook for by name is sent where that hook's work is done, so that a call by
 * number is served, followed or forgotten exactly as the named call would be; every other
 * number goes to the kernel.  The shim's own code never comes through here: it makes its
 * system calls with base/raw.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "fanout.h"
#include "kaio.h"
#include "raw.h"
#include "shim.h"
#include "shmap.h"
#include "touch.h"
#include "uring.h"
#include "wonce.h"
#include "wthru.h"

long syscall(long number, ...);

static long raw_args(long n, const long *a)
{
	return kvs_raw6(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* A change of a file made through libc's syscall() (a write, a truncation, a copy into it):
 * followed as the shim's hooks follow one (kvs_shim_change_before), over the whole file (the
 * arguments are the kernel's to check): the file keeps nothing of write-through meanwhile,
 * and its shards are dropped.  The kernel's answer, -errno on failure. */
static long changing(long number, const long *a)
{
	struct kvs_shim_change ch;
	int fd = (number == SYS_copy_file_range || number == SYS_splice) ? (int)a[2] : (int)a[0];
	bool on = kvs_shim_change_before(&ch, fd, KVS_WT_ANYWHERE, NULL, UINT64_MAX, true);
	long r = kvs_raw6(number, a[0], a[1], a[2], a[3], a[4], a[5]);

	if (on) {
		int saved = errno;

		kvs_shim_change_after(&ch, r < 0 ? -1 : r);
		errno = saved;
	}
	return r;
}

/* An open by number: followed as the open hooks follow one (hooks/open.c), the kernel's answer,
 * -errno on failure. */
static long opening(long number, const long *a, int dirfd, const char *path, int flags)
{
	struct kvs_wonce_open o;
	long r;

	kvs_shim_opening(&o, dirfd, path, flags);
	r = raw_args(number, a);
	if (r >= 0) {
		int saved = errno;

		kvs_shim_opened(&o, (int)r, flags);
		errno = saved;
	}
	return r;
}

#ifdef SYS_openat2
/* openat2's flags, from its struct open_how (a[2], of a[3] bytes), read as the kernel reads
 * it; one it cannot read is its to refuse (0: nothing to follow). */
static int openat2_flags(const long *a)
{
	uint64_t flags = 0;

	if ((size_t)a[3] < sizeof(flags) ||
	    !kvs_shim_copy_in(&flags, (const void *)a[2], sizeof(flags)))
		return 0;
	return (int)flags;
}
#endif

/* The mapping numbers, as the libc names (hooks/posix.c): a KV file mapped is counted, a
 * writable shared mapping recorded until it goes (shmap.h), an io_uring's rings noted. */
static long mapping(long number, const long *a)
{
	uint64_t before = kvs_shmap_now();
	int fd = (int)a[4], flags = (int)a[3];

	if (number == SYS_mmap && fd >= 0 && !(flags & MAP_ANONYMOUS))
		kvs_shim_note_mmap(fd, (uint64_t)a[1]);
	long r = kvs_raw6(number, a[0], a[1], a[2], a[3], a[4], a[5]);
	if (r < 0 && r > -4096)
		return r;
	int saved = errno;
	if (number == SYS_mmap && fd >= 0 && !(flags & MAP_ANONYMOUS)) {
		kvs_shim_mapped((void *)r, fd, (int)a[2], flags, a[5], (uint64_t)a[1]);
		kvs_uring_mapped(fd, a[5], (void *)r);
	} else if (number == SYS_munmap) {
		kvs_shmap_unmapped((void *)a[0], (size_t)a[1], before);
	} else if (number == SYS_mremap) {
		kvs_shmap_remapped((void *)a[0], (size_t)a[1], (size_t)a[2], before);
	}
	errno = saved;
	return r;
}

#ifdef SYS_io_uring_register
/* io_uring through libc's syscall() (fio's own ring code): api/uring.c learns the ring's
 * layout and files, and serves the entries an enter is about to submit. */
static long uring_number(long number, const long *a)
{
	long r;

	switch (number) {
	case SYS_io_uring_setup:
		r = kvs_raw6(number, a[0], a[1], a[2], a[3], a[4], a[5]);
		if (r >= 0) {
			int saved = errno;
			kvs_uring_setup_done((int)r, (const void *)a[1]);
			errno = saved;
		}
		break;
	case SYS_io_uring_enter: {
		int saved = errno;
		kvs_uring_enter((int)a[0], (unsigned)a[1], (unsigned)a[3]);
		errno = saved;
		r = kvs_raw6(number, a[0], a[1], a[2], a[3], a[4], a[5]);
		break;
	}
	case SYS_io_uring_register:
		r = kvs_raw6(number, a[0], a[1], a[2], a[3], a[4], a[5]);
		{
			int saved = errno;
			kvs_uring_register((int)a[0], (unsigned)a[1], (const void *)a[2],
					   (unsigned)a[3], r);
			errno = saved;
		}
		break;
	default:
		r = raw_args(number, a);
		break;
	}
	return r;
}

#endif

/* A number closed or replaced: what fdinfo knew of it goes, before and after the kernel's
 * close (fdinfo.h), and the close fan-out runs before it (hooks/fanout.h). */
static long closing(long number, const long *a)
{
	long r;

	switch (number) {
	case SYS_close:
		kvs_shim_fd_gone((int)a[0]);
		if ((int)a[0] >= 0)
			kvs_shim_fds_closing((unsigned int)a[0], (unsigned int)a[0]);
		r = raw_args(number, a);
		kvs_shim_fd_gone((int)a[0]);
		break;
#ifdef SYS_dup2
	case SYS_dup2:
#endif
	case SYS_dup3:
		kvs_shim_fd_gone((int)a[1]);
		kvs_shim_dup_closing((int)a[0], (int)a[1], number == SYS_dup3 ? (int)a[2] : 0);
		r = raw_args(number, a);
		kvs_shim_fd_gone((int)a[1]);
		break;
#ifdef SYS_close_range
	case SYS_close_range:
		kvs_shim_fds_gone((unsigned int)a[0], (unsigned int)a[1]);
		kvs_shim_range_closing((unsigned int)a[0], (unsigned int)a[1], (unsigned int)a[2]);
		r = raw_args(number, a);
		kvs_shim_fds_gone((unsigned int)a[0], (unsigned int)a[1]);
		break;
#endif
	default:
		r = raw_args(number, a);
		break;
	}
	return r;
}

/* A truncation by path or descriptor: followed as a change of the file (shim.h). */
static long truncating(long number, const long *a)
{
	long r;

	switch (number) {
#ifdef SYS_truncate
	case SYS_truncate: {
		struct kvs_shim_change ch;
		int fd = kvs_shim_truncate_path_before(&ch, (const char *)a[0], (int64_t)a[1]);

		r = raw_args(number, a);
		kvs_shim_truncate_path_after(&ch, fd, r < 0 ? -1 : 0);
		break;
	}
#endif
	case SYS_ftruncate: {
		struct kvs_shim_change ch;
		bool on = kvs_shim_truncate_before(&ch, (int)a[0], (int64_t)a[1]);

		r = raw_args(number, a);
		if (on)
			kvs_shim_change_after(&ch, r < 0 ? -1 : 0);
		break;
	}
	default:
		r = raw_args(number, a);
		break;
	}
	return r;
}

/* libc's syscall(): the io_* numbers that touch served entries go to api/kaio.c, the
 * io_uring numbers to api/uring.c, the timestamp numbers to touch.c, a closed or replaced
 * number to fdinfo.c, and the numbers that change a file's bytes are followed (changing);
 * every other number goes to the kernel as glibc's would (-1 and errno for -4095..-1). */
static long by_number(long number, const long *a)
{
	long r;

	switch (number) {
#ifdef SYS_io_uring_register
	case SYS_io_uring_setup:
	case SYS_io_uring_enter:
	case SYS_io_uring_register:
		r = uring_number(number, a);
		break;
#endif
#ifdef SYS_utime
	case SYS_utime:
#endif
#ifdef SYS_utimes
	case SYS_utimes:
#endif
#ifdef SYS_futimesat
	case SYS_futimesat:
#endif
	case SYS_utimensat:
		r = kvs_time_syscall(number, a, raw_args); /* touch.h: keeps the cached shards */
		break;
	/* A number closed or replaced: what fdinfo knew of it goes, before and after (fdinfo.h). */
	case SYS_close:
#ifdef SYS_dup2
	case SYS_dup2:
#endif
	case SYS_dup3:
#ifdef SYS_close_range
	case SYS_close_range:
#endif
		r = closing(number, a);
		break;
		/* Opens: an O_TRUNC of a write-once file, and the number's class (as hooks/open.c).
		 */
#ifdef SYS_open
	case SYS_open:
		r = opening(number, a, AT_FDCWD, (const char *)a[0], (int)a[1]);
		break;
#endif
#ifdef SYS_creat
	case SYS_creat:
		r = opening(number, a, AT_FDCWD, (const char *)a[0], O_CREAT | O_WRONLY | O_TRUNC);
		break;
#endif
	case SYS_openat:
		r = opening(number, a, (int)a[0], (const char *)a[1], (int)a[2]);
		break;
#ifdef SYS_openat2
	case SYS_openat2:
		r = opening(number, a, (int)a[0], (const char *)a[1], openat2_flags(a));
		break;
#endif
#ifdef SYS_truncate
	case SYS_truncate:
#endif
	case SYS_ftruncate:
		r = truncating(number, a);
		break;
	case SYS_write:
	case SYS_pwrite64:
	case SYS_writev:
	case SYS_pwritev:
	case SYS_pwritev2:
	case SYS_fallocate:
	case SYS_copy_file_range:
	case SYS_sendfile:
	case SYS_splice:
		r = changing(number, a);
		break;
	case SYS_mmap:
	case SYS_munmap:
	case SYS_mremap:
		r = mapping(number, a);
		break;
	default:
		r = raw_args(number, a);
		break;
	}
	return r;
}

/* The door: six arguments read as glibc's syscall() reads them, the kernel's answer in glibc's
 * convention. */
KVS_EXPORT long syscall(long number, ...)
{
	long a[6], r;
	va_list ap;

	va_start(ap, number);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	/* The io_* numbers, and libaio's own calls, first. */
	if (!kvs_libaio_syscall(number, a, &r))
		r = by_number(number, a);
	if (r < 0 && r > -4096) {
		errno = (int)-r;
		return -1;
	}
	return r;
}
