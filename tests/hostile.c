/*
 * kvshim-hostile: an engine that does what engines get wrong, for hostile_test.sh to run under
 * LD_PRELOAD=libkvshim.so.  Every case prints one result line (compared with the same run
 * without the shim where the kernel's answer is the reference) or "FAIL ..." and exits 1.
 *
 * Files are "stamped": every 4 KiB block begins with the file's tag, the block's offset and a
 * generation number, so any 4 KiB of returned data says which file, where and which version.
 *
 *   kvshim-hostile mkfile FILE TAG MIB GEN   write a stamped file (O_DIRECT, not under the shim)
 *   kvshim-hostile dup2race F0 F1 SECONDS    a thread flips fd 100 between F0 and F1 with dup2
 *                                            while others pread it: every chunk is wholly one
 *                                            file's; then a fresh process checks both files
 *   kvshim-hostile verify FILE TAG GEN       every block of FILE read under the shim is right
 *   kvshim-hostile posrace FILE              4 threads read() one description to EOF: no chunk
 *                                            twice, none missing
 *   kvshim-hostile opath FILE                pread/read on an O_PATH descriptor
 *   kvshim-hostile efault FILE               pread into read-only, unmapped and half-unmapped
 *                                            buffers
 *   kvshim-hostile cancel FILE               cancel readers at random moments; the rest go on
 *   kvshim-hostile signal FILE SECONDS       a timer's handler does long served reads while the
 *                                            main thread mallocs
 *   kvshim-hostile forkfds FILE              after served reads, a fork child holds no
 *                                            descriptor of the shim's (region, ring, anchors)
 *   kvshim-hostile locks A B                 a record lock on A survives the shim's anchors
 *   kvshim-hostile anchors A B               read A through fd, dup2 B onto fd, read again: no
 *                                            descriptor of A is left (its anchor was closed)
 *   kvshim-hostile fdleak FILE               read, rewrite a block (another descriptor), read
 *                                            again, 300 times: the shim holds no more
 *                                            descriptors at the end than after the first read
 *   kvshim-hostile writer FILE TAG MIB GENS LOG   rewrite FILE GENS times (O_DIRECT), logging
 *                                            when each write returned
 *   kvshim-hostile reader FILE SECONDS LOG   read FILE in a loop, logging start time and the
 *                                            generation of each 1 MiB chunk
 *
 * For scripts/soak.sh (STATE is a shared file of per-file generations and times):
 *   kvshim-hostile soakwriter DIR NFILES MIB SECONDS STATE   files of MIB MiB, one in four
 *                                            of 192 KiB and one in four with a 320 KiB tail
 *   kvshim-hostile soakreader DIR NFILES SECONDS STATE SETTLE_MS   4 threads, random reads
 *                                            of the 1 MiB chunks (or the tail); prints
 *                                            cumulative "reads wrong stale torn early" every
 *                                            second
 *   (both with a last argument "once": the files.write_once way; the writer writes each
 *   generation to NAME.tmp and renames it over NAME, so every generation is a new file; the
 *   reader opens the file for each read, and a read whose open began after a generation's
 *   rename returned must see it: no settle window)
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB   (1u << 20)
#define BLOCK 4096u

struct stamp {
	uint64_t tag, off, gen;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *aligned(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	return p;
}

static void stamp_fill(char *buf, size_t len, uint64_t tag, uint64_t off, uint64_t gen)
{
	for (size_t b = 0; b < len; b += BLOCK) {
		struct stamp s = {tag, off + b, gen};

		memset(buf + b, (int)(tag + gen), BLOCK);
		memcpy(buf + b, &s, sizeof(s));
	}
}

/* Check len bytes read at off: each block must carry (tag, its offset) and one generation.
 * Returns the generation, or -1 if any block is wrong or generations are mixed. */
static int64_t stamp_check(const char *buf, size_t len, uint64_t tag, uint64_t off)
{
	int64_t gen = -1;

	for (size_t b = 0; b < len; b += BLOCK) {
		struct stamp s;

		memcpy(&s, buf + b, sizeof(s));
		if (s.tag != tag || s.off != off + b)
			return -1;
		if (gen >= 0 && (uint64_t)gen != s.gen)
			return -1;
		gen = (int64_t)s.gen;
		for (size_t i = sizeof(s); i < BLOCK; i++)
			if ((unsigned char)buf[b + i] != (unsigned char)(tag + s.gen))
				return -1;
	}
	return gen;
}

static uint64_t tag_of(const char *buf)
{
	struct stamp s;

	memcpy(&s, buf, sizeof(s));
	return s.tag;
}

static int write_stamped(const char *path, uint64_t tag, unsigned mib, uint64_t gen)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_DIRECT, 0644);
	char *buf = aligned(MIB);

	if (fd < 0) {
		perror(path);
		return 2;
	}
	for (unsigned i = 0; i < mib; i++) {
		stamp_fill(buf, MIB, tag, (uint64_t)i * MIB, gen);
		if (pwrite(fd, buf, MIB, (off_t)i * MIB) != MIB) {
			perror("pwrite");
			return 2;
		}
	}
	close(fd);
	munmap(buf, MIB);
	return 0;
}

/* ------------------------------------------------------------------ dup2race */

static _Atomic int stop;
static int race_fds[2];
static off_t race_size;

static void *flipper(void *arg)
{
	for (unsigned i = 0; !atomic_load(&stop); i++)
		dup2(race_fds[i & 1], 100);
	return NULL;
}

static _Atomic long race_bad, race_reads;

static void *race_reader(void *arg)
{
	char *buf = aligned(MIB);
	unsigned seed = (unsigned)(uintptr_t)arg;

	while (!atomic_load(&stop)) {
		off_t off = (off_t)(rand_r(&seed) % (race_size / MIB)) * MIB;
		ssize_t n = pread(100, buf, MIB, off);

		if (n < 0 && errno == EBADF)
			continue; /* between dup2's close and install: the kernel says so too */
		atomic_fetch_add(&race_reads, 1);
		if (n != MIB || stamp_check(buf, MIB, tag_of(buf), (uint64_t)off) < 0 ||
		    (tag_of(buf) != 0 && tag_of(buf) != 1))
			atomic_fetch_add(&race_bad, 1);
	}
	munmap(buf, MIB);
	return NULL;
}

static int cmd_dup2race(const char *f0, const char *f1, double seconds)
{
	pthread_t fl, rd[3];
	struct stat st;

	race_fds[0] = open(f0, O_RDONLY | O_DIRECT);
	race_fds[1] = open(f1, O_RDONLY | O_DIRECT);
	if (race_fds[0] < 0 || race_fds[1] < 0 || fstat(race_fds[0], &st)) {
		perror("open");
		return 2;
	}
	race_size = st.st_size;
	dup2(race_fds[0], 100);
	pthread_create(&fl, NULL, flipper, NULL);
	for (int i = 0; i < 3; i++)
		pthread_create(&rd[i], NULL, race_reader, (void *)(uintptr_t)(i + 1));
	usleep((useconds_t)(seconds * 1e6));
	atomic_store(&stop, 1);
	pthread_join(fl, NULL);
	for (int i = 0; i < 3; i++)
		pthread_join(rd[i], NULL);
	if (race_bad) {
		printf("FAIL dup2race: %ld of %ld chunks were not wholly one file's\n", race_bad,
		       race_reads);
		return 1;
	}
	printf("dup2race: %ld reads, every chunk wholly one file's\n", race_reads);
	return 0;
}

static int cmd_verify(const char *path, uint64_t tag, uint64_t gen)
{
	int fd = open(path, O_RDONLY | O_DIRECT);
	char *buf = aligned(MIB);
	struct stat st;
	long bad = 0;

	if (fd < 0 || fstat(fd, &st)) {
		perror(path);
		return 2;
	}
	for (off_t off = 0; off < st.st_size; off += MIB)
		if (pread(fd, buf, MIB, off) != MIB ||
		    stamp_check(buf, MIB, tag, (uint64_t)off) != (int64_t)gen)
			bad++;
	if (bad) {
		printf("FAIL verify %s: %ld of %ld MiB wrong (another file's or version's bytes)\n",
		       path, bad, (long)(st.st_size / MIB));
		return 1;
	}
	printf("verify: %s right\n", path);
	return 0;
}

/* ------------------------------------------------------------------ posrace */

static int pos_fd;
static uint8_t *pos_seen;
static _Atomic long pos_dup, pos_bad;

static void *pos_reader(void *arg)
{
	char *buf = aligned(MIB);

	for (;;) {
		ssize_t n = read(pos_fd, buf, MIB);

		if (n <= 0)
			break;
		struct stamp s;
		memcpy(&s, buf, sizeof(s));
		if (stamp_check(buf, (size_t)n, s.tag, s.off) < 0 || s.off % MIB) {
			atomic_fetch_add(&pos_bad, 1);
			continue;
		}
		if (__atomic_fetch_add(&pos_seen[s.off / MIB], 1, __ATOMIC_RELAXED))
			atomic_fetch_add(&pos_dup, 1);
	}
	munmap(buf, MIB);
	return NULL;
}

static int cmd_posrace(const char *path)
{
	struct stat st;
	pthread_t th[4];
	long missing = 0;

	for (int pass = 0; pass < 20; pass++) {
		pos_fd = open(path, O_RDONLY | O_DIRECT);
		if (pos_fd < 0 || fstat(pos_fd, &st)) {
			perror(path);
			return 2;
		}
		pos_seen = calloc((size_t)(st.st_size / MIB) + 1, 1);
		for (int i = 0; i < 4; i++)
			pthread_create(&th[i], NULL, pos_reader, NULL);
		for (int i = 0; i < 4; i++)
			pthread_join(th[i], NULL);
		for (off_t i = 0; i < st.st_size / MIB; i++)
			missing += pos_seen[i] == 0;
		free(pos_seen);
		close(pos_fd);
	}
	if (pos_dup || pos_bad || missing) {
		printf("FAIL posrace: %ld chunks twice, %ld missing, %ld wrong\n", pos_dup, missing,
		       pos_bad);
		return 1;
	}
	printf("posrace: every chunk once\n");
	return 0;
}

/* ------------------------------------------------------------------ opath, efault */

static void report(const char *what, ssize_t n)
{
	if (n < 0)
		printf("%s: -1 %s\n", what, strerror(errno));
	else
		printf("%s: %zd\n", what, n);
}

static int cmd_opath(const char *path)
{
	int fd = open(path, O_PATH);
	char *buf = aligned(MIB);

	report("pread O_PATH", pread(fd, buf, MIB, 0));
	report("read O_PATH", read(fd, buf, MIB));
	return 0;
}

static int cmd_efault(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECT);
	int bfd = open(path, O_RDONLY);
	char *ro = mmap(NULL, MIB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	/* PROT_NONE rather than munmap: an unmapped range could be reused by the next mmap (the
	 * shim's own, say), and the run without the shim would not compare. */
	char *gone = mmap(NULL, MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *half = aligned(2 * MIB);

	mprotect(half + MIB, MIB, PROT_NONE);
	/* Warm the cache so the reads below would be hits. */
	char *ok = aligned(2 * MIB);
	pread(fd, ok, 2 * MIB, 0);
	pread(fd, ok, 2 * MIB, 0);
	report("direct read-only", pread(fd, ro, MIB, 0));
	report("direct unmapped", pread(fd, gone, MIB, 0));
	report("direct half-unmapped", pread(fd, half, 2 * MIB, 0));
	report("buffered read-only", pread(bfd, ro, MIB, 0));
	report("buffered unmapped", pread(bfd, gone, MIB, 0));
	report("direct good", pread(fd, ok, 2 * MIB, 0));
	return 0;
}

/* ------------------------------------------------------------------ cancel */

static const char *cancel_path;

static void close_fd(void *arg)
{
	close((int)(intptr_t)arg);
}

static void *cancel_reader(void *arg)
{
	int fd = open(cancel_path, O_RDONLY | O_DIRECT);
	char *buf = aligned(4 * MIB);
	unsigned seed = (unsigned)(uintptr_t)arg;
	struct stat st;

	fstat(fd, &st);
	pthread_cleanup_push(close_fd, (void *)(intptr_t)fd);
	for (;;) {
		off_t off = (off_t)(rand_r(&seed) % (st.st_size / MIB - 3)) * MIB;
		pread(fd, buf, 4 * MIB, off);
	}
	pthread_cleanup_pop(1);
	return NULL;
}

static int cmd_cancel(const char *path)
{
	pthread_t th[6];

	cancel_path = path;
	for (int round = 0; round < 40; round++) {
		for (int i = 0; i < 6; i++)
			pthread_create(&th[i], NULL, cancel_reader,
				       (void *)(uintptr_t)(round * 6 + i + 1));
		usleep((useconds_t)(1000 + rand() % 20000));
		for (int i = 0; i < 6; i++)
			pthread_cancel(th[i]);
		for (int i = 0; i < 6; i++)
			pthread_join(th[i], NULL);
	}
	/* Everything the cancelled threads held must be free again: this read must finish. */
	int fd = open(path, O_RDONLY | O_DIRECT);
	char *buf = aligned(4 * MIB);
	alarm(20);
	report("cancel: after 240 cancels, a read", pread(fd, buf, 4 * MIB, 0));
	return 0;
}

/* ------------------------------------------------------------------ signal */

static int sig_fd;
static char *sig_buf;
static off_t sig_size;
static _Atomic long sig_reads;

static void on_alarm(int sig)
{
	int saved = errno;
	off_t off = (off_t)(sig_reads % (sig_size / MIB - 20)) * MIB;

	/* 17 shards in one read: more than a task's stack holds, so the old loader mallocked. */
	if (pread(sig_fd, sig_buf, 17 * MIB, off) == 17 * MIB)
		atomic_fetch_add(&sig_reads, 1);
	errno = saved;
}

static int cmd_signal(const char *path, double seconds)
{
	struct itimerval it = {{0, 0}, {0, 0}};
	struct stat st;
	void *keep[64] = {0};
	long allocs = 0;

	sig_fd = open(path, O_RDONLY | O_DIRECT);
	if (sig_fd < 0 || fstat(sig_fd, &st)) {
		perror(path);
		return 2;
	}
	sig_size = st.st_size;
	sig_buf = aligned(20 * MIB);
	/* The first KV read attaches (maps the region, starts threads: that allocates); the
	 * handler's reads are the ones after it. */
	pread(sig_fd, sig_buf, MIB, 0);
	signal(SIGALRM, on_alarm);
	double end = now_s() + seconds;
	while (now_s() < end) {
		int i = rand() % 64;

		/* One shot at a time, at a random moment of the malloc loop: the handler never
		 * starves the program, and it lands inside malloc often. */
		if (allocs % 256 == 0) {
			it.it_value.tv_usec = 1 + rand() % 2000;
			setitimer(ITIMER_REAL, &it, NULL);
		}
		free(keep[i]);
		keep[i] = malloc((size_t)(rand() % 65536) + 1);
		allocs++;
	}
	memset(&it, 0, sizeof(it));
	setitimer(ITIMER_REAL, &it, NULL);
	printf("signal: %ld mallocs, %ld reads from the handler, no deadlock\n", allocs,
	       (long)sig_reads);
	return 0;
}

/* ------------------------------------------------------------------ forkfds */

static int cmd_forkfds(const char *path)
{
	char had[4096] = {0}; /* descriptors inherited from whoever started us */

	for (int i = 0; i < 4096; i++)
		had[i] = fcntl(i, F_GETFD) >= 0;
	int fd = open(path, O_RDONLY | O_DIRECT);
	char *buf = aligned(4 * MIB);

	for (int i = 0; i < 3; i++)
		pread(fd, buf, 4 * MIB, 0);
	pid_t pid = fork();
	if (pid == 0) {
		char link[64], target[4096];
		int extra = 0;

		for (int i = 0; i < 4096; i++) {
			snprintf(link, sizeof(link), "/proc/self/fd/%d", i);
			ssize_t n = readlink(link, target, sizeof(target) - 1);
			if (n <= 0 || i == fd || had[i])
				continue;
			target[n] = '\0';
			printf("child holds fd %d -> %s\n", i, target);
			extra++;
		}
		_exit(extra ? 1 : 0);
	}
	int status;
	waitpid(pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		printf("FAIL forkfds: the fork child inherited descriptors of the shim's\n");
		return 1;
	}
	printf("forkfds: the fork child holds only the program's descriptors\n");
	return 0;
}

/* ------------------------------------------------------------------ locks */

/* Does another process see a write lock on path's first byte? */
static int lock_seen_by_child(const char *path)
{
	pid_t pid = fork();

	if (pid == 0) {
		int fd = open(path, O_RDWR);
		struct flock fl = {
		    .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};

		fcntl(fd, F_GETLK, &fl);
		_exit(fl.l_type == F_UNLCK ? 1 : 0);
	}
	int status;
	waitpid(pid, &status, 0);
	return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int cmd_locks(const char *a, const char *b)
{
	char *buf = aligned(4 * MIB);
	struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};

	/* fd1 of A is read (the shim anchors it); A is opened again as fd2, and fd1's number is
	 * made to name B (dup2: the shim's anchors may hold any freed number, so the program
	 * reuses fd1's own); then A is locked through fd2.  Reading B through fd1's number makes
	 * the shim replace that entry's anchor of A while the program still holds A through fd2:
	 * it must not close it, which would drop the lock. */
	int fd1 = open(a, O_RDWR | O_DIRECT);
	for (int i = 0; i < 3; i++)
		pread(fd1, buf, 4 * MIB, 0);
	int fd2 = open(a, O_RDWR | O_DIRECT);
	int tb = open(b, O_RDONLY | O_DIRECT);
	if (fd1 < 0 || fd2 < 0 || tb < 0 || dup2(tb, fd1) != fd1) {
		perror("open or dup2");
		return 2;
	}
	close(tb);
	if (fcntl(fd2, F_SETLK, &fl)) {
		perror("F_SETLK");
		return 2;
	}
	for (int i = 0; i < 3; i++) /* misses: read-ahead (prefetch=read) of shard 6 runs on A */
		pread(fd2, buf, 2 * MIB, 4 * MIB);
	int fdb = fd1;
	for (int i = 0; i < 3; i++)
		pread(fdb, buf, 4 * MIB, 0);
	usleep(200000); /* let read-ahead finish */
	if (!lock_seen_by_child(a)) {
		printf("FAIL locks: the program's record lock on A was dropped\n");
		return 1;
	}
	printf("locks: the record lock survived (fds %d %d)\n", fd2, fdb);
	return 0;
}

/* ------------------------------------------------------------------ anchors */

/* How many descriptors of this process name (dev, ino)? */
static int fds_naming(dev_t dev, ino_t ino)
{
	struct stat st;
	int n = 0;

	for (int i = 0; i < 65536; i++)
		n += fstat(i, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
	return n;
}

static int cmd_anchors(const char *a, const char *b)
{
	/* A is read through fd (the shim anchors it: two descriptors name A), then fd's number is
	 * made to name B and read again.  The shim replaces that entry's anchor; the program holds
	 * nothing of A any more, so A's old anchor must be closed, not leaked.  Stdin is closed
	 * first, so A's anchor is descriptor 0, which must count as the shim's like any other. */
	char *buf = aligned(4 * MIB);
	int fd = open(a, O_RDONLY | O_DIRECT), tb = open(b, O_RDONLY | O_DIRECT);
	struct stat sa;

	if (fd <= 0 || tb <= 0 || fstat(fd, &sa) || close(0)) {
		perror("open");
		return 2;
	}
	for (int i = 0; i < 3; i++)
		pread(fd, buf, 4 * MIB, 0);
	int held = fds_naming(sa.st_dev, sa.st_ino);
	if (dup2(tb, fd) != fd) {
		perror("dup2");
		return 2;
	}
	close(tb);
	for (int i = 0; i < 3; i++)
		pread(fd, buf, 4 * MIB, 0);
	int left = fds_naming(sa.st_dev, sa.st_ino);
	if (held != 2 || left != 0) {
		printf(
		    "FAIL anchors: %d descriptors named A while the program read it (want 2: its "
		    "own and the anchor), %d once it let go (want 0)\n",
		    held, left);
		return 1;
	}
	printf("anchors: A's anchor closed once the program let go of A\n");
	return 0;
}

/* ------------------------------------------------------------------ fdleak */

static int count_fds(void)
{
	int n = 0;

	for (int i = 0; i < 65536; i++)
		n += fcntl(i, F_GETFD) >= 0;
	return n;
}

static int cmd_fdleak(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECT), wfd = open(path, O_WRONLY | O_DIRECT);
	char *buf = aligned(MIB);
	int after_first = -1;
	struct stamp sp;

	for (int i = 0; i < 300; i++) {
		if (pread(fd, buf, MIB, 0) != MIB)
			return 2;
		if (i == 0)
			after_first = count_fds();
		memcpy(&sp, buf, sizeof(sp));
		if (pwrite(wfd, buf, BLOCK, 0) != BLOCK) /* same bytes: a rewrite */
			return 2;
		/* A new mtime each time, whatever the file system's timestamp granularity. */
		struct timespec ts[2] = {{0, UTIME_OMIT}, {1700000000 + i, 0}};
		if (futimens(wfd, ts))
			return 2;
	}
	int end = count_fds();
	if (end > after_first + 2) {
		printf("FAIL fdleak: %d descriptors after the first read, %d after 300 rewrites\n",
		       after_first, end);
		return 1;
	}
	printf("fdleak: descriptors steady over 300 rewrites\n");
	return 0;
}

/* ------------------------------------------------------------------ writer, reader */

/* Each generation is one O_DIRECT pwrite of the whole file: the kernel moves mtime when the
 * call starts and the data lands during it, the window in which a reader sees the new identity
 * with old bytes. */
static int cmd_writer(const char *path, uint64_t tag, unsigned mib, unsigned gens, const char *log)
{
	FILE *lf = fopen(log, "w");
	int fd = open(path, O_WRONLY | O_DIRECT);
	char *buf = aligned((size_t)mib * MIB);

	if (fd < 0) {
		perror(path);
		return 2;
	}
	for (unsigned g = 1; g <= gens; g++) {
		stamp_fill(buf, (size_t)mib * MIB, tag, 0, g);
		if (pwrite(fd, buf, (size_t)mib * MIB, 0) != (ssize_t)mib * MIB) {
			perror("pwrite");
			return 2;
		}
		fprintf(lf, "%u %.6f\n", g, now_s());
		fflush(lf);
		usleep(400000);
	}
	fclose(lf);
	close(fd);
	return 0;
}

static int cmd_reader(const char *path, double seconds, const char *log)
{
	FILE *lf = fopen(log, "w");
	char *buf = aligned(MIB);
	double end = now_s() + seconds;

	while (now_s() < end) {
		int fd = open(path, O_RDONLY | O_DIRECT);
		struct stat st;

		if (fd < 0 || fstat(fd, &st))
			continue;
		for (off_t off = 0; off + MIB <= st.st_size; off += MIB) {
			double t = now_s();
			ssize_t n = pread(fd, buf, MIB, off);
			int64_t g =
			    n == MIB ? stamp_check(buf, MIB, tag_of(buf), (uint64_t)off) : -1;

			fprintf(lf, "%.6f %lld\n", t, (long long)g);
		}
		close(fd);
	}
	fclose(lf);
	return 0;
}

/* ------------------------------------------------------------------ soak */

struct soak_file {
	_Atomic uint64_t gen;	      /* last generation whose write returned */
	_Atomic uint64_t returned_ns; /* when it returned */
	_Atomic uint64_t writing;     /* a write is in flight */
};

static struct soak_file *soak_map(const char *state, unsigned nfiles, bool create)
{
	int fd = open(state, O_RDWR | (create ? O_CREAT | O_TRUNC : 0), 0644);

	if (fd < 0 || (create && ftruncate(fd, (off_t)(nfiles * sizeof(struct soak_file))))) {
		perror(state);
		exit(2);
	}
	void *p = mmap(NULL, nfiles * sizeof(struct soak_file), PROT_READ | PROT_WRITE, MAP_SHARED,
		       fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	return p;
}

static uint64_t now_ns(void)
{
	return (uint64_t)(now_s() * 1e9);
}

/* The size of soak file i: MIB MiB, except that one file in four is smaller than a shard
 * (192 KiB) and one in four has a tail (320 KiB more), so that packed slots (cache/pack.c) are
 * loaded, hit, evicted and reloaded alongside whole shards. */
static size_t soak_size(unsigned i, unsigned mib)
{
	if (i % 4 == 1)
		return 192 * 1024;
	return (size_t)mib * MIB + (i % 4 == 3 ? 320 * 1024 : 0);
}

static int cmd_soakwriter(const char *dir, unsigned nfiles, unsigned mib, double seconds,
			  const char *state, bool once)
{
	struct soak_file *sf = soak_map(state, nfiles, true);
	char *buf = aligned((size_t)mib * MIB + MIB), path[4096];
	double end = now_s() + seconds;
	unsigned seed = (unsigned)getpid();

	for (unsigned i = 0; i < nfiles; i++) {
		size_t size = soak_size(i, mib);
		int fd;

		snprintf(path, sizeof(path), "%s/s%u", dir, i);
		fd = open(path, O_WRONLY | O_CREAT | O_DIRECT, 0644);
		stamp_fill(buf, size, i, 0, 0);
		if (fd < 0 || pwrite(fd, buf, size, 0) != (ssize_t)size) {
			perror(path);
			return 2;
		}
		close(fd);
	}
	double longest = 0;
	long writes = 0;

	while (now_s() < end) {
		unsigned i = (unsigned)rand_r(&seed) % nfiles;
		uint64_t g = atomic_load(&sf[i].gen) + 1;
		int fd;

		size_t size = soak_size(i, mib);

		char tmp[4200];

		snprintf(path, sizeof(path), "%s/s%u", dir, i);
		snprintf(tmp, sizeof(tmp), "%s.tmp", path);
		/* Write-once: a new file under a temporary name, then renamed into place. */
		fd = once ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644)
			  : open(path, O_WRONLY | O_DIRECT);
		stamp_fill(buf, size, i, 0, g);
		atomic_store(&sf[i].writing, 1);
		double t0 = now_s();
		if (fd < 0 || pwrite(fd, buf, size, 0) != (ssize_t)size ||
		    (once && (close(fd) || (fd = -1, rename(tmp, path))))) {
			perror("soakwriter");
			return 2;
		}
		if (now_s() - t0 > longest)
			longest = now_s() - t0;
		writes++;
		fprintf(stderr, "write: file %u gen %llu %.3f-%.3f\n", i, (unsigned long long)g, t0,
			now_s());
		/* The time first: a reader that sees the new generation sees its time too. */
		atomic_store(&sf[i].returned_ns, now_ns());
		atomic_store(&sf[i].gen, g);
		atomic_store(&sf[i].writing, 0);
		if (fd >= 0)
			close(fd);
		usleep(200000);
	}
	printf("writes %ld, longest %.3f s\n", writes, longest);
	return 0;
}

struct soak_args {
	const char *dir;
	unsigned nfiles;
	double end;
	struct soak_file *sf;
	uint64_t settle_ns;
	bool once; /* open per read; no settle window from the open on */
};

static _Atomic long soak_reads, soak_bad, soak_stale, soak_torn, soak_early;

static void *soak_thread(void *arg)
{
	struct soak_args *a = arg;
	char *buf = aligned(MIB), path[4096];
	int fds[256];
	unsigned seed = (unsigned)(uintptr_t)&path ^ (unsigned)getpid();

	for (unsigned i = 0; i < a->nfiles; i++) {
		snprintf(path, sizeof(path), "%s/s%u", a->dir, i);
		fds[i] = open(path, O_RDONLY | O_DIRECT);
	}
	while (now_s() < a->end) {
		unsigned i = (unsigned)rand_r(&seed) % a->nfiles;
		uint64_t topen = now_ns(), gopen = atomic_load(&a->sf[i].gen);
		struct stat st;

		if (a->once) { /* as an engine reads a block: open, read, close */
			snprintf(path, sizeof(path), "%s/s%u", a->dir, i);
			close(fds[i]);
			fds[i] = open(path, O_RDONLY | O_DIRECT);
		}
		if (fstat(fds[i], &st) || st.st_size < (off_t)BLOCK)
			continue;
		/* A chunk at a MiB boundary: 1 MiB, or what is left of the file (a tail, a file
		 * smaller than a shard). */
		unsigned chunks = (unsigned)((st.st_size + MIB - 1) / MIB);
		off_t off = (off_t)((unsigned)rand_r(&seed) % chunks) * MIB;
		ssize_t len = st.st_size - off < MIB ? (ssize_t)(st.st_size - off) : MIB;
		uint64_t t0 = now_ns(), g0 = atomic_load(&a->sf[i].gen);
		uint64_t r0 = atomic_load(&a->sf[i].returned_ns),
			 w0 = atomic_load(&a->sf[i].writing);
		ssize_t n = pread(fds[i], buf, (size_t)len, off);
		uint64_t w1 = atomic_load(&a->sf[i].writing), g1 = atomic_load(&a->sf[i].gen);
		struct stamp sp;

		atomic_fetch_add(&soak_reads, 1);
		memcpy(&sp, buf, sizeof(sp));
		if (n != len || sp.tag != i || sp.off != (uint64_t)off) {
			fprintf(stderr,
				"bad: file %u off %lld: n %zd errno %d, tag %llu off %llu\n", i,
				(long long)off, n, errno, (unsigned long long)sp.tag,
				(unsigned long long)sp.off);
			atomic_fetch_add(&soak_bad, 1);
			continue;
		}
		int64_t g = stamp_check(buf, (size_t)len, i, (uint64_t)off);
		/* The rule (operations.md, files.settle): a read that starts files.settle after a
		 * write returned sees that write.  Before that it may see older bytes, or bytes of
		 * a load that overlapped the write (handed out to its readers, not kept). */
		bool settled = !r0 || t0 >= r0 + a->settle_ns;

		if (a->once) {
			/* Every generation is a file of its own, renamed into place: a read sees
			 * one generation whole, never one older than the last rename that returned
			 * before its open began. */
			(void)t0;
			(void)w0;
			(void)w1;
			(void)g1;
			if (g < 0 || (uint64_t)g < gopen) {
				fprintf(stderr,
					"%s: file %u off %lld: generation %lld, %llu renamed into "
					"place before the open (%.3f s)\n",
					g < 0 ? "torn" : "stale", i, (long long)off, (long long)g,
					(unsigned long long)gopen, (double)(topen - r0) * 1e-9);
				atomic_fetch_add(g < 0 ? &soak_bad : &soak_stale, 1);
			}
			continue;
		}
		if (g < 0 && (w0 || w1 || g0 != g1)) {
			atomic_fetch_add(&soak_torn, 1); /* the read overlapped a write */
		} else if ((g < 0 || (uint64_t)g < g0) && !settled) {
			atomic_fetch_add(&soak_early, 1);
		} else if (g < 0 || (uint64_t)g < g0) {
			fprintf(
			    stderr,
			    "%s: file %u off %lld: generation %lld, %llu written %.3f s before the "
			    "read began\n",
			    g < 0 ? "torn" : "stale", i, (long long)off, (long long)g,
			    (unsigned long long)g0, (double)(t0 - r0) * 1e-9);
			atomic_fetch_add(g < 0 ? &soak_bad : &soak_stale, 1);
		}
	}
	return NULL;
}

static int cmd_soakreader(const char *dir, unsigned nfiles, double seconds, const char *state,
			  unsigned settle_ms, bool once)
{
	struct soak_args a = {dir,
			      nfiles,
			      now_s() + seconds,
			      soak_map(state, nfiles, false),
			      (uint64_t)settle_ms * 1000000ull,
			      once};
	pthread_t th[4];

	if (nfiles > 256)
		return 2;
	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, soak_thread, &a);
	while (now_s() < a.end) {
		usleep(1000000);
		printf("%ld %ld %ld %ld %ld\n", (long)soak_reads, (long)soak_bad, (long)soak_stale,
		       (long)soak_torn, (long)soak_early);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	printf("%ld %ld %ld %ld %ld\n", (long)soak_reads, (long)soak_bad, (long)soak_stale,
	       (long)soak_torn, (long)soak_early);
	return 0;
}

int main(int argc, char **argv)
{
	const char *c = argc > 1 ? argv[1] : "";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(c, "mkfile") && argc == 6)
		return write_stamped(argv[2], strtoull(argv[3], NULL, 0), (unsigned)atoi(argv[4]),
				     strtoull(argv[5], NULL, 0));
	if (!strcmp(c, "dup2race") && argc == 5)
		return cmd_dup2race(argv[2], argv[3], atof(argv[4]));
	if (!strcmp(c, "verify") && argc == 5)
		return cmd_verify(argv[2], strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
	if (!strcmp(c, "posrace") && argc == 3)
		return cmd_posrace(argv[2]);
	if (!strcmp(c, "opath") && argc == 3)
		return cmd_opath(argv[2]);
	if (!strcmp(c, "efault") && argc == 3)
		return cmd_efault(argv[2]);
	if (!strcmp(c, "cancel") && argc == 3)
		return cmd_cancel(argv[2]);
	if (!strcmp(c, "signal") && argc == 4)
		return cmd_signal(argv[2], atof(argv[3]));
	if (!strcmp(c, "forkfds") && argc == 3)
		return cmd_forkfds(argv[2]);
	if (!strcmp(c, "locks") && argc == 4)
		return cmd_locks(argv[2], argv[3]);
	if (!strcmp(c, "anchors") && argc == 4)
		return cmd_anchors(argv[2], argv[3]);
	if (!strcmp(c, "fdleak") && argc == 3)
		return cmd_fdleak(argv[2]);
	if (!strcmp(c, "writer") && argc == 7)
		return cmd_writer(argv[2], strtoull(argv[3], NULL, 0), (unsigned)atoi(argv[4]),
				  (unsigned)atoi(argv[5]), argv[6]);
	if (!strcmp(c, "reader") && argc == 5)
		return cmd_reader(argv[2], atof(argv[3]), argv[4]);
	bool once = argc == 8 && !strcmp(argv[7], "once");
	if (!strcmp(c, "soakwriter") && (argc == 7 || once))
		return cmd_soakwriter(argv[2], (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]),
				      atof(argv[5]), argv[6], once);
	if (!strcmp(c, "soakreader") && (argc == 7 || once))
		return cmd_soakreader(argv[2], (unsigned)atoi(argv[3]), atof(argv[4]), argv[5],
				      (unsigned)atoi(argv[6]), once);
	fprintf(stderr, "usage: see the comment at the top of tests/hostile.c\n");
	return 2;
}
