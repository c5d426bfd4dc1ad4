/*
 * kaio_serve: the kernel AIO engine's served reads and their carriers (kaio_int.h): a read the
 * cache takes started in the loader and waited for with the others of its chunk (struct batch),
 * then the program's iocb rewritten into its carrier, a write of the bytes to /dev/null (the
 * carriers' descriptor, kaio_devnull), or put back as it was when submitted again.  The
 * protocol is the DESIGN comment of api/kaio.c.
 */
#include <fcntl.h>
#include <limits.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include "fdinfo.h"
#include "kaio.h"
#include "kaio_int.h"
#include "progmem.h"
#include "raw.h"
#include "shim.h"
#include "sys.h"

#ifndef IOCB_FLAG_IOPRIO
#define IOCB_FLAG_IOPRIO (1 << 1)
#endif

pthread_mutex_t kaio_carriers_mu = PTHREAD_MUTEX_INITIALIZER; /* the carriers' table */

/* The carriers' descriptor: /dev/null, opened for writing at the first served entry. */
struct kvs_ownfd kaio_devnull = KVS_OWNFD_INIT;

/* ------------------------------------------------------------------ carriers */

void kvs_libaio_numbers_closing(unsigned int lo, unsigned int hi)
{
	kvs_ownfd_closing(&kaio_devnull, lo, hi);
}

bool kvs_libaio_numbers_in(unsigned int lo, unsigned int hi)
{
	return kvs_ownfd_in(&kaio_devnull, lo, hi);
}

/* The carriers' descriptor, held (kvs_ownfd_put with *ticket), or -1: serve nothing. */
int kaio_devnull_get(unsigned int *ticket)
{
	int fd = kvs_ownfd_get(&kaio_devnull, ticket);
	struct stat st;

	if (fd >= 0)
		return fd;
	if (kvs_ownfd_peek(&kaio_devnull) >= 0)
		return -1; /* there, but not ours any more (a close the hooks did not see) */
	fd = kvs_sys_openat(AT_FDCWD, "/dev/null", O_WRONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	fd = kvs_fd_move_high(fd);
	if (RAW(SYS_fstat, fd, &st, 0, 0, 0, 0) != 0 || !S_ISCHR(st.st_mode)) {
		kvs_sys_close(fd);
		return -1;
	}
	kaio_devnull.dev = (uint64_t)st.st_dev;
	kaio_devnull.ino = (uint64_t)st.st_ino;
	if (!kvs_ownfd_publish(&kaio_devnull, fd))
		kvs_sys_close(fd); /* another thread was first: use its */
	return kvs_ownfd_get(&kaio_devnull, ticket);
}

/* Carriers the program may submit again as they are (an iocb prepared once and submitted
 * again without io_prep_*), by the iocb's address: what it was and what it is now.  Under
 * kaio_carriers_mu; a slot is overwritten by the next carrier that hashes there. */
#define CARRIERS 1024
static struct carried {
	uintptr_t obj;
	struct iocb was, as;
} carriers[CARRIERS];

static struct carried *carried_slot(uintptr_t obj)
{
	return &carriers[(obj >> 6) * 0x9E3779B97F4A7C15ull >> 54];
}

/* Rewrite the program's iocb at obj (cb: our copy of it) into the carrier of a served read
 * that gave all its len bytes: a write of them to /dev/null, which the kernel completes at
 * once with that count, through the program's context, its aio_data, its eventfd and its
 * iocb's address.  Only the opcode and the descriptor change (PREAD to PWRITE, PREADV to
 * PWRITEV over the same array: the same count either way).  The iocb stays so once submitted:
 * the kernel posts the event during the io_submit, and the program may then free its memory.
 * False, with the iocb untouched: the entry goes to the kernel as it is.  A short read (the
 * end of the file) is never carried: a carrier's count is its aio_nbytes, and a program that
 * compares its result with aio_nbytes must see it short. */
bool kaio_carrier_set(struct iocb *obj, const struct iocb *cb, size_t len, int64_t result,
		      int nullfd)
{
	struct iocb k = *cb;

	if (result < 0 || (uint64_t)result != len)
		return false;
	k.aio_fildes = (uint32_t)nullfd;
	k.aio_lio_opcode =
	    cb->aio_lio_opcode == IOCB_CMD_PREADV ? IOCB_CMD_PWRITEV : IOCB_CMD_PWRITE;
	if (!kvs_progmem_store(obj, &k, sizeof(k)))
		return false;
	struct carried *e = carried_slot((uintptr_t)obj);
	pthread_mutex_lock(&kaio_carriers_mu);
	*e = (struct carried){(uintptr_t)obj, *cb, k};
	pthread_mutex_unlock(&kaio_carriers_mu);
	return true;
}

/* The program submits the iocb at obj (cb: our copy) again: if it still holds a carrier's
 * opcode and descriptor (the program may have changed its offset, buffer or data, as a reused
 * iocb is), those two are put back as they were, in the program's memory and in cb, before
 * the kernel reads it (the program owns it again: it is submitting it).  A carrier whose slot
 * another took since is not known any more: it goes to the kernel as a write to /dev/null, so
 * the slots are many (CARRIERS) and a miss is a read that returns no bytes, said nowhere. */
void kaio_carrier_undo(struct iocb *obj, struct iocb *cb)
{
	struct carried *e = carried_slot((uintptr_t)obj), c;

	pthread_mutex_lock(&kaio_carriers_mu);
	c = *e;
	pthread_mutex_unlock(&kaio_carriers_mu);
	if (c.obj != (uintptr_t)obj || cb->aio_fildes != c.as.aio_fildes ||
	    cb->aio_lio_opcode != c.as.aio_lio_opcode)
		return;
	struct iocb k = *cb;
	k.aio_fildes = c.was.aio_fildes;
	k.aio_lio_opcode = c.was.aio_lio_opcode;
	if (kvs_progmem_store(obj, &k, sizeof(k)))
		*cb = k;
}

/* ------------------------------------------------------------------ served entries */

/* A served entry is over (the loader's completion thread).  The result is stored before the
 * count drops (release: pairs with the acquire in kaio_batch_wait); the last one wakes the
 * submitter, which may free the batch as soon as it sees 0: the wake is the last touch. */
static void served_done(struct kvs_shim_async *a, int64_t result)
{
	struct served *s = (struct served *)a;
	struct batch *b = a->arg;

	s->result = result;
	if (atomic_fetch_sub_explicit(&b->running, 1, memory_order_release) == 1)
		kvs_futex_wake(&b->running, 1, false); /* on freed memory at worst: harmless */
}

/* Wait until every started entry of b has its result. */
void kaio_batch_wait(struct batch *b)
{
	uint32_t n;

	while ((n = atomic_load_explicit(&b->running, memory_order_acquire)) != 0) /* pairs above */
		kvs_futex_wait(&b->running, n, 0, false);
}

/* Bytes cb reads if the shim could serve it; 0 if it is not a read the shim takes. */
size_t kaio_candidate(const struct iocb *cb)
{
	size_t len = 0;

	if (!cb || cb->aio_rw_flags || cb->aio_reserved2 || (int64_t)cb->aio_offset < 0 ||
	    (cb->aio_flags & ~(uint32_t)(IOCB_FLAG_RESFD | IOCB_FLAG_IOPRIO)))
		return 0;
	if (cb->aio_lio_opcode == IOCB_CMD_PREAD) {
		len = (size_t)cb->aio_nbytes;
	} else if (cb->aio_lio_opcode == IOCB_CMD_PREADV) {
		struct iovec local[KVS_IOV_LOCAL];
		uint64_t n = 0;

		/* The program's array, read as the kernel reads it: one it refuses is its own. */
		if (!kvs_shim_wants(SIZE_MAX) || cb->aio_nbytes > IOV_MAX ||
		    !kvs_shim_iov_read((const struct iovec *)(uintptr_t)cb->aio_buf,
				       (int)cb->aio_nbytes, local, &n))
			return 0;
		len = (size_t)n;
	} else {
		return 0;
	}
	return len && kvs_shim_wants(len) ? len : 0;
}

/* Start cb (our copy of a program's iocb) as entry s of batch b: true when the cache took it
 * (its result is then in s->result once b's count says so). */
bool kaio_start(struct batch *b, struct served *s, const struct iocb *cb, size_t len)
{
	int n = cb->aio_lio_opcode == IOCB_CMD_PREADV ? (int)cb->aio_nbytes : 1;

	s->iov = s->inl;
	if (n > INLINE_IOV && !(s->iov = malloc((size_t)n * sizeof(*s->iov)))) {
		s->iov = s->inl;
		return false;
	}
	if (cb->aio_lio_opcode == IOCB_CMD_PREADV) {
		if (!kvs_shim_copy_in(s->iov, (const void *)(uintptr_t)cb->aio_buf,
				      (size_t)n * sizeof(*s->iov)))
			/* changed under us since kaio_candidate() read it: the kernel's */
			goto refused;
	} else {
		s->iov[0] = (struct iovec){(void *)(uintptr_t)cb->aio_buf, (size_t)cb->aio_nbytes};
	}
	s->iovcnt = n;
	s->len = len;
	s->a.arg = b;
	atomic_fetch_add_explicit(&b->running, 1, memory_order_relaxed);
	int r = kvs_shim_read_start(&s->a, (int)cb->aio_fildes, s->iov, n, (off_t)cb->aio_offset,
				    served_done);
	if (r == 0)
		return true; /* served_done will count it */
	atomic_fetch_sub_explicit(&b->running, 1, memory_order_relaxed);
	if (r == 1) {
		s->result = s->a.result; /* a hit, over already */
		return true;
	}
refused:
	if (s->iov != s->inl)
		free(s->iov);
	s->iov = s->inl;
	return false;
}

void kaio_batch_free(struct batch *b)
{
	if (!b)
		return;
	for (int i = 0; i < KVS_SUBMIT_CHUNK; i++)
		if (b->started[i] && b->e[i].iov != b->e[i].inl)
			free(b->e[i].iov);
	free(b);
}
