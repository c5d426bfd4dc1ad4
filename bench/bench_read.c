/*
 * kvshim-bench-read: the read side of the benchmarks (scripts/bench.sh runs it with and
 * without LD_PRELOAD=libkvshim.so).  It calls plain libc pread, so under the shim every figure
 * includes the hook's own cost.
 *
 *   kvshim-bench-read memcpy MIB
 *       single-thread memcpy bandwidth, 1 MiB at a time over MIB MiB (GB/s)
 *   kvshim-bench-read read [--direct] [--passes N] [--bs BYTES] FILE...
 *       read every FILE in preads of BYTES (default 1 MiB), N passes; GB/s of the best pass
 *       after the first, and the time per pread of that pass (us), the figure for the
 *       per-call cost of the hit path when BYTES is small
 *   kvshim-bench-read probe MIB
 *       what the shim's buffer check costs on a 1 MiB buffer that is already mapped (as an
 *       engine's is), next to a whole-range MADV_POPULATE_WRITE and to memcpy of 1 MiB
 *   kvshim-bench-read ranks N [--direct] [--distinct] [--split] FILE...
 *       fork N processes that start together and each read every FILE with one pread per file
 *       (one task of all its shards); print the time until the last one is done (s).
 *       --split: rank r reads only files r, r+N, r+2N...: the unique bytes once between
 *       them, at the ranks' concurrency (the storage term of the load's limit)
 *   kvshim-bench-read copy N [--distinct] [--memcpy] [--dir DIR] MIB
 *       fork N processes that start together and each copy MIB MiB, 16 MiB at a time, from
 *       one shared source (a memfd, or with --dir an unnamed file in DIR of the pages DIR
 *       gives, filled first, as the region is) into its destination:
 *       one 16 MiB buffer faulted in and reused, or with --distinct fresh memory for all MIB;
 *       print the time until the last one is done (s) and the aggregate rate (the copy
 *       term of the load's limit).  The copy is the shim's default (loader.copy = auto, the
 *       streaming copy of loader/copy.c); --memcpy copies with memcpy
 *
 *   kvshim-bench-read zero [--threads N] [--advise] DIR MIB
 *       the zeroing limit: MIB MiB of a new unnamed file in DIR (of the kind of pages DIR
 *       gives: a huge=always tmpfs or a hugetlbfs gives huge pages; --advise asks a
 *       huge=advise tmpfs for them with MADV_HUGEPAGE) allocated and cleared by the kernel as
 *       `kvshim prepare` has a region's pages made, without its bookkeeping: on a tmpfs one
 *       fallocate, then N threads (default: one per CPU) fault their shares in; print the
 *       time (s), the rate and the seconds per GiB; the file is gone at exit
 *
 *   kvshim-bench-read files [--fds K] [--rounds R] FILE...
 *       with K other descriptors open (of /dev/null), R rounds of: for each FILE, open it
 *       O_DIRECT, one pread of its first 64 KiB, close; the time per file of the best round
 *       after the first (us): what a program that opens one file per block pays per block
 *   kvshim-bench-read write [--direct] [--bs BYTES] N DIR
 *       write N files DIR/w<i> of BYTES (default 4 MiB) each, as an engine saves KV blocks:
 *       open, one write, close (under the shim: write-through stages and publishes them);
 *       print the time per file (us) and the rate (GB/s).  The files are left in DIR
 *
 * Prints one line of figures; checks no thresholds (the machines are shared: compare ratios).
 */
#include <errno.h>
#include <linux/futex.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "copy.h"

#define MIB (1u << 20)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *page_alloc(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("kvshim-bench-read: mmap");
		exit(1);
	}
	memset(p, 1, len); /* fault it in before any clock starts */
	return p;
}

static int bench_memcpy(size_t mib)
{
	char *src = page_alloc(mib * MIB), *dst = page_alloc(MIB);
	double best = 0;

	for (int pass = 0; pass < 4; pass++) {
		double t0 = now();
		for (size_t i = 0; i < mib; i++)
			memcpy(dst, src + i * MIB, MIB);
		double gbs = (double)mib * MIB / (now() - t0) / 1e9;
		if (gbs > best)
			best = gbs;
	}
	__asm__ volatile("" : : "r"(dst) : "memory");
	printf("memcpy %.2f GB/s\n", best);
	return 0;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* The shim's buffer check (shim/progmem.c, kvs_progmem_writable): an atomic add of 0 to the first
 * word of the buffer's first and last page (FUTEX_WAKE_OP), msync(MS_ASYNC) over all of it. */
static int check_like_shim(char *buf, size_t len)
{
	for (int k = 0; k < 2; k++) {
		uint32_t *w = (uint32_t *)(k ? buf + len - 4096 : buf);

		if (syscall(SYS_futex, w, FUTEX_WAKE_OP | FUTEX_PRIVATE_FLAG, 0, NULL, w,
			    FUTEX_OP(FUTEX_OP_ADD, 0, FUTEX_OP_CMP_EQ, 0)) < 0)
			return -1;
	}
	return msync(buf, len, MS_ASYNC);
}

static int bench_probe(size_t mib)
{
	char *src = page_alloc(mib * MIB), *dst = page_alloc(MIB);
	double best[3] = {1e9, 1e9, 1e9}; /* the shim's check, a whole-range populate, memcpy */

	for (int pass = 0; pass < 5; pass++) {
		double t[4];

		t[0] = now();
		for (size_t i = 0; i < mib; i++)
			if (check_like_shim(dst, MIB)) {
				perror("kvshim-bench-read: buffer check");
				return 1;
			}
		t[1] = now();
		for (size_t i = 0; i < mib; i++)
			madvise(dst, MIB, MADV_POPULATE_WRITE);
		t[2] = now();
		for (size_t i = 0; i < mib; i++)
			memcpy(dst, src + i * MIB, MIB);
		t[3] = now();
		for (int k = 0; k < 3; k++)
			if ((t[k + 1] - t[k]) / (double)mib < best[k])
				best[k] = (t[k + 1] - t[k]) / (double)mib;
	}
	printf("per MiB: shim's buffer check %.2f us (%.1f%% of memcpy), whole-range populate "
	       "%.2f us (%.1f%%), memcpy %.2f us\n",
	       best[0] * 1e6, 100 * best[0] / best[2], best[1] * 1e6, 100 * best[1] / best[2],
	       best[2] * 1e6);
	return 0;
}

static int open_file(const char *path, bool direct)
{
	int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));

	if (fd < 0) {
		fprintf(stderr, "kvshim-bench-read: %s: %s\n", path, strerror(errno));
		exit(1);
	}
	return fd;
}

static int bench_read(int argc, char **argv)
{
	bool direct = false;
	int passes = 3, i = 0;
	size_t bs = MIB;
	double best = 0, best_us = 0;

	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--direct"))
			direct = true;
		else if (!strcmp(argv[i], "--passes") && i + 1 < argc)
			passes = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--bs") && i + 1 < argc)
			bs = strtoull(argv[++i], NULL, 0);
	}
	if (bs == 0 || bs % 4096) {
		fprintf(stderr, "kvshim-bench-read: --bs must be a multiple of 4096\n");
		return 2;
	}
	char *buf = page_alloc(bs);
	for (int pass = 0; pass < passes; pass++) {
		uint64_t bytes = 0, calls = 0;
		double t0 = now();

		for (int f = i; f < argc; f++) {
			int fd = open_file(argv[f], direct);
			ssize_t n;
			off_t off = 0;

			while ((n = pread(fd, buf, bs, off)) > 0) {
				bytes += (uint64_t)n;
				off += n;
				calls++;
			}
			if (n < 0) {
				perror("kvshim-bench-read: pread");
				return 1;
			}
			close(fd);
		}
		double dt = now() - t0, gbs = (double)bytes / dt / 1e9;
		if (pass > 0 && gbs > best) {
			best = gbs;
			best_us = calls ? dt / (double)calls * 1e6 : 0;
		}
	}
	printf("read %.2f GB/s, %.2f us per pread\n", best, best_us);
	return 0;
}

static int bench_files(int argc, char **argv)
{
	int i = 0, fds = 0, rounds = 5;
	double best = 0;

	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--fds") && i + 1 < argc)
			fds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
	}
	if (i >= argc || rounds < 2) {
		fprintf(stderr, "kvshim-bench-read: files [--fds K] [--rounds R >= 2] FILE...\n");
		return 2;
	}
	for (int k = 0; k < fds; k++)
		if (open("/dev/null", O_RDONLY) < 0) {
			perror("kvshim-bench-read: /dev/null");
			return 1;
		}
	char *buf = page_alloc(64 << 10);
	for (int r = 0; r < rounds; r++) {
		double t0 = now();

		for (int f = i; f < argc; f++) {
			int fd = open_file(argv[f], true);

			if (pread(fd, buf, 64 << 10, 0) < 0) {
				perror("kvshim-bench-read: pread");
				return 1;
			}
			close(fd);
		}
		double us = (now() - t0) / (argc - i) * 1e6;
		if (r > 0 && (best == 0 || us < best))
			best = us;
	}
	printf("files %.1f us per file with %d other descriptors\n", best, fds);
	return 0;
}

static int bench_write(int argc, char **argv)
{
	bool direct = false;
	size_t bs = 4 * MIB;
	int i = 0;

	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--direct"))
			direct = true;
		else if (!strcmp(argv[i], "--bs") && i + 1 < argc)
			bs = strtoull(argv[++i], NULL, 0);
	}
	if (argc - i != 2 || bs == 0 || bs % 4096) {
		fprintf(
		    stderr,
		    "kvshim-bench-read: write [--direct] [--bs BYTES (4 KiB multiple)] N DIR\n");
		return 2;
	}
	int n = atoi(argv[i]);
	char *buf = page_alloc(bs);
	for (size_t k = 0; k < bs; k++)
		buf[k] = (char)(k * 131 + 7);
	double t0 = now();
	for (int f = 0; f < n; f++) {
		char path[4096];

		snprintf(path, sizeof(path), "%s/w%d", argv[i + 1], f);
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
		if (fd < 0 || write(fd, buf, bs) != (ssize_t)bs || close(fd)) {
			fprintf(stderr, "kvshim-bench-read: %s: %s\n", path, strerror(errno));
			return 1;
		}
	}
	double dt = now() - t0;
	printf("write %.1f us per file, %.2f GB/s\n", dt / n * 1e6, (double)bs * n / dt / 1e9);
	return 0;
}

/* A start line for processes timed together (ranks, copy): children check in and spin until
 * go; each notes its end; the figure is the last end since go. */
struct board {
	volatile int ready, go;
	double end[64];
};

static struct board *board_new(int n)
{
	struct board *bd =
	    mmap(NULL, sizeof(*bd), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return n <= 0 || n > 64 || bd == MAP_FAILED ? NULL : bd;
}

/* In a child: check in and wait for the start. */
static void board_start(struct board *bd)
{
	__sync_fetch_and_add(&bd->ready, 1);
	while (!bd->go)
		;
}

/* In the parent: start n children once all checked in, reap them; *bad is set if one failed.
 * Returns the seconds from the start until the last child's end. */
static double board_run(struct board *bd, int n, int *bad)
{
	while (bd->ready < n)
		usleep(100);
	double t0 = now(), last = t0;
	bd->go = 1;
	*bad = 0;
	for (int r = 0; r < n; r++) {
		int st;
		wait(&st);
		*bad |= !WIFEXITED(st) || WEXITSTATUS(st);
	}
	for (int r = 0; r < n; r++)
		if (bd->end[r] > last)
			last = bd->end[r];
	return last - t0;
}

static int bench_ranks(int argc, char **argv)
{
	int n = argc > 0 ? atoi(argv[0]) : 0, i = 1, bad;
	bool direct = false;
	struct board *bd = board_new(n);

	if (!bd)
		return 2;
	bool distinct = false, split = false;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--direct"))
			direct = true;
		else if (!strcmp(argv[i], "--distinct"))
			distinct = true;
		else if (!strcmp(argv[i], "--split"))
			split = true;
		else
			return 2;
	}
	for (int r = 0; r < n; r++) {
		if (fork())
			continue;
		int first = split ? i + r : i, step = split ? n : 1;
		size_t biggest = 0;
		for (int f = i; f < argc; f++) {
			struct stat st;
			if (stat(argv[f], &st) == 0 && (size_t)st.st_size > biggest)
				biggest = (size_t)st.st_size;
		}
		size_t each = (biggest + 4095) & ~4095ul;
		/* --distinct: a destination of its own per file, as an engine's KV blocks have,
		 * fresh (never touched) like the demo's; else one buffer, faulted in, reused. */
		char *buf = distinct ? mmap(NULL, each * (size_t)(argc - i), PROT_READ | PROT_WRITE,
					    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
				     : page_alloc(each);
		if (buf == MAP_FAILED)
			_exit(1);
		board_start(bd);
		for (int f = first; f < argc; f += step) {
			int fd = open_file(argv[f], direct);
			char *dst = distinct ? buf + each * (size_t)((f - first) / step) : buf;
			if (pread(fd, dst, each, 0) < 0)
				_exit(1);
			close(fd);
		}
		bd->end[r] = now();
		_exit(0);
	}
	double t = board_run(bd, n, &bad);
	printf("ranks %d time %.3f s\n", n, t);
	return bad;
}

/* The copy term: what N ranks' copies out of one shared source cost, with no storage and no
 * cache protocol.  Like ranks, the processes start together and the time is the last one's. */
static int bench_copy(int argc, char **argv)
{
	int n = argc > 0 ? atoi(argv[0]) : 0, i = 1, bad;
	bool distinct = false;
	kvs_copy_fn copy = kvs_copy_pick(KVS_COPY_AUTO);
	const size_t chunk = 16 * (size_t)MIB; /* the files' size in bench.sh */
	struct board *bd = board_new(n);

	if (!bd)
		return 2;
	const char *dir = NULL;

	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--distinct"))
			distinct = true;
		else if (!strcmp(argv[i], "--memcpy"))
			copy = kvs_copy_pick(KVS_COPY_MEMCPY);
		else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else
			return 2;
	}
	if (i >= argc || atoi(argv[i]) <= 0)
		return 2;
	size_t len = (size_t)atoi(argv[i]) * MIB;
	/* --dir: a source of the pages DIR gives (a huge=always tmpfs, a hugetlbfs), as a region
	 * there has; else a memfd, 4 KiB pages as /dev/shm's. */
	int fd = dir ? open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)
		     : memfd_create("kvshim-bench-copy", 0);
	if (fd < 0 || ftruncate(fd, (off_t)len) < 0) {
		perror("kvshim-bench-read: memfd");
		return 1;
	}
	char *src = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (src == MAP_FAILED) {
		perror("kvshim-bench-read: mmap");
		return 1;
	}
	memset(src, 7, len); /* every page allocated before any clock starts, as a warm region's */
	for (int r = 0; r < n; r++) {
		if (fork())
			continue;
		/* --distinct: fresh memory, never touched, as the ranks' destinations are. */
		char *dst = distinct ? mmap(NULL, len, PROT_READ | PROT_WRITE,
					    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
				     : page_alloc(chunk);
		if (dst == MAP_FAILED)
			_exit(1);
		board_start(bd);
		for (size_t off = 0; off < len; off += chunk) {
			size_t k = len - off < chunk ? len - off : chunk;
			copy(distinct ? dst + off : dst, src + off, k);
		}
		__asm__ volatile("" : : "r"(dst) : "memory");
		bd->end[r] = now();
		_exit(0);
	}
	double t = board_run(bd, n, &bad);
	printf("copy %d time %.3f s %.2f GB/s\n", n, t, (double)n * (double)len / t / 1e9);
	return bad;
}

/*
 * small KIND N PATH: N calls of 16 bytes each, the way a program writes its logs and output,
 * to PATH (a file outside files.roots, /dev/null, or "-" for stdout): KIND is write, writev,
 * fwrite (a stdio stream, flushed when its buffer fills) or pwrite.  Prints the time per call;
 * run it under the shim and without, paired (farm-bench --vs), for what the hooks cost a
 * descriptor that is not a KV file.
 */
static int bench_small(const char *kind, long n, const char *path)
{
	static const char line[16] = "0123456789abcde\n";
	int fd = strcmp(path, "-") ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : 1;
	FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
	struct iovec v = {(void *)line, sizeof(line)};
	double t0 = now();

	if (!f) {
		perror(path);
		return 1;
	}
	for (long i = 0; i < n; i++) {
		ssize_t r = -1;

		if (!strcmp(kind, "write"))
			r = write(fd, line, sizeof(line));
		else if (!strcmp(kind, "writev"))
			r = writev(fd, &v, 1);
		else if (!strcmp(kind, "pwrite"))
			r = pwrite(fd, line, sizeof(line), (off_t)(i % 4096) * 16);
		else if (!strcmp(kind, "fwrite"))
			r = fwrite(line, 1, sizeof(line), f) == sizeof(line) ? 16 : -1;
		if (r != (ssize_t)sizeof(line)) {
			fprintf(stderr, "small %s: call %ld: %s\n", kind, i, strerror(errno));
			return 1;
		}
	}
	fflush(f);
	double t = now() - t0;
	fprintf(stderr, "small %s: %ld calls, %.1f ns a call\n", kind, n, t * 1e9 / (double)n);
	return 0;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct zero_part {
	char *at;
	size_t len;
	int err;
};

static void *zero_main(void *arg)
{
	struct zero_part *p = arg;

	if (p->len && madvise(p->at, p->len, MADV_POPULATE_WRITE) < 0)
		p->err = errno;
	return NULL;
}

/* The zeroing limit: fresh memory of DIR's kind, faulted in (allocated and cleared by the
 * kernel) by N threads at once, each its own share, in multiples of 2 MiB (so that no two
 * threads share a huge page). */
static int bench_zero(int argc, char **argv)
{
	int i = 0, n = 0, fd, rc = 0;
	bool advise = false;
	cpu_set_t set;

	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--advise"))
			advise = true;
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			n = atoi(argv[++i]);
		else
			return 2;
	}
	if (i + 2 != argc || atoi(argv[i + 1]) <= 0)
		return 2;
	if (n <= 0)
		n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
	if (n > 64)
		n = 64;
	size_t len = (size_t)atoi(argv[i + 1]) * MIB, unit = 2 * MIB;
	size_t share = (len / (size_t)n + unit - 1) / unit * unit;
	fd = open(argv[i], O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)len) < 0) {
		fprintf(stderr, "kvshim-bench-read: %s: %s\n", argv[i], strerror(errno));
		return 1;
	}
	char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		fprintf(stderr, "kvshim-bench-read: mmap: %s\n", strerror(errno));
		return 1;
	}
	if (advise)
		madvise(m, len, MADV_HUGEPAGE);
	struct zero_part part[64];
	pthread_t th[64];
	struct statfs sf;
	double t0 = now();
	/* As prepare allocates a tmpfs region's pages (without zeroing them) before it faults
	 * them in; a hugetlbfs's fallocate would zero them on this thread, and huge=advise's would
	 * give 4 KiB pages: there the faults allocate. */
	if (!advise && fstatfs(fd, &sf) == 0 && sf.f_type == TMPFS_MAGIC &&
	    fallocate(fd, 0, 0, (off_t)len) < 0) {
		fprintf(stderr, "kvshim-bench-read: fallocate: %s\n", strerror(errno));
		return 1;
	}
	for (int k = 0; k < n; k++) {
		size_t off = (size_t)k * share < len ? (size_t)k * share : len;
		part[k] = (struct zero_part){m + off, len - off < share ? len - off : share, 0};
		if (pthread_create(&th[k], NULL, zero_main, &part[k]))
			return 1;
	}
	for (int k = 0; k < n; k++) {
		pthread_join(th[k], NULL);
		if (part[k].err) {
			fprintf(stderr, "kvshim-bench-read: MADV_POPULATE_WRITE: %s\n",
				strerror(part[k].err));
			rc = 1;
		}
	}
	double t = now() - t0;
	printf("zero %d threads time %.3f s %.2f GB/s %.3f s per GiB\n", n, t,
	       (double)len / t / 1e9, t / ((double)len / (1u << 30)));
	munmap(m, len);
	close(fd);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "small"))
		return bench_small(argv[2], atol(argv[3]), argv[4]);
	if (argc >= 3 && !strcmp(argv[1], "memcpy"))
		return bench_memcpy((size_t)atoi(argv[2]));
	if (argc >= 3 && !strcmp(argv[1], "probe"))
		return bench_probe((size_t)atoi(argv[2]));
	if (argc >= 3 && !strcmp(argv[1], "read"))
		return bench_read(argc - 2, argv + 2);
	if (argc >= 4 && !strcmp(argv[1], "ranks"))
		return bench_ranks(argc - 2, argv + 2);
	if (argc >= 4 && !strcmp(argv[1], "copy"))
		return bench_copy(argc - 2, argv + 2);
	if (argc >= 4 && !strcmp(argv[1], "write"))
		return bench_write(argc - 2, argv + 2);
	if (argc >= 3 && !strcmp(argv[1], "files"))
		return bench_files(argc - 2, argv + 2);
	if (argc >= 4 && !strcmp(argv[1], "zero"))
		return bench_zero(argc - 2, argv + 2);
	fprintf(stderr, "usage: kvshim-bench-read memcpy MIB | probe MIB | read [--direct] "
			"[--passes N] [--bs BYTES] FILE... "
			"| ranks N [--direct] [--distinct] [--split] FILE... "
			"| copy N [--distinct] [--memcpy] [--dir DIR] MIB "
			"| write [--direct] [--bs BYTES] N DIR "
			"| files [--fds K] [--rounds R] FILE... "
			"| small write|writev|pwrite|fwrite N PATH|- "
			"| zero [--threads N] [--advise] DIR MIB\n");
	return 2;
}
