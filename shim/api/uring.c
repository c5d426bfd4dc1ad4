/*
 * uring: the engine of the program's io_uring reads of KV files, served at submission (its
 * doors: hooks/uring.c for liburing's names, hooks/syscall.c for the io_uring numbers).
 *
 * DESIGN
 *
 * Where the entries are seen.  A program hands submission queue entries (SQEs) to the kernel
 * in io_uring_enter; until then they are in memory the program shares with the kernel, which
 * reads them during that call (no SQPOLL).  The shim sees that moment through two doors:
 *   - liburing's exported functions, called through the PLT (io_uring_submit and the other
 *     calls that submit, below): the ring is liburing's struct io_uring, whose layout is
 *     liburing's ABI since 2.0; the entries not yet seen by the kernel are [*khead, sqe_tail).
 *     Modern liburing makes its system calls itself, so this is the only door for NIXL's
 *     bundled liburing or Debian's.  The real function is the caller's liburing (the library
 *     its own lookup scope finds: a plugin's private liburing too), never the shim's own copy,
 *     which is renamed (CMakeLists.txt).
 *   - libc's syscall() (hooks/syscall.c calls kvs_uring_setup_done, kvs_uring_enter and
 *     kvs_uring_register): io_uring_setup gives the ring's offsets, the mmap hook gives where
 *     its SQ ring and SQE array are mapped (kvs_uring_mapped), and
 *     io_uring_enter(fd, to_submit) names the entries [*khead, *khead + to_submit) (fio's own
 *     io_uring code).
 * A ring mapped through mmap() whose setup the shim did not see is said once at info: its
 * reads are not served.
 *
 * What is served.  IORING_OP_READ and READV of a KV file at an explicit offset, no RWF flags,
 * no buffer selection (not READ_FIXED: whether its address lies in the registered buffer is the
 * kernel's to check); by descriptor, or by registered-file index when
 * IOSQE_FIXED_FILE is set (the table recorded from io_uring_register / the liburing calls,
 * each slot with the identity of the file it was registered with, checked against the
 * descriptor number at serve time).  Not an entry that follows a linked one (its read must
 * wait for its predecessor), nor one with IOSQE_IO_DRAIN.  The candidates of one submission
 * are started together through the asynchronous path (kvs_shim_read_start: hits copied at
 * once, misses loaded as the synchronous path loads them), and the submit waits for them; each
 * one served is rewritten into IORING_OP_NOP with IORING_NOP_INJECT_RESULT and the byte count,
 * keeping its user_data and its IO_LINK, IO_HARDLINK, CQE_SKIP_SUCCESS and ASYNC flags, so the
 * kernel completes it as the read would have.  A read that reaches past the end of the file is
 * left to the kernel, and so is one that comes out short: a short read breaks a link and posts
 * its CQE despite CQE_SKIP_SUCCESS, and O_DIRECT leaves its own tail past the end.  So is an
 * entry the cache failed (the kernel reads it again).
 *
 * Passed through, counted (unserved_io_uring) and said once per cause: SQPOLL rings (the
 * kernel takes entries whenever it likes), a kernel without NOP result injection (probed
 * once), a registered ring descriptor on the syscall door, a fixed-file table the shim does not
 * know (files installed by the ring itself), a ring seen only at mmap.  Every other read entry
 * of a KV file left to the kernel (above: READ_FIXED, linked, drained, past the end, short) is
 * counted in unserved_io_uring too, without a line of its own (declined).
 *
 * Threads.  tables_mu guards the ring and file tables; it is never held across a read or a
 * call into liburing, and across one kind of system call only: files_set fstats each file it
 * records (its identity), under the lock.  A submission's reads complete on the loader's
 * completion thread, which signals the batch's condition variable.
 *
 * Files (their shared state and calls: api/uring_int.h): this one holds the serving (the
 * kernel's NOP probed, the pending entries read, served and rewritten, the changes followed)
 * and the two submitting doors (kvs_uring_serve_liburing, kvs_uring_enter); api/uring_rings.c
 * the ring and file tables (tables_mu, kvs_uring_files_set), the causes said once, and the
 * syscall door's records (kvs_uring_setup_done, kvs_uring_mapped, kvs_uring_register).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dlsym.h"
#include "elfsym.h"
#include "uring.h"
#include "uring_int.h"
#include "config.h"
#include "log.h"
#include "raw.h"
#include "shim.h"
#include "wthru.h"

#ifndef IORING_NOP_INJECT_RESULT
#define IORING_NOP_INJECT_RESULT (1U << 0)
#endif
#ifndef IORING_SETUP_NO_MMAP
#define IORING_SETUP_NO_MMAP (1U << 14)
#endif
#ifndef IORING_SETUP_NO_SQARRAY
#define IORING_SETUP_NO_SQARRAY (1U << 16)
#endif
#ifndef IORING_ENTER_REGISTERED_RING
#define IORING_ENTER_REGISTERED_RING (1U << 4)
#endif

/* ------------------------------------------------------------------ the kernel's NOP */

/* Does this kernel complete IORING_OP_NOP with IORING_NOP_INJECT_RESULT's result?  Asked once
 * of a ring of the shim's own, through raw system calls (base/raw.h): no hook sees it. */
static bool probe_inject(void)
{
	struct io_uring_params p;
	bool ok = false;

	memset(&p, 0, sizeof(p));
	int fd = (int)kvs_syscall(SYS_io_uring_setup, 2, &p);
	if (fd < 0)
		return false;
	size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	size_t sqe_len = p.sq_entries * sizeof(struct io_uring_sqe);
	char *sq = kvs_sys_mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
				IORING_OFF_SQ_RING);
	char *cq = kvs_sys_mmap(NULL, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
				IORING_OFF_CQ_RING);
	struct io_uring_sqe *sqe = kvs_sys_mmap(NULL, sqe_len, PROT_READ | PROT_WRITE,
						MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
	if (sq != MAP_FAILED && cq != MAP_FAILED && sqe != MAP_FAILED) {
		unsigned *tail = (unsigned *)(sq + p.sq_off.tail);
		unsigned *array = (unsigned *)(sq + p.sq_off.array);

		memset(sqe, 0, sizeof(*sqe));
		sqe->opcode = IORING_OP_NOP;
		sqe->rw_flags = IORING_NOP_INJECT_RESULT;
		sqe->len = 4242;
		sqe->user_data = 7;
		array[*tail & *(unsigned *)(sq + p.sq_off.ring_mask)] = 0;
		__atomic_store_n(tail, *tail + 1, __ATOMIC_RELEASE);
		if (kvs_syscall(SYS_io_uring_enter, fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) ==
		    1) {
			unsigned head =
			    __atomic_load_n((unsigned *)(cq + p.cq_off.head), __ATOMIC_ACQUIRE);
			struct io_uring_cqe *cqe = (struct io_uring_cqe *)(cq + p.cq_off.cqes) +
						   (head & *(unsigned *)(cq + p.cq_off.ring_mask));
			ok = cqe->user_data == 7 && cqe->res == 4242;
		}
	}
	if (sq != MAP_FAILED)
		kvs_sys_munmap(sq, sq_len);
	if (cq != MAP_FAILED)
		kvs_sys_munmap(cq, cq_len);
	if (sqe != MAP_FAILED)
		kvs_sys_munmap(sqe, sqe_len);
	kvs_sys_close(fd);
	return ok;
}

static bool inject_ok(void)
{
	static _Atomic int known; /* 0 unknown, 1 yes, 2 no */
	int k = atomic_load_explicit(&known, memory_order_relaxed);

	if (!k) {
		k = probe_inject() ? 1 : 2;
		atomic_store_explicit(&known, k, memory_order_relaxed);
	}
	return k == 1;
}

/* ------------------------------------------------------------------ serving */

/* A ring's pending entries, whichever door they came through. */
struct view {
	int ring_fd;
	char *sqes;
	unsigned stride; /* bytes per SQE: 64, or 128 with IORING_SETUP_SQE128 */
	unsigned mask;
	const unsigned *array; /* NULL: IORING_SETUP_NO_SQARRAY, entries in ring order */
	unsigned head, tail;   /* [head, tail): the entries the kernel will take */
	unsigned flags;	       /* the ring's setup flags */
};

struct batch {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	unsigned left;
};

struct cand {
	struct kvs_shim_async a; /* a.arg: the batch */
	struct io_uring_sqe *sqe;
	struct iovec iov;
	struct iovec *iovcopy; /* READV: the program's iovecs, copied (read_of) */
	uint64_t asked;
	int state; /* 0 not started, 1 over (result), 2 in flight */
	int64_t result;
};

static void cand_done(struct kvs_shim_async *a, int64_t result)
{
	struct cand *c = (struct cand *)((char *)a - offsetof(struct cand, a));
	struct batch *b = a->arg;

	pthread_mutex_lock(&b->mu);
	c->result = result;
	c->state = 1;
	if (--b->left == 0)
		pthread_cond_broadcast(&b->cond);
	pthread_mutex_unlock(&b->mu);
}

/* The descriptor and the bytes of sqe if it is a read the shim may serve; -1 if not. */
static int read_of(const struct view *v, const struct io_uring_sqe *sqe, struct iovec *iov,
		   const struct iovec **iovp, int *iovcnt)
{
	/* Not READ_FIXED: whether its address lies in the registered buffer is the kernel's
	 * to check (-EFAULT), and the shim does not track those buffers. */
	if (sqe->opcode != IORING_OP_READ && sqe->opcode != IORING_OP_READV)
		return -1;
	if (sqe->off == (__u64)-1 || sqe->off > (__u64)LLONG_MAX || sqe->rw_flags ||
	    (sqe->flags & (IOSQE_BUFFER_SELECT | IOSQE_IO_DRAIN)))
		return -1;
	if (sqe->opcode == IORING_OP_READV) {
		/* The program's iovec array, copied the way that cannot fault: a bad address is the
		 * kernel's -EFAULT, not the shim's SIGSEGV. */
		struct iovec *copy =
		    sqe->len && sqe->len <= IOV_MAX ? malloc(sqe->len * sizeof(*copy)) : NULL;
		struct iovec local = {copy, sqe->len * sizeof(*copy)};
		struct iovec remote = {(void *)(uintptr_t)sqe->addr, sqe->len * sizeof(*copy)};
		if (!copy || kvs_syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1,
					 0) != (long)(sqe->len * sizeof(*copy))) {
			free(copy);
			return -1;
		}
		*iovp = copy;
		*iovcnt = (int)sqe->len;
	} else {
		iov->iov_base = (void *)(uintptr_t)sqe->addr;
		iov->iov_len = sqe->len;
		*iovp = iov;
		*iovcnt = 1;
	}
	if (!(sqe->flags & IOSQE_FIXED_FILE))
		return sqe->fd;
	int fd = uring_fixed_fd(v->ring_fd, (unsigned)sqe->fd);
	if (fd < 0)
		uring_unserved(C_FIXED, -1);
	return fd;
}

/* Does sqe change the ring's registered files (so the recorded table no longer holds)? */
static bool changes_files(const struct io_uring_sqe *sqe)
{
	if (sqe->opcode == IORING_OP_MSG_RING) {
		/* it may install a file in another ring */
		atomic_store(&uring_fixed_untrusted, true);
		return true;
	}
	if (sqe->opcode >= IORING_OP_LAST)
		return true; /* an operation newer than this build knows (a direct pipe...) */
	switch (sqe->opcode) {
	case IORING_OP_FILES_UPDATE:
		return true;
	case IORING_OP_OPENAT:
	case IORING_OP_OPENAT2:
	case IORING_OP_ACCEPT:
	case IORING_OP_CLOSE:
#ifdef IORING_OP_SOCKET
	case IORING_OP_SOCKET:
#endif
		return sqe->file_index != 0;
	default:
		return false;
	}
}

static struct io_uring_sqe *sqe_at(const struct view *v, unsigned i)
{
	unsigned idx = v->array ? v->array[i & v->mask] : i & v->mask;

	if (idx > v->mask)
		return NULL; /* a corrupt array entry: the kernel will say so */
	return (struct io_uring_sqe *)(v->sqes + (size_t)idx * v->stride);
}

/* The set-up flags whose rings the shim serves; any other (IOPOLL: a buffered read is the
 * kernel's -EOPNOTSUPP there; mixed SQE sizes; anything newer) passes through whole. */
#define KNOWN_SETUP                                                                                \
	((1U << 1) | (1U << 2) | (1U << 3) | (1U << 4) | (1U << 5) | (1U << 6) | (1U << 7) |       \
	 (1U << 8) | (1U << 9) | IORING_SETUP_SQE128 | (1U << 11) | (1U << 12) | (1U << 13) |      \
	 (1U << 15) | IORING_SETUP_NO_SQARRAY)

/* IORING_OP_FTRUNCATE (Linux 6.9), by number: liburing's headers may be older. */
#define KVS_IORING_OP_FTRUNCATE 55

/* A change of a KV file through the ring (a write, a fallocate, a splice into it, a
 * truncation): it is
 * followed as a change the kernel has been handed already (kvs_shim_change_now): its shards are
 * dropped from the cache before the kernel has it (as kernel AIO writes are, api/kaio.c), so
 * no later read is served the old bytes, and no staged copy of the file, this process's or
 * another's, keeps them.  Its completion is not looked for: a publication of the file before
 * it lands keeps none of its range. */
static void invalidate_if_write(const struct view *v, const struct io_uring_sqe *sqe)
{
	uint64_t len = 0, off = sqe->off;
	int fd;

	if (sqe->opcode == IORING_OP_WRITE || sqe->opcode == IORING_OP_WRITE_FIXED) {
		len = sqe->len;
	} else if (sqe->opcode == IORING_OP_WRITEV && sqe->len && sqe->len <= IOV_MAX) {
		struct iovec local[KVS_IOV_LOCAL];

		if (!kvs_shim_iov_read((const struct iovec *)(uintptr_t)sqe->addr, (int)sqe->len,
				       local, &len))
			len = UINT64_MAX; /* unknown: everything from the offset on */
	} else if (sqe->opcode == IORING_OP_FALLOCATE) {
		len = sqe->addr;	      /* the length, as io_uring_prep_fallocate puts it */
		if (sqe->len & (0x08 | 0x20)) /* COLLAPSE_RANGE, INSERT_RANGE: all past off */
			len = UINT64_MAX;
	} else if (sqe->opcode == IORING_OP_SPLICE) {
		/* Into fd at off (the out side; -1: its position). */
		len = sqe->len;
	} else if (sqe->opcode == KVS_IORING_OP_FTRUNCATE) {
		len = UINT64_MAX; /* off is the new length */
	} else {
		return;
	}
	fd = (sqe->flags & IOSQE_FIXED_FILE) ? uring_fixed_fd(v->ring_fd, (unsigned)sqe->fd)
					     : sqe->fd;
	if (fd < 0) {
		if (sqe->flags & IOSQE_FIXED_FILE)
			uring_unserved(C_FIXED, -1); /* a change the shim cannot name: said */
		return;
	}
	if (sqe->opcode == KVS_IORING_OP_FTRUNCATE) {
		struct kvs_shim_change ch;

		if (off <= (__u64)LLONG_MAX && kvs_shim_truncate_before(&ch, fd, (int64_t)off))
			kvs_shim_change_after(&ch, 0);
	} else if (off == (__u64)-1)
		kvs_shim_change_now(fd, KVS_WT_AT_POS, len);
	else if (off <= (__u64)LLONG_MAX)
		kvs_shim_change_now(fd, (int64_t)off, len);
}

/* sqe, a read the shim leaves to the kernel (READ_FIXED, one that follows a link or a drain,
 * with RWF flags, up to or past the end of the file, shorter than files.min_read, or one that
 * came out short): counted in unserved_io_uring when it reads a KV file.  A registered file the
 * shim cannot name was counted by read_of. */
static void declined(const struct view *v, const struct io_uring_sqe *sqe)
{
	if (sqe->opcode != IORING_OP_READ && sqe->opcode != IORING_OP_READV &&
	    sqe->opcode != IORING_OP_READ_FIXED)
		return;
	int fd = (sqe->flags & IOSQE_FIXED_FILE) ? uring_fixed_fd(v->ring_fd, (unsigned)sqe->fd)
						 : sqe->fd;
	if (fd < 0)
		return;
	/* READ and READ_FIXED name their bytes; a READV's iovecs are not read again for it. */
	kvs_shim_note_uring_unserved(fd, sqe->off,
				     sqe->opcode == IORING_OP_READV ? 0 : (uint64_t)sqe->len);
	if (sqe->opcode == IORING_OP_READ_FIXED && kvs_shim_is_kv(fd))
		kvs_log_once(
		    KVS_CAUSE_URING_READ_FIXED, KVS_LOG_INFO,
		    "an io_uring READ_FIXED of a KV file (into buffers registered with the "
		    "ring): not served (counted in unserved_io_uring)");
}

/* Serve what can be served of v's pending entries and rewrite those into NOPs. */
static void serve(const struct view *v)
{
	unsigned n = v->tail - v->head;

	if (n == 0 || n > 65536 || !kvs_shim_wants(SIZE_MAX) || !inject_ok() ||
	    (v->flags & ~KNOWN_SETUP))
		return;
	struct cand *c = NULL;
	unsigned nc = 0;
	struct batch b = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
	bool linked = false; /* the previous entry links to this one */

	bool drained = false; /* an IOSQE_IO_DRAIN entry came: the rest waits for it */
	int cancel_state;

	/* The wait below must not be a cancellation point: reads in flight would complete into
	 * a stack that is gone. */
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
	for (unsigned i = v->head; i != v->tail; i++) {
		struct io_uring_sqe *sqe = sqe_at(v, i);
		struct iovec iov;
		const struct iovec *iovp = NULL;
		int iovcnt, fd;

		if (!sqe)
			break;
		bool follows = linked;
		linked = sqe->flags & (IOSQE_IO_LINK | IOSQE_IO_HARDLINK);
		drained = drained || (sqe->flags & IOSQE_IO_DRAIN);
		if (changes_files(sqe))
			kvs_uring_files_unknown(v->ring_fd);
		invalidate_if_write(v, sqe);
		if (follows || drained || (fd = read_of(v, sqe, &iov, &iovp, &iovcnt)) < 0) {
			if (iovp && iovp != &iov)
				free((void *)iovp); /* read_of's copy of a READV's iovecs */
			declined(v, sqe);
			continue;
		}
		struct iovec *copy = iovp != &iov ? (struct iovec *)iovp : NULL;
		uint64_t len = 0;
		for (int k = 0; k < iovcnt; k++)
			len += iovp[k].iov_len;
		struct stat st;
		if (len == 0 || len > INT32_MAX || !kvs_shim_wants(len) || fstat(fd, &st) != 0 ||
		    sqe->off + len > (uint64_t)st.st_size || (!c && !(c = calloc(n, sizeof(*c))))) {
			free(
			    copy); /* up to or past the end of the file: the kernel's (see below) */
			declined(v, sqe);
			continue;
		}
		struct cand *x = &c[nc];
		x->sqe = sqe;
		x->iov = iov;
		x->iovcopy = copy;
		x->asked = len;
		x->a.arg = &b;
		pthread_mutex_lock(&b.mu);
		b.left++;
		pthread_mutex_unlock(&b.mu);
		int r = kvs_shim_read_start(&x->a, fd, copy ? copy : &x->iov, iovcnt,
					    (off_t)sqe->off, cand_done);
		pthread_mutex_lock(&b.mu);
		if (r != 0)
			b.left--; /* done will not be called */
		pthread_mutex_unlock(&b.mu);
		if (r == 1) {
			x->state = 1;
			x->result = x->a.result;
		} else if (r == 0) {
			x->state = 2;
		} else {
			free(copy);
			x->iovcopy = NULL;
			continue; /* not served: the kernel reads it */
		}
		nc++;
	}
	pthread_mutex_lock(&b.mu);
	while (b.left)
		pthread_cond_wait(&b.cond, &b.mu);
	pthread_mutex_unlock(&b.mu);
	for (unsigned k = 0; k < nc; k++) {
		struct io_uring_sqe *sqe = c[k].sqe;
		int64_t res = c[k].result;

		/* Short (the end of the file), or failed: the kernel reads it again and answers as
		 * it would (a short read breaks a link and posts a CQE despite CQE_SKIP_SUCCESS,
		 * and O_DIRECT leaves its own tail past the end); only the file's last shard is
		 * read twice. */
		if (res < (int64_t)c[k].asked) {
			if (res >= 0)
				declined(v, sqe); /* a failure was counted as unserved_fallback */
			continue;
		}
		__u64 user_data = sqe->user_data;
		__u8 flags = sqe->flags & (IOSQE_IO_LINK | IOSQE_IO_HARDLINK |
					   IOSQE_CQE_SKIP_SUCCESS | IOSQE_ASYNC);
		__u16 personality = sqe->personality;
		memset(sqe, 0, v->stride);
		sqe->opcode = IORING_OP_NOP;
		sqe->flags = flags;
		sqe->fd = -1;
		sqe->len = (__u32)res;
		sqe->rw_flags = IORING_NOP_INJECT_RESULT;
		sqe->user_data = user_data;
		sqe->personality = personality;
	}
	for (unsigned k = 0; k < nc; k++)
		free(c[k].iovcopy);
	free(c);
	pthread_cond_destroy(&b.cond);
	pthread_mutex_destroy(&b.mu);
	pthread_setcancelstate(cancel_state, NULL);
}

/* Count the KV entries of a ring the shim passes through whole (SQPOLL, no NOP injection);
 * its changes of files are followed still. */
static void pass_all(const struct view *v, enum cause why)
{
	for (unsigned i = v->head; i != v->tail && v->tail - v->head <= 65536; i++) {
		struct io_uring_sqe *sqe = sqe_at(v, i);

		if (sqe)
			invalidate_if_write(v, sqe);

		if (sqe &&
		    (sqe->opcode == IORING_OP_READ || sqe->opcode == IORING_OP_READV ||
		     sqe->opcode == IORING_OP_READ_FIXED) &&
		    !(sqe->flags & IOSQE_FIXED_FILE))
			uring_unserved(why, sqe->fd);
	}
}

/* ------------------------------------------------------------------ liburing's rings */

void kvs_uring_serve_liburing(struct io_uring *ring, bool flushed_only, unsigned limit)
{
	if (!ring || !ring->sq.khead || !ring->sq.sqes || !ring->sq.ring_entries)
		return;
	int saved = errno;
	struct view v = {
	    .ring_fd = ring->ring_fd,
	    .sqes = (char *)ring->sq.sqes,
	    .stride = (ring->flags & IORING_SETUP_SQE128) ? 128 : 64,
	    .mask = ring->sq.ring_mask ? ring->sq.ring_mask : *ring->sq.kring_mask,
	    .array = (ring->flags & IORING_SETUP_NO_SQARRAY) ? NULL : ring->sq.array,
	    .head = __atomic_load_n(ring->sq.khead, __ATOMIC_ACQUIRE),
	    .tail = ring->sq.sqe_tail,
	    .flags = ring->flags,
	};
	if (flushed_only) {
		unsigned kt = __atomic_load_n(ring->sq.ktail, __ATOMIC_ACQUIRE);
		v.tail = kt - v.head > limit ? v.head + limit : kt;
	}
	static __thread int last_seen = -1;
	bool known = last_seen == ring->ring_fd;
	uring_ring_seen(ring->ring_fd, &known);
	last_seen = ring->ring_fd;
	if (v.tail != v.head) {
		if (ring->flags & IORING_SETUP_SQPOLL)
			pass_all(&v, C_SQPOLL);
		else if (kvs_shim_wants(SIZE_MAX) && !inject_ok())
			pass_all(&v, C_NOP);
		else
			serve(&v);
	}
	errno = saved;
}

/* ------------------------------------------------------------------ the syscall door */

void kvs_uring_enter(int fd, unsigned to_submit, unsigned flags)
{
	if (to_submit == 0 || !atomic_load_explicit(&uring_nrings, memory_order_relaxed))
		return;
	if (flags & IORING_ENTER_REGISTERED_RING) {
		uring_unserved(C_REGRING, -1);
		return;
	}
	struct view v = {.ring_fd = fd};
	bool sqpoll = false, ok = false;

	uring_lock_tables();
	struct ring *r = uring_ring_locked(fd, false);
	if (r)
		r->seen_submit = true;
	if (r && r->raw && r->sq_ring && r->sqes && !(r->flags & IORING_SETUP_NO_MMAP)) {
		v.sqes = r->sqes;
		v.stride = (r->flags & IORING_SETUP_SQE128) ? 128 : 64;
		v.mask = *(unsigned *)(r->sq_ring + r->off_mask);
		v.array = (r->flags & IORING_SETUP_NO_SQARRAY)
			      ? NULL
			      : (const unsigned *)(r->sq_ring + r->off_array);
		v.head = __atomic_load_n((unsigned *)(r->sq_ring + r->off_head), __ATOMIC_ACQUIRE);
		v.tail = __atomic_load_n((unsigned *)(r->sq_ring + r->off_tail), __ATOMIC_ACQUIRE);
		v.flags = r->flags;
		sqpoll = r->flags & IORING_SETUP_SQPOLL;
		ok = true;
	}
	uring_unlock_tables();
	if (!ok)
		return;
	if (v.tail - v.head > to_submit)
		v.tail = v.head + to_submit; /* the kernel takes only these */
	if (sqpoll)
		pass_all(&v, C_SQPOLL);
	else if (kvs_shim_wants(SIZE_MAX) && !inject_ok())
		pass_all(&v, C_NOP);
	else
		serve(&v);
}
