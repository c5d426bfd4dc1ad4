/*
 * cufile_batch: the engine of cuFile's batch calls over a mixed batch (docs/design.md,
 * "Batches"), below their doors (hooks/cufile_batch.c, one call each into kvs_cufile_batch_*).
 *
 * DESIGN.  The caller's batch handle is the real library's; the shim keeps, per handle, a
 * struct batch with one entry per slot of the batch (cuFileBatchIOSetUp's nr).  Submit splits
 * the entries: reads the cache can serve start in the loader (kvs_shim_read_to_start) and
 * complete on its completion thread; all others go to the real batch in one real Submit,
 * before any entry is started, so that a refused Submit leaves nothing behind.  A served entry
 * whose load fails is read by the real cuFileRead on the completion thread, so it completes
 * either way.  GetStatus reports served completions first, then asks the real batch (without
 * waiting while served entries are in flight), and honours min_nr, *nr and the timeout over
 * both.  Cancel cancels the real part; served entries complete (they are reads from memory).
 * Destroy waits for served entries in flight, then destroys the real batch.
 *
 * Locks: batches_mu guards the list of batches (taken briefly, never across a call); each
 * batch's mu guards its entries' state, running and real_pending; cond signals a served
 * completion.  No lock is held across a call into the real library or the loader.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cufile.h"
#include "deadline.h"
#include "shim.h"

enum { E_FREE, E_RESERVED, E_RUNNING, E_DONE };

struct batch;

struct entry {
	struct kvs_shim_async a; /* a.arg: this entry */
	struct batch *b;
	kvs_cufile_io_params_t io;
	int state;
	int64_t result;
};

struct batch {
	kvs_cufile_batch_handle_t handle;
	unsigned max;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	unsigned running;      /* served entries in flight */
	unsigned real_pending; /* entries given to the real batch, not reported yet */
	struct entry *e;
	struct batch *next;
};

static pthread_mutex_t batches_mu = PTHREAD_MUTEX_INITIALIZER;
static struct batch *batches;

#define REAL_FN(type, fn) ((type)kvs_cufile_real(KVS_CF_##fn))

static const kvs_cufile_error_t ok = {KVS_CU_FILE_SUCCESS, 0};
static const kvs_cufile_error_t no_library = {KVS_CU_FILE_DRIVER_NOT_INITIALIZED, 0};

static struct batch *find(kvs_cufile_batch_handle_t h, bool unlink)
{
	struct batch **p, *b = NULL;

	pthread_mutex_lock(&batches_mu);
	for (p = &batches; *p; p = &(*p)->next) {
		if ((*p)->handle == h) {
			b = *p;
			if (unlink)
				*p = b->next;
			break;
		}
	}
	pthread_mutex_unlock(&batches_mu);
	return b;
}

static void batch_free(struct batch *b)
{
	pthread_cond_destroy(&b->cond);
	pthread_mutex_destroy(&b->mu);
	free(b->e);
	free(b);
}

kvs_cufile_error_t kvs_cufile_batch_setup(kvs_cufile_batch_handle_t *batch_idp, unsigned nr)
{
	kvs_cufile_batch_setup_fn fn = REAL_FN(kvs_cufile_batch_setup_fn, cuFileBatchIOSetUp);
	kvs_cufile_error_t e;
	struct batch *b;

	if (!fn)
		return no_library;
	e = fn(batch_idp, nr);
	if (e.err != KVS_CU_FILE_SUCCESS || !batch_idp || !nr || !kvs_shim_wants(SIZE_MAX))
		return e;
	/* Without memory for the bookkeeping the batch is simply not served. */
	b = calloc(1, sizeof(*b));
	if (!b)
		return e;
	b->e = calloc(nr, sizeof(*b->e));
	if (!b->e) {
		free(b);
		return e;
	}
	b->handle = *batch_idp;
	b->max = nr;
	pthread_mutex_init(&b->mu, NULL);
	kvs_cond_init_mono(&b->cond);
	pthread_mutex_lock(&batches_mu);
	b->next = batches;
	batches = b;
	pthread_mutex_unlock(&batches_mu);
	return e;
}

/* A served entry is over (the loader's completion thread): on failure read it with the real
 * cuFileRead here, so that the entry completes as it would have without the shim.  That
 * thread has no CUDA context of its own, and libcufile needs the buffer's for a GPU buffer
 * ("APIs with GPU buffers should be called in a valid CUDA context"): the entry's is made
 * current around the call. */
static void entry_done(struct kvs_shim_async *a, int64_t result)
{
	struct entry *en = a->arg;
	struct batch *b = en->b;

	if (result < 0) {
		kvs_cufile_read_fn rd = REAL_FN(kvs_cufile_read_fn, cuFileRead);
		const kvs_cufile_io_params_t *io = &en->io;
		bool pushed = kvs_device_push(&a->tg) == 0;

		result = rd ? rd(io->fh, io->u.batch.devPtr_base, io->u.batch.size,
				 io->u.batch.file_offset, io->u.batch.devPtr_offset)
			    : -KVS_CU_FILE_DRIVER_NOT_INITIALIZED;
		if (pushed)
			kvs_device_pop(&a->tg);
	}
	pthread_mutex_lock(&b->mu);
	en->result = result;
	en->state = E_DONE;
	b->running--;
	pthread_cond_broadcast(&b->cond);
	pthread_mutex_unlock(&b->mu);
}

/* Can io be served (and is there an entry for it)?  Returns its fd, or -1. */
static int servable(const kvs_cufile_io_params_t *io)
{
	if (io->mode != KVS_CUFILE_BATCH || io->opcode != KVS_CUFILE_READ ||
	    !io->u.batch.devPtr_base || io->u.batch.devPtr_offset < 0 ||
	    io->u.batch.file_offset < 0 || !kvs_shim_wants(io->u.batch.size))
		return -1;
	return kvs_cufile_fd(io->fh);
}

/* Start io as entry slot i of b (reserved by the caller); false if the loader would not take
 * it, and then the slot stays reserved: the caller gives it back once the real library has
 * answered for the entry, so no other Submit can take it meanwhile (a failing real submit
 * reports the entry failed in that slot). */
static bool start(struct batch *b, unsigned i, int fd, const kvs_cufile_io_params_t *io)
{
	struct entry *en = &b->e[i];
	uint64_t ptr =
	    (uint64_t)(uintptr_t)io->u.batch.devPtr_base + (uint64_t)io->u.batch.devPtr_offset;

	en->b = b;
	en->io = *io;
	en->a.arg = en;
	pthread_mutex_lock(&b->mu);
	en->state = E_RUNNING;
	b->running++;
	pthread_mutex_unlock(&b->mu);
	int r = kvs_shim_read_to_start(&en->a, fd, ptr, io->u.batch.size, io->u.batch.file_offset,
				       entry_done);
	if (r == 1)
		entry_done(&en->a, en->a.result); /* over already (hits into host memory) */
	if (r >= 0)
		return true;
	pthread_mutex_lock(&b->mu);
	en->state = E_RESERVED;
	b->running--;
	pthread_mutex_unlock(&b->mu);
	return false;
}

/* A free entry slot of b, or -1.  Caller holds b->mu. */
static int free_slot(struct batch *b, unsigned from)
{
	for (unsigned i = from; i < b->max; i++)
		if (b->e[i].state == E_FREE)
			return (int)i;
	return -1;
}

/* shim.mode = observe: each read the cache would serve is keyed and counted, and the batch
 * goes whole to the real Submit, as without the shim. */
static kvs_cufile_error_t submit_observed(kvs_cufile_batch_submit_fn fn, struct batch *b,
					  kvs_cufile_batch_handle_t batch_idp, unsigned nr,
					  kvs_cufile_io_params_t *iocbp, unsigned int flags)
{
	kvs_cufile_error_t e;

	for (unsigned i = 0; i < nr; i++) {
		int fd = servable(&iocbp[i]);

		if (fd >= 0)
			kvs_shim_observe_to(fd,
					    (uint64_t)(uintptr_t)iocbp[i].u.batch.devPtr_base +
						(uint64_t)iocbp[i].u.batch.devPtr_offset,
					    iocbp[i].u.batch.size, iocbp[i].u.batch.file_offset);
	}
	e = fn(batch_idp, nr, iocbp, flags);
	if (e.err == KVS_CU_FILE_SUCCESS) {
		pthread_mutex_lock(&b->mu);
		b->real_pending += nr; /* GetStatus asks the real batch for them */
		pthread_mutex_unlock(&b->mu);
	}
	return e;
}

/* Split the nr entries of iocbp: a served entry needs a free slot, reserved now so that a
 * concurrent Submit on the same batch cannot take it (its fd in fds[i], its slot in slot[i]);
 * every other one (slot[i] -1) is copied to rest, *nrest of them.  Returns how many are
 * served. */
static unsigned reserve_slots(struct batch *b, unsigned nr, const kvs_cufile_io_params_t *iocbp,
			      int *fds, int *slot, kvs_cufile_io_params_t *rest, unsigned *nrest)
{
	unsigned nserve = 0;

	pthread_mutex_lock(&b->mu);
	for (unsigned i = 0, from = 0; i < nr; i++) {
		int s = -1;

		fds[i] = servable(&iocbp[i]);
		if (fds[i] >= 0)
			s = free_slot(b, from);
		slot[i] = s;
		if (s >= 0) {
			b->e[s].state = E_RESERVED;
			from = (unsigned)s + 1;
			nserve++;
		} else {
			rest[(*nrest)++] = iocbp[i];
		}
	}
	pthread_mutex_unlock(&b->mu);
	return nserve;
}

/* The entries not served, in one real Submit before any served entry starts: refused, it gives
 * the reserved slots back, so that it leaves nothing behind. */
static kvs_cufile_error_t submit_rest(kvs_cufile_batch_submit_fn fn, struct batch *b,
				      kvs_cufile_batch_handle_t batch_idp, unsigned nr,
				      const int *slot, kvs_cufile_io_params_t *rest, unsigned nrest,
				      unsigned int flags)
{
	kvs_cufile_error_t e = fn(batch_idp, nrest, rest, flags);

	if (e.err != KVS_CU_FILE_SUCCESS) {
		pthread_mutex_lock(&b->mu);
		for (unsigned i = 0; i < nr; i++)
			if (slot[i] >= 0)
				b->e[slot[i]].state = E_FREE;
		pthread_mutex_unlock(&b->mu);
		return e;
	}
	pthread_mutex_lock(&b->mu);
	b->real_pending += nrest;
	pthread_mutex_unlock(&b->mu);
	return e;
}

/* Start each entry reserved a slot (slot[i] >= 0). */
static void start_reserved(kvs_cufile_batch_submit_fn fn, struct batch *b,
			   kvs_cufile_batch_handle_t batch_idp, unsigned nr,
			   kvs_cufile_io_params_t *iocbp, unsigned int flags, const int *fds,
			   const int *slot)
{
	for (unsigned i = 0; i < nr; i++) {
		if (slot[i] < 0 || start(b, (unsigned)slot[i], fds[i], &iocbp[i]))
			continue;
		/* The loader would not take it: the real batch reads it after all.  Its slot is
		 * still reserved, and free once the real library has it. */
		if (fn(batch_idp, 1, &iocbp[i], flags).err == KVS_CU_FILE_SUCCESS) {
			pthread_mutex_lock(&b->mu);
			b->e[slot[i]].state = E_FREE;
			b->real_pending++;
			pthread_mutex_unlock(&b->mu);
		} else {
			/* Report it failed, as a refused entry of the real batch would be. */
			pthread_mutex_lock(&b->mu);
			b->e[slot[i]] = (struct entry){.b = b,
						       .io = iocbp[i],
						       .state = E_DONE,
						       .result = -KVS_CU_FILE_IO_ERROR};
			pthread_mutex_unlock(&b->mu);
		}
	}
}

kvs_cufile_error_t kvs_cufile_batch_submit(kvs_cufile_batch_handle_t batch_idp, unsigned nr,
					   kvs_cufile_io_params_t *iocbp, unsigned int flags)
{
	kvs_cufile_batch_submit_fn fn = REAL_FN(kvs_cufile_batch_submit_fn, cuFileBatchIOSubmit);
	struct batch *b = find(batch_idp, false);
	kvs_cufile_io_params_t *rest = NULL;
	int *fds = NULL, *slot = NULL;
	unsigned nrest = 0, nserve;
	kvs_cufile_error_t e = ok;

	if (!fn)
		return no_library;
	if (!b || !iocbp || nr == 0 || nr > b->max)
		return fn(batch_idp, nr, iocbp, flags);
	if (kvs_shim_observing())
		return submit_observed(fn, b, batch_idp, nr, iocbp, flags);
	rest = malloc(nr * sizeof(*rest));
	fds = malloc(nr * sizeof(*fds));
	slot = malloc(nr * sizeof(*slot));
	if (!rest || !fds || !slot) {
		e = fn(batch_idp, nr, iocbp, flags);
		goto out;
	}
	nserve = reserve_slots(b, nr, iocbp, fds, slot, rest, &nrest);
	if (nrest) {
		e = submit_rest(fn, b, batch_idp, nr, slot, rest, nrest, flags);
		if (e.err != KVS_CU_FILE_SUCCESS)
			goto out;
	}
	if (nserve)
		start_reserved(fn, b, batch_idp, nr, iocbp, flags, fds, slot);
out:
	free(rest);
	free(fds);
	free(slot);
	return e;
}

/* Move up to room completed served entries into ev.  Caller holds b->mu. */
static unsigned harvest(struct batch *b, kvs_cufile_io_events_t *ev, unsigned room)
{
	unsigned n = 0;

	for (unsigned i = 0; i < b->max && n < room; i++) {
		struct entry *en = &b->e[i];

		if (en->state != E_DONE)
			continue;
		ev[n].cookie = en->io.cookie;
		ev[n].status = en->result >= 0 ? KVS_CUFILE_COMPLETE : KVS_CUFILE_FAILED;
		ev[n].ret = (size_t)en->result;
		en->state = E_FREE;
		n++;
	}
	return n;
}

/* What is left until deadline of the caller's timeout, in *left; NULL (wait for ever) when the
 * caller gave none. */
static struct timespec *time_left(const struct timespec *timeout, uint64_t deadline,
				  struct timespec *left)
{
	if (!timeout)
		return NULL;
	uint64_t t = kvs_mono_ns();
	*left = kvs_ns_ts(deadline > t ? deadline - t : 0);
	return left;
}

kvs_cufile_error_t kvs_cufile_batch_get_status(kvs_cufile_batch_handle_t batch_idp, unsigned min_nr,
					       unsigned *nr, kvs_cufile_io_events_t *iocbp,
					       struct timespec *timeout)
{
	kvs_cufile_batch_get_status_fn fn =
	    REAL_FN(kvs_cufile_batch_get_status_fn, cuFileBatchIOGetStatus);
	struct batch *b = find(batch_idp, false);
	uint64_t deadline = UINT64_MAX;
	unsigned max, got = 0;
	kvs_cufile_error_t e = ok;

	if (!fn)
		return no_library;
	if (!b || !nr || !iocbp)
		return fn(batch_idp, min_nr, nr, iocbp, timeout);
	max = *nr;
	deadline = kvs_deadline_ns(timeout);
	pthread_mutex_lock(&b->mu);
	for (;;) {
		got += harvest(b, iocbp + got, max - got);
		bool served_left = b->running > 0;
		unsigned pending = b->real_pending;
		pthread_mutex_unlock(&b->mu);

		if (got < max && pending) {
			/* Wait in the real call only when nothing of ours can complete meanwhile.
			 */
			unsigned n = max - got, want = got >= min_nr ? 0 : min_nr - got;
			struct timespec zero = {0, 0}, left, *ts = &zero;

			if (!served_left) {
				if (want > pending)
					want = pending;
				ts = time_left(timeout, deadline, &left);
			} else {
				want = 0;
			}
			e = fn(batch_idp, want, &n, iocbp + got, ts);
			if (e.err != KVS_CU_FILE_SUCCESS) {
				pthread_mutex_lock(&b->mu);
				break;
			}
			got += n;
			pthread_mutex_lock(&b->mu);
			b->real_pending -= n < b->real_pending ? n : b->real_pending;
		} else {
			pthread_mutex_lock(&b->mu);
		}
		if (got >= min_nr || got >= max || (!b->running && !b->real_pending))
			break;
		uint64_t t = kvs_mono_ns();
		if (t >= deadline)
			break;
		/* Sleep until a served entry completes; poll the real batch every millisecond. */
		uint64_t until = b->real_pending ? t + 1000000 : deadline;
		if (until > deadline)
			until = deadline;
		if (b->running)
			kvs_cond_wait_until(&b->cond, &b->mu, until);
	}
	pthread_mutex_unlock(&b->mu);
	*nr = got;
	return got && e.err != KVS_CU_FILE_SUCCESS ? ok : e;
}

/* Wait until no served entry of b is in flight. */
static void drain(struct batch *b)
{
	pthread_mutex_lock(&b->mu);
	while (b->running)
		pthread_cond_wait(&b->cond, &b->mu);
	pthread_mutex_unlock(&b->mu);
}

kvs_cufile_error_t kvs_cufile_batch_cancel(kvs_cufile_batch_handle_t batch_idp)
{
	kvs_cufile_batch_cancel_fn fn = REAL_FN(kvs_cufile_batch_cancel_fn, cuFileBatchIOCancel);
	struct batch *b = find(batch_idp, false);

	if (!fn)
		return no_library;
	if (b)
		drain(b); /* served reads finish; GetStatus reports them complete */
	return fn(batch_idp);
}

void kvs_cufile_batch_destroy(kvs_cufile_batch_handle_t batch_idp)
{
	kvs_cufile_batch_destroy_fn fn = REAL_FN(kvs_cufile_batch_destroy_fn, cuFileBatchIODestroy);
	struct batch *b = find(batch_idp, true);

	if (b) {
		drain(b); /* the loader still writes into its entries until then */
		batch_free(b);
	}
	if (fn)
		fn(batch_idp);
}
