/*
 * ring: the request ring between a node's engine processes and its remote helper (`kvshim
 * remote`), a shared file beside the region.  The protocol, its states and its crash table are
 * the essay at the top of ring.c; docs/design.md, "Beyond one node: the remote tier", says why it
 * is shaped so.
 *
 * An engine (the loader's owner of a shard) asks with kvs_ring_get and waits for the answer
 * with kvs_ring_wait; after a storage load it offers the shard with kvs_ring_put.  The helper
 * takes what is posted with kvs_ring_take and answers with kvs_ring_done.  The bytes of a get
 * land in the entry's own staging buffer, never in a slot of the region: the engine copies them
 * into its slot itself, so a transfer that comes back late can only ever land in staging that
 * nobody reads.
 *
 * Engine calls are lock-free, make no allocation and at most a futex system call each: they run
 * on a hooked read's thread, which may be a signal handler's.  The helper's calls are its own.
 */
#ifndef KVS_REMOTE_RING_H
#define KVS_REMOTE_RING_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "cache.h"

#define KVS_RING_MAGIC	 0x3130544d5253564bull /* "KVSRMT01" */
#define KVS_RING_VERSION 1u
#define KVS_RING_KEY_MAX 160u	       /* bytes of a remote key, its NUL included */
#define KVS_RING_BEAT_NS 100000000ull  /* the helper's heartbeat period */
#define KVS_RING_DEAD_NS 1000000000ull /* a beat this old: the helper is gone or stopped */

/* What an engine's entry asks. */
enum kvs_ring_op { KVS_RING_GET = 1, KVS_RING_PUT = 2 };

/* Where misses go, as the helper decides (the header's route word). */
enum kvs_ring_route {
	KVS_ROUTE_ASK = 0,     /* ask the pool first */
	KVS_ROUTE_STORAGE = 1, /* storage is faster here: ask one miss in KVS_RING_PROBE */
	KVS_ROUTE_BROKEN = 2,  /* the breaker is open: do not ask */
};
#define KVS_RING_PROBE 16u

/* A get's answers (kvs_ring_wait). */
enum kvs_ring_answer {
	KVS_RING_HIT = 0,     /* the bytes are in staging, length as asked */
	KVS_RING_MISS = 1,    /* the pool does not hold the key */
	KVS_RING_ERROR = 2,   /* the helper or the pool failed, or answered a wrong length */
	KVS_RING_TIMEOUT = 3, /* no answer by the deadline: the entry is abandoned */
};

struct kvs_ring;

/*
 * Who posted an entry, in a form the helper can check whatever PID namespace either runs in
 * (kvs_cache_whoami: a process-table slot of the region and when its process attached).  A
 * thread id would not do: an engine in a pod's namespace and a helper in the node's see
 * different numbers for the same thread.
 */
struct kvs_ring_owner {
	uint32_t slot;
	uint64_t at;
};

/* Is the owner still there (kvs_cache_still)?  The helper's beat asks; true when unsure. */
typedef bool (*kvs_ring_still_fn)(void *arg, const struct kvs_ring_owner *o);

/* One posted get, as the engine keeps it between kvs_ring_get and kvs_ring_wait. */
struct kvs_ring_ticket {
	uint32_t entry; /* UINT32_MAX: none */
	uint32_t word;	/* the entry's word as posted (its owner's tid and POSTED) */
	uint32_t len;
};

/* ------------------------------------------------------------------ engines */

/*
 * Map the ring at path for an engine (read and write; trusted as the region is under mode,
 * cache.mode: kvs_cache_open_file; the right magic, version and shard_size).  Returns 0 or -errno;
 * the mapping is the process's until kvs_ring_unmap.
 */
int kvs_ring_map(const char *path, uint64_t shard_size, uint32_t mode, struct kvs_ring **out);
void kvs_ring_unmap(struct kvs_ring *r);

/* Is a helper beating now (a beat younger than KVS_RING_DEAD_NS)?  One load and a clock read. */
bool kvs_ring_alive(const struct kvs_ring *r);

/* The pid of the helper that built or took over the ring, in its own PID namespace. */
int kvs_ring_helper_pid(const struct kvs_ring *r);

/* The helper's route for misses (enum kvs_ring_route).  One load. */
int kvs_ring_route(const struct kvs_ring *r);

/* Does the file at path hold another ring than r (a helper started since with other
 * dimensions)?  One stat. */
bool kvs_ring_replaced(const struct kvs_ring *r, const char *path);

/*
 * Post a get of key (len bytes, at most the ring's shard size) and ring the bell.  Returns 0
 * with *t filled, or -EBUSY when every entry is taken (the caller reads storage).
 */
int kvs_ring_get(struct kvs_ring *r, const struct kvs_ring_owner *o, const char *key, uint32_t len,
		 struct kvs_ring_ticket *t);

/* kvs_ring_get with the region's key of the shard and the slot its owner loads it in (its
 * pin's), for a helper that gets straight into that slot (kvs_ring_zero_copy). */
int kvs_ring_get_for(struct kvs_ring *r, const struct kvs_ring_owner *o, const char *key,
		     const struct kvs_key *shard, uint32_t slot, uint32_t len,
		     struct kvs_ring_ticket *t);

/* Does the helper get into owners' slots (remote.zero_copy) rather than into staging?  Then a
 * hit's bytes are in the slot already.  Set by the helper before its first beat. */
bool kvs_ring_zero_copy(const struct kvs_ring *r);
void kvs_ring_set_zero_copy(struct kvs_ring *r, bool on);

/*
 * Wait for t's answer until deadline_ns (kvs_mono_ns's clock).  On KVS_RING_HIT, *staging is
 * the entry's buffer, holding the bytes, and stays the caller's until kvs_ring_release(t); on
 * any other answer the entry is given back already.
 */
int kvs_ring_wait(struct kvs_ring *r, struct kvs_ring_ticket *t, uint64_t deadline_ns,
		  const void **staging);

/* Give back a get answered KVS_RING_HIT, once its bytes are copied out. */
void kvs_ring_release(struct kvs_ring *r, const struct kvs_ring_ticket *t);

/*
 * Offer shard key of the region (len bytes, READY there) to the pool under remote key rkey.
 * The engine does not wait: the helper copies the shard out if it is still READY under key.
 * Returns 0, or -EBUSY when no entry is free (the offer is dropped: the caller counts it).
 */
int kvs_ring_put(struct kvs_ring *r, const struct kvs_ring_owner *o, const char *rkey,
		 const struct kvs_key *key, uint32_t len);

/* ------------------------------------------------------------------ the helper */

/*
 * Build the ring at path for nent entries of shard_size bytes of staging each, mode as the
 * region's: a new file, renamed into place, unless the file there is a ring of the same
 * dimensions, which is taken over (what a helper that died left in it is answered: ring.c).
 * The caller holds the helper's lock (kvs_ring_lock) first.  Returns 0 or -errno, with msg.
 */
int kvs_ring_create(const char *path, uint32_t nent, uint64_t shard_size, uint32_t mode,
		    struct kvs_ring **out, char *msg, size_t msglen);

/* Take the helper's lock of the ring at path (its .lock file, flock, held for the process's
 * life).  Returns the lock's descriptor, or -EWOULDBLOCK when another helper holds it. */
int kvs_ring_lock(const char *path, uint32_t mode);

/* Beat, and give back the entries of engine processes that are gone (still says so: ring.c,
 * "Crashes").  The helper calls it every KVS_RING_BEAT_NS.  Returns the entries given back. */
int kvs_ring_beat(struct kvs_ring *r, kvs_ring_still_fn still, void *arg);

/* Give back what kvs_ring_beat gives back, without beating: for a helper whose gets are stuck
 * (engines should stop asking), which still frees what dead engines left. */
int kvs_ring_reclaim(struct kvs_ring *r, kvs_ring_still_fn still, void *arg);

/* How long the buffer of a get answered with an error stays out of use (ring.c): longer than
 * the pool client's own bound on a transfer.  0 until set. */
void kvs_ring_set_hold(struct kvs_ring *r, uint64_t ns);

/* Say the helper is leaving: the beat is cleared, so engines stop asking at once. */
void kvs_ring_leave(struct kvs_ring *r);

void kvs_ring_set_route(struct kvs_ring *r, int route);

/* One request taken by the helper. */
struct kvs_ring_job {
	uint32_t entry;
	uint32_t op; /* enum kvs_ring_op */
	uint32_t len;
	struct kvs_ring_owner owner;
	uint32_t slot;	    /* a get's: the slot its owner loads (UINT32_MAX unless _get_for) */
	struct kvs_key key; /* the region's shard (a get's: zero unless kvs_ring_get_for) */
	char rkey[KVS_RING_KEY_MAX];
	void *staging; /* the entry's buffer */
};

/*
 * Take up to n posted entries of op (enum kvs_ring_op), waiting for op's bell until one is
 * posted or timeout_ns passes: each becomes the helper's until kvs_ring_done.  Returns how many
 * were taken.  One thread per op.
 */
int kvs_ring_take(struct kvs_ring *r, unsigned op, struct kvs_ring_job *jobs, int n,
		  uint64_t timeout_ns);

/* Answer a taken entry: result is the bytes got (a get), or -errno: -ENOENT (the pool does
 * not hold the key), -ECANCELED (refused before any transfer started), or another (failed:
 * its buffer is held, ring.c).  A put's entry is simply given back. */
void kvs_ring_done(struct kvs_ring *r, uint32_t entry, int64_t result);

/* The staging memory (every entry's buffer, one range), to register with the pool. */
void kvs_ring_staging(const struct kvs_ring *r, void **base, size_t *len);

uint32_t kvs_ring_entries(const struct kvs_ring *r);

/* The length a taken entry asks for (the helper's). */
bool kvs_ring_len(const struct kvs_ring *r, uint32_t entry, uint32_t *len);

#endif
