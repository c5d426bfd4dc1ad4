/*
 * kaio_int: what the files of the kernel AIO engine share (kaio.c, kaio_kernel.c,
 * kaio_serve.c, kaio_write.c), and nothing else includes.  The protocol, the locks and their
 * order are the DESIGN comment of api/kaio.c.
 *
 * Calls run one way: kaio.c (io_submit's chunks, the reaping, the syscall door, the fork rule)
 * calls the other three; kaio_write.c calls kaio_kernel.c; kaio_serve.c and kaio_kernel.c call
 * none of them.
 */
#ifndef KVS_SHIM_KAIO_INT_H
#define KVS_SHIM_KAIO_INT_H

#include <linux/aio_abi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include "kaio.h"
#include "raw.h"
#include "shim.h"
#include "sys.h"

/* kvs_raw6 (raw.h): the kernel's answer, -errno on failure, errno untouched. */
#define RAW(n, a, b, c, d, e, f)                                                                   \
	kvs_raw6((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

#define INLINE_IOV	 4
#define KVS_SUBMIT_CHUNK 64 /* iocbs of one io_submit looked at, and served, together */

/* ------------------------------------------------------------------ kaio_kernel.c */

/* Set while this thread is inside one of libaio's real functions (its system calls through
 * libc's syscall() go straight to the kernel). */
extern __thread int kaio_in_libaio __attribute__((tls_model("initial-exec")));

/* The kernel part of each call: libaio's real function for a call through libaio, when it can
 * be found, else the system call; -errno on failure.  sig: io_pgetevents' struct
 * __aio_sigset, or NULL for io_getevents. */
long kaio_real_submit(enum kvs_kaio_via v, aio_context_t ctx, long nr, struct iocb **p);
long kaio_real_getevents(enum kvs_kaio_via v, aio_context_t ctx, long min_nr, long nr,
			 struct io_event *ev, struct timespec *ts, const void *sig);
long kaio_real_cancel(enum kvs_kaio_via v, aio_context_t ctx, struct iocb *cb,
		      struct io_event *res);
long kaio_real_destroy(enum kvs_kaio_via v, aio_context_t ctx);

/* ------------------------------------------------------------------ kaio_serve.c */

/* A served iocb of one io_submit, from its start until its result is known. */
struct served {
	struct kvs_shim_async a; /* a.arg: the batch */
	int64_t result;		 /* bytes, or -errno: the kernel reads it */
	size_t len;		 /* bytes asked for */
	int iovcnt;
	struct iovec *iov; /* inl, or malloc'd for a long PREADV */
	struct iovec inl[INLINE_IOV];
};

/* The served entries of one chunk of an io_submit; on the submitting thread's heap. */
struct batch {
	_Atomic uint32_t running; /* started entries whose result is not in yet: a futex word */
	bool started[KVS_SUBMIT_CHUNK];
	struct served e[KVS_SUBMIT_CHUNK];
};

extern pthread_mutex_t kaio_carriers_mu; /* the carriers' table */
extern struct kvs_ownfd kaio_devnull;	 /* the carriers' descriptor */

/* The carriers' descriptor, held (kvs_ownfd_put with *ticket), or -1: serve nothing. */
int kaio_devnull_get(unsigned int *ticket);
/* The iocb at obj (cb: our copy) made the carrier of a served read that gave all its len
 * bytes (false: untouched); or, submitted again, its read put back. */
bool kaio_carrier_set(struct iocb *obj, const struct iocb *cb, size_t len, int64_t result,
		      int nullfd);
void kaio_carrier_undo(struct iocb *obj, struct iocb *cb);
/* Bytes cb reads if the shim could serve it (0: not a read it takes); started as entry s of
 * b (true: the cache took it); every started entry's result in; b and its iovecs freed. */
size_t kaio_candidate(const struct iocb *cb);
bool kaio_start(struct batch *b, struct served *s, const struct iocb *cb, size_t len);
void kaio_batch_wait(struct batch *b);
void kaio_batch_free(struct batch *b);

/* ------------------------------------------------------------------ kaio_write.c */

/* A kernel write (PWRITE, PWRITEV) of a KV file, noted for write-through (wthru.h) until its
 * event is seen; under its context's mu. */
struct kwrite {
	uint64_t obj; /* the iocb */
	struct kvs_shim_wpend p;
	struct kwrite *next;
};

/* What the shim keeps of an io context: its kernel writes in flight, nothing else. */
struct kctx {
	aio_context_t id;
	pthread_mutex_t mu;
	struct kwrite *writes; /* kernel writes noted for write-through, until their event */
	unsigned nwrites;
	struct kctx *next;
};

extern pthread_mutex_t kaio_ctx_mu; /* the list of contexts */
extern struct kctx *kaio_ctxs;

/* The context ctx (unlinked if unlink; NULL if the shim keeps none), or made if need be (NULL
 * when the kernel does not know ctx, or memory is short). */
struct kctx *kaio_find(aio_context_t ctx, bool unlink);
struct kctx *kaio_find_or_make(aio_context_t ctx);
/* A write's shards dropped before the kernel has it. */
void kaio_invalidate_write(const struct iocb *cb);
/* The noted write of the iocb at obj, taken out (caller holds c->mu); completed with n and
 * freed; the writes among n events from the kernel, over. */
struct kwrite *kaio_take_write(struct kctx *c, uint64_t obj);
void kaio_complete_write(struct kwrite *w, ssize_t n);
void kaio_kernel_events(struct kctx *c, const struct io_event *ev, long n);
/* A run of entries submitted to the kernel, its writes noted first: the kernel's answer. */
long kaio_submit_run(enum kvs_kaio_via v, struct kctx *c, aio_context_t ctx, long nr,
		     struct iocb **p, const struct iocb *cbs);

#endif
