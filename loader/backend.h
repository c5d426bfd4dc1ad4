/*
 * backend: storage reads for the loader, through io_uring where the kernel allows it and a
 * pool of threads where it does not (loader.io, loader.io_depth).
 *
 * Reads use raw system calls, never the interposed libc names, so the shim's own hooks are not
 * re-entered.  A read is retried after EINTR and EAGAIN and continued after a short count
 * until it is complete or a read returns 0 (end of file).
 */
#ifndef KVS_BACKEND_H
#define KVS_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

struct kvs_backend;

struct kvs_bio {
	int fd;
	void *buf;
	uint64_t off;
	uint32_t len;
	/* Set by the backend before done() runs: bytes read (short only at end of file) or
	 * -errno. */
	int64_t result;
	/* Called once, on a backend thread, when the read is over. */
	void (*done)(struct kvs_bio *bio);
	void *arg; /* the submitter's */
	/* Private to the backend. */
	uint32_t got;
	struct kvs_bio *next;
};

/* Tests only: microseconds every storage read of backends created from now on sleeps first,
 * to play slow storage.  Never set by the shim (a hidden symbol: no environment, no key). */
extern unsigned kvs_backend_test_delay_us;
/* Tests only: the next N io_uring submissions fail as if io_uring_enter had (the SQE filled,
 * not consumed); and, for backends created while set, every io_uring_wait_cqe of the reaper
 * fails with -EIO.  Hidden symbols, like kvs_backend_test_delay_us. */
extern unsigned kvs_backend_test_fail_submits;
extern bool kvs_backend_test_fail_wait;
/* Tests only: the next N io_uring reads longer than 4 KiB ask the kernel for about half their
 * length (4 KiB-aligned), as if storage returned a short read mid-file; the reaper must
 * finish the rest. */
extern unsigned kvs_backend_test_short_reads;
/* Tests only: when nonzero, counted down by each thread start of kvs_backend_create; the start
 * that brings it to 0 fails with -EAGAIN, as pthread_create does when the process is out of
 * threads or memory (1: the next start fails; 3: the third from now). */
extern unsigned kvs_backend_test_fail_thread;

/* Start a backend.  mode is enum kvs_io_mode; depth bounds the reads in flight.
 * Returns 0 or -errno (-ENOSYS/-EPERM when io_uring was asked for and is unavailable). */
int kvs_backend_create(int mode, unsigned depth, struct kvs_backend **out);

/* Queue bio; blocks while depth reads are in flight.  done() may run before this returns. */
void kvs_backend_submit(struct kvs_backend *be, struct kvs_bio *bio);

/* Block until fewer than depth reads are in flight (a submit would not block). */
void kvs_backend_wait_room(struct kvs_backend *be);

/* Finish the reads in flight, stop the threads, free. NULL is accepted.  If the kernel will not
 * take the reaper's stop NOP within about a second, the backend is left as it is and never
 * freed: a leak, never a hang. */
void kvs_backend_destroy(struct kvs_backend *be);

/* The fork child: close the io_uring (descriptor and mappings) inherited from the parent, whose
 * reaper does not exist here.  Nothing else is touched. */
void kvs_backend_forget(struct kvs_backend *be);

/* "io_uring" or "threads". */
const char *kvs_backend_name(const struct kvs_backend *be);

/* Read len bytes at off into buf synchronously, with the same retry rules. */
int64_t kvs_read_full(int fd, void *buf, uint64_t len, uint64_t off);

#endif
