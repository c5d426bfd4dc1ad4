/*
 * sys: see sys.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>

#include "raw.h"
#include "sys.h"

int kvs_thread_start(pthread_t *th, void *(*fn)(void *), void *arg, size_t stack)
{
	pthread_attr_t a;
	sigset_t all, old;
	pthread_t ignored;
	int r;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&a);
	if (stack)
		pthread_attr_setstacksize(&a, stack);
	if (!th)
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	r = pthread_create(th ? th : &ignored, &a, fn, arg);
	pthread_attr_destroy(&a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return -r;
}

_Atomic int64_t kvs_node_offset_ns;

/* Read "monotonic <s> <ns>" of /proc/self/timens_offsets with raw system calls (this runs at
 * an attach, inside the host), parsed by hand. */
void kvs_node_clock_init(void)
{
	char buf[256];
	int64_t off = 0;
	long fd =
	    kvs_syscall(SYS_openat, AT_FDCWD, "/proc/self/timens_offsets", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		goto out;
	long n = kvs_syscall(SYS_read, fd, buf, sizeof(buf) - 1);
	kvs_syscall(SYS_close, fd);
	if (n <= 0)
		goto out;
	buf[n] = '\0';
	const char *p = strstr(buf, "monotonic");
	if (!p)
		goto out;
	p += strlen("monotonic");
	int64_t v[2] = {0, 0};
	for (int k = 0; k < 2; k++) {
		bool neg = false;

		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '-') {
			neg = true;
			p++;
		}
		while (*p >= '0' && *p <= '9')
			v[k] = v[k] * 10 + (*p++ - '0');
		if (neg)
			v[k] = -v[k];
	}
	off = v[0] * 1000000000ll + v[1];
out:
	atomic_store_explicit(&kvs_node_offset_ns, off, memory_order_relaxed);
}

bool kvs_fd_is(int fd, uint64_t dev, uint64_t ino)
{
	struct stat st;
	int saved = errno;
	int fl = fd < 0 ? -1 : (int)kvs_syscall(SYS_fcntl, fd, F_GETFD);
	bool ours = fl >= 0 && (fl & FD_CLOEXEC) && fstat(fd, &st) == 0 &&
		    (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino;

	errno = saved;
	return ours;
}

void kvs_close_if_ours(int fd, uint64_t dev, uint64_t ino)
{
	if (kvs_fd_is(fd, dev, ino))
		kvs_syscall(SYS_close, fd);
}

bool kvs_fd_move_above(_Atomic int *fd, unsigned int lo, unsigned int hi, uint64_t dev,
		       uint64_t ino)
{
	int old = atomic_load_explicit(fd, memory_order_acquire);

	if (old < 0 || (unsigned int)old < lo || (unsigned int)old > hi)
		return true; /* not among the numbers closed */
	if (hi >= INT_MAX || !kvs_fd_is(old, dev, ino))
		return false;
	int saved = errno;
	int nd = (int)kvs_syscall(SYS_fcntl, old, F_DUPFD_CLOEXEC, (int)hi + 1);
	errno = saved;
	if (nd < 0)
		return false; /* no number above hi (RLIMIT_NOFILE): it goes with the close */
	/* Another closing thread may have moved it first: then this copy is not needed. */
	if (!atomic_compare_exchange_strong(fd, &old, nd))
		kvs_syscall(SYS_close, nd);
	return true;
}
