/*
 * ring_reaper: kernel AIO reaped where the kernel puts it, as loaders with their own libaio do.
 *
 *   ring_reaper mk FILE SIZE            write SIZE bytes of a known pattern
 *   ring_reaper peek FILE BS DEPTH      O_DIRECT reads of the whole file, DEPTH in flight, each
 *                                       BS bytes, submitted through libc's syscall() and reaped
 *                                       by reading the completion ring in this process's memory
 *                                       (no system call), with IOCB_FLAG_RESFD on an eventfd
 *   ring_reaper again FILE BS N         one iocb prepared once and submitted N times as it is
 *                                       (the buffer cleared between), reaped from the ring
 *   ring_reaper libaio FILE BS DEPTH    the same through libaio's io_submit and
 *                                       io_getevents(ctx, 0, DEPTH, ev, {0, 0}) in a loop, built
 *                                       against a static libaio (runai-model-streamer's way:
 *                                       it peeks at the ring and makes no system call while it
 *                                       is empty)
 *
 * Every byte is checked against the pattern, every result against the file's size, every
 * event's aio_data and iocb address against what was submitted, and the eventfd's count
 * against the events.  A reaper that finds nothing for 30 s says "hang" and exits 3.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef RING_REAPER_LIBAIO
/* libaio's calls, with the kernel's types (libaio.h's own struct iocb is the same layout under
 * other names; an io_context_t is the context's address). */
typedef void *io_context_t;
int io_setup(int maxevents, io_context_t *ctxp);
int io_submit(io_context_t ctx, long nr, struct iocb **iocbs);
int io_getevents(io_context_t ctx, long min_nr, long nr, struct io_event *events,
		 struct timespec *timeout);
#endif

#define MAXDEPTH 256

static uint64_t pattern(uint64_t off)
{
	return (off * 0x9E3779B97F4A7C15ull) ^ 0x6b7673686d6b76ull;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A size with an optional K or M suffix. */
static uint64_t size_arg(const char *a)
{
	char *end;
	uint64_t v = strtoull(a, &end, 0);

	return *end == 'K' ? v << 10 : *end == 'M' ? v << 20 : v;
}

static int mk(const char *path, uint64_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	static uint64_t buf[1 << 16];

	if (fd < 0)
		return perror(path), 1;
	for (uint64_t off = 0; off < size;) {
		uint64_t n = size - off < sizeof(buf) ? size - off : sizeof(buf);

		for (uint64_t i = 0; i < (n + 7) / 8; i++)
			buf[i] = pattern(off + i * 8);
		if (write(fd, buf, n) != (ssize_t)n)
			return perror("write"), 1;
		off += n;
	}
	return close(fd) ? 1 : 0;
}

/* The kernel's completion ring at the context's address (fs/aio.c, struct aio_ring). */
struct ring {
	unsigned id, nr, head, tail, magic, compat_features, incompat_features, header_length;
	struct io_event ev[];
};

struct slot {
	struct iocb cb;
	uint64_t off;
	void *buf;
	int busy;
};

static struct slot slots[MAXDEPTH];
static uint64_t fsize, bs;
static int bad;

static void check(struct slot *s, const struct io_event *e)
{
	uint64_t want = fsize - s->off < bs ? fsize - s->off : bs;

	if (e->obj != (uint64_t)(uintptr_t)&s->cb || e->data != s->off) {
		fprintf(stderr, "event names iocb %#llx data %llu, want %p data %llu\n",
			(unsigned long long)e->obj, (unsigned long long)e->data, (void *)&s->cb,
			(unsigned long long)s->off);
		bad++;
		return;
	}
	if (e->res != (__s64)want) {
		fprintf(stderr, "read at %llu: res %lld, want %llu\n", (unsigned long long)s->off,
			(long long)e->res, (unsigned long long)want);
		bad++;
		return;
	}
	const uint64_t *w = s->buf;
	for (uint64_t i = 0; i < want / 8; i++) {
		if (w[i] != pattern(s->off + i * 8)) {
			fprintf(stderr, "read at %llu: wrong byte at +%llu\n",
				(unsigned long long)s->off, (unsigned long long)i * 8);
			bad++;
			return;
		}
	}
}

/* Reap one event from the ring, 30 s at most: 1, or 0 on a hang. */
static int reap_one(struct ring *ring, struct io_event *ev)
{
	double t0 = now_s();

	while (now_s() - t0 < 30) {
		unsigned head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);

		if (head != __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE)) {
			*ev = ring->ev[head];
			__atomic_store_n(&ring->head, (head + 1) % ring->nr, __ATOMIC_RELEASE);
			return 1;
		}
	}
	return 0;
}

/* One iocb, prepared once, submitted n times as it is. */
static int again(aio_context_t ctx, int fd, int n)
{
	struct slot *s = &slots[0];
	struct iocb *list[1] = {&s->cb};

	s->off = 0;
	s->cb.aio_lio_opcode = IOCB_CMD_PREAD;
	s->cb.aio_fildes = (uint32_t)fd;
	s->cb.aio_buf = (uint64_t)(uintptr_t)s->buf;
	s->cb.aio_nbytes = bs;
	s->cb.aio_offset = 0;
	s->cb.aio_data = 0;
	for (int i = 0; i < n; i++) {
		struct io_event ev;

		memset(s->buf, 0, bs);
		if (syscall(SYS_io_submit, ctx, 1, list) != 1)
			return fprintf(stderr, "io_submit: %s\n", strerror(errno)), 1;
		if (!reap_one((struct ring *)ctx, &ev))
			return fprintf(stderr, "hang: submission %d not reaped\n", i), 3;
		check(s, &ev);
		if (bad)
			return fprintf(stderr, "submission %d of the same iocb\n", i), 1;
	}
	printf("again: %d submissions of one iocb, right\n", n);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "mk"))
		return mk(argv[2], size_arg(argv[3]));
	if (argc != 5 ||
	    (strcmp(argv[1], "peek") && strcmp(argv[1], "libaio") && strcmp(argv[1], "again"))) {
		fprintf(stderr,
			"usage: ring_reaper mk FILE SIZE | peek|libaio|again FILE BS DEPTH\n");
		return 2;
	}
	bool use_libaio = !strcmp(argv[1], "libaio");
#ifndef RING_REAPER_LIBAIO
	if (use_libaio) {
		fprintf(stderr, "built without a static libaio\n");
		return 77;
	}
#endif
	const char *path = argv[2];
	bs = size_arg(argv[3]);
	int depth = atoi(argv[4]);
	struct stat st;
	int fd = open(path, O_RDONLY | O_DIRECT);

	if (fd < 0 || fstat(fd, &st))
		return perror(path), 2;
	if (depth < 1 || depth > MAXDEPTH || !bs || bs % 4096)
		return fprintf(stderr, "bad BS or DEPTH\n"), 2;
	fsize = (uint64_t)st.st_size;
	int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	aio_context_t ctx = 0;
#ifdef RING_REAPER_LIBAIO
	io_context_t lctx = 0;
	if (use_libaio) {
		int r = io_setup(depth, &lctx);
		if (r < 0)
			return fprintf(stderr, "io_setup: %s\n", strerror(-r)), 77;
		ctx = (aio_context_t)(uintptr_t)lctx;
	} else
#endif
	    if (syscall(SYS_io_setup, depth, &ctx))
		return fprintf(stderr, "io_setup: %s\n", strerror(errno)), 77;
	for (int i = 0; i < depth; i++)
		if (posix_memalign(&slots[i].buf, 4096, bs))
			return 2;

	struct ring *ring = (struct ring *)ctx;
	if (!strcmp(argv[1], "again"))
		return again(ctx, fd, depth);
	uint64_t next = 0, done = 0, nreads = (fsize + bs - 1) / bs, events = 0;
	double last = now_s();

	while (done < nreads) {
		/* Submit into every free slot, one io_submit for the lot. */
		struct iocb *list[MAXDEPTH];
		int n = 0;

		for (int i = 0; i < depth && next < nreads; i++) {
			struct slot *s = &slots[i];

			if (s->busy)
				continue;
			s->off = next++ * bs;
			memset(&s->cb, 0, sizeof(s->cb));
			s->cb.aio_lio_opcode = IOCB_CMD_PREAD;
			s->cb.aio_fildes = (uint32_t)fd;
			s->cb.aio_buf = (uint64_t)(uintptr_t)s->buf;
			s->cb.aio_nbytes = bs;
			s->cb.aio_offset = (int64_t)s->off;
			s->cb.aio_data = s->off;
			if (!use_libaio && efd >= 0) {
				s->cb.aio_flags = IOCB_FLAG_RESFD;
				s->cb.aio_resfd = (uint32_t)efd;
			}
			s->busy = 1;
			list[n++] = &s->cb;
		}
		if (n) {
			long r;
#ifdef RING_REAPER_LIBAIO
			if (use_libaio)
				r = io_submit(lctx, n, list);
			else
#endif
				r = syscall(SYS_io_submit, ctx, n, list) < 0 ? -errno : n;
			if (r != n) {
				fprintf(stderr, "io_submit: %ld of %d\n", r, n);
				return 1;
			}
		}
		/* Reap without waiting, where the kernel puts the events. */
		struct io_event ev[MAXDEPTH];
		long got = 0;
#ifdef RING_REAPER_LIBAIO
		if (use_libaio) {
			struct timespec zero = {0, 0};
			got = io_getevents(lctx, 0, depth, ev, &zero);
			if (got < 0)
				return fprintf(stderr, "io_getevents: %s\n", strerror((int)-got)),
				       1;
		} else
#endif
		{
			unsigned head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
			unsigned tail = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);

			while (head != tail && got < MAXDEPTH) {
				ev[got++] = ring->ev[head];
				head = (head + 1) % ring->nr;
			}
			__atomic_store_n(&ring->head, head, __ATOMIC_RELEASE);
		}
		for (long k = 0; k < got; k++) {
			struct slot *s = (struct slot *)(uintptr_t)ev[k].obj;

			if (s < slots || s >= slots + depth || !s->busy) {
				fprintf(stderr, "event for an unknown iocb %#llx\n",
					(unsigned long long)ev[k].obj);
				return 1;
			}
			check(s, &ev[k]);
			s->busy = 0;
			done++;
			events++;
		}
		if (got) {
			last = now_s();
		} else if (now_s() - last > 30) {
			fprintf(stderr,
				"hang: %llu of %llu reads reaped, nothing for 30 s (ring head %u "
				"tail %u)\n",
				(unsigned long long)done, (unsigned long long)nreads, ring->head,
				ring->tail);
			return 3;
		}
	}
	uint64_t count = 0;
	if (!use_libaio && efd >= 0 && read(efd, &count, sizeof(count)) != sizeof(count))
		count = 0;
	if (!use_libaio && efd >= 0 && count != events) {
		fprintf(stderr, "eventfd counted %llu, %llu events\n", (unsigned long long)count,
			(unsigned long long)events);
		bad++;
	}
	if (bad)
		return 1;
	printf("%s: %llu reads, %llu bytes, right\n", argv[1], (unsigned long long)done,
	       (unsigned long long)fsize);
	return 0;
}
