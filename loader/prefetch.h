/*
 * prefetch: the shard after a recent read, made ready before anyone asks for it
 * (loader.prefetch): "alloc" takes a slot for it (kvs_cache_prealloc) so that the load that
 * follows does not evict on its critical path; "read" also reads it from storage.
 *
 * One thread per loader, asleep until a read is noted.  It holds no pin between notes; a
 * read-ahead's pin is released by its completion on a backend thread.
 */
#ifndef KVS_PREFETCH_H
#define KVS_PREFETCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "cache.h"
#include "loader.h"

#define KVS_PREFETCH_RECENT 8

/* A file recently read.  fd is the shim's anchor of it (never closed here: the anchor belongs
 * to the shim, and closing a descriptor would drop the program's record locks); read-ahead
 * checks before and after that it still names the same file. */
struct kvs_recent {
	struct kvs_key block;
	uint64_t dev, ino;
	bool write_once; /* keyed by birth (kvs_read.write_once) */
	uint64_t next_shard, file_size;
	struct kvs_fresh fresh;
	int fd;
	bool direct, valid;
};

/* A read-ahead in flight; a fixed pool, so that no loader thread calls malloc. */
struct kvs_prefetch_io {
	struct kvs_bio bio;
	struct kvs_prefetcher *pf;
	struct kvs_pin pin;
	struct kvs_key block;
	uint64_t dev, ino;
	bool write_once; /* keyed by birth (kvs_read.write_once) */
	struct kvs_keep keep;
	uint32_t size;
	_Atomic uint32_t busy;
};

struct kvs_prefetcher {
	struct kvs_cache *c;
	struct kvs_backend *be;
	uint64_t shard_size;
	int mode;	    /* enum kvs_prefetch */
	pthread_mutex_t mu; /* guards recent[], next, stop */
	pthread_cond_t cond;
	struct kvs_recent recent[KVS_PREFETCH_RECENT];
	uint32_t next;
	bool stop, started;
	pthread_t thread;
	struct kvs_prefetch_io io[KVS_PREFETCH_RECENT];
};

/* Start the thread (none for mode KVS_PREFETCH_OFF).  Returns 0 or -errno. */
int kvs_prefetch_start(struct kvs_prefetcher *pf, struct kvs_cache *c, struct kvs_backend *be,
		       int mode, uint64_t shard_size);

/* A read of rd ended at shard last: remember the file so that shard last + 1 is prepared.
 * Cheap (a mutex, a wake); never blocks on I/O. */
void kvs_prefetch_note(struct kvs_prefetcher *pf, const struct kvs_read *rd, uint64_t last);

/* Stop and join the thread.  Read-aheads in flight finish on the backend, which the caller
 * destroys after this. */
void kvs_prefetch_stop(struct kvs_prefetcher *pf);

#endif
