/*
 * wedge: saves at the edges of write-through (tests/fresh_test.sh), each followed by a check
 * that what a read through the hooked pread returns is what storage holds (a raw pread64
 * system call, which no hook sees):
 *
 *   wedge liowait FILE   four 1 MiB O_DIRECT aio_writes in one lio_listio(LIO_WAIT); the
 *                        program fills the buffers with other bytes before aio_return (legal:
 *                        the writes are over when lio_listio returns)
 *   wedge foreign FILE   own writes with a write not seen by any hook (a raw system call, as a
 *                        process outside the shim makes) between them, over bytes already
 *                        written
 *   wedge regrow FILE    4 MiB written, ftruncate to 0, 1 MiB written at 2 MiB (a hole before)
 *   wedge badwrite FILE  writes from buffers the kernel cannot read: (void *)16, and 8 KiB of
 *                        which the second page is PROT_NONE (buffered: the kernel writes the
 *                        first page; O_DIRECT: EFAULT); the answers are printed, then good
 *                        bytes finish the file
 *   wedge forkaio FILE   an aio_write seen over, then fork: the child asks aio_error and
 *                        aio_return of the parent's aiocb; then the parent rewrites part of
 *                        what it wrote and closes
 *
 * Each prints its answers and then "FILE: N bytes, served as stored" (or where they differ).
 * Exit 0 unless the command could not run (2).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1 << 20)

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

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	return p;
}

static int opendst(const char *path, int flags)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | flags, 0644);

	if (fd < 0) {
		perror(path);
		exit(2);
	}
	return fd;
}

/* Read FILE whole through the hooked pread (O_DIRECT, 1 MiB at a time) and by the raw system
 * call; say whether they agree. */
static void verify(const char *path)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_DIRECT);

	if (fd < 0 || fstat(fd, &st)) {
		perror(path);
		exit(2);
	}
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

static int cmd_liowait(const char *path)
{
	enum { N = 4 };
	unsigned char *buf = big(N * MIB);
	struct aiocb cb[N], *list[N];
	int fd = opendst(path, O_DIRECT);

	fill(buf, N * MIB, 1);
	memset(cb, 0, sizeof(cb));
	for (int i = 0; i < N; i++) {
		cb[i].aio_fildes = fd;
		cb[i].aio_buf = buf + (size_t)i * MIB;
		cb[i].aio_nbytes = MIB;
		cb[i].aio_offset = (off_t)i * MIB;
		cb[i].aio_lio_opcode = LIO_WRITE;
		list[i] = &cb[i];
	}
	int r = lio_listio(LIO_WAIT, list, N, NULL);
	memset(buf, 0xee, N * MIB); /* over: the buffers are the program's again */
	printf("lio_listio %d", r);
	for (int i = 0; i < N; i++)
		printf(" [%d: %d %zd]", i, aio_error(&cb[i]), aio_return(&cb[i]));
	printf("\n");
	close(fd);
	verify(path);
	return 0;
}

static int cmd_foreign(const char *path)
{
	unsigned char *buf = big(4 * MIB), *other = big(MIB / 2);
	int fd = opendst(path, 0);

	fill(buf, 4 * MIB, 2);
	fill(other, MIB / 2, 3);
	printf("pwrite %zd", pwrite(fd, buf, 2 * MIB, 0));
	printf(", unseen %ld", syscall(SYS_pwrite64, fd, other, MIB / 2, (off_t)MIB));
	printf(", pwrite %zd\n", pwrite(fd, buf + 2 * MIB, 2 * MIB, 2 * MIB));
	close(fd);
	verify(path);
	return 0;
}

static int cmd_regrow(const char *path)
{
	unsigned char *buf = big(4 * MIB);
	int fd = opendst(path, 0);

	fill(buf, 4 * MIB, 4);
	printf("pwrite %zd", pwrite(fd, buf, 4 * MIB, 0));
	printf(", ftruncate %d", ftruncate(fd, 0));
	fill(buf, MIB, 5);
	printf(", pwrite %zd\n", pwrite(fd, buf, MIB, 2 * MIB));
	close(fd);
	verify(path);
	return 0;
}

static void badwrites(int fd, const char *how)
{
	long pg = sysconf(_SC_PAGESIZE);
	unsigned char *two =
	    mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	void *volatile bad = (void *)16; /* volatile: the compiler would refuse the call */
	ssize_t n;

	if (two == MAP_FAILED)
		exit(2);
	fill(two, (size_t)pg, 6);
	/* PROT_NONE, not munmap: a sanitizer runtime may map something new where it was. */
	mprotect(two + pg, (size_t)pg, PROT_NONE);
	errno = 0;
	n = pwrite(fd, bad, MIB, 0);
	printf("%s from (void *)16: %zd %s", how, n, n < 0 ? strerror(errno) : "");
	errno = 0;
	n = pwrite(fd, two, (size_t)pg * 2, 0);
	printf("; half unmapped: %zd %s\n", n, n < 0 ? strerror(errno) : "");
	munmap(two, (size_t)pg * 2);
}

/* The good bytes after the bad ones start past the page a partial write may have left: a
 * file whose last page came from a write the kernel cut short answers O_DIRECT reads with EIO
 * on ext4 (Linux 6.18) until its page cache is dropped, with or without the shim. */
static int cmd_badwrite(const char *path)
{
	unsigned char *buf = big(4 * MIB);
	int fd = opendst(path, 0);

	fill(buf, 4 * MIB, 7);
	badwrites(fd, "buffered");
	printf("then pwrite %zd\n", pwrite(fd, buf + 8192, 4 * MIB - 8192, 8192));
	close(fd);
	verify(path);
	fd = opendst(path, O_DIRECT);
	badwrites(fd, "O_DIRECT");
	printf("then pwrite %zd\n", pwrite(fd, buf + MIB, 3 * MIB, MIB));
	close(fd);
	verify(path);
	return 0;
}

static int cmd_forkaio(const char *path)
{
	unsigned char *buf = big(4 * MIB);
	struct aiocb cb = {0};
	const struct aiocb *l[1] = {&cb};
	int fd = opendst(path, 0), st = 0;

	fill(buf, 4 * MIB, 8);
	cb.aio_fildes = fd;
	cb.aio_buf = buf;
	cb.aio_nbytes = 4 * MIB;
	if (aio_write(&cb))
		return 2;
	while (aio_error(&cb) == EINPROGRESS)
		aio_suspend(l, 1, NULL);
	pid_t pid = fork();
	if (pid == 0) {
		int e = aio_error(&cb);
		ssize_t r = aio_return(&cb);
		printf("child: aio_error %d, aio_return %zd\n", e, r);
		fflush(stdout);
		_exit(0);
	}
	waitpid(pid, &st, 0);
	printf("parent: aio_return %zd\n", aio_return(&cb));
	fill(buf, MIB, 9);
	printf("pwrite %zd\n", pwrite(fd, buf, MIB, MIB));
	close(fd);
	verify(path);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "liowait"))
		return cmd_liowait(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "foreign"))
		return cmd_foreign(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "regrow"))
		return cmd_regrow(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "badwrite"))
		return cmd_badwrite(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "forkaio"))
		return cmd_forkaio(argv[2]);
	fprintf(stderr, "usage: wedge liowait|foreign|regrow|badwrite|forkaio FILE\n");
	return 2;
}
