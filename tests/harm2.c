/*
 * harm2: what "Never harm the host, part 2" found broken in the asynchronous and fork paths,
 * each as a command whose output is compared with and without the shim (harm2_test.sh).
 *
 *   harm2 retired SLOW FAST OTHER   kernel AIO: a read of SLOW (on a slow file system) is
 *                                   submitted; its descriptor is closed, FAST opened on the
 *                                   same number and read (which retires SLOW's anchor), then
 *                                   OTHER opened; the event and the buffer must be SLOW's
 *   harm2 resfd FILE REGULAR        io_submit of a read with IOCB_FLAG_RESFD naming a regular
 *                                   file: the kernel answers EINVAL and writes nothing
 *   harm2 eoftail FILE              a 1 MiB O_DIRECT read of a short FILE, by pread, io_submit
 *                                   and aio_read: the result and what the tail holds
 *   harm2 timeout SLOW              io_getevents and aio_suspend with timeouts too long to add
 *                                   to the clock ({LONG_MAX, 0}, {18446744074, 0}) wait for the
 *                                   read instead of returning at once
 *   harm2 sigev FILE N              N aio_reads notified by SIGEV_THREAD with detached
 *                                   attributes, then a join of an unrelated thread
 *   harm2 forkfds FILE              after reading FILE, close every descriptor from 3 up, open
 *                                   pipes on those numbers, fork: the child finds every pipe
 *   harm2 ownfds FILE DIR HOW       after a read of FILE (the region's and the walk's
 *                                   descriptors exist), close every descriptor from 3 up (HOW:
 *                                   "loop", syscall(SYS_close) up to 1023; "close", close() up
 *                                   to 1023; "range", syscall close_range(3, ~0U); "closefrom",
 *                                   glibc's closefrom(3), whose close the shim does not see),
 *                                   open 64 files of DIR on those numbers, every other one with
 *                                   an OFD lock on all of it, then read 3 MiB more (claims, and
 *                                   the walk moves) and wait 1.5 s: every file is still open,
 *                                   empty, locked if it was, and no other descriptor names one;
 *                                   "busy": the close() loop at once, while an eager walk runs,
 *                                   timed (a close must not wait for the walk's next chunks)
 *   harm2 vforkclose FILE           after a read of FILE, 8 vfork children each call
 *                                   close_range(3, ~0U) (CPython's subprocess), then FILE is
 *                                   closed: no descriptor of FILE is left in the parent
 *   harm2 initlock LIB FILE         a thread dlopen()s LIB, whose constructor reads FILE while
 *                                   the loader's lock is held; meanwhile the main thread makes
 *                                   the process's first hooked call: neither waits for ever
 *
 * Each prints one line per check; the test compares them, or looks for "ok".  Exit 0 unless the
 * command could not run (2).  The syscall door of kernel AIO is used (libaio makes the same
 * system calls through libc's syscall()).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <aio.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1u << 20)

static void die(const char *what)
{
	fprintf(stderr, "harm2: %s: %s\n", what, strerror(errno));
	exit(2);
}

static void *aligned(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static long k_setup(unsigned n, aio_context_t *ctx)
{
	return syscall(SYS_io_setup, n, ctx);
}

static long k_submit(aio_context_t ctx, struct iocb *cb)
{
	struct iocb *p = cb;

	return syscall(SYS_io_submit, ctx, 1, &p);
}

static long k_getevents(aio_context_t ctx, long min_nr, struct io_event *ev, struct timespec *ts)
{
	return syscall(SYS_io_getevents, ctx, min_nr, 1, ev, ts);
}

static struct iocb read_iocb(int fd, void *buf, size_t len, off_t off)
{
	return (struct iocb){.aio_lio_opcode = IOCB_CMD_PREAD,
			     .aio_fildes = (uint32_t)fd,
			     .aio_buf = (uint64_t)(uintptr_t)buf,
			     .aio_nbytes = len,
			     .aio_offset = off,
			     .aio_data = 42};
}

/* The bytes of path at [0, len): a buffered read, which the shim passes through. */
static char *contents(const char *path, size_t len)
{
	char *b = malloc(len);
	int fd = open(path, O_RDONLY);

	if (!b || fd < 0 || pread(fd, b, len, 0) != (ssize_t)len)
		die(path);
	close(fd);
	return b;
}

static int cmd_retired(const char *slow, const char *fast, const char *other)
{
	aio_context_t ctx = 0;
	struct io_event ev;
	char *buf = aligned(MIB), *fbuf = aligned(MIB), *want = contents(slow, MIB);
	int a = open(slow, O_RDONLY | O_DIRECT);

	if (a < 0 || k_setup(4, &ctx) < 0)
		die("setup");
	struct iocb cb = read_iocb(a, buf, MIB, 0);
	if (k_submit(ctx, &cb) != 1)
		die("io_submit");
	/* While SLOW's read is in flight: its number is closed, FAST takes it and is read. */
	close(a);
	int b = open(fast, O_RDONLY | O_DIRECT);
	if (b != a) {
		if (b < 0 || dup2(b, a) < 0)
			die("fast");
		close(b);
		b = a;
	}
	if (pread(b, fbuf, MIB, 0) < 0)
		die("pread fast");
	close(b);
	/* Unrelated files now take every free number, the old anchor's among them if it went. */
	int others[16];
	for (int i = 0; i < 16; i++)
		others[i] = open(other, O_RDONLY);
	long n = k_getevents(ctx, 1, &ev, NULL);
	printf("retired: events %ld res %lld, buffer is %s\n", n, (long long)ev.res,
	       n == 1 && ev.res == MIB && !memcmp(buf, want, MIB) ? "the slow file's" : "WRONG");
	for (int i = 0; i < 16; i++)
		if (others[i] >= 0)
			close(others[i]);
	return 0;
}

static int cmd_resfd(const char *path, const char *regular)
{
	aio_context_t ctx = 0;
	char *buf = aligned(MIB);
	int fd = open(path, O_RDONLY | O_DIRECT), reg = open(regular, O_RDWR | O_CREAT, 0644);
	struct io_event ev;
	struct timespec short_wait = {0, 200000000};

	if (fd < 0 || reg < 0 || k_setup(4, &ctx) < 0)
		die("setup");
	/* Warm first, so that a served read would be a hit, completed at submission. */
	if (pread(fd, buf, MIB, 0) < 0)
		die("pread");
	struct iocb cb = read_iocb(fd, buf, MIB, 0);
	cb.aio_flags = IOCB_FLAG_RESFD;
	cb.aio_resfd = (uint32_t)reg;
	errno = 0;
	long r = k_submit(ctx, &cb);
	int err = errno;
	long n = k_getevents(ctx, 0, &ev, &short_wait);
	struct stat st;
	fstat(reg, &st);
	printf("resfd regular: io_submit %ld errno %s, events %ld, file %lld bytes\n", r,
	       r < 0 ? strerrorname_np(err) : "-", n, (long long)st.st_size);
	/* And a real eventfd, closed by the program before it reaps: counted once. */
	int efd = eventfd(0, 0);
	cb.aio_resfd = (uint32_t)efd;
	r = k_submit(ctx, &cb);
	n = k_getevents(ctx, 1, &ev, NULL);
	uint64_t count = 0;
	long got = read(efd, &count, sizeof(count));
	printf("resfd eventfd: io_submit %ld, events %ld res %lld, eventfd read %ld count %llu\n",
	       r, n, (long long)ev.res, got, (unsigned long long)count);
	return 0;
}

static const char *tail_state(const unsigned char *b, size_t from, size_t len)
{
	for (size_t i = from; i < len; i++)
		if (b[i] != 0)
			return b[i] == 0xaa ? "left as it was" : "other bytes";
	return "zeroed";
}

static int cmd_eoftail(const char *path)
{
	unsigned char *buf = aligned(MIB);
	int fd = open(path, O_RDONLY | O_DIRECT);
	struct stat st;

	if (fd < 0 || fstat(fd, &st) < 0)
		die(path);
	for (int pass = 0; pass < 2; pass++) { /* cold, then warm (a hit at submission) */
		memset(buf, 0xaa, MIB);
		ssize_t n = pread(fd, buf, MIB, 0);
		printf("eoftail pread pass %d: %zd, tail %s\n", pass, n,
		       n >= 0 ? tail_state(buf, (size_t)n, MIB) : "-");

		aio_context_t ctx = 0;
		struct io_event ev;
		memset(buf, 0xaa, MIB);
		if (k_setup(4, &ctx) < 0)
			die("io_setup");
		struct iocb cb = read_iocb(fd, buf, MIB, 0);
		if (k_submit(ctx, &cb) != 1 || k_getevents(ctx, 1, &ev, NULL) != 1)
			die("kernel aio");
		printf("eoftail io_submit pass %d: %lld, tail %s\n", pass, (long long)ev.res,
		       ev.res >= 0 ? tail_state(buf, (size_t)ev.res, MIB) : "-");
		syscall(SYS_io_destroy, ctx);

		struct aiocb a = {.aio_fildes = fd, .aio_buf = buf, .aio_nbytes = MIB};
		memset(buf, 0xaa, MIB);
		const struct aiocb *list[1] = {&a};
		if (aio_read(&a) != 0)
			die("aio_read");
		while (aio_error(&a) == EINPROGRESS)
			aio_suspend(list, 1, NULL);
		n = aio_return(&a);
		printf("eoftail aio_read pass %d: %zd, tail %s\n", pass, n,
		       n >= 0 ? tail_state(buf, (size_t)n, MIB) : "-");
	}
	printf("eoftail: file of %lld bytes\n", (long long)st.st_size);
	return 0;
}

static int cmd_timeout(const char *slow)
{
	static const struct timespec longs[2] = {{LONG_MAX, 0}, {18446744074L, 0}};
	char *buf = aligned(MIB);
	int fd = open(slow, O_RDONLY | O_DIRECT);

	if (fd < 0)
		die(slow);
	for (int i = 0; i < 2; i++) {
		aio_context_t ctx = 0;
		struct io_event ev;
		struct timespec ts = longs[i];
		if (k_setup(4, &ctx) < 0)
			die("io_setup");
		/* A block not read yet: a miss on a slow file system, so the event is late. */
		struct iocb cb = read_iocb(fd, buf, MIB, (off_t)(1 + i) * MIB);
		/* From the submit: the shim's io_submit waits for the reads it serves, the kernel's
		 * io_getevents for its own. */
		double t0 = now_ms();
		if (k_submit(ctx, &cb) != 1)
			die("io_submit");
		long n = k_getevents(ctx, 1, &ev, &ts);
		printf("timeout io_getevents {%lld, 0}: %ld event%s, res %lld, waited %s\n",
		       (long long)ts.tv_sec, n, n == 1 ? "" : "s", n == 1 ? (long long)ev.res : 0LL,
		       now_ms() - t0 >= 100 ? "for it" : "not at all");
		syscall(SYS_io_destroy, ctx);
	}
	for (int i = 0; i < 2; i++) {
		struct aiocb a = {.aio_fildes = fd,
				  .aio_buf = buf,
				  .aio_nbytes = MIB,
				  .aio_offset = (off_t)(3 + i) * MIB};
		const struct aiocb *list[1] = {&a};
		struct timespec ts = longs[i];
		if (aio_read(&a) != 0)
			die("aio_read");
		double t0 = now_ms();
		int r = aio_suspend(list, 1, &ts);
		int err = errno;
		while (aio_error(&a) == EINPROGRESS)
			aio_suspend(list, 1, NULL);
		printf("timeout aio_suspend {%lld, 0}: %d%s%s, read %zd, waited %s\n",
		       (long long)ts.tv_sec, r, r ? " " : "", r ? strerrorname_np(err) : "",
		       aio_return(&a), now_ms() - t0 >= 100 ? "for it" : "not at all");
	}
	return 0;
}

static _Atomic int notified;

static void note(union sigval v)
{
	(void)v;
	atomic_fetch_add(&notified, 1);
}

static void *idle(void *arg)
{
	return arg;
}

static int cmd_sigev(const char *path, int n)
{
	char *buf = aligned(MIB);
	int fd = open(path, O_RDONLY | O_DIRECT);
	pthread_attr_t attr;
	pthread_t other;

	if (fd < 0)
		die(path);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&other, NULL, idle, buf))
		die("pthread_create");
	for (int i = 0; i < n; i++) {
		struct aiocb a = {.aio_fildes = fd, .aio_buf = buf, .aio_nbytes = MIB};
		const struct aiocb *list[1] = {&a};
		a.aio_sigevent.sigev_notify = SIGEV_THREAD;
		a.aio_sigevent.sigev_notify_function = note;
		a.aio_sigevent.sigev_notify_attributes = &attr;
		if (aio_read(&a) != 0)
			die("aio_read");
		while (aio_error(&a) == EINPROGRESS)
			aio_suspend(list, 1, NULL);
		aio_return(&a);
	}
	for (int i = 0; i < 500 && atomic_load(&notified) < n; i++)
		usleep(10000);
	void *ret = NULL;
	int j = pthread_join(other, &ret);
	printf("sigev: %d of %d notified, join of another thread: %s\n", atomic_load(&notified), n,
	       j == 0 && ret == buf ? "ok" : strerror(j));
	return 0;
}

static int cmd_forkfds(const char *path)
{
	char *buf = aligned(MIB);
	int fd = open(path, O_RDONLY | O_DIRECT), pipes[32][2], np = 0, st = 0;

	if (fd < 0 || pread(fd, buf, MIB, 0) < 0) /* the region and an anchor now exist */
		die(path);
	/* What daemons do: close every descriptor but stdio, then open their own. */
	for (int i = 3; i < 1024; i++)
		syscall(SYS_close, i); /* raw: the shim is not told, as with close_range */
	for (; np < 32 && pipe(pipes[np]) == 0; np++)
		;
	pid_t kid;
	/* A loaded machine (other tests' thousands of threads) may refuse a fork for a while: a
	 * program retries, and a refusal is said, never taken for a child that found nothing. */
	for (int tries = 0; (kid = fork()) < 0 && errno == EAGAIN && tries < 100; tries++)
		usleep(50000);
	if (kid < 0) {
		printf("forkfds: fork: %s\n", strerror(errno));
		return 1;
	}
	if (kid == 0) {
		int good = 0;

		for (int i = 0; i < np; i++) {
			char c = 'x';

			good += fcntl(pipes[i][0], F_GETFD) >= 0 &&
				fcntl(pipes[i][1], F_GETFD) >= 0 &&
				write(pipes[i][1], &c, 1) == 1 && read(pipes[i][0], &c, 1) == 1;
		}
		printf("forkfds: the child found %d of %d pipes whole\n", good, np);
		fflush(stdout);
		_exit(0);
	}
	if (waitpid(kid, &st, 0) != kid || !WIFEXITED(st) || WEXITSTATUS(st))
		printf("forkfds: the child ended with status %#x\n", st);
	return 0;
}

/* Descriptors of this process whose link contains name (whole: is name). */
static int fds_naming(const char *name, bool whole)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	for (struct dirent *e; d && (e = readdir(d));) {
		char link[300], target[4096];
		ssize_t len;

		snprintf(link, sizeof(link), "/proc/self/fd/%s", e->d_name);
		len = readlink(link, target, sizeof(target) - 1);
		if (len > 0) {
			target[len] = '\0';
			n += whole ? !strcmp(target, name) : strstr(target, name) != NULL;
		}
	}
	if (d)
		closedir(d);
	return n;
}

static int cmd_ownfds(const char *path, const char *dir, const char *how)
{
	enum { NFILES = 64 };
	char *buf = aligned(MIB), name[4096];
	int fd = open(path, O_RDONLY | O_DIRECT), files[NFILES], whole = 0;

	if (fd < 0 || pread(fd, buf, MIB, 0) < 0) /* the region, its walk and an anchor exist */
		die(path);
	if (strcmp(how, "busy"))
		usleep(300000); /* the walk reached its window and waits, holding its descriptor */
	double t0 = now_ms();
	if (!strcmp(how, "loop")) {
		for (int i = 3; i < 1024; i++)
			syscall(SYS_close, i);
	} else if (!strcmp(how, "close") || !strcmp(how, "busy")) {
		for (int i = 3; i < 1024; i++)
			close(i);
	} else if (!strcmp(how, "closefrom")) {
		closefrom(3);
	} else if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0) {
		die("close_range");
	}
	if (now_ms() - t0 > 1000)
		printf("ownfds %s: closing took %.0f ms\n", how, now_ms() - t0);
	for (int i = 0; i < NFILES; i++) {
		struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};

		snprintf(name, sizeof(name), "%s/own.%d", dir, i);
		files[i] = open(name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (files[i] < 0 || (i % 2 == 0 && fcntl(files[i], F_OFD_SETLK, &fl) < 0))
			die(name);
	}
	/* More reads: slots are claimed (their pages made through the region's descriptor), and
	 * the walk, woken, goes on through its own. */
	fd = open(path, O_RDONLY | O_DIRECT);
	for (int i = 1; fd >= 0 && i < 4; i++)
		if (pread(fd, buf, MIB, (off_t)i * MIB) < 0)
			die(path);
	usleep(1500000);
	for (int i = 0; i < NFILES; i++) {
		struct stat st;
		struct flock probe[2] = {
		    {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_len = 1},
		    {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 8192, .l_len = 1}};
		bool locked = i % 2 == 0; /* as the program left it */

		snprintf(name, sizeof(name), "%s/own.%d", dir, i);
		int other = open(name, O_RDONLY | O_CLOEXEC); /* another description asks */
		for (int k = 0; k < 2 && other >= 0; k++) {
			bool held =
			    fcntl(other, F_OFD_GETLK, &probe[k]) == 0 && probe[k].l_type != F_UNLCK;

			locked = i % 2 == 0 ? locked && held : locked || held;
		}
		if (other >= 0)
			close(other);
		if (fstat(files[i], &st) == 0 && st.st_size == 0 && st.st_blocks == 0 &&
		    locked == (i % 2 == 0))
			whole++;
		else
			printf("ownfds %s: own.%d: %s, %lld bytes, %lld blocks, %s\n", how, i,
			       fcntl(files[i], F_GETFD) < 0 ? "closed" : "open",
			       (long long)st.st_size, (long long)st.st_blocks,
			       locked ? "locked" : "unlocked");
	}
	printf("ownfds %s: %d of %d of the program's files untouched\n", how, whole, NFILES);
	/* Nobody else opened them: the shim never opens a file through a number it lost. */
	int named = fds_naming("/own.", false);
	printf("ownfds %s: %d descriptors name the program's files\n", how, named);
	return 0;
}

static int cmd_vforkclose(const char *path)
{
	char *buf = aligned(MIB), want[4096];
	int fd = open(path, O_RDONLY | O_DIRECT), left = 0;

	if (fd < 0 || pread(fd, buf, MIB, 0) < 0 || !realpath(path, want))
		die(path);
	for (int i = 0; i < 8; i++) {
		pid_t kid = vfork();

		if (kid == 0) {
			close_range(3, ~0u, 0); /* the child's table; the parent's memory */
			_exit(0);
		}
		if (kid < 0 || waitpid(kid, NULL, 0) != kid)
			die("vfork");
	}
	close(fd);
	left = fds_naming(want, true);
	printf("vforkclose: %d descriptors of the file left after 8 spawns\n", left);
	return 0;
}

static void *opener(void *lib)
{
	return dlopen(lib, RTLD_NOW | RTLD_LOCAL);
}

/* Nothing hooked may run before the main thread's pread: the shim's first call is that one. */
static int cmd_initlock(const char *lib, const char *path)
{
	static char buf[1 << 20] __attribute__((aligned(4096)));
	pthread_t t;
	void *h = NULL;

	setenv("KVS_HARM2_FILE", path, 1);
	if (pthread_create(&t, NULL, opener, (void *)lib))
		return 2;
	usleep(100000); /* the opener is in the constructor now, holding the loader's lock */
	int fd = open(path, O_RDONLY | O_DIRECT);
	ssize_t n = fd >= 0 ? pread(fd, buf, sizeof(buf), 0) : -1;
	pthread_join(t, &h);
	int *ctor = h ? dlsym(h, "harm2_ctor_result") : NULL;
	printf("initlock: main read %zd, constructor read %d\n", n, ctor ? *ctor : -2);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "initlock"))
		return cmd_initlock(argv[2], argv[3]); /* before anything that could be hooked */
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && !strcmp(argv[1], "retired"))
		return cmd_retired(argv[2], argv[3], argv[4]);
	if (argc == 4 && !strcmp(argv[1], "resfd"))
		return cmd_resfd(argv[2], argv[3]);
	if (argc == 3 && !strcmp(argv[1], "eoftail"))
		return cmd_eoftail(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "timeout"))
		return cmd_timeout(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "sigev"))
		return cmd_sigev(argv[2], atoi(argv[3]));
	if (argc == 3 && !strcmp(argv[1], "vforkclose"))
		return cmd_vforkclose(argv[2]);
	if (argc == 5 && !strcmp(argv[1], "ownfds"))
		return cmd_ownfds(argv[2], argv[3], argv[4]);
	if (argc == 3 && !strcmp(argv[1], "forkfds"))
		return cmd_forkfds(argv[2]);
	fprintf(stderr, "usage: see the comment at the top of tests/harm2.c\n");
	return 2;
}
