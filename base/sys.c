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

/* Kvs_ownfd_get calls on this thread not yet put: kvs_ownfd_closing never waits for them. */
static __thread int ownfd_held __attribute__((tls_model("initial-exec")));

int kvs_ownfd_get(struct kvs_ownfd *o)
{
	atomic_fetch_add(&o->users, 1); /* before the load: see kvs_ownfd_closing */
	int fd = atomic_load(&o->fd);

	if (fd >= 0 && kvs_fd_is(fd, o->dev, o->ino)) {
		ownfd_held++;
		return fd;
	}
	atomic_fetch_sub(&o->users, 1);
	return -1;
}

void kvs_ownfd_put(struct kvs_ownfd *o)
{
	ownfd_held--;
	atomic_fetch_sub(&o->users, 1);
}

void kvs_ownfd_closing(struct kvs_ownfd *o, unsigned int lo, unsigned int hi)
{
	int saved = errno, old = atomic_load(&o->fd);

	for (;;) {
		if (old < 0 || (unsigned int)old < lo || (unsigned int)old > hi)
			break; /* not among the numbers closed */
		unsigned int from = hi < 2 ? 3 : hi + 1;
		int nd = hi >= INT_MAX || !kvs_fd_is(old, o->dev, o->ino)
			     ? -1
			     : (int)kvs_syscall(SYS_fcntl, old, F_DUPFD_CLOEXEC, (int)from);
		/* -1: no number free above hi, or the number was not ours any more: gone. */
		if (atomic_compare_exchange_strong(&o->fd, &old, nd))
			break;
		if (nd >= 0)
			kvs_syscall(SYS_close, nd); /* moved or closed meanwhile: look again */
	}
	if (old >= 0 && (unsigned int)old >= lo && (unsigned int)old <= hi && !ownfd_held) {
		/* A user that loaded the old number finishes before the program closes it. */
		uint64_t until = kvs_mono_ns() + KVS_OWNFD_WAIT_NS;
		struct timespec pause = {0, 50000};

		while (atomic_load(&o->users) && kvs_mono_ns() < until)
			kvs_syscall(SYS_nanosleep, &pause, NULL);
	}
	errno = saved;
}

void kvs_bitmap_take_range(_Atomic uint64_t *map, unsigned int nbits, unsigned int lo,
			   unsigned int hi, void (*each)(unsigned int bit, void *arg), void *arg)
{
	if (lo >= nbits || hi < lo)
		return;
	if (hi >= nbits)
		hi = nbits - 1;
	for (unsigned int w = lo / 64; w <= hi / 64; w++) {
		uint64_t mask = ~0ull;

		if (w == lo / 64)
			mask &= ~0ull << (lo % 64);
		if (w == hi / 64 && hi % 64 != 63)
			mask &= (1ull << (hi % 64 + 1)) - 1;
		if (!(atomic_load_explicit(&map[w], memory_order_relaxed) & mask))
			continue;
		uint64_t bits = atomic_fetch_and(&map[w], ~mask) & mask;
		for (unsigned int b = 0; bits && each; b++, bits >>= 1)
			if (bits & 1)
				each(w * 64 + b, arg);
	}
}

void kvs_ownfd_close(struct kvs_ownfd *o)
{
	kvs_close_if_ours(atomic_exchange(&o->fd, -1), o->dev, o->ino);
}
