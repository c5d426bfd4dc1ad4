/*
 * loader: one per process; turns a read of a KV file into pins of its shards, in rotated
 * order, storage reads for the shards this process owns, waits for the others, and copies to a
 * destination.  It sits on top of cache/ and knows nothing of CUDA or of the hooks: a
 * destination is a pair of functions the caller supplies.
 *
 * Threads (docs/design.md, "Threads"): the thread that asks does the work.  kvs_loader_read
 * pins, submits its owned storage reads, waits and copies on the calling thread; storage reads
 * complete on the backend's threads, which publish READY or FAILED.  kvs_loader_start is the
 * asynchronous form: the caller pins and submits, a completion thread waits, copies and calls
 * back.  A prefetch thread preallocates or reads ahead the shard after recent reads.  Idle
 * threads sleep.
 */
#ifndef KVS_LOADER_H
#define KVS_LOADER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "backend.h"
#include "cache.h"

struct kvs_config;
struct kvs_loader;

/*
 * Where a read's bytes go.  copy() places len bytes from src (inside the shared region) at
 * byte pos of the request and returns 0 or -errno; it may return before it has read src (an
 * asynchronous device copy).  fence() returns once no copy issued so far reads its source any
 * more, even when one failed, and reports 0 or -errno; NULL means every copy is over when
 * copy() returns.  The loader holds the pin of every slot a copy reads until the fence.
 */
struct kvs_dest {
	int (*copy)(void *ctx, uint64_t pos, const void *src, uint64_t len);
	int (*fence)(void *ctx);
	void *ctx;
};

/*
 * How long shards of a file may be kept (publish.c, kvs_keep_for): what the hook's fstat
 * said of the file's last change, and the rules for its file system.
 */
struct kvs_fresh {
	uint64_t changed_ns; /* the later of st_mtim and st_ctim (CLOCK_REALTIME ns) */
	uint64_t settle_ns;  /* files.settle for the file */
	uint64_t
	    revalidate_ns; /* files.revalidate: every load kept at most this long; 0 = no bound */
	bool node_clock;   /* another machine's clock may have written the stamps: also
			    * count how long this node has seen the identity */
};

/* How long a load may be kept, decided before its storage read starts (publish.h,
 * kvs_keep_for), and the file's write mark it is kept under. */
struct kvs_keep {
	uint64_t until; /* kept until then (the node's clock), 0 for good */
	uint64_t mark;	/* the file's write mark (kvs_cache_write_mark), when marked */
	uint64_t dev, ino;
	bool marked; /* false: a write of the file was in flight: nothing is kept */
};

/* A file's identity on every node that sees it (remote.h, kvs_remote_ident). */
struct kvs_rid {
	uint64_t lo, hi;
};

/* One intercepted read, as the hook sees it. */
struct kvs_read {
	int fd;			/* a descriptor of the file the block id was taken from (the
				 * shim's anchor), valid until the read is over */
	bool direct;		/* the fd has O_DIRECT: storage reads are 4 KiB aligned */
	struct kvs_fresh fresh; /* how long what is loaded now may be kept */
	struct kvs_key block;	/* the file's block id; shard ignored */
	uint64_t dev, ino;	/* the file, for the check after each storage read */
	bool write_once;	/* block is the file's identity by birth (cache.h, kvs_ident) */
	uint64_t file_size;	/* st_size when the block id was taken */
	int root;		/* which of files.roots the file is under (the shim's) */
	uint32_t tally;		/* the tallies its storage reads count in (kvs_cache_tally_ref) */
	uint64_t off;		/* file offset of the read */
	uint64_t len;		/* bytes asked for */
	/* The destination: dest, or when it is NULL the host buffers iov (memcpy). */
	const struct kvs_dest *dest;
	const struct iovec *iov;
	int iovcnt;
};

/* Shards one task holds at once; a longer read is served as consecutive pieces. */
#define KVS_TASK_OPS 16

/* One shard of a task.  Private to the loader. */
struct kvs_op {
	uint64_t shard;
	uint64_t pos;  /* where its bytes go, as an offset into the request */
	uint32_t from; /* first byte wanted, within the shard */
	uint32_t len;  /* bytes wanted */
	uint32_t size; /* the shard's bytes in the file (short for the last one) */
	int kind;
	struct kvs_pin pin;
	struct kvs_bio bio;
	const struct kvs_read *rd;
	_Atomic uint32_t io_done;    /* owner: the backend is finished with bio and the op */
	uint64_t t_submit;	     /* owner: when its storage read was submitted (storage_ns) */
	const struct kvs_keep *keep; /* owner: its task's (kvs_task.keep) */
	const struct kvs_rid *rid;   /* owner: offer the load to the remote pool (kvs_task.rid) */
};

/* A read in progress: storage the caller provides (on its stack, or with the request it
 * belongs to), so that the loader allocates nothing.  Fields private to the loader. */
struct kvs_task {
	const struct kvs_read *rd;
	uint64_t off, end; /* the piece being served, and the end of the whole read */
	uint64_t piece_end;
	struct kvs_keep keep; /* how long loads this task owns are kept */
	struct kvs_rid rid;   /* its file's remote identity, when it may be shared */
	uint32_t nops;
	int64_t result;
	void (*done)(struct kvs_task *t, int64_t result);
	void *arg; /* the caller's, untouched */
	struct kvs_task *next;
	struct kvs_op ops[KVS_TASK_OPS];
	uint32_t order[KVS_TASK_OPS];
};

/* Start a loader over cache c (backend and prefetch threads; the completion thread starts with
 * the first asynchronous read).  Returns 0 or -errno. */
int kvs_loader_create(struct kvs_cache *c, const struct kvs_config *cfg, struct kvs_loader **out);

/*
 * Serve rd on the calling thread.  Returns the bytes placed in the destination, which is what
 * pread would return (min(len, file_size - off), 0 at or past the end), or a negative errno
 * meaning that nothing is promised about the destination and the caller must make the real
 * call.  Safe from any number of threads at once; calls no malloc (a hooked read may come
 * from a signal handler), and neither do the loader threads it waits for.
 *
 * What is kept.  A shard this process loads is kept for good when the file's identity is
 * settled (rd->fresh, kvs_keep_for), else until an expiry, after which one process of the
 * node loads it again.  After every storage read of a shard the loader checks its descriptor
 * again: a different file (dev, ino) fails the load (-ESTALE); the same file with another
 * identity (a write began meanwhile) publishes the bytes to the readers of that load only
 * (kvs_cache_mark_ready_unkept): the next read loads them again.
 *
 * A shard that failed, timed out (loader.wait_timeout_ms) or could not be pinned is read from
 * storage by this call, only its wanted bytes, when the destination is host memory (rd->dest
 * NULL); with any other destination the call returns its error.  When the cache can take none
 * of the read's first piece (every slot it could use is pinned), nothing is held or copied
 * and the call returns -ENOBUFS: the caller's real call reads it (so does kvs_loader_start).
 */
int64_t kvs_loader_read(struct kvs_loader *ld, const struct kvs_read *rd);

/*
 * Serve rd asynchronously into t.  The calling thread pins the first KVS_TASK_OPS shards and
 * submits its owned storage reads; the completion thread waits, copies, fences, serves the
 * rest piece by piece, and then calls done(t, result) once, result as kvs_loader_read returns.
 * rd, its destination and t must stay valid until done is called; t->arg is the caller's.
 * Returns 0 (done will be called), 1 (the read is over already: every shard was READY and
 * copied on the calling thread, or it was empty; t->result holds the byte count and done will
 * not be called), or -errno (done will not be called, and nothing is held).
 */
int kvs_loader_start(struct kvs_loader *ld, struct kvs_task *t, const struct kvs_read *rd,
		     void (*done)(struct kvs_task *t, int64_t result), void *arg);

/*
 * For a caller that copies from the slots itself, in an order of its own (cuFileReadAsync: the
 * copies go on the program's stream).  kvs_loader_pin pins the shards of rd, which must span at
 * most KVS_TASK_OPS, and starts the storage reads this process owns.  Nothing is held after
 * an error: -E2BIG for a longer read, -EINVAL when rd asks for nothing (no bytes, or at or past
 * the end of the file), -EOVERFLOW for a length past INT64_MAX / 2, and when a shard cannot be
 * pinned, the pin's error (-ENOSPC, -ENOBUFS, -EUCLEAN: kvs_cache_pin_load) or -ENOSPC.
 * kvs_loader_op gives op i's bytes: src in the region (valid until kvs_loader_unpin), pos in
 * the request, len.  kvs_loader_settle
 * waits until every op is READY, reading from storage into the slot a shard whose load failed
 * (the pin keeps the slot ours); it may block for as long as storage takes and calls no
 * malloc; returns 0 or -errno (the slots' bytes are then not the file's).  kvs_loader_unpin
 * releases every pin.  Between pin and unpin, t is the caller's to keep.
 */
int kvs_loader_pin(struct kvs_loader *ld, struct kvs_task *t, const struct kvs_read *rd);
uint32_t kvs_loader_nops(const struct kvs_task *t);
/* Was every op READY when kvs_loader_pin pinned it (so that kvs_loader_settle waits for
 * nothing)? */
bool kvs_loader_pinned_ready(const struct kvs_task *t);
void kvs_loader_op(struct kvs_loader *ld, struct kvs_task *t, uint32_t i, const void **src,
		   uint64_t *pos, uint32_t *len);
int kvs_loader_settle(struct kvs_loader *ld, struct kvs_task *t);
void kvs_loader_unpin(struct kvs_loader *ld, struct kvs_task *t);

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
