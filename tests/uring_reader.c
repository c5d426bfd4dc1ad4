/*
 * uring_reader: io_uring reads through liburing (a shared liburing: its calls go through the
 * PLT, as NIXL's and most engines' do), printed so that a run under the shim can be compared
 * line for line with a run without it (tests/uring_test.sh).
 *
 *   uring_reader mix FILE... -- OTHER   every FILE (O_DIRECT) read whole in 1 MiB entries of
 *                                       each kind: READ, READV (two halves), READ_FIXED
 *                                       (registered buffers), READ through a registered file
 *                                       (IOSQE_FIXED_FILE); some with CQE_SKIP_SUCCESS; a
 *                                       linked pair (the second follows the first); OTHER (a
 *                                       file that is not KV) read in between; the last entry of
 *                                       each file asks past its end
 *   uring_reader sqpoll FILE            FILE read whole through a ring with SQPOLL
 *   uring_reader hold FILE N            N 1 MiB reads of FILE submitted in one go, then
 *                                       "submitted" printed and the completions awaited (the
 *                                       test SIGKILLs it meanwhile, the file on slowfs)
 *
 * mix and sqpoll print one line per completion, sorted by entry ("entry E: res R, sum S": S
 * the checksum of the entry's whole buffer, so that past a short read the tail counts too),
 * then the entries that posted none.  Exit 0 unless the command could not run (2).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB	 (1u << 20)
#define MAX_ENT	 512
#define NFIXBUFS 4

struct ent {
	int used;
	int file; /* index of its file */
	int cqes; /* completions seen */
	int res;  /* the last one's */
	int skip; /* CQE_SKIP_SUCCESS: 1 whole (posts no completion), 2 short (posts one) */
	unsigned char *buf;
	size_t len;
};

static struct ent ents[MAX_ENT];
static int nents;

static void die(const char *what, int err)
{
	fprintf(stderr, "uring_reader: %s: %s\n", what, strerror(err));
	exit(2);
}

static uint32_t sum(const unsigned char *p, size_t n)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

static unsigned char *buffer(size_t len)
{
	void *p;

	if (posix_memalign(&p, 4096, len))
		die("posix_memalign", ENOMEM);
	memset(p, 0xa5, len);
	return p;
}

static struct io_uring_sqe *get_sqe(struct io_uring *ring)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe) { /* full: hand these to the kernel first */
		int r = io_uring_submit(ring);
		if (r < 0)
			die("io_uring_submit", -r);
		sqe = io_uring_get_sqe(ring);
	}
	if (!sqe)
		die("io_uring_get_sqe", EBUSY);
	return sqe;
}

static int new_ent(int file, size_t len, unsigned char *buf)
{
	if (nents == MAX_ENT)
		die("too many entries", E2BIG);
	ents[nents] = (struct ent){1, file, 0, 0, 0, buf ? buf : buffer(len), len};
	return nents++;
}

/* Wait for every completion, then print them all.  An entry with CQE_SKIP_SUCCESS posts one
 * only if it fails or comes out short (ents[].skip says which: 1 silent, 2 posts). */
static void reap_and_print(struct io_uring *ring)
{
	int want = 0;

	for (int i = 0; i < nents; i++)
		want += ents[i].skip != 1;
	for (int got = 0; got < want; got++) {
		struct io_uring_cqe *cqe;
		int r = io_uring_wait_cqe(ring, &cqe);

		if (r < 0)
			die("io_uring_wait_cqe", -r);
		int e = (int)cqe->user_data;
		if (e >= 0 && e < nents) {
			ents[e].cqes++;
			ents[e].res = cqe->res;
		}
		io_uring_cqe_seen(ring, cqe);
	}
	struct io_uring_cqe *cqe;
	usleep(20000); /* one that should not come, late */
	while (io_uring_peek_cqe(ring, &cqe) == 0) {
		int e = (int)cqe->user_data;
		if (e >= 0 && e < nents) {
			ents[e].cqes++;
			ents[e].res = cqe->res;
		}
		io_uring_cqe_seen(ring, cqe);
	}
	for (int i = 0; i < nents; i++) {
		if (ents[i].cqes)
			printf("entry %d (file %d): res %d, sum %08x, %d completion(s)\n", i,
			       ents[i].file, ents[i].res, sum(ents[i].buf, ents[i].len),
			       ents[i].cqes);
		else
			printf("entry %d (file %d): no completion (skipped), sum %08x\n", i,
			       ents[i].file, sum(ents[i].buf, ents[i].len));
	}
}

static int cmd_mix(int nfiles, char **paths, const char *other)
{
	struct io_uring ring;
	int fds[64], ofd = open(other, O_RDONLY);
	int r = io_uring_queue_init(64, &ring, 0);

	if (r < 0)
		die("io_uring_queue_init", -r);
	if (nfiles > 63 || ofd < 0)
		die("files", EINVAL);
	for (int i = 0; i < nfiles; i++)
		if ((fds[i] = open(paths[i], O_RDONLY | O_DIRECT)) < 0)
			die(paths[i], errno);
	fds[nfiles] = ofd;
	if ((r = io_uring_register_files(&ring, fds, (unsigned)nfiles + 1)) < 0)
		die("io_uring_register_files", -r);
	struct iovec fixed[NFIXBUFS];
	for (int i = 0; i < NFIXBUFS; i++)
		fixed[i] = (struct iovec){buffer(MIB), MIB};
	if ((r = io_uring_register_buffers(&ring, fixed, NFIXBUFS)) < 0)
		die("io_uring_register_buffers", -r);
	int nfixed = 0;

	for (int f = 0; f < nfiles; f++) {
		struct stat st;
		if (fstat(fds[f], &st))
			die("fstat", errno);
		size_t size = (size_t)st.st_size, chunks = (size + MIB - 1) / MIB;
		for (size_t k = 0; k <= chunks; k++) { /* one past the last: a read at the end */
			off_t off = (off_t)(k * MIB);
			int kind = (int)((k + (size_t)f) % 5);
			struct io_uring_sqe *sqe = get_sqe(&ring);
			int e;

			if (kind == 0) { /* plain READ */
				e = new_ent(f, MIB, NULL);
				io_uring_prep_read(sqe, fds[f], ents[e].buf, MIB, (__u64)off);
			} else if (kind == 1) { /* READV, two halves */
				e = new_ent(f, MIB, NULL);
				struct iovec *v = malloc(2 * sizeof(*v));
				v[0] = (struct iovec){ents[e].buf, MIB / 2};
				v[1] = (struct iovec){ents[e].buf + MIB / 2, MIB / 2};
				io_uring_prep_readv(sqe, fds[f], v, 2, (__u64)off);
			} else if (kind == 2 && nfixed < NFIXBUFS) { /* READ_FIXED */
				e = new_ent(f, MIB, fixed[nfixed].iov_base);
				io_uring_prep_read_fixed(sqe, fds[f], ents[e].buf, MIB, (__u64)off,
							 nfixed);
				nfixed++;
			} else if (kind == 3) { /* a registered file, its CQE skipped on success */
				e = new_ent(f, MIB, NULL);
				io_uring_prep_read(sqe, f, ents[e].buf, MIB, (__u64)off);
				sqe->flags |= IOSQE_FIXED_FILE | IOSQE_CQE_SKIP_SUCCESS;
				ents[e].skip = (size_t)off + MIB <= size ? 1 : 2; /* short: posts */
			} else { /* a linked pair: this one, then the other file's read after it */
				e = new_ent(f, MIB, NULL);
				io_uring_prep_read(sqe, fds[f], ents[e].buf, MIB, (__u64)off);
				sqe->flags |= IOSQE_IO_LINK;
				io_uring_sqe_set_data64(sqe, (__u64)e);
				sqe = get_sqe(&ring);
				e = new_ent(nfiles, 4096, NULL);
				io_uring_prep_read(sqe, ofd, ents[e].buf, 4096, 0);
			}
			io_uring_sqe_set_data64(sqe, (__u64)e);
		}
		if ((r = io_uring_submit(&ring)) < 0)
			die("io_uring_submit", -r);
	}
	reap_and_print(&ring);
	io_uring_queue_exit(&ring);
	return 0;
}

static int cmd_sqpoll(const char *path)
{
	struct io_uring ring;
	struct io_uring_params p = {.flags = IORING_SETUP_SQPOLL, .sq_thread_idle = 100};
	int fd = open(path, O_RDONLY | O_DIRECT);
	struct stat st;

	int r = io_uring_queue_init_params(16, &ring, &p);
	if (r < 0)
		die("io_uring_queue_init_params (SQPOLL)", -r);
	if (fd < 0 || fstat(fd, &st))
		die(path, errno);
	for (off_t off = 0; off < st.st_size; off += MIB) {
		struct io_uring_sqe *sqe = get_sqe(&ring);
		int e = new_ent(0, MIB, NULL);

		io_uring_prep_read(sqe, fd, ents[e].buf, MIB, (__u64)off);
		io_uring_sqe_set_data64(sqe, (__u64)e);
	}
	if ((r = io_uring_submit(&ring)) < 0)
		die("io_uring_submit", -r);
	reap_and_print(&ring);
	io_uring_queue_exit(&ring);
	return 0;
}

static int cmd_hold(const char *path, int n)
{
	struct io_uring ring;
	int fd = open(path, O_RDONLY | O_DIRECT);
	int r = io_uring_queue_init(64, &ring, 0);

	if (r < 0 || fd < 0 || n <= 0 || n > 64)
		die("set-up", r < 0 ? -r : errno);
	for (int i = 0; i < n; i++) {
		struct io_uring_sqe *sqe = get_sqe(&ring);
		int e = new_ent(0, MIB, NULL);

		io_uring_prep_read(sqe, fd, ents[e].buf, MIB, (__u64)i * MIB);
		io_uring_sqe_set_data64(sqe, (__u64)e);
	}
	printf("submitting\n");
	fflush(stdout);
	r = io_uring_submit(&ring);
	printf("submitted %d\n", r);
	fflush(stdout);
	reap_and_print(&ring);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 5 && !strcmp(argv[1], "mix") && !strcmp(argv[argc - 2], "--"))
		return cmd_mix(argc - 4, argv + 2, argv[argc - 1]);
	if (argc == 3 && !strcmp(argv[1], "sqpoll"))
		return cmd_sqpoll(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "hold"))
		return cmd_hold(argv[2], atoi(argv[3]));
	fprintf(stderr, "usage: uring_reader mix FILE... -- OTHER | sqpoll FILE | hold FILE N\n");
	return 2;
}
