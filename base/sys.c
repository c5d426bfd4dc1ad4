/*
 * sys: see sys.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/resource.h>
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

/* The lowest number the shim's long-held descriptors take (kvs_fd_dup_high). */
static long high_floor(void)
{
	struct rlimit rl;

	if (kvs_syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl) == 0 && rl.rlim_cur / 2 < 1024)
		return (long)(rl.rlim_cur / 2);
	return 1024;
}

int kvs_fd_dup_high(int fd)
{
	int saved = errno;
	long floor = high_floor();
	int nd = floor > 2 ? (int)kvs_syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, floor) : -1;

	if (nd < 0)
		nd = (int)kvs_syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 0);
	errno = saved;
	return nd;
}

int kvs_fd_move_high(int fd)
{
	int saved = errno, nd;

	if (fd < 0 || fd >= high_floor())
		return fd;
	nd = (int)kvs_syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, high_floor());
	if (nd >= 0)
		kvs_syscall(SYS_close, fd);
	errno = saved;
	return nd >= 0 ? nd : fd;
}

/* Calls on an ownfd this thread makes now: kvs_ownfd_closing never waits for them. */
static __thread int ownfd_held __attribute__((tls_model("initial-exec")));

static inline int word_fd(uint64_t w)
{
	return (int)(uint32_t)w;
}

static inline uint64_t word_next(uint64_t w, int fd)
{
	return ((w >> 32) + 1) << 32 | (uint32_t)fd;
}

/* Count this thread as a user of the generation now; the word it counted against. */
static uint64_t hold(struct kvs_ownfd *o)
{
	for (;;) {
		uint64_t w = atomic_load(&o->word);
		unsigned int g = (unsigned int)(w >> 32) & 1;

		if (word_fd(w) < 0)
			return w;
		atomic_fetch_add(&o->users[g], 1);
		if (atomic_load(&o->word) == w) {
			ownfd_held++;
			return w;
		}
		atomic_fetch_sub(&o->users[g], 1); /* moved meanwhile: count against the new one */
	}
}

static void unhold(struct kvs_ownfd *o, uint64_t w)
{
	ownfd_held--;
	atomic_fetch_sub(&o->users[(w >> 32) & 1], 1);
}

int kvs_ownfd_get(struct kvs_ownfd *o, unsigned int *ticket)
{
	uint64_t w = hold(o);
	int fd = word_fd(w);

	if (fd < 0)
		return -1;
	if (!kvs_fd_is(fd, o->dev, o->ino)) {
		unhold(o, w);
		return -1;
	}
	*ticket = (unsigned int)(w >> 32);
	return fd;
}

void kvs_ownfd_put(struct kvs_ownfd *o, unsigned int ticket)
{
	unhold(o, (uint64_t)ticket << 32);
}

/* Wait for the users of w's generation (see kvs_ownfd_closing). */
static void wait_users(struct kvs_ownfd *o, uint64_t w)
{
	uint64_t until = kvs_mono_ns() + KVS_OWNFD_WAIT_NS;
	struct timespec pause = {0, 50000};

	while (!ownfd_held && atomic_load(&o->users[(w >> 32) & 1]) && kvs_mono_ns() < until)
		kvs_syscall(SYS_nanosleep, &pause, NULL);
}

/* A new number for fd of ours, outside [lo, hi]: 1024 or more, else above hi; -1 if none. */
static int move_above(int fd, unsigned int hi)
{
	if (hi >= INT_MAX)
		return -1;
	int nd = -1;
	if (hi < 1023)
		nd = (int)kvs_syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 1024);
	if (nd < 0)
		nd = (int)kvs_syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, hi < 2 ? 3 : (int)hi + 1);
	return nd < 0 ? -1 : nd;
}

void kvs_ownfd_closing(struct kvs_ownfd *o, unsigned int lo, unsigned int hi)
{
	int saved = errno;
	uint64_t w = atomic_load(&o->word);

	for (int tries = 0; tries < 64; tries++) {
		int fd = word_fd(w);

		if (fd < 0 || (unsigned int)fd < lo || (unsigned int)fd > hi)
			break; /* not among the numbers closed */
		uint64_t seen = w;
		/* Not ours any more (a close the hooks did not see): none, nothing to move. */
		int nd = kvs_fd_is(fd, o->dev, o->ino) ? move_above(fd, hi) : -1;
		bool moved = atomic_compare_exchange_strong(&o->word, &w, word_next(seen, nd));

		if (!moved && nd >= 0)
			kvs_syscall(SYS_close, nd); /* another closer or the owner was first */
		wait_users(o, seen); /* they may be using fd: the program closes it after them */
		if (moved)
			break;
	}
	errno = saved;
}

void kvs_ownfd_close(struct kvs_ownfd *o)
{
	for (;;) {
		uint64_t held = hold(o), w = held;
		int fd = word_fd(held);

		if (fd < 0)
			return;
		/* Closed while the word still names it and this thread counts as its user: a
		 * program's close of the number finds it there and waits for this one. */
		kvs_close_if_ours(fd, o->dev, o->ino);
		bool out = atomic_compare_exchange_strong(&o->word, &w, word_next(held, -1));
		unhold(o, held);
		if (out)
			return;
		/* A hook moved it meanwhile: the new number is a copy of ours, closed next. */
	}
}

void kvs_ownfd_set(struct kvs_ownfd *o, int fd)
{
	atomic_store(&o->word, word_next(atomic_load(&o->word), fd));
}

bool kvs_ownfd_publish(struct kvs_ownfd *o, int fd)
{
	uint64_t w = atomic_load(&o->word);

	return word_fd(w) < 0 && atomic_compare_exchange_strong(&o->word, &w, word_next(w, fd));
}

void kvs_ownfd_atfork_child(struct kvs_ownfd *o)
{
	atomic_store(&o->users[0], 0);
	atomic_store(&o->users[1], 0);
}

/* The bits of word w of a bitmap that lie in [lo, hi] (lo <= hi). */
static uint64_t word_mask(unsigned int w, unsigned int lo, unsigned int hi)
{
	uint64_t mask = ~0ull;

	if (w == lo / 64)
		mask &= ~0ull << (lo % 64);
	if (w == hi / 64 && hi % 64 != 63)
		mask &= (1ull << (hi % 64 + 1)) - 1;
	return mask;
}

/* [lo, *hi] within a bitmap of nbits: false when empty, else *hi cut to the last bit. */
static bool clip(unsigned int nbits, unsigned int lo, unsigned int *hi)
{
	if (lo >= nbits || *hi < lo)
		return false;
	if (*hi >= nbits)
		*hi = nbits - 1;
	return true;
}

void kvs_bitmap_take_range(_Atomic uint64_t *map, unsigned int nbits, unsigned int lo,
			   unsigned int hi, void (*each)(unsigned int bit, void *arg), void *arg)
{
	if (!clip(nbits, lo, &hi))
		return;
	for (unsigned int w = lo / 64; w <= hi / 64; w++) {
		uint64_t mask = word_mask(w, lo, hi);

		if (!(atomic_load_explicit(&map[w], memory_order_relaxed) & mask))
			continue;
		uint64_t bits = atomic_fetch_and(&map[w], ~mask) & mask;
		for (unsigned int b = 0; bits && each; b++, bits >>= 1)
			if (bits & 1)
				each(w * 64 + b, arg);
	}
}

bool kvs_bitmap_any(_Atomic uint64_t *map, unsigned int nbits, unsigned int lo, unsigned int hi)
{
	if (!clip(nbits, lo, &hi))
		return false;
	for (unsigned int w = lo / 64; w <= hi / 64; w++)
		if (atomic_load(&map[w]) & word_mask(w, lo, hi))
			return true;
	return false;
}

bool kvs_ownfd_in(struct kvs_ownfd *o, unsigned int lo, unsigned int hi)
{
	int fd = kvs_ownfd_peek(o);

	return fd >= 0 && (unsigned int)fd >= lo && (unsigned int)fd <= hi;
}

void kvs_bitmap_wait_clear(_Atomic uint64_t *map, unsigned int nbits, unsigned int lo,
			   unsigned int hi, uint64_t max_ns)
{
	uint64_t until = 0;
	struct timespec pause = {0, 50000};

	if (!clip(nbits, lo, &hi))
		return;
	for (unsigned int w = lo / 64; w <= hi / 64; w++) {
		uint64_t mask = word_mask(w, lo, hi);

		while (atomic_load(&map[w]) & mask) {
			if (!until)
				until = kvs_mono_ns() + max_ns;
			if (kvs_mono_ns() >= until)
				return;
			kvs_syscall(SYS_nanosleep, &pause, NULL);
		}
	}
}
