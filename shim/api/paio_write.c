/*
 * paio_write: the POSIX aio engine's writes (paio_int.h): a write to a KV file invalidated
 * before glibc has it, noted for write-through until the program sees it over, then completed
 * (kvs_paio_write, kvs_aio_closing).  The protocol is the DESIGN comment of api/paio.c.
 */
#include <aio.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "paio_int.h"
#include "shim.h"

/*
 * Writes.  A write changes the shards it covers: they are dropped before it is submitted.
 * glibc completes it on its own thread, so its bytes are kept for write-through (wthru.h)
 * only once the program sees it complete: aio_error answering 0 or aio_return.  Until then
 * it is noted in paio_wtable (under paio_mu; paio_wpending, read without paio_mu, says whether to
 * look). Completing one takes no lock but the shim's, and frees nothing (the pool): aio_error,
 * aio_return and close may run in a signal handler.
 */

/* The noted write of cb (fd >= 0: any of fd, cb ignored), taken out of the table; NULL if
 * none.  wreq_give_back it once completed. */
static struct wreq *take_write(const struct aiocb *cb, int fd)
{
	struct wreq *w = NULL;

	/* pairs with paio_before_write */
	if (!atomic_load_explicit(&paio_wpending, memory_order_acquire))
		return NULL;
	paio_lock();
	for (int i = fd >= 0 ? 0 : (int)paio_bucket(cb); i < NBUCKETS && !w; i++) {
		for (struct wreq **pp = &paio_wtable[i]; *pp; pp = &(*pp)->next) {
			if (fd >= 0 ? (*pp)->fd == fd : (*pp)->cb == cb) {
				w = *pp;
				*pp = w->next;
				atomic_fetch_sub_explicit(&paio_wpending, 1, memory_order_release);
				break;
			}
		}
		if (fd < 0)
			break;
	}
	paio_unlock();
	return w;
}

/* Complete w's write with result n (-1: failed, or unknown), and give w back. */
static void complete_write(struct wreq *w, ssize_t n)
{
	if (!w)
		return;
	kvs_shim_write_completed(&w->p, n);
	paio_lock();
	paio_wreq_put(w);
	paio_unlock();
}

void paio_before_write(const struct aiocb *cb)
{
	if (!cb || cb->aio_offset < 0)
		return;
	kvs_shim_invalidate(cb->aio_fildes, cb->aio_offset, cb->aio_nbytes, false, 0);
	/* A rewrite of a write-once file counts at the submission (its result comes later). */
	if (cb->aio_nbytes)
		kvs_shim_invalidate(cb->aio_fildes, cb->aio_offset, cb->aio_nbytes, false,
				    -(off_t)cb->aio_nbytes);
	struct iovec io = {(void *)(uintptr_t)cb->aio_buf, cb->aio_nbytes};
	/* An aiocb reused without its result collected: the old write is of no use now. */
	complete_write(take_write(cb, -1), -1);
	paio_setup(); /* the fork handlers that keep paio_mu sane */
	paio_lock();
	struct wreq *w = paio_wreq_get();
	paio_unlock();
	if (!w) {
		/* No room to note it: followed at once, as a change that keeps nothing. */
		kvs_shim_change_now(cb->aio_fildes, cb->aio_offset, cb->aio_nbytes);
		return;
	}
	if (!kvs_shim_write_submitted(&w->p, cb->aio_fildes, &io, 1, (uint64_t)cb->aio_offset)) {
		paio_lock();
		paio_wreq_put(w);
		paio_unlock();
		return;
	}
	w->cb = cb;
	w->fd = cb->aio_fildes;
	paio_lock();
	w->next = paio_wtable[paio_bucket(cb)];
	paio_wtable[paio_bucket(cb)] = w;
	/* pairs with take_write */
	atomic_fetch_add_explicit(&paio_wpending, 1, memory_order_release);
	paio_unlock();
}

/* The program saw cb's write over with result n (-1: failed). */
void paio_write_seen(const struct aiocb *cb, ssize_t n)
{
	complete_write(take_write(cb, -1), n);
}

/* cb's write, if it is over by glibc's account (aio_error != EINPROGRESS), seen now. */
void paio_write_seen_if_over(int v, const struct aiocb *cb)
{
	int r = paio_real_error(v, cb);

	if (r != EINPROGRESS)
		paio_write_seen(cb, r == 0 ? paio_real_return(v, (struct aiocb *)cb) : -1);
}

void kvs_aio_closing(int fd)
{
	/* pairs with paio_before_write */
	if (!atomic_load_explicit(&paio_wpending, memory_order_acquire))
		return;
	int saved = errno;
	/* Writes of fd the program never asked about: whether they are over is not known here
	 * (their aiocbs may be gone), so they keep nothing, and the close finds the file free. */
	for (struct wreq *w; (w = take_write(NULL, fd));)
		complete_write(w, -1);
	errno = saved;
}

int kvs_paio_write(int v, struct aiocb *cb)
{
	paio_before_write(cb);
	int r = paio_real_write(v, cb);
	if (r != 0) {
		int saved = errno;

		paio_write_seen(cb, -1);
		errno = saved;
	}
	return r;
}
