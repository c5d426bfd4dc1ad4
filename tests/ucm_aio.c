/*
 * ucm_aio: reads files the way UCM's AIO engine does (raw syscall io_setup/io_submit/
 * io_getevents, O_DIRECT, IOCB_FLAG_RESFD completions on an eventfd watched by epoll) and
 * checks every byte against a buffered read of the same file.  Exit 0 when all is right,
 * 1 on a wrong byte or a broken rule, 77 when the kernel has no AIO.
 *
 *   ucm_aio read BS FILE...       iodepth 16, blocks of BS bytes; prints "FILE HASH" lines
 *   ucm_aio mixed BS F1 F2        one io_submit of 8 iocbs alternating F1 and F2
 *   ucm_aio cancel BS FILE        io_cancel every iocb in flight, then reap them all
 *   ucm_aio destroy BS FILE       io_destroy with 16 reads in flight, then a new context
 *   ucm_aio loop BS SECS FILE     read FILE over and over for SECS seconds (to be killed)
 *   ucm_aio bench BS ROUNDS FILE  µs per served io_submit+io_getevents vs pread, medians
 */

#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 16

static int fails;
#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "ucm_aio: " __VA_ARGS__);                                  \
			fputc('\n', stderr);                                                       \
			fails++;                                                                   \
		}                                                                                  \
	} while (0)

static long io_setup_(unsigned n, aio_context_t *ctx)
{
	return syscall(SYS_io_setup, n, ctx);
}
static long io_submit_(aio_context_t ctx, long n, struct iocb **p)
{
	return syscall(SYS_io_submit, ctx, n, p);
}
static long io_getevents_(aio_context_t ctx, long mn, long n, struct io_event *e,
			  struct timespec *ts)
{
	return syscall(SYS_io_getevents, ctx, mn, n, e, ts);
}

struct engine {
	aio_context_t ctx;
	int efd, ep;
};

static void engine_open(struct engine *e)
{
	struct epoll_event ev = {.events = EPOLLIN};

	e->ctx = 0;
	if (io_setup_(DEPTH * 2, &e->ctx)) {
		perror("io_setup");
		exit(errno == ENOSYS ? 77 : 1);
	}
	e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	e->ep = epoll_create1(EPOLL_CLOEXEC);
	if (e->efd < 0 || e->ep < 0 || epoll_ctl(e->ep, EPOLL_CTL_ADD, e->efd, &ev)) {
		perror("eventfd/epoll");
		exit(1);
	}
}

static void engine_close(struct engine *e)
{
	CHECK(syscall(SYS_io_destroy, e->ctx) == 0, "io_destroy: %s", strerror(errno));
	close(e->efd);
	close(e->ep);
}

/* Wait for the eventfd, then reap what is there without waiting (UCM's loop).  Returns the
 * events reaped into ev (at most room); counts the eventfd's tokens into *tokens. */
static long reap(struct engine *e, struct io_event *ev, long room, uint64_t *tokens)
{
	struct epoll_event pe;
	struct timespec zero = {0, 0};
	uint64_t cnt;
	long n;

	for (;;) {
		n = io_getevents_(e->ctx, 0, room, ev, &zero);
		if (n < 0) {
			perror("io_getevents");
			exit(1);
		}
		if (n > 0)
			return n;
		if (epoll_wait(e->ep, &pe, 1, 5000) == 0) {
			fprintf(stderr, "ucm_aio: no completion in 5 s\n");
			exit(1);
		}
		if (read(e->efd, &cnt, sizeof(cnt)) == sizeof(cnt))
			*tokens += cnt;
	}
}

static void *abuf(size_t n)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, n ? n : 4096)) {
		perror("posix_memalign");
		exit(1);
	}
	return p;
}

static void prep(struct iocb *cb, int fd, void *buf, size_t n, off_t off, int efd, uint64_t data)
{
	memset(cb, 0, sizeof(*cb));
	cb->aio_lio_opcode = IOCB_CMD_PREAD;
	cb->aio_fildes = (uint32_t)fd;
	cb->aio_buf = (uint64_t)(uintptr_t)buf;
	cb->aio_nbytes = n;
	cb->aio_offset = off;
	cb->aio_data = data;
	if (efd >= 0) {
		cb->aio_flags = IOCB_FLAG_RESFD;
		cb->aio_resfd = (uint32_t)efd;
	}
}

/* The file's bytes, read without O_DIRECT (the shim leaves buffered reads alone). */
static char *whole(const char *path, size_t *size)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	char *b;
	size_t got = 0;

	if (fd < 0 || fstat(fd, &st)) {
		perror(path);
		exit(1);
	}
	*size = (size_t)st.st_size;
	b = malloc(*size + 1);
	while (got < *size) {
		ssize_t n = pread(fd, b + got, *size - got, (off_t)got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	return b;
}

static uint64_t fnv(const char *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
	return h;
}

/* Read path whole with DEPTH reads of bs in flight; check each block and the token count. */
static void read_file(struct engine *e, const char *path, size_t bs, bool print)
{
	size_t size;
	char *want = whole(path, &size);
	int fd = open(path, O_RDONLY | O_DIRECT);
	char *bufs[DEPTH];
	struct iocb cbs[DEPTH], *p[1];
	struct io_event ev[DEPTH];
	uint64_t tokens = 0, events = 0, next = 0, inflight = 0;
	off_t off_of[DEPTH];

	if (fd < 0) {
		perror(path);
		exit(1);
	}
	for (int i = 0; i < DEPTH; i++)
		bufs[i] = abuf(bs);
	for (int i = 0; i < DEPTH && next < size; i++, next += bs) {
		off_of[i] = (off_t)next;
		prep(&cbs[i], fd, bufs[i], bs, (off_t)next, e->efd, (uint64_t)i);
		p[0] = &cbs[i];
		CHECK(io_submit_(e->ctx, 1, p) == 1, "io_submit: %s", strerror(errno));
		inflight++;
	}
	while (inflight) {
		long n = reap(e, ev, DEPTH, &tokens);

		for (long k = 0; k < n; k++) {
			int i = (int)ev[k].data;
			size_t off = (size_t)off_of[i], len = size - off < bs ? size - off : bs;

			CHECK(ev[k].obj == (uint64_t)(uintptr_t)&cbs[i], "event obj wrong");
			CHECK(ev[k].res == (int64_t)len, "%s at %zu: res %lld, want %zu", path, off,
			      (long long)ev[k].res, len);
			CHECK(ev[k].res2 == 0, "res2 %lld", (long long)ev[k].res2);
			CHECK(ev[k].res < 0 || memcmp(bufs[i], want + off, len) == 0,
			      "%s at %zu: wrong bytes", path, off);
			events++;
			inflight--;
			if (next < size) {
				off_of[i] = (off_t)next;
				prep(&cbs[i], fd, bufs[i], bs, (off_t)next, e->efd, (uint64_t)i);
				p[0] = &cbs[i];
				CHECK(io_submit_(e->ctx, 1, p) == 1, "io_submit: %s",
				      strerror(errno));
				next += bs;
				inflight++;
			}
		}
	}
	/* Every completion wrote exactly one token; collect the ones not read yet. */
	uint64_t cnt;
	if (read(e->efd, &cnt, sizeof(cnt)) == sizeof(cnt))
		tokens += cnt;
	CHECK(tokens == events, "%s: %llu eventfd tokens for %llu events", path,
	      (unsigned long long)tokens, (unsigned long long)events);
	if (print)
		printf("%s %016llx\n", path, (unsigned long long)fnv(want, size));
	for (int i = 0; i < DEPTH; i++)
		free(bufs[i]);
	free(want);
	close(fd);
}

/* One submit of 8 iocbs alternating f1 (served) and f2 (the kernel's). */
static void mixed(struct engine *e, size_t bs, const char *f1, const char *f2)
{
	size_t s1, s2;
	char *w1 = whole(f1, &s1), *w2 = whole(f2, &s2);
	int fd1 = open(f1, O_RDONLY | O_DIRECT), fd2 = open(f2, O_RDONLY | O_DIRECT);
	struct iocb cbs[8], *p[8];
	struct io_event ev[8];
	char *bufs[8];
	uint64_t tokens = 0, seen = 0;
	long got = 0;

	for (int i = 0; i < 8; i++) {
		bufs[i] = abuf(bs);
		prep(&cbs[i], i % 2 ? fd2 : fd1, bufs[i], bs, (off_t)((size_t)(i / 2) * bs), e->efd,
		     (uint64_t)i);
		p[i] = &cbs[i];
	}
	CHECK(io_submit_(e->ctx, 8, p) == 8, "mixed io_submit: %s", strerror(errno));
	while (got < 8) {
		long n = reap(e, ev + got, 8 - got, &tokens);
		got += n;
	}
	for (int k = 0; k < 8; k++) {
		int i = (int)ev[k].data;
		const char *w = i % 2 ? w2 : w1;
		size_t size = i % 2 ? s2 : s1, off = (size_t)(i / 2) * bs;
		size_t len = off >= size ? 0 : size - off < bs ? size - off : bs;

		CHECK(!(seen & (1u << i)), "mixed: event %d twice", i);
		seen |= 1u << i;
		CHECK(ev[k].obj == (uint64_t)(uintptr_t)&cbs[i], "mixed: obj wrong");
		CHECK(ev[k].res == (int64_t)len && memcmp(bufs[i], w + off, len) == 0,
		      "mixed: iocb %d res %lld wrong", i, (long long)ev[k].res);
	}
	struct timespec zero = {0, 0};
	CHECK(io_getevents_(e->ctx, 0, 8, ev, &zero) == 0, "mixed: an event too many");
	uint64_t cnt;
	if (read(e->efd, &cnt, sizeof(cnt)) == sizeof(cnt))
		tokens += cnt;
	CHECK(tokens == 8, "mixed: %llu tokens for 8 events", (unsigned long long)tokens);
	for (int i = 0; i < 8; i++)
		free(bufs[i]);
	free(w1);
	free(w2);
	close(fd1);
	close(fd2);
}

/* Submit DEPTH reads; then cancel (every answer must leave the read to complete, or be
 * EINPROGRESS/0) and reap them all, or destroy the context with them in flight. */
static void in_flight(struct engine *e, size_t bs, const char *path, bool destroy)
{
	size_t size;
	char *want = whole(path, &size);
	int fd = open(path, O_RDONLY | O_DIRECT);
	struct iocb cbs[DEPTH], *p[DEPTH];
	struct io_event ev[DEPTH], res;
	char *bufs[DEPTH];
	int n = 0;

	for (int i = 0; i < DEPTH && (size_t)i * bs < size; i++, n++) {
		bufs[i] = abuf(bs);
		prep(&cbs[i], fd, bufs[i], bs, (off_t)((size_t)i * bs), -1, (uint64_t)i);
		p[i] = &cbs[i];
	}
	CHECK(io_submit_(e->ctx, n, p) == n, "io_submit: %s", strerror(errno));
	if (destroy) {
		CHECK(syscall(SYS_io_destroy, e->ctx) == 0, "io_destroy in flight: %s",
		      strerror(errno));
		engine_open(e); /* the next context works */
		read_file(e, path, bs, false);
	} else {
		int cancelled = 0;

		for (int i = 0; i < n; i++) {
			long r = syscall(SYS_io_cancel, e->ctx, &cbs[i], &res);
			CHECK(r == 0 || errno == EAGAIN || errno == EINVAL || errno == EINPROGRESS,
			      "io_cancel: %s", strerror(errno));
			cancelled += r == 0;
		}
		int got = 0;
		struct timespec ts = {5, 0};
		while (got < n - cancelled) {
			long k = io_getevents_(e->ctx, 1, DEPTH, ev, &ts);
			CHECK(k > 0, "io_getevents after cancel: %ld %s", k, strerror(errno));
			if (k <= 0)
				break;
			for (long j = 0; j < k; j++) {
				int i = (int)ev[j].data;
				size_t off = (size_t)i * bs,
				       len = size - off < bs ? size - off : bs;
				CHECK(ev[j].res == (int64_t)len &&
					  !memcmp(bufs[i], want + off, len),
				      "cancelled read %d: res %lld", i, (long long)ev[j].res);
			}
			got += (int)k;
		}
	}
	for (int i = 0; i < n; i++)
		free(bufs[i]);
	free(want);
	close(fd);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Alternating rounds: iters served io_submit+io_getevents(min 1) of bs at offset 0, then as
 * many preads; median µs per call of each. */
static void bench(struct engine *e, size_t bs, int rounds, const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECT), iters = 200;
	char *buf = abuf(bs);
	double *ta = calloc((size_t)rounds, sizeof(double)), *tp = calloc((size_t)rounds, 8);
	struct iocb cb, *p[1] = {&cb};
	struct io_event ev;

	for (int w = 0; w < 20; w++) /* warm: the cache holds the block */
		CHECK(pread(fd, buf, bs, 0) == (ssize_t)bs, "pread");
	for (int r = 0; r < rounds; r++) {
		double t0 = now_us();
		for (int i = 0; i < iters; i++) {
			prep(&cb, fd, buf, bs, 0, -1, 1);
			if (io_submit_(e->ctx, 1, p) != 1 ||
			    io_getevents_(e->ctx, 1, 1, &ev, NULL) != 1 || ev.res != (int64_t)bs) {
				CHECK(0, "bench aio failed");
				return;
			}
		}
		double t1 = now_us();
		for (int i = 0; i < iters; i++)
			if (pread(fd, buf, bs, 0) != (ssize_t)bs) {
				CHECK(0, "bench pread failed");
				return;
			}
		double t2 = now_us();
		ta[r] = (t1 - t0) / iters;
		tp[r] = (t2 - t1) / iters;
	}
	qsort(ta, (size_t)rounds, sizeof(double), cmpd);
	qsort(tp, (size_t)rounds, sizeof(double), cmpd);
	printf("bench: bs %zu: io_submit+io_getevents %.1f us, pread %.1f us, difference %.1f us "
	       "(medians of %d rounds of %d)\n",
	       bs, ta[rounds / 2], tp[rounds / 2], ta[rounds / 2] - tp[rounds / 2], rounds, iters);
	free(ta);
	free(tp);
	free(buf);
	close(fd);
}

int main(int argc, char **argv)
{
	struct engine e;

	if (argc < 4) {
		fprintf(stderr, "usage: see the top of ucm_aio.c\n");
		return 2;
	}
	char *end;
	size_t bs = strtoull(argv[2], &end, 0);
	if (*end == 'K' || *end == 'k')
		bs <<= 10;
	else if (*end == 'M' || *end == 'm')
		bs <<= 20;
	engine_open(&e);
	if (!strcmp(argv[1], "read")) {
		for (int i = 3; i < argc; i++)
			read_file(&e, argv[i], bs, true);
	} else if (!strcmp(argv[1], "mixed") && argc == 5) {
		mixed(&e, bs, argv[3], argv[4]);
	} else if (!strcmp(argv[1], "cancel")) {
		in_flight(&e, bs, argv[3], false);
	} else if (!strcmp(argv[1], "destroy")) {
		in_flight(&e, bs, argv[3], true);
	} else if (!strcmp(argv[1], "loop") && argc == 5) {
		double stop = now_us() + atof(argv[3]) * 1e6;
		while (now_us() < stop && !fails)
			read_file(&e, argv[4], bs, false);
	} else if (!strcmp(argv[1], "bench") && argc == 5) {
		bench(&e, bs, atoi(argv[3]), argv[4]);
	} else {
		fprintf(stderr, "usage: see the top of ucm_aio.c\n");
		return 2;
	}
	engine_close(&e);
	return fails ? 1 : 0;
}
