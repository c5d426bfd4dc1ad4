/*
 * e2e_reader: exercise every interposed read call on one file and print what each returned,
 * the errno it left and the file position after it, so that a run under LD_PRELOAD can be
 * compared line by line with a run without the shim (tests/e2e_test.sh).  Built with
 * _FORTIFY_SOURCE so that reads into arrays of known size go through __read_chk and
 * __pread_chk, as they do in fortified engines.
 *
 *   kvshim-e2e-reader FILE      (FILE at least 3 MiB; its size need not be aligned)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define MIB (1 << 20)

static char big[MIB] __attribute__((aligned(4096)));
static char two[2][MIB / 2] __attribute__((aligned(4096)));
static char spare[MIB + 4096] __attribute__((aligned(4096)));

/* FNV-1a of the first n bytes, so the output shows the data without printing it. */
static uint64_t digest(const char *p, ssize_t n)
{
	uint64_t h = 1469598103934665603ull;

	for (ssize_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
	return h;
}

/* The buffer the last call wrote into, whole: what a call leaves past its count matters too
 * (some file systems zero it on a short O_DIRECT read, none touch it at the end of file). */
static const char *whole;
static size_t whole_len;

#define INTO(buf, len) (whole = (const char *)(buf), whole_len = (len))

static void report(const char *what, int fd, ssize_t n, const char *buf)
{
	int e = errno;
	off_t pos = fd >= 0 ? lseek(fd, 0, SEEK_CUR) : -1;

	printf("%-28s ret %8zd errno %4d pos %8lld data %016llx buffer %016llx\n", what, n, e,
	       (long long)pos, (unsigned long long)(n > 0 && buf ? digest(buf, n) : 0),
	       (unsigned long long)(whole ? digest(whole, (ssize_t)whole_len) : 0));
}

int main(int argc, char **argv)
{
	struct stat st;
	ssize_t n;

	if (argc != 2)
		return 2;
	int fd = open(argv[1], O_RDONLY | O_DIRECT);
	if (fd < 0 || fstat(fd, &st) < 0 || st.st_size < 3 * MIB)
		return 2;
	off_t end = st.st_size & ~(off_t)4095;

	/* Successful reads leave errno alone: set it to a marker first. */
	INTO(big, sizeof(big));
	errno = 4242;
	n = pread(fd, big, MIB, 0);
	report("pread 0", fd, n, big);
	errno = 4242;
	n = pread(fd, big, MIB, MIB + 4096);
	report("pread unaligned-in-shard", fd, n, big);
	errno = 4242;
	lseek(fd, 4096, SEEK_SET);
	n = read(fd, big, MIB); /* fortified: __read_chk */
	report("read at 4096", fd, n, big);
	errno = 4242;
	n = read(fd, big, MIB);
	report("read again", fd, n, big);
	struct iovec v[2] = {{two[0], MIB / 2}, {two[1], MIB / 2}};
	INTO(two, sizeof(two));
	errno = 4242;
	n = readv(fd, v, 2);
	report("readv", fd, n, two[0]);
	errno = 4242;
	n = preadv(fd, v, 2, 2 * MIB);
	report("preadv", fd, n, two[1]);
	errno = 4242;
	n = preadv2(fd, v, 2, MIB, 0);
	report("preadv2 flags 0", fd, n, two[0]);
	errno = 4242;
	n = preadv2(fd, v, 2, -1, 0);
	report("preadv2 at position", fd, n, two[1]);
	INTO(big, sizeof(big));
	errno = 4242;
	n = pread(fd, big, MIB, end - 4096); /* short: end of file */
	report("pread across EOF", fd, n, big);
	errno = 4242;
	n = pread(fd, big, MIB, end + 8192); /* past the end */
	report("pread past EOF", fd, n, big);
	lseek(fd, end, SEEK_SET);
	errno = 4242;
	n = read(fd, big, MIB);
	report("read at EOF", fd, n, big);

	/* Failures: the real call's errno. */
	INTO(spare, sizeof(spare));
	errno = 0;
	n = pread(fd, spare + 1, MIB, 0); /* O_DIRECT needs an aligned buffer */
	report("pread misaligned buffer", fd, n, NULL);
	errno = 0;
	n = pread(fd, big, MIB, -4096);
	report("pread negative offset", fd, n, NULL);
	int wfd = open(argv[1], O_WRONLY);
	errno = 0;
	n = pread(wfd, big, MIB, 0);
	report("pread write-only fd", -1, n, NULL);
	close(wfd);
	errno = 0;
	n = read(-1, big, MIB);
	report("read bad fd", -1, n, NULL);
	close(fd);

	/* stdio: fread through its own buffer, position and EOF as glibc keeps them. */
	FILE *f = fopen(argv[1], "rb");
	char *heap = malloc(3 * MIB);
	if (!f || !heap)
		return 2;
	memset(heap, 0x5a, 3 * MIB);
	INTO(heap, 3 * MIB);
	errno = 4242;
	size_t k = fread(heap, 1, MIB, f);
	report("fread 1 MiB", -1, (ssize_t)k, heap);
	printf("ftell %ld\n", ftell(f));
	errno = 4242;
	k = fread(heap, 4096, 300, f);
	report("fread 300 x 4 KiB", -1, (ssize_t)k, heap);
	printf("ftell %ld feof %d\n", ftell(f), feof(f));
	fseek(f, -100, SEEK_END);
	k = fread(heap, 1, MIB, f);
	report("fread across EOF", -1, (ssize_t)k, heap);
	printf("feof %d ferror %d\n", feof(f), ferror(f));
	fclose(f);
	free(heap);
	return 0;
}
