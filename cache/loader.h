/*
 * loader: one per process; turns a read of a KV file into pins of its shards, in rotated
 * order, storage reads for the shards this process owns, waits for the others, and copies.
 *
 * Threads (design.md §2): the calling thread serves shards that are READY at once; the rest
 * goes, as a task, to a dispatch thread (pins in rotated order, submits owned reads at once,
 * preallocates or reads ahead when idle) and then, through a single-producer single-consumer
 * ring, to a transfer thread (waits, copies, releases, completes the task).  Idle threads sleep.
 */
#ifndef KVS_LOADER_H
#define KVS_LOADER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "cache.h"

struct kvs_config;
struct kvs_loader;

/* One intercepted read, as the hook sees it. */
struct kvs_read {
	int fd;		      /* a descriptor of the file the block id was taken from (the
			       * shim's anchor), valid until kvs_loader_read returns */
	bool direct;	      /* the fd has O_DIRECT: storage reads are 4 KiB aligned */
	bool keep;	      /* the file's times are settled: shards read now may be kept */
	struct kvs_key block; /* the file's block id; shard ignored */
	uint64_t dev, ino;    /* the file, for the check after each storage read */
	uint64_t file_size;   /* st_size when the block id was taken */
	uint64_t off;	      /* file offset of the read */
	const struct iovec *iov;
	int iovcnt;
	uint64_t len; /* sum of the iov lengths */
};

/* Start a loader over cache c (threads, backend).  Returns 0 or -errno. */
int kvs_loader_create(struct kvs_cache *c, const struct kvs_config *cfg, struct kvs_loader **out);

/*
 * Serve rd.  Returns the bytes placed in the iovecs, which is what pread would return
 * (min(len, file_size - off), 0 at or past the end), or a negative errno meaning that nothing
 * is promised about the buffers and the caller must make the real call.  Safe from any number
 * of threads at once; calls no malloc (a hooked read may come from a signal handler), and
 * neither do the loader threads it waits for.
 *
 * What is kept.  After every storage read of a shard the loader checks its descriptor again:
 * a different file (dev, ino) fails the load (-ESTALE); the same file with another identity (a
 * write began meanwhile), or rd->keep false, publishes the bytes to the readers of that load
 * only (kvs_cache_mark_ready_unkept): the next read loads them again.
 */
int64_t kvs_loader_read(struct kvs_loader *ld, const struct kvs_read *rd);

/* Stop the threads and free.  No read may be in progress.  NULL is accepted. */
void kvs_loader_destroy(struct kvs_loader *ld);

/* The fork child: close what the loader holds of the kernel's (its io_uring) without touching
 * its threads, which do not exist here, or its locks.  The memory is abandoned. */
void kvs_loader_forget(struct kvs_loader *ld);

/* The rotated visiting order of nops shards for local rank `rank` of `nranks`: slice rank %
 * nranks first (shards rank, rank + nranks, ...), then the next slice, wrapping.  nranks 1
 * gives the natural order.  order receives nops indices. */
void kvs_loader_order(uint32_t rank, uint32_t nranks, uint32_t nops, uint32_t *order);

/* The backend's name ("io_uring" or "threads"), for logs. */
const char *kvs_loader_backend(const struct kvs_loader *ld);

#endif
