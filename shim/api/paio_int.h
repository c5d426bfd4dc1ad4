/*
 * paio_int: what the files of the POSIX aio engine share (paio.c, paio_real.c, paio_table.c,
 * paio_serve.c, paio_write.c), and nothing else includes.  The protocol, the locks and what
 * is read without them are the DESIGN comment of api/paio.c.
 *
 * Calls run one way: paio.c (the entry points but aio_write) calls the other four;
 * paio_serve.c and paio_write.c call paio_table.c (and paio_write.c paio_real.c);
 * paio_table.c and paio_real.c call none of them.
 */
#ifndef KVS_SHIM_PAIO_INT_H
#define KVS_SHIM_PAIO_INT_H

#include <aio.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include "shim.h"

/* paio_real.c: glibc's functions (v 0: the plain names, v 1: the 64 names); each answers as
 * glibc's, or -1 ENOSYS where glibc's cannot be found. */
int paio_real_read(int v, struct aiocb *cb);
int paio_real_write(int v, struct aiocb *cb);
int paio_real_lio(int v, int mode, struct aiocb *const list[], int nent, struct sigevent *sig);
int paio_real_error(int v, const struct aiocb *cb);
ssize_t paio_real_return(int v, struct aiocb *cb);
int paio_real_suspend(int v, const struct aiocb *const list[], int nent,
		      const struct timespec *timeout);
int paio_real_cancel(int v, int fd, struct aiocb *cb);

/* ------------------------------------------------------------------ paio_table.c */

struct group {
	unsigned left;	     /* outstanding: the caller's hold, served entries, the real part */
	bool failed;	     /* a served entry failed */
	bool notify;	     /* LIO_NOWAIT with a sig: the last one out notifies and frees */
	struct sigevent sev; /* lio_listio's sig, copied */
	pid_t pid;	     /* the submitter, for SIGEV_SIGNAL */
};

struct req {
	struct kvs_shim_async a; /* a.arg: this request */
	struct iovec iov;
	struct aiocb *cb;
	int fd;
	off_t off;
	pid_t pid;
	struct sigevent sev; /* cb->aio_sigevent at submission */
	struct group *g;     /* lio_listio's group, or NULL */
	struct req *next;    /* the bucket's chain */
};

#define NBUCKETS 256

extern pthread_mutex_t paio_mu;
extern pthread_cond_t paio_cond; /* CLOCK_MONOTONIC; initialised with the fork handlers */
extern struct req *paio_table[NBUCKETS];
extern _Atomic unsigned paio_inflight; /* served requests in the table; written under paio_mu */

/* Writes to KV files noted for write-through until the program sees them over (paio_write.c,
 * "Writes"); under paio_mu, paio_wpending read without it.  Entries come from a pool mapped
 * once (paio_table.c): aio_error, aio_return and close give them back, and may run in a
 * signal handler, where free() could wait for the arena lock of the malloc it interrupted. */
struct wreq {
	const struct aiocb *cb;
	int fd; /* cb's descriptor at submission (the aiocb itself is not read again) */
	struct kvs_shim_wpend p;
	struct wreq *next;
};
extern struct wreq *paio_wtable[NBUCKETS];
extern _Atomic unsigned paio_wpending;

/* paio_mu, taken and released with the shim's guard raised around it (guard.h). */
void paio_lock(void);
void paio_unlock(void);
/* A free entry of the pool, or NULL (it cannot be mapped, or is spent); back to it.  Caller
 * holds paio_mu. */
struct wreq *paio_wreq_get(void);
void paio_wreq_put(struct wreq *w);
/* The bucket of cb in either table. */
unsigned paio_bucket(const struct aiocb *cb);
/* The running served request of cb, or NULL; r out of the table.  Caller holds paio_mu. */
struct req *paio_find(const struct aiocb *cb);
void paio_unlink_req(struct req *r);
/* Is any served request running?  Without the lock. */
bool paio_busy(void);
/* Once, before the first served request or noted write: paio_cond on the monotonic clock. */
void paio_setup(void);

/* ------------------------------------------------------------------ paio_serve.c */

/* Drop one from g's count (caller holds paio_mu): g when the caller must notify and free it
 * (paio_group_notify, without the lock). */
struct group *paio_group_put(struct group *g);
void paio_group_notify(struct group *g);
/* glibc's SIGEV_THREAD for the real part of a LIO_NOWAIT list (v.sival_ptr: the group). */
void paio_real_part_done(union sigval v);
/* Can cb be served at all?  Serve it as a member of g (or alone): 0 (it is ours until it
 * completes) or -1 (the caller submits it to glibc; nothing changed). */
bool paio_candidate(const struct aiocb *cb);
int paio_serve(struct aiocb *cb, struct group *g);

/* ------------------------------------------------------------------ paio_write.c */

/* Before cb's write is submitted: its shards dropped, the write noted for write-through. */
void paio_before_write(const struct aiocb *cb);
/* The program saw cb's write over with result n (-1: failed); or if glibc says it is over. */
void paio_write_seen(const struct aiocb *cb, ssize_t n);
void paio_write_seen_if_over(int v, const struct aiocb *cb);

#endif
