/*
 * harm3: what "Never harm the host, part 3: the write path" found broken, each as a command
 * (tests/harm3_test.sh runs them with and without the shim and compares, or checks that what
 * the cache serves afterwards is what storage holds).
 *
 *   harm3 verify FILE            FILE read whole through the hooked pread (O_DIRECT, 1 MiB at
 *                                a time) and by the raw system call: "FILE: N bytes, served as
 *                                stored", or where they differ
 *   harm3 sigaio FILE N          N 64 KiB aio_writes notified by SIGEV_SIGNAL, reaped in the
 *                                handler (aio_error, aio_return, then a close of a descriptor
 *                                of FILE) while the main thread allocates: "no deadlock"
 *   harm3 appendoff FILE HOW     on an O_APPEND descriptor, 1 MiB written at the position,
 *                                then 1 MiB more "at offset 0" by HOW (pwrite, pwritev,
 *                                pwritev2, aio, lio, kaio): Linux appends it
 *   harm3 appendstream FILE HOW  1 MiB saved, then 1 MiB fwritten through an append stream:
 *                                fopen "a+" (HOW a+), or "a" after fseek to 0 (HOW aseek)
 *   harm3 badvec FILE            readv, writev, preadv, pwritev, preadv2, pwritev2 with an
 *                                iovec array the kernel cannot read (PROT_NONE), on FILE and on
 *                                a pipe; io_submit with such an iocb array, iocb and PWRITEV
 *                                iovec array: the answers
 *   harm3 bigwrite FILE          write(fd, 1 MiB buffer, 1 << 46) to FILE: the answer, and
 *                                whether it came within a second
 *   harm3 errno FILE             errno set to a sentinel, then successful calls of the hooked
 *                                write path (fwrite to stdout, write, pwrite, close, fsync,
 *                                ftruncate, rename, fclose): errno after each
 *   harm3 change FILE HOW        a 1 MiB aio_write seen over by aio_suspend, then the process
 *                                changes bytes in its range by HOW (fallocate, copyrange,
 *                                pwrite8k: 8 KiB on another descriptor, pwrite8: 8 bytes at 64
 *                                on another descriptor (seen once defect 6(a) is fixed), uring,
 * sendfile, splice, truncate: by path to 4 KiB and back to 1 MiB, syscall: SYS_pwrite64 through
 *                                libc's syscall()), then aio_return and close;
 *                                kaio: the same with kernel AIO reaped late, by fallocate
 *   harm3 stdio FILE HOW         fopen "r+", fwrite 1 MiB at 0, fseek 0, then HOW (fputc,
 *                                fprintf, fwrite_unlocked, fputs) writes a header, fclose
 *   harm3 mapstore FILE          1 MiB saved; a MAP_SHARED writable mapping; a store, a pwrite
 *                                of the shard, another store; close (the mapping lives on)
 *   harm3 reborn FILE            1 MiB written and closed, FILE deleted and created again with
 *                                other bytes until it has the same inode, size and stamps (on
 *                                a file system of whole-second stamps)
 *   harm3 hold FILE MIB          MIB MiB written to FILE, "holding" printed, then the file held
 *                                open until the process is killed
 *   harm3 aiokill FILE           an aio_write of FILE seen over, then SIGKILL before it is
 *                                reaped (the shim sees a write that never ends)
 *   harm3 uringprobe FILE N      N reads of FILE, each through a ring of its own set up and
 *                                entered through libc's syscall(), with a seccomp filter that
 *                                refuses io_uring_setup of 2 entries (the shim's probe ring)
 *   harm3 vread FILE BLOCK       vLLM's file tier: FILE read in BLOCK-byte blocks with preadv
 *                                (O_DIRECT); a block whose count is not BLOCK (or the end) or
 *                                that fails would be deleted: "vread: N blocks, M deleted"
 *
 * The writing commands end with verify's line.  Exit 0 unless the command could not run (2).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/aio_abi.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/io_uring.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#ifdef HARM3_URING
#include <liburing.h>
#endif

#define MIB (1u << 20)

static void die(const char *what)
{
	fprintf(stderr, "harm3: %s: %s\n", what, strerror(errno));
	exit(2);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (unsigned char)x;
	}
}

static void *big(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

static int opendst(const char *path, int flags)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | flags, 0644);

	if (fd < 0)
		die(path);
	return fd;
}

/* An address the kernel cannot read: a page mapped PROT_NONE and left so (an address
 * unmapped could be mapped again by a sanitizer runtime before the call that should fault). */
static void *unmapped(void)
{
	void *p = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Read FILE whole through the hooked pread (O_DIRECT, 1 MiB at a time) and by the raw system
 * call; say whether they agree. */
static void verify(const char *path)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_DIRECT);

	if (fd < 0 || fstat(fd, &st))
		die(path);
	size_t len = ((size_t)st.st_size + MIB - 1) / MIB * MIB;
	unsigned char *a = big(len ? len : MIB), *b = big(len ? len : MIB);
	size_t got = 0;

	for (size_t off = 0; off < len; off += MIB) {
		ssize_t n = pread(fd, a + off, MIB, (off_t)off);
		ssize_t m = syscall(SYS_pread64, fd, b + off, MIB, (off_t)off);

		if (n != m) {
			printf("%s: at %zu the hooked pread answered %zd, storage %zd\n", path, off,
			       n, m);
			close(fd);
			return;
		}
		got += n > 0 ? (size_t)n : 0;
	}
	close(fd);
	for (size_t i = 0; i < got; i++) {
		if (a[i] != b[i]) {
			printf("%s: byte %zu served %#x, stored %#x\n", path, i, a[i], b[i]);
			return;
		}
	}
	printf("%s: %zu bytes, served as stored\n", path, got);
}

/* ------------------------------------------------------------------ 1: aio in a handler */

static struct aiocb sig_cb;
static _Atomic int sig_reaped, sig_closefd = -1;

static void on_aio(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	struct aiocb *cb = si->si_value.sival_ptr;
	int e = aio_error(cb);

	if (e != EINPROGRESS) {
		aio_return(cb);
		int fd = atomic_exchange(&sig_closefd, -1);
		if (fd >= 0)
			close(fd); /* a descriptor of the file its writes were noted for */
		atomic_fetch_add(&sig_reaped, 1);
	}
}

static int cmd_sigaio(const char *path, int rounds)
{
	struct sigaction sa = {0};
	unsigned char *buf = big(64 << 10);
	char other_path[PATH_MAX];
	int fd = opendst(path, 0);

	snprintf(other_path, sizeof(other_path), "%s.other", path);
	int other = opendst(other_path, 0);

	fill(buf, 64 << 10, 11);
	sa.sa_sigaction = on_aio;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGRTMIN, &sa, NULL);
	double t0 = now_s();
	for (int i = 0; i < rounds; i++) {
		int before = atomic_load(&sig_reaped);

		atomic_store(&sig_closefd, open(path, O_RDONLY));
		memset(&sig_cb, 0, sizeof(sig_cb));
		sig_cb.aio_fildes = fd;
		sig_cb.aio_buf = buf;
		sig_cb.aio_nbytes = 64 << 10;
		sig_cb.aio_offset = (off_t)(i % 64) << 16;
		sig_cb.aio_sigevent.sigev_notify = SIGEV_SIGNAL;
		sig_cb.aio_sigevent.sigev_signo = SIGRTMIN;
		sig_cb.aio_sigevent.sigev_value.sival_ptr = &sig_cb;
		if (aio_write(&sig_cb))
			die("aio_write");
		/* The main thread allocates (sizes past the thread cache's reach, and those of
		 * the shim's notes, so the arena's lock is often held) and writes another KV file
		 * (the shim's locks held) while the write completes and the signal comes. */
		while (atomic_load(&sig_reaped) == before) {
			void *p[24];

			for (int k = 0; k < 24; k++)
				p[k] =
				    malloc(k < 12 ? 96 + (size_t)k * 16 : 2048 + (size_t)k * 512);
			for (int k = 0; k < 24; k++)
				free(p[k]);
			if (pwrite(other, buf, 4096, (off_t)(i % 16) << 12) != 4096)
				die("pwrite");
		}
		int left = atomic_exchange(&sig_closefd, -1);
		if (left >= 0)
			close(left);
	}
	close(fd);
	close(other);
	if (getenv("HARM3_TIMING")) /* for benchmarks.md: the rounds alone */
		fprintf(stderr, "sigaio: %.2f us a round\n", (now_s() - t0) * 1e6 / rounds);
	printf("sigaio: %d writes reaped in the handler, no deadlock\n", atomic_load(&sig_reaped));
	return 0;
}

/* ------------------------------------------------------------------ 2, 3: appends */

static int aio_one(int fd, void *buf, size_t n, off_t off, int lio)
{
	struct aiocb cb = {0}, *l[1] = {&cb};
	const struct aiocb *cl[1] = {&cb};

	cb.aio_fildes = fd;
	cb.aio_buf = buf;
	cb.aio_nbytes = n;
	cb.aio_offset = off;
	cb.aio_lio_opcode = LIO_WRITE;
	if (lio ? lio_listio(LIO_WAIT, l, 1, NULL) : aio_write(&cb))
		return -1;
	while (aio_error(&cb) == EINPROGRESS)
		aio_suspend(cl, 1, NULL);
	return (int)aio_return(&cb);
}

static long kaio_one(int fd, int op, void *buf, size_t n, off_t off)
{
	aio_context_t ctx = 0;
	struct io_event ev;
	struct iocb cb = {.aio_lio_opcode = (uint16_t)op,
			  .aio_fildes = (uint32_t)fd,
			  .aio_buf = (uint64_t)(uintptr_t)buf,
			  .aio_nbytes = n,
			  .aio_offset = off};
	struct iocb *p = &cb;

	if (syscall(SYS_io_setup, 4, &ctx) < 0 || syscall(SYS_io_submit, ctx, 1, &p) != 1 ||
	    syscall(SYS_io_getevents, ctx, 1, 1, &ev, NULL) != 1)
		die("kernel aio");
	syscall(SYS_io_destroy, ctx);
	return (long)ev.res;
}

static int cmd_appendoff(const char *path, const char *how)
{
	unsigned char *a = big(MIB), *b = big(MIB);
	int fd = opendst(path, O_APPEND);
	struct iovec v = {b, MIB};
	long r;

	fill(a, MIB, 21);
	fill(b, MIB, 22);
	if (write(fd, a, MIB) != MIB)
		die("write");
	if (!strcmp(how, "pwrite"))
		r = pwrite(fd, b, MIB, 0);
	else if (!strcmp(how, "pwritev"))
		r = pwritev(fd, &v, 1, 0);
	else if (!strcmp(how, "pwritev2"))
		r = pwritev2(fd, &v, 1, 0, 0);
	else if (!strcmp(how, "aio"))
		r = aio_one(fd, b, MIB, 0, 0);
	else if (!strcmp(how, "lio"))
		r = aio_one(fd, b, MIB, 0, 1);
	else if (!strcmp(how, "kaio"))
		r = kaio_one(fd, IOCB_CMD_PWRITE, b, MIB, 0);
	else
		return 2;
	printf("appendoff %s: %ld\n", how, r);
	close(fd);
	verify(path);
	return 0;
}

static int cmd_appendstream(const char *path, const char *how)
{
	unsigned char *a = big(MIB), *b = big(MIB);
	FILE *f = fopen(path, "w");

	fill(a, MIB, 31);
	fill(b, MIB, 32);
	if (!f || fwrite(a, 1, MIB, f) != MIB || fclose(f))
		die("save");
	if (!strcmp(how, "a+")) {
		f = fopen(path, "a+");
	} else {
		f = fopen(path, "a");
		if (f && fseek(f, 0, SEEK_SET))
			die("fseek");
	}
	if (!f)
		die("fopen");
	printf("appendstream %s: fwrite %zu\n", how, fwrite(b, 1, MIB, f));
	fclose(f);
	verify(path);
	return 0;
}

/* ------------------------------------------------------------------ 4: bad arrays */

static void say(const char *what, long r)
{
	printf("%s: %ld %s\n", what, r, r < 0 ? strerrorname_np(errno) : "");
}

static int cmd_badvec(const char *path)
{
	struct iovec *bad = unmapped();
	unsigned char *buf = big(MIB);
	int fd = opendst(path, O_DIRECT), p[2];

	fill(buf, MIB, 12);
	if (pipe(p) || write(fd, buf, MIB) != MIB)
		die(path);
	for (int round = 0; round < 2; round++) {
		int r = round ? p[0] : fd, w = round ? p[1] : fd;
		const char *on = round ? "pipe" : "file";
		char what[64];

#define BAD(name, call)                                                                            \
	do {                                                                                       \
		snprintf(what, sizeof(what), "%s %s", name, on);                                   \
		errno = 0;                                                                         \
		say(what, (long)(call));                                                           \
	} while (0)
		BAD("readv", readv(r, bad, 2));
		BAD("writev", writev(w, bad, 2));
		if (!round) {
			BAD("preadv", preadv(r, bad, 2, 0));
			BAD("pwritev", pwritev(w, bad, 2, 0));
			BAD("preadv2", preadv2(r, bad, 2, 0, 0));
			BAD("pwritev2", pwritev2(w, bad, 2, 0, 0));
			BAD("preadv2 at the position", preadv2(r, bad, 2, -1, 0));
		}
	}
	/* Kernel AIO, through libc's syscall(). */
	aio_context_t ctx = 0;
	if (syscall(SYS_io_setup, 4, &ctx) < 0)
		die("io_setup");
	errno = 0;
	say("io_submit unmapped array", syscall(SYS_io_submit, ctx, 1, (struct iocb **)bad));
	struct iocb *pbad = (struct iocb *)bad;
	errno = 0;
	say("io_submit unmapped iocb", syscall(SYS_io_submit, ctx, 1, &pbad));
	struct iocb wv = {.aio_lio_opcode = IOCB_CMD_PWRITEV,
			  .aio_fildes = (uint32_t)fd,
			  .aio_buf = (uint64_t)(uintptr_t)bad,
			  .aio_nbytes = 2,
			  .aio_offset = 0};
	struct iocb rv = wv, *pw = &wv, *pr = &rv;
	rv.aio_lio_opcode = IOCB_CMD_PREADV;
	struct io_event ev;
	struct timespec ts = {1, 0};
	long n = syscall(SYS_io_submit, ctx, 1, &pw);
	if (n == 1 && syscall(SYS_io_getevents, ctx, 1, 1, &ev, &ts) == 1)
		n = (long)ev.res;
	say("io_submit PWRITEV, unmapped iovecs", n);
	n = syscall(SYS_io_submit, ctx, 1, &pr);
	if (n == 1 && syscall(SYS_io_getevents, ctx, 1, 1, &ev, &ts) == 1)
		n = (long)ev.res;
	say("io_submit PREADV, unmapped iovecs", n);
	syscall(SYS_io_destroy, ctx);
	close(fd);
	return 0;
}

/* ------------------------------------------------------------------ 8: a long write */

static int cmd_bigwrite(const char *path)
{
	unsigned char *buf = big(MIB);
	int fd = opendst(path, 0);
	double t = now_s();

	fill(buf, MIB, 41);
	errno = 0;
	ssize_t r = write(fd, buf, (size_t)1 << 46);
	int e = errno;
	t = now_s() - t;
	errno = e;
	say("write of 1 << 46 bytes from a 1 MiB buffer", r);
	printf("within a second: %s\n", t < 1 ? "yes" : "no");
	if (getenv("HARM3_TIMING")) { /* for benchmarks.md: the call alone, first and again */
		double t2 = now_s();
		ssize_t r2 = write(fd, buf, (size_t)1 << 46);
		t2 = now_s() - t2;
		fprintf(stderr, "bigwrite: the write took %.1f us, again %.1f us (%zd)\n", t * 1e6,
			t2 * 1e6, r2);
	}
	close(fd);
	return 0;
}

/* ------------------------------------------------------------------ 12: errno */

static int cmd_errno(const char *path)
{
	unsigned char *buf = big(MIB);
	char to[PATH_MAX];
	int fd = opendst(path, 0);

#define KEEP(what, call)                                                                           \
	do {                                                                                       \
		errno = 4242;                                                                      \
		long r_ = (long)(call);                                                            \
		int e_ = errno;                                                                    \
		fprintf(stderr, "%s: %ld, errno %d\n", what, r_, e_);                              \
	} while (0)
	fill(buf, MIB, 51);
	KEEP("fwrite to stdout", fwrite("hello\n", 1, 6, stdout));
	KEEP("fflush stdout", fflush(stdout));
	KEEP("write", write(fd, buf, MIB));
	KEEP("pwrite", pwrite(fd, buf, 4096, 0));
	KEEP("fsync", fsync(fd));
	KEEP("fdatasync", fdatasync(fd));
	KEEP("ftruncate", ftruncate(fd, 2 * MIB));
	KEEP("close", close(fd));
	snprintf(to, sizeof(to), "%s.moved", path);
	KEEP("rename", rename(path, to));
	KEEP("rename back", rename(to, path));
	FILE *f = fopen(path, "r+");
	KEEP("fwrite", fwrite(buf, 1, MIB, f));
	KEEP("fclose", fclose(f));
	return 0;
}

/* ------------------------------------------------------------------ 9: changes in flight */

static long change_by(const char *path, int fd, const char *how, unsigned char *other)
{
	if (!strcmp(how, "fallocate"))
		return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 8192);
	if (!strcmp(how, "pwrite8k") || !strcmp(how, "pwrite8")) {
		/* 8 KiB at 0, or an 8-byte patch at 64 (issue 25 defect 6(a)'s header) */
		int o = open(path, O_RDWR);
		bool k = how[7] == 'k';
		long r = pwrite(o, other, k ? 8192 : 8, k ? 0 : 64);
		close(o);
		return r;
	}
	if (!strcmp(how, "copyrange") || !strcmp(how, "sendfile") || !strcmp(how, "splice")) {
		char src[PATH_MAX];
		snprintf(src, sizeof(src), "%s.src", path);
		int s = open(src, O_RDWR | O_CREAT | O_TRUNC, 0644), o = open(path, O_RDWR);
		long r = -1;
		if (s < 0 || o < 0 || write(s, other, 8192) != 8192)
			die("source");
		off_t in = 0, out = 0;
		if (!strcmp(how, "copyrange")) {
			r = copy_file_range(s, &in, o, &out, 8192, 0);
		} else if (!strcmp(how, "sendfile")) {
			r = sendfile(o, s, &in, 8192);
		} else {
			int p[2];
			if (pipe(p) || write(p[1], other, 8192) != 8192)
				die("pipe");
			r = splice(p[0], NULL, o, &out, 8192, 0);
			close(p[0]);
			close(p[1]);
		}
		close(s);
		close(o);
		unlink(src);
		return r;
	}
	if (!strcmp(how, "syscall")) { /* libc's syscall(), as programs without a wrapper call */
		int o = open(path, O_RDWR);
		long r = syscall(SYS_pwrite64, o, other, 8192, 0);
		close(o);
		return r;
	}
	if (!strcmp(how, "truncate")) /* down and up again: the same size, zeros past 4 KiB */
		return truncate(path, 4096) ? -1 : truncate(path, MIB);
#ifdef HARM3_URING
	if (!strcmp(how, "uring")) {
		struct io_uring ring;
		struct io_uring_cqe *cqe;
		int o = open(path, O_RDWR);
		if (o < 0 || io_uring_queue_init(4, &ring, 0))
			die("io_uring");
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
		io_uring_prep_write(sqe, o, other, 8192, 0);
		io_uring_submit(&ring);
		io_uring_wait_cqe(&ring, &cqe);
		long r = cqe->res;
		io_uring_cqe_seen(&ring, cqe);
		io_uring_queue_exit(&ring);
		close(o);
		return r;
	}
#endif
	errno = EINVAL;
	return -2;
}

static int cmd_change(const char *path, const char *how)
{
	unsigned char *a = big(MIB), *other = big(MIB);
	int fd = opendst(path, 0);
	long c;

	fill(a, MIB, 61);
	fill(other, MIB, 62);
	if (!strcmp(how, "kaio")) {
		/* Kernel AIO reaped late: the write is over in the kernel long before its event. */
		aio_context_t ctx = 0;
		struct io_event ev;
		struct iocb cb = {.aio_lio_opcode = IOCB_CMD_PWRITE,
				  .aio_fildes = (uint32_t)fd,
				  .aio_buf = (uint64_t)(uintptr_t)a,
				  .aio_nbytes = MIB},
			    *p = &cb;
		if (syscall(SYS_io_setup, 4, &ctx) < 0 || syscall(SYS_io_submit, ctx, 1, &p) != 1)
			die("kernel aio");
		usleep(200000);
		c = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 8192);
		long n = syscall(SYS_io_getevents, ctx, 1, 1, &ev, NULL);
		printf("change kaio: io_getevents %ld res %lld, fallocate %ld\n", n,
		       (long long)ev.res, c);
		syscall(SYS_io_destroy, ctx);
	} else {
		struct aiocb cb = {0};
		const struct aiocb *l[1] = {&cb};
		cb.aio_fildes = fd;
		cb.aio_buf = a;
		cb.aio_nbytes = MIB;
		if (aio_write(&cb))
			die("aio_write");
		/* Over by aio_suspend's word alone: the shim hears of it only at aio_return. */
		while (aio_suspend(l, 1, NULL) != 0)
			;
		c = change_by(path, fd, how, other);
		if (c == -2)
			return 2;
		printf("change %s: %ld, aio_return %zd\n", how, c, aio_return(&cb));
	}
	close(fd);
	verify(path);
	return 0;
}

/* ------------------------------------------------------------------ 10: stdio */

static char header[] = "HEADER";

static int cmd_stdio(const char *path, const char *how)
{
	unsigned char *a = big(MIB);
	int fd = opendst(path, 0);

	fill(a, MIB, 71);
	close(fd);
	FILE *f = fopen(path, "r+");
	if (!f)
		die("fopen");
	size_t n = fwrite(a, 1, MIB, f);
	fseek(f, 0, SEEK_SET);
	if (!strcmp(how, "fputc"))
		fputc('H', f);
	else if (!strcmp(how, "fprintf"))
		fprintf(f, "HEADER %d", 42);
	else if (!strcmp(how, "fwrite_unlocked"))
		fwrite_unlocked("HEADER", 1, 6, f);
	else if (!strcmp(how, "fputs"))
		fputs(header, f); /* not a constant: the compiler would make it an fwrite */
	else
		return 2;
	printf("stdio %s: fwrite %zu, fclose %d\n", how, n, fclose(f));
	verify(path);
	return 0;
}

/* ------------------------------------------------------------------ 11: shared mappings */

static int cmd_mapstore(const char *path)
{
	unsigned char *a = big(MIB);
	int fd = opendst(path, 0);

	fill(a, MIB, 81);
	if (pwrite(fd, a, MIB, 0) != MIB)
		die("pwrite");
	close(fd);
	if ((fd = open(path, O_RDWR)) < 0)
		die(path);
	unsigned char *m = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		die("mmap");
	m[0] = 'S';
	fill(a, MIB, 82);
	long r = pwrite(fd, a, MIB, 0);
	m[0] = 'T'; /* no fault, no new stamp */
	printf("mapstore: pwrite %ld\n", r);
	close(fd);
	verify(path);
	munmap(m, MIB);
	return 0;
}

/* ------------------------------------------------------------------ 6(b): an inode reborn */

static int cmd_reborn(const char *path)
{
	unsigned char *a = big(MIB);
	struct stat s1, s2;

	for (int tries = 0; tries < 20; tries++) {
		int fd = opendst(path, 0);

		fill(a, MIB, 91);
		if (write(fd, a, MIB) != MIB || fstat(fd, &s1))
			die("write");
		close(fd); /* published (this process never reads: it is not attached) */
		unlink(path);
		fd = opendst(path, 0);
		fill(a, MIB, 92 + (unsigned)tries);
		if (write(fd, a, MIB) != MIB || fstat(fd, &s2))
			die("write");
		close(fd);
		if (s1.st_ino == s2.st_ino && s1.st_mtim.tv_sec == s2.st_mtim.tv_sec &&
		    s1.st_mtim.tv_nsec == s2.st_mtim.tv_nsec &&
		    s1.st_ctim.tv_sec == s2.st_ctim.tv_sec &&
		    s1.st_ctim.tv_nsec == s2.st_ctim.tv_nsec) {
			printf("reborn: the same inode, size and stamps\n");
			verify(path);
			return 0;
		}
		unlink(path);
		usleep(100000);
	}
	printf("reborn: never the same identity (not a file system of whole-second stamps)\n");
	return 0;
}

/* ------------------------------------------------------------------ 7, also: held, killed */

static int cmd_hold(const char *path, int mib)
{
	unsigned char *a = big(MIB);
	int fd = opendst(path, 0);

	fill(a, MIB, 101);
	for (int i = 0; i < mib; i++)
		if (write(fd, a, MIB) != MIB)
			die("write");
	printf("holding\n");
	fflush(stdout);
	for (;;)
		pause();
	return 0;
}

static int cmd_aiokill(const char *path)
{
	unsigned char *a = big(MIB);
	int fd = opendst(path, 0);
	struct aiocb cb = {0};
	const struct aiocb *l[1] = {&cb};

	fill(a, MIB, 111);
	cb.aio_fildes = fd;
	cb.aio_buf = a;
	cb.aio_nbytes = MIB;
	if (aio_write(&cb))
		die("aio_write");
	while (aio_suspend(l, 1, NULL) != 0) /* over, and the shim not told: still in flight */
		;
	raise(SIGKILL);
	return 2;
}

/* ------------------------------------------------------------------ io_uring's probe */

/* N 1 MiB reads of FILE through a ring of 8 entries set up and entered through libc's
 * syscall() (fio's own ring code does so), with io_uring_setup of 2 entries refused by a
 * seccomp filter: the shim's probe of the kernel uses a ring of 2, and must fail without
 * blinding the thread to the rings it sets up or enters after. */
static int cmd_uringprobe(const char *path, int n)
{
	struct sock_filter f[] = {
	    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 3),
	    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 2, 0, 1),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {sizeof(f) / sizeof(f[0]), f};
	struct io_uring_params p;
	unsigned char *buf = big(MIB);
	int fd = open(path, O_RDONLY | O_DIRECT);

	if (fd < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
		die("seccomp");
	long res = 0;
	for (int i = 0; i < n; i++) {
		memset(&p, 0, sizeof(p));
		int r = (int)syscall(SYS_io_uring_setup, 8, &p);
		if (r < 0)
			die("io_uring_setup");
		size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
		size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
		size_t sqe_len = p.sq_entries * sizeof(struct io_uring_sqe);
		char *sq = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r,
				IORING_OFF_SQ_RING);
		char *cq = mmap(NULL, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r,
				IORING_OFF_CQ_RING);
		struct io_uring_sqe *sqe = mmap(NULL, sqe_len, PROT_READ | PROT_WRITE,
						MAP_SHARED | MAP_POPULATE, r, IORING_OFF_SQES);
		if (sq == MAP_FAILED || cq == MAP_FAILED || sqe == MAP_FAILED)
			die("mmap");
		unsigned *tail = (unsigned *)(sq + p.sq_off.tail);
		unsigned *array = (unsigned *)(sq + p.sq_off.array);
		memset(sqe, 0, sizeof(*sqe));
		sqe->opcode = IORING_OP_READ;
		sqe->fd = fd;
		sqe->addr = (uint64_t)(uintptr_t)buf;
		sqe->len = MIB;
		array[*tail & *(unsigned *)(sq + p.sq_off.ring_mask)] = 0;
		__atomic_store_n(tail, *tail + 1, __ATOMIC_RELEASE);
		if (syscall(SYS_io_uring_enter, r, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) != 1)
			die("io_uring_enter");
		unsigned head = __atomic_load_n((unsigned *)(cq + p.cq_off.head), __ATOMIC_ACQUIRE);
		res = ((struct io_uring_cqe
			    *)(cq + p.cq_off.cqes))[head & *(unsigned *)(cq + p.cq_off.ring_mask)]
			  .res;
		munmap(sq, sq_len);
		munmap(cq, cq_len);
		munmap(sqe, sqe_len);
		close(r);
	}
	printf("uringprobe: %d reads, the last %ld\n", n, res);
	return 0;
}

/* ------------------------------------------------------------------ vLLM's reader */

static int cmd_vread(const char *path, size_t block)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_DIRECT);

	if (fd < 0 || fstat(fd, &st))
		die(path);
	unsigned char *buf = big(block);
	size_t blocks = 0, deleted = 0;
	for (off_t off = 0; off < st.st_size; off += (off_t)block) {
		size_t want = (size_t)st.st_size - (size_t)off < block
				  ? (size_t)st.st_size - (size_t)off
				  : block;
		struct iovec v = {buf, block};
		ssize_t n = preadv(fd, &v, 1, off);

		blocks++;
		if (n != (ssize_t)want) {
			deleted++;
			fprintf(stderr, "vread: block at %lld: %zd of %zu (%s): would delete\n",
				(long long)off, n, want, n < 0 ? strerror(errno) : "short");
		}
	}
	close(fd);
	printf("vread: %zu blocks, %zu deleted\n", blocks, deleted);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "verify"))
		return verify(argv[2]), 0;
	if (argc == 4 && !strcmp(argv[1], "sigaio"))
		return cmd_sigaio(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "appendoff"))
		return cmd_appendoff(argv[2], argv[3]);
	if (argc == 4 && !strcmp(argv[1], "appendstream"))
		return cmd_appendstream(argv[2], argv[3]);
	if (argc == 3 && !strcmp(argv[1], "badvec"))
		return cmd_badvec(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "bigwrite"))
		return cmd_bigwrite(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "errno"))
		return cmd_errno(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "change"))
		return cmd_change(argv[2], argv[3]);
	if (argc == 4 && !strcmp(argv[1], "stdio"))
		return cmd_stdio(argv[2], argv[3]);
	if (argc == 3 && !strcmp(argv[1], "mapstore"))
		return cmd_mapstore(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "reborn"))
		return cmd_reborn(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "hold"))
		return cmd_hold(argv[2], atoi(argv[3]));
	if (argc == 3 && !strcmp(argv[1], "aiokill"))
		return cmd_aiokill(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "uringprobe"))
		return cmd_uringprobe(argv[2], atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "vread"))
		return cmd_vread(argv[2], (size_t)strtoull(argv[3], NULL, 0));
	fprintf(stderr, "usage: see the top of tests/harm3.c\n");
	return 2;
}
