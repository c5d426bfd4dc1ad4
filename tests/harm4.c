/*
 * harm4: changes to a file of a write-once root, made every way a program can, under the shim
 * and without it (tests/harm4_test.sh compares the two).  Each mode reads the whole file with
 * O_DIRECT first (under the shim: served, its shards kept for good), changes it, then reads it
 * again twice, with O_DIRECT (served) and buffered (passed through), and prints the size and a
 * hash of each.  The shim must serve the new bytes, never the old.
 *
 *   harm4 mk FILE SIZE SEED      write SIZE bytes of pattern SEED
 *   harm4 load FILE              the O_DIRECT read alone (fills the cache)
 *   harm4 loadall DIR            the same for every file of DIR
 *   harm4 show FILE              the two reads and their hashes
 *   harm4 ftrunc FILE            ftruncate to 0, then back to the size (zeros)
 *   harm4 ftrunc_half FILE       ftruncate to half, then back
 *   harm4 grow FILE              ftruncate to the size plus 12 KiB (zeros after the old end)
 *   harm4 mmapw FILE             a MAP_SHARED PROT_WRITE mapping: stores, msync, munmap
 *   harm4 mmaplive FILE          a MAP_SHARED PROT_WRITE mapping that lives while another
 *                                process (this program's "show", under the same LD_PRELOAD)
 *                                reads the file after each of two rounds of stores, and once
 *                                more after the munmap
 *   harm4 mmapmoved FILE         a writable shared mapping moved by mremap, its old address
 *                                mapped anew and unmapped, then two rounds of stores through
 *                                the moved one, another process reading after each, and after
 *                                its munmap
 *   harm4 mmapsys FILE           mmaplive through syscall(SYS_mmap) and syscall(SYS_munmap)
 *   harm4 mmapro FILE            a MAP_SHARED PROT_READ mapping through an O_RDWR descriptor,
 *                                made writable by mprotect, stores, another process reading
 *   harm4 poke FILE              its first byte written again as it is (pwrite)
 *   harm4 mmaphold FILE          a MAP_SHARED PROT_WRITE mapping, one store, "mapped" on
 *                                stdout, then a sleep until killed
 *   harm4 sys_truncate FILE      syscall(SYS_truncate, 0), then the size written again (seed 7)
 *   harm4 sys_openat FILE        syscall(SYS_openat, O_WRONLY | O_TRUNC), written again
 *   harm4 sys_openat2 FILE       syscall(SYS_openat2) with O_TRUNC in its struct open_how
 *   harm4 sys_creat FILE         syscall(SYS_creat), written again
 *   harm4 sys_ftruncate FILE     syscall(SYS_ftruncate, 0), then back
 *   harm4 rewrite FILE           open(O_WRONLY | O_TRUNC) as the first call that changes it
 *   harm4 append FILE            pwritev2(RWF_APPEND) of 4 KiB, and a pwrite on a read-only
 *                                descriptor (EBADF): neither rewrites a byte
 *   harm4 dup2lock FILE          a POSIX lock on FILE, a read, dup2 of stdin onto 3 to 40:
 *                                is the lock still held (asked by a child)?
 *   harm4 inline FILE            an O_DIRECT open through libc, 1 MiB read by an inline system
 *                                call (no libc door: a bundled liburing's way), a close
 *   harm4 freopen FILE           a stream written to another file (its number classed "not a KV
 *                                file"), freopen'ed onto FILE "r+" (glibc closes and opens
 *                                inside itself, most often on the same number), 4 KiB written
 *                                over its first bytes
 *   harm4 reborn FILE            a number read as a pipe (popen, 1 MiB by read), closed
 *                                inside glibc (pclose), then FILE opened on it and read
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef RWF_APPEND
#define RWF_APPEND 0x10
#endif

#define MIB (1024 * 1024)

static void die(const char *what)
{
	fprintf(stderr, "harm4: %s: %s\n", what, strerror(errno));
	exit(2);
}

static uint64_t word(uint64_t off, uint64_t seed)
{
	return (off * 0x9E3779B97F4A7C15ull) ^ (seed * 0xff51afd7ed558ccdull);
}

static void fill(int fd, uint64_t size, uint64_t seed)
{
	static uint64_t buf[MIB / 8];

	for (uint64_t off = 0; off < size;) {
		uint64_t n = size - off < MIB ? size - off : MIB;

		for (uint64_t i = 0; i < (n + 7) / 8; i++)
			buf[i] = word(off + i * 8, seed);
		if (pwrite(fd, buf, n, (off_t)off) != (ssize_t)n)
			die("pwrite");
		off += n;
	}
}

/* The whole file read with flags (O_DIRECT or 0) in 1 MiB reads: its size and an FNV-1a hash. */
static void hash_read(const char *path, int flags, uint64_t *size, uint64_t *h)
{
	int fd = open(path, O_RDONLY | flags);
	void *buf;

	if (fd < 0)
		die(path);
	if (posix_memalign(&buf, 4096, MIB))
		die("posix_memalign");
	*size = 0;
	*h = 0xcbf29ce484222325ull;
	for (;;) {
		ssize_t n = pread(fd, buf, MIB, (off_t)*size);

		if (n < 0)
			die("pread");
		if (n == 0)
			break;
		for (ssize_t i = 0; i < n; i++)
			*h = (*h ^ ((unsigned char *)buf)[i]) * 0x100000001b3ull;
		*size += (uint64_t)n;
	}
	free(buf);
	close(fd);
}

static void show(const char *path)
{
	uint64_t sd, hd, sb, hb;

	hash_read(path, O_DIRECT, &sd, &hd);
	hash_read(path, 0, &sb, &hb);
	printf("direct %llu %016llx, buffered %llu %016llx, %s\n", (unsigned long long)sd,
	       (unsigned long long)hd, (unsigned long long)sb, (unsigned long long)hb,
	       sd == sb && hd == hb ? "agree" : "DIFFER");
}

static uint64_t size_of(const char *path)
{
	struct stat st;

	if (stat(path, &st))
		die(path);
	return (uint64_t)st.st_size;
}

/* pread64 as an inline system call: no libc function, so no hook, sees it. */
static long inline_pread(int fd, void *buf, size_t len, off_t off)
{
#if defined(__x86_64__)
	long r;
	register long r10 __asm__("r10") = (long)off;

	__asm__ volatile("syscall"
			 : "=a"(r)
			 : "0"((long)SYS_pread64), "D"((long)fd), "S"(buf), "d"(len), "r"(r10)
			 : "rcx", "r11", "memory");
	return r;
#elif defined(__aarch64__)
	register long x8 __asm__("x8") = SYS_pread64;
	register long x0 __asm__("x0") = fd;
	register long x1 __asm__("x1") = (long)buf;
	register long x2 __asm__("x2") = (long)len;
	register long x3 __asm__("x3") = (long)off;

	__asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
	return x0;
#else
	return pread(fd, buf, len, off);
#endif
}

/* "show" of path by another process of this program (the environment, LD_PRELOAD included,
 * is inherited): a rank of the node reading the file. */
static void show_elsewhere(const char *path)
{
	fflush(stdout);
	pid_t pid = fork();

	if (pid < 0)
		die("fork");
	if (pid == 0) {
		execl("/proc/self/exe", "harm4", "show", path, (char *)NULL);
		_exit(127);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		die("show");
}

/* path mapped MAP_SHARED with prot through a descriptor opened O_RDWR, closed at once (the
 * mapping keeps the file); through syscall(SYS_mmap) with raw. */
static char *map_rw(const char *path, uint64_t size, int prot, bool raw)
{
	int fd = open(path, O_RDWR);
	char *p;

	if (fd < 0)
		die(path);
	p = raw ? (char *)syscall(SYS_mmap, NULL, (size_t)size, prot, MAP_SHARED, fd, 0L)
		: mmap(NULL, size, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		die("mmap");
	close(fd);
	return p;
}

/* A store into every page of the mapping: the page's number plus add. */
static void store_pages(char *p, uint64_t size, int add)
{
	for (uint64_t i = 0; i < size; i += 4096)
		p[i] = (char)(i / 4096 + (uint64_t)add);
}

/* Two rounds of stores (round times step), another process reading the file after each. */
static void two_rounds_shown(char *p, uint64_t size, int step, const char *path)
{
	for (int round = 1; round <= 2; round++) {
		store_pages(p, size, round * step);
		show_elsewhere(path);
	}
}

static int lock_held_by_parent(const char *path)
{
	pid_t pid = fork();

	if (pid < 0)
		die("fork");
	if (pid == 0) {
		int fd = open(path, O_RDWR);
		struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};

		if (fd < 0 || fcntl(fd, F_GETLK, &fl))
			_exit(2);
		_exit(fl.l_type == F_UNLCK ? 1 : 0);
	}
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "mk")) {
		int fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd < 0)
			die(argv[2]);
		fill(fd, strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
		return close(fd) ? 1 : 0;
	}
	if (argc != 3) {
		fprintf(stderr, "usage: harm4 MODE FILE (see the source)\n");
		return 2;
	}
	if (!strcmp(argv[1], "loadall")) {
		char p[4096];
		uint64_t s, h;
		DIR *d = opendir(argv[2]);
		struct dirent *e;

		if (!d)
			die(argv[2]);
		while ((e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			snprintf(p, sizeof(p), "%s/%s", argv[2], e->d_name);
			hash_read(p, O_DIRECT, &s, &h);
		}
		closedir(d);
		return 0;
	}
	const char *m = argv[1], *path = argv[2];
	uint64_t size = size_of(path), s, h;
	int fd;

	if (!strcmp(m, "show")) {
		show(path);
		return 0;
	}
	if (!strcmp(m, "inline")) {
		void *d;

		if ((fd = open(path, O_RDONLY | O_DIRECT)) < 0 || posix_memalign(&d, 4096, MIB))
			die(path);
		long n = inline_pread(fd, d, MIB, 0);
		close(fd);
		printf("inline pread: %ld\n", n);
		return 0;
	}
	if (!strcmp(m, "reborn")) {
		FILE *p = popen("head -c 1048576 /dev/zero", "r");
		char *b = malloc(MIB);
		void *d;

		if (!p || !b || posix_memalign(&d, 4096, MIB))
			die("popen");
		int was = fileno(p);
		size_t got = 0;
		for (ssize_t r; got < MIB && (r = read(was, b + got, MIB - got)) > 0;)
			got += (size_t)r; /* read(2) of the number: the shim looks at it */
		pclose(p);		  /* closes the number inside glibc */
		free(b);
		if ((fd = open(path, O_RDONLY | O_DIRECT)) < 0)
			die(path);
		uint64_t n = 0;
		for (ssize_t r; (r = pread(fd, d, MIB, (off_t)n)) > 0;)
			n += (uint64_t)r;
		printf("pipe read %zu bytes on number %d; the file opened on %s, %llu bytes read\n",
		       got, was, fd == was ? "the same number" : "another number",
		       (unsigned long long)n);
		return 0;
	}
	hash_read(path, O_DIRECT, &s, &h); /* under the shim: the shards are kept for good */
	if (!strcmp(m, "load"))
		return 0;
	if (!strcmp(m, "ftrunc") || !strcmp(m, "ftrunc_half") || !strcmp(m, "grow")) {
		if ((fd = open(path, O_RDWR)) < 0)
			die(path);
		if (!strcmp(m, "grow")) {
			if (ftruncate(fd, (off_t)size + 12288))
				die("ftruncate");
		} else if (ftruncate(fd, !strcmp(m, "ftrunc") ? 0 : (off_t)size / 2) ||
			   ftruncate(fd, (off_t)size)) {
			die("ftruncate");
		}
		close(fd);
	} else if (!strcmp(m, "mmapw")) {
		char *p = map_rw(path, size, PROT_READ | PROT_WRITE, false);

		store_pages(p, size, 0);
		if (msync(p, size, MS_SYNC) || munmap(p, size))
			die("msync");
	} else if (!strcmp(m, "mmapmoved")) {
		char *p = map_rw(path, size, PROT_READ | PROT_WRITE, false);
		char *q = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (q == MAP_FAILED)
			die("mmap");
		char *moved = mremap(p, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, q);
		if (moved != q)
			die("mremap");
		/* The old address is someone else's now, and goes. */
		if (mmap(p, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
			 -1, 0) != p ||
		    munmap(p, size))
			die("mmap over the old address");
		two_rounds_shown(moved, size, 17, path);
		if (munmap(moved, size))
			die("munmap");
		show_elsewhere(path);
	} else if (!strcmp(m, "mmapsys")) {
		char *p = map_rw(path, size, PROT_READ | PROT_WRITE, true);

		two_rounds_shown(p, size, 11, path);
		if (syscall(SYS_munmap, p, (size_t)size))
			die("SYS_munmap");
		show_elsewhere(path);
	} else if (!strcmp(m, "mmapro")) {
		char *p = map_rw(path, size, PROT_READ, false);

		if (mprotect(p, size, PROT_READ | PROT_WRITE))
			die("mprotect");
		store_pages(p, size, 5);
		show_elsewhere(path);
		if (munmap(p, size))
			die("munmap");
	} else if (!strcmp(m, "poke")) {
		char c;
		if ((fd = open(path, O_RDWR)) < 0 || pread(fd, &c, 1, 0) != 1 ||
		    pwrite(fd, &c, 1, 0) != 1)
			die("poke");
		close(fd);
	} else if (!strcmp(m, "mmaphold")) {
		char *p = map_rw(path, size, PROT_READ | PROT_WRITE, false);

		p[0] = 'x';
		printf("mapped\n");
		fflush(stdout);
		for (;;)
			pause();
	} else if (!strcmp(m, "mmaplive")) {
		char *p = map_rw(path, size, PROT_READ | PROT_WRITE, false);

		/* No msync: O_DIRECT reads write dirty pages back. */
		two_rounds_shown(p, size, 31, path);
		if (munmap(p, size))
			die("munmap");
		show_elsewhere(path);
	} else if (!strcmp(m, "sys_truncate") || !strcmp(m, "sys_ftruncate")) {
		if ((fd = open(path, O_RDWR)) < 0)
			die(path);
		if ((!strcmp(m, "sys_truncate") ? syscall(SYS_truncate, path, 0L)
						: syscall(SYS_ftruncate, fd, 0L)))
			die("truncate");
		fill(fd, size, 7);
		close(fd);
	} else if (!strcmp(m, "sys_openat") || !strcmp(m, "sys_openat2") ||
		   !strcmp(m, "sys_creat")) {
		if (!strcmp(m, "sys_openat")) {
			fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_TRUNC);
		} else if (!strcmp(m, "sys_creat")) {
			fd = (int)syscall(SYS_creat, path, 0644);
		} else {
			struct {
				uint64_t flags, mode, resolve;
			} how = {O_WRONLY | O_TRUNC, 0, 0};
			fd = (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof(how));
		}
		if (fd < 0)
			die("open by number");
		fill(fd, size, 7);
		close(fd);
	} else if (!strcmp(m, "rewrite")) {
		if ((fd = open(path, O_WRONLY | O_TRUNC)) < 0)
			die(path);
		fill(fd, size, 7);
		close(fd);
	} else if (!strcmp(m, "append")) {
		char b[4096];
		struct iovec v = {b, sizeof(b)};

		memset(b, 0x5a, sizeof(b));
		if ((fd = open(path, O_RDWR)) < 0)
			die(path);
		if (pwritev2(fd, &v, 1, 0, RWF_APPEND) != (ssize_t)sizeof(b))
			die("pwritev2");
		close(fd);
		if ((fd = open(path, O_RDONLY)) < 0)
			die(path);
		errno = 0;
		ssize_t n = pwrite(fd, b, sizeof(b), 0);
		printf("pwrite on a read-only descriptor: %zd %s\n", n, strerrorname_np(errno));
		close(fd);
	} else if (!strcmp(m, "freopen")) {
		char other[4096], b[4096];

		snprintf(other, sizeof(other), "%s.other", path);
		FILE *f = fopen(other, "w");
		if (!f)
			die(other);
		memset(b, 0x33, sizeof(b));
		for (int i = 0; i < 256; i++) /* 1 MiB: the shim looks at the number */
			if (fwrite(b, 1, sizeof(b), f) != sizeof(b))
				die("fwrite");
		fflush(f);
		if (!(f = freopen(path, "r+", f)))
			die("freopen");
		memset(b, 0x44, sizeof(b));
		if (fwrite(b, 1, sizeof(b), f) != sizeof(b) || fclose(f))
			die("fwrite");
		unlink(other);
	} else if (!strcmp(m, "dup2lock")) {
		struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};

		void *d;

		/* Read through the locked descriptor itself: a close of any other descriptor of the
		 * file would drop the lock (the test's own fault, not the shim's). */
		if ((fd = open(path, O_RDWR | O_DIRECT)) < 0 || fcntl(fd, F_SETLK, &fl) ||
		    posix_memalign(&d, 4096, MIB))
			die("lock");
		if (pread(fd, d, MIB, 0) != MIB) /* served: the shim's anchor is a dup of fd */
			die("pread");
		int before = lock_held_by_parent(path);
		for (int n = 3; n <= 40; n++)
			if (n != fd)
				dup2(0, n);
		printf("lock held: before the dup2s %s, after %s\n", before ? "yes" : "no",
		       lock_held_by_parent(path) ? "yes" : "no");
		return 0;
	} else {
		fprintf(stderr, "harm4: unknown mode %s\n", m);
		return 2;
	}
	show(path);
	return 0;
}
