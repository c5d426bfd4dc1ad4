/*
 * aio_reader: glibc POSIX aio on a KV file and a file outside the roots, every way the shim
 * serves it: aio_read with aio_suspend/aio_error/aio_return, lio_listio LIO_WAIT over a mix of
 * both files (and a LIO_NOP), SIGEV_SIGNAL and SIGEV_THREAD notifications, lio_listio
 * LIO_NOWAIT with a list-wide signal, aio_cancel of a finished read.  It checks what glibc
 * promises (results, si_code, si_value, that aio_error is final when notified) and prints a
 * digest of each part's bytes, so that tests/aio_test.sh can compare a run under LD_PRELOAD
 * with one without the shim.  Exit 0: every check held; 1: one failed (on stderr).
 *
 *   kvshim-aio-reader KVFILE OTHERFILE     (both at least 4 MiB; O_DIRECT)
 *   kvshim-aio-reader bench KVFILE         (µs per 1 MiB aio_read vs pread, medians)
 */
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB   (1 << 20)
#define DEPTH 4

static int failed;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "aio_reader: %s:%d: ", __FILE__, __LINE__);                \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			failed = 1;                                                                \
		}                                                                                  \
	} while (0)

static uint64_t digest(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 1099511628211ull;
	return h;
}

static void *abuf(size_t n)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, n)) {
		perror("posix_memalign");
		exit(2);
	}
	memset(p, 0xa5, n);
	return p;
}

static void setup_cb(struct aiocb *cb, int fd, void *buf, size_t n, off_t off)
{
	memset(cb, 0, sizeof(*cb));
	cb->aio_fildes = fd;
	cb->aio_buf = buf;
	cb->aio_nbytes = n;
	cb->aio_offset = off;
	cb->aio_sigevent.sigev_notify = SIGEV_NONE;
}

/* Wait for cb with aio_suspend, then take its result. */
static ssize_t finish(struct aiocb *cb)
{
	const struct aiocb *l[1] = {cb};
	struct timespec ts = {10, 0};

	while (aio_error(cb) == EINPROGRESS)
		if (aio_suspend(l, 1, &ts) != 0 && errno != EINTR) {
			CHECK(0, "aio_suspend: %s", strerror(errno));
			return -1;
		}
	CHECK(aio_error(cb) == 0, "aio_error %d", aio_error(cb));
	return aio_return(cb);
}

/* Part 1: the whole KV file, DEPTH reads in flight, waiting on any with aio_suspend. */
static uint64_t part_read(int fd, off_t size)
{
	struct aiocb cb[DEPTH];
	const struct aiocb *list[DEPTH];
	char *buf[DEPTH];
	uint64_t h = 1469598103934665603ull;
	off_t next = 0, at[DEPTH];
	int busy = 0;

	for (int i = 0; i < DEPTH; i++) {
		buf[i] = abuf(MIB);
		list[i] = NULL;
	}
	/* In order: submit DEPTH, then retire the oldest and submit the next into its slot. */
	for (int i = 0; i < DEPTH && next < size; i++, next += MIB) {
		setup_cb(&cb[i], fd, buf[i], MIB, next);
		at[i] = next;
		CHECK(aio_read(&cb[i]) == 0, "aio_read: %s", strerror(errno));
		list[i] = &cb[i];
		busy++;
	}
	for (int k = 0; busy; k = (k + 1) % DEPTH) {
		if (!list[k])
			continue;
		struct timespec ts = {10, 0};
		/* Any of them: exercises aio_suspend over a list, then waits for this one. */
		CHECK(aio_suspend(list, DEPTH, &ts) == 0, "aio_suspend: %s", strerror(errno));
		ssize_t n = finish(&cb[k]);
		CHECK(n == (size - at[k] < MIB ? size - at[k] : MIB), "aio_return %zd at %lld", n,
		      (long long)at[k]);
		if (n > 0)
			h = digest(h, buf[k], (size_t)n);
		list[k] = NULL;
		busy--;
		if (next < size) {
			setup_cb(&cb[k], fd, buf[k], MIB, next);
			at[k] = next;
			CHECK(aio_read(&cb[k]) == 0, "aio_read: %s", strerror(errno));
			list[k] = &cb[k];
			busy++;
			next += MIB;
		}
	}
	for (int i = 0; i < DEPTH; i++)
		free(buf[i]);
	return h;
}

/* Part 2: lio_listio LIO_WAIT over KV, other, NOP, KV. */
static uint64_t part_lio_wait(int kv, int other)
{
	struct aiocb cb[4];
	struct aiocb *list[4] = {&cb[0], &cb[1], &cb[2], &cb[3]};
	char *buf = abuf(4 * MIB);
	uint64_t h = 1469598103934665603ull;

	setup_cb(&cb[0], kv, buf, MIB, 2 * MIB);
	setup_cb(&cb[1], other, buf + MIB, MIB, MIB);
	setup_cb(&cb[2], kv, buf + 2 * MIB, MIB, 0);
	setup_cb(&cb[3], kv, buf + 3 * MIB, MIB, 3 * MIB);
	cb[0].aio_lio_opcode = LIO_READ;
	cb[1].aio_lio_opcode = LIO_READ;
	cb[2].aio_lio_opcode = LIO_NOP;
	cb[3].aio_lio_opcode = LIO_READ;
	CHECK(lio_listio(LIO_WAIT, list, 4, NULL) == 0, "lio_listio: %s", strerror(errno));
	for (int i = 0; i < 4; i++) {
		if (i == 2)
			continue;
		CHECK(aio_error(&cb[i]) == 0, "lio entry %d: aio_error %d", i, aio_error(&cb[i]));
		CHECK(aio_return(&cb[i]) == MIB, "lio entry %d: short", i);
	}
	h = digest(h, buf, MIB);
	h = digest(h, buf + MIB, MIB);
	h = digest(h, buf + 3 * MIB, MIB);
	free(buf);
	return h;
}

static atomic_int note_ok, note_calls;
static sem_t note_sem;
static struct aiocb note_cb;

static void on_note(union sigval v)
{
	/* The result is published before the notification. */
	atomic_store(&note_ok, v.sival_ptr == &note_cb && aio_error(&note_cb) == 0);
	atomic_fetch_add(&note_calls, 1);
	sem_post(&note_sem);
}

static int wait_sig(int sig, siginfo_t *si)
{
	sigset_t s;
	struct timespec ts = {10, 0};

	sigemptyset(&s);
	sigaddset(&s, sig);
	return sigtimedwait(&s, si, &ts);
}

/* Part 3: SIGEV_SIGNAL (si_code SI_ASYNCIO, the value, the pid), SIGEV_THREAD, and
 * lio_listio LIO_NOWAIT signalling once when its KV and other entries are all over. */
static uint64_t part_notify(int kv, int other)
{
	int sig = SIGRTMIN + 1;
	struct aiocb cb, lcb[3];
	struct aiocb *list[3] = {&lcb[0], &lcb[1], &lcb[2]};
	struct sigevent lsig;
	char *buf = abuf(4 * MIB);
	uint64_t h = 1469598103934665603ull;
	siginfo_t si;
	sigset_t s;

	sigemptyset(&s);
	sigaddset(&s, sig);
	pthread_sigmask(SIG_BLOCK, &s, NULL);

	setup_cb(&cb, kv, buf, MIB, MIB);
	cb.aio_sigevent.sigev_notify = SIGEV_SIGNAL;
	cb.aio_sigevent.sigev_signo = sig;
	cb.aio_sigevent.sigev_value.sival_int = 4242;
	CHECK(aio_read(&cb) == 0, "aio_read: %s", strerror(errno));
	CHECK(wait_sig(sig, &si) == sig, "no SIGEV_SIGNAL");
	CHECK(si.si_code == SI_ASYNCIO, "si_code %d", si.si_code);
	CHECK(si.si_value.sival_int == 4242, "si_value %d", si.si_value.sival_int);
	CHECK(si.si_pid == getpid(), "si_pid %d", (int)si.si_pid);
	CHECK(aio_error(&cb) == 0 && aio_return(&cb) == MIB, "signalled before done");
	h = digest(h, buf, MIB);

	sem_init(&note_sem, 0, 0);
	setup_cb(&note_cb, kv, buf, MIB, 3 * MIB);
	note_cb.aio_sigevent.sigev_notify = SIGEV_THREAD;
	note_cb.aio_sigevent.sigev_notify_function = on_note;
	note_cb.aio_sigevent.sigev_value.sival_ptr = &note_cb;
	CHECK(aio_read(&note_cb) == 0, "aio_read: %s", strerror(errno));
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 10;
	CHECK(sem_timedwait(&note_sem, &dl) == 0, "no SIGEV_THREAD");
	CHECK(atomic_load(&note_ok), "SIGEV_THREAD: wrong value or not done when notified");
	CHECK(aio_return(&note_cb) == MIB, "SIGEV_THREAD: aio_return");
	h = digest(h, buf, MIB);

	setup_cb(&lcb[0], kv, buf, MIB, 0);
	setup_cb(&lcb[1], other, buf + MIB, MIB, 0);
	setup_cb(&lcb[2], kv, buf + 2 * MIB, MIB, 2 * MIB);
	for (int i = 0; i < 3; i++)
		lcb[i].aio_lio_opcode = LIO_READ;
	memset(&lsig, 0, sizeof(lsig));
	lsig.sigev_notify = SIGEV_SIGNAL;
	lsig.sigev_signo = sig;
	lsig.sigev_value.sival_int = 77;
	CHECK(lio_listio(LIO_NOWAIT, list, 3, &lsig) == 0, "lio_listio: %s", strerror(errno));
	CHECK(wait_sig(sig, &si) == sig, "no list-wide signal");
	CHECK(si.si_value.sival_int == 77, "list signal value %d", si.si_value.sival_int);
	for (int i = 0; i < 3; i++) {
		CHECK(aio_error(&lcb[i]) == 0, "NOWAIT entry %d not done when signalled", i);
		CHECK(aio_return(&lcb[i]) == MIB, "NOWAIT entry %d: short", i);
		/* Finished, served or not: glibc's answer. */
		CHECK(aio_cancel(lcb[i].aio_fildes, &lcb[i]) == AIO_ALLDONE, "cancel entry %d", i);
	}
	h = digest(h, buf, 3 * MIB);
	/* Nothing more may arrive: one signal per list, none per entry without a sigevent. */
	struct timespec z = {0, 50000000};
	CHECK(sigtimedwait(&s, &si, &z) == -1, "an extra signal");

	/* The list's real part ends last (a pipe that gets its byte 100 ms after the KV entry is
	 * done), while no thread waits for the signal: it must stay pending for the threads that
	 * take it (here only sigtimedwait, later), as glibc's own does, sent from its helper
	 * thread with every signal blocked, never to a thread that would die of it. */
	int p[2];
	char c = 0;
	CHECK(pipe(p) == 0, "pipe: %s", strerror(errno));
	setup_cb(&lcb[0], kv, buf, MIB, MIB);
	setup_cb(&lcb[1], p[0], &c, 1, 0);
	lcb[0].aio_lio_opcode = lcb[1].aio_lio_opcode = LIO_READ;
	lsig.sigev_value.sival_int = 99;
	CHECK(lio_listio(LIO_NOWAIT, list, 2, &lsig) == 0, "lio_listio: %s", strerror(errno));
	usleep(100000);
	CHECK(write(p[1], "x", 1) == 1, "pipe write: %s", strerror(errno));
	usleep(200000); /* the signal comes while no thread waits for it: it stays pending */
	CHECK(wait_sig(sig, &si) == sig, "no list-wide signal (real part last)");
	CHECK(si.si_value.sival_int == 99, "list signal value %d", si.si_value.sival_int);
	CHECK(aio_return(&lcb[0]) == MIB && aio_return(&lcb[1]) == 1 && c == 'x',
	      "real part last: entries not done when signalled");
	h = digest(h, buf, MIB);
	close(p[0]);
	close(p[1]);
	free(buf);
	return h;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* 1 MiB at offset 0, a cache hit both ways: aio_read + aio_suspend + aio_return against
 * pread, in 21 alternating rounds of 200; the medians of the per-round means. */
static int bench(const char *path)
{
	enum { ROUNDS = 21, CALLS = 200 };
	int fd = open(path, O_RDONLY | O_DIRECT);
	char *buf = abuf(MIB);
	double a[ROUNDS], p[ROUNDS];
	struct aiocb cb;

	if (fd < 0) {
		perror(path);
		return 2;
	}
	CHECK(pread(fd, buf, MIB, 0) == MIB, "warm-up pread");
	for (int r = 0; r < ROUNDS; r++) {
		double t = now_us();
		for (int i = 0; i < CALLS; i++) {
			setup_cb(&cb, fd, buf, MIB, 0);
			CHECK(aio_read(&cb) == 0, "aio_read");
			CHECK(finish(&cb) == MIB, "aio_return");
		}
		a[r] = (now_us() - t) / CALLS;
		t = now_us();
		for (int i = 0; i < CALLS; i++)
			CHECK(pread(fd, buf, MIB, 0) == MIB, "pread");
		p[r] = (now_us() - t) / CALLS;
	}
	qsort(a, ROUNDS, sizeof(a[0]), cmp);
	qsort(p, ROUNDS, sizeof(p[0]), cmp);
	printf("aio_read %.1f us pread %.1f us (1 MiB, medians of %d rounds)\n", a[ROUNDS / 2],
	       p[ROUNDS / 2], ROUNDS);
	close(fd);
	free(buf);
	return failed;
}

int main(int argc, char **argv)
{
	int kv, other;
	off_t size;

	if (argc == 3 && strcmp(argv[1], "bench") == 0)
		return bench(argv[2]);
	if (argc != 3) {
		fprintf(stderr, "usage: %s KVFILE OTHERFILE | bench KVFILE\n", argv[0]);
		return 2;
	}
	kv = open(argv[1], O_RDONLY | O_DIRECT);
	other = open(argv[2], O_RDONLY | O_DIRECT);
	if (kv < 0 || other < 0) {
		perror("open");
		return 2;
	}
	size = lseek(kv, 0, SEEK_END);
	printf("read %016llx\n", (unsigned long long)part_read(kv, size));
	printf("lio_wait %016llx\n", (unsigned long long)part_lio_wait(kv, other));
	printf("notify %016llx\n", (unsigned long long)part_notify(kv, other));
	close(kv);
	close(other);
	return failed;
}
