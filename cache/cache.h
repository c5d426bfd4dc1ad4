/*
 * cache: the node-wide shared KV cache (docs/design.md, "The shared region").
 *
 * One POSIX shared-memory region per node and name holds fixed-size slots, each caching one
 * (block, shard) of a KV file.  Every process that maps the region may pin a key: the first pin
 * of a key that is not READY makes the pinner its owner, which loads the bytes and publishes
 * READY or FAILED; other pinners wait on the slot's state word and copy the bytes out.  The full
 * protocol (who writes what, which lock guards it, what happens when a process dies) is the
 * essay at the top of region.c; this header is the contract.
 *
 * All functions return 0 (or a documented non-negative value) on success and -errno on failure;
 * none sets errno, prints, or exits.  Project-specific codes:
 *   -EUCLEAN  the region's shared state is corrupt (an index out of bounds, a chain cycle),
 *             or a lock on it is stuck: its holder does not exist, or it did not move within
 *             the lock timeout (loader.wait_timeout_ms; 2 s for a KVS_OPEN_WATCH mapping).
 *             The caller reads storage itself.
 *   -ENOSPC   every slot that the caller may take is pinned;
 *   -ENOBUFS  this process already holds KVS_PINS_PER_PROC pins.
 */
#ifndef KVS_CACHE_H
#define KVS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "params.h"

struct kvs_cache;

/* Identity of one cached shard: the 128-bit block id of a file and the shard index in it. */
struct kvs_key {
	uint64_t block_lo;
	uint64_t block_hi;
	uint64_t shard;
};

/* The key of shard `shard` of block (a kvs_block_id, whose shard is ignored). */
static inline struct kvs_key kvs_shard_key(const struct kvs_key *block, uint64_t shard)
{
	struct kvs_key k = {block->block_lo, block->block_hi, shard};

	return k;
}

/* The bytes of a file of size bytes that its shard starting at start holds (shards of S). */
static inline uint64_t kvs_shard_bytes(uint64_t size, uint64_t start, uint64_t S)
{
	return start >= size ? 0 : size - start < S ? size - start : S;
}

/* A pin: which slot, and which entry of this process's pin table records it. */
struct kvs_pin {
	uint32_t slot;
	uint32_t entry;
};

enum kvs_counter_id {
#define KVS_COUNTER(name, help) KVS_CTR_##name,
#include "counters.def"
#undef KVS_COUNTER
	KVS_NCOUNTERS
};

struct kvs_counters {
	uint64_t v[KVS_NCOUNTERS];
};

/*
 * Tallies (cache/tally.c): the figures of reads by pod (a PID namespace) and by root (a
 * directory of files.roots), in a bounded table in the region: KVS_TALLY_PODS pod entries
 * and KVS_TALLY_ROOTS root entries, the last of each named "other".  A process joins its
 * pod's entry when it attaches (taking a free one, else one whose processes are all gone,
 * whose figures then go to "other", else "other"), and each of its roots' entries when asked
 * (a root the table has no room for counts in "other").  A reference names one pod and one
 * root entry (KVS_TALLY_NONE: neither); kvs_cache_tally_add adds to both, without a lock.
 */
enum kvs_tally_id {
#define KVS_TALLY(name, help) KVS_TALLY_##name,
#include "tallies.def"
#undef KVS_TALLY
	KVS_NTALLY
};
#define KVS_TALLY_PODS	   16u
#define KVS_TALLY_ROOTS	   16u
#define KVS_TALLY_NAME_MAX 168u /* bytes of a tally's name, its NUL included */
#define KVS_TALLY_NONE	   0u	/* a reference to no entry (a zeroed one) */
enum kvs_tally_kind {
	KVS_TALLY_FREE = 0,
	KVS_TALLY_POD = 1,
	KVS_TALLY_ROOT = 2,
	KVS_TALLY_OTHER = 3
};

/* The reference to this process's pod entry and to root entry root (a kvs_cache_tally_root
 * answer, or -1 for none): what kvs_cache_tally_add takes.  KVS_TALLY_NONE for a watcher. */
uint32_t kvs_cache_tally_ref(const struct kvs_cache *c, int root);
/* The entry of the root directory path (its entry made now if there is none and room),
 * "other"'s when the table is full: an index for kvs_cache_tally_ref, or -EUCLEAN (the
 * process table's lock is stuck) or -EPERM (a watcher). */
int kvs_cache_tally_root(struct kvs_cache *c, const char *path);
/* Add v to figure id of the entries ref names (relaxed adds; no-op for KVS_TALLY_NONE). */
void kvs_cache_tally_add(struct kvs_cache *c, uint32_t ref, enum kvs_tally_id id, uint64_t v);

struct kvs_tally_info {
	enum kvs_tally_kind kind; /* POD, ROOT or OTHER (of pods, or of roots: root says which) */
	bool root;		  /* a root's entry (or the roots' "other") */
	uint64_t key;		  /* POD: its PID namespace (inode of /proc/self/ns/pid) */
	char name[KVS_TALLY_NAME_MAX]; /* POD: its host name; ROOT: the directory; "other" */
	uint32_t processes;	       /* POD: processes attached now that joined it */
	uint64_t v[KVS_NTALLY];
};
/* The entries in use (pods first, then roots; an "other" only when it has counted something)
 * into out[0..n): returns how many there are (may exceed n).  Works on a watcher's mapping. */
int kvs_cache_tallies(struct kvs_cache *c, struct kvs_tally_info *out, int n);

/* What a pin found. */
enum kvs_pin_result {
	KVS_PIN_HIT = 0,   /* READY: copy the bytes out, then release */
	KVS_PIN_OWNER = 1, /* the caller must load it, then mark it ready or failed, then release */
	KVS_PIN_WAIT = 2,  /* another process loads it: kvs_cache_wait, then copy, then release */
};

/* Who may take a slot.  Normal allocations never take the reserved share of slots. */
enum kvs_alloc_class {
	KVS_ALLOC_NORMAL = 0,
	KVS_ALLOC_LOAD = 1,	/* a demand load an engine thread is waiting for */
	KVS_ALLOC_PREFETCH = 2, /* a preallocation or read-ahead */
	KVS_ALLOC_STAGE = 3,	/* write-through's staging: free frames, or ones unused lately */
};

/* Slot states as the existence query reports them. */
enum kvs_slot_state {
	KVS_SLOT_FREE = 0,
	KVS_SLOT_CLAIMED = 1, /* taken by an allocator, not yet hashed */
	KVS_SLOT_LOADING = 2,
	KVS_SLOT_READY = 3,
	KVS_SLOT_FAILED = 4,
	KVS_SLOT_ALLOCATED = 5, /* lookup only: LOADING with no pin, so no owner (prealloc) */
};

enum kvs_open_flags {
	KVS_OPEN_CREATE = 1 << 0, /* create the region if it does not exist */
	KVS_OPEN_WATCH = 1 << 1,  /* map the control plane only; take no process slot */
};

/*
 * Map the region that cfg names (/dev/shm/kvshim.<euid>.<cache.name>), creating it when absent
 * and KVS_OPEN_CREATE is given, and (unless KVS_OPEN_WATCH) attach this process: take a process
 * table slot and its liveness lock.  *out is set on success only.  The object at the path is
 * used only if kvs_cache_open_file trusts it.  A region is built only if it fits in the free
 * space of /dev/shm less cfg->shm_headroom; with cache_capacity 0 (auto) it is built as
 * large as fits, and an existing region is taken with the slot count it has.
 * A region refused for its dimensions counts the refusal in its header (refused_attaches), when
 * it is of this layout.  With KVS_OPEN_CREATE and cfg->on_mismatch = rebuild, such a
 * region is replaced by one built for cfg instead, if no live process is attached to it.
 * Errors: -ENOENT (absent, no CREATE), -EPERM (an object at the path that is not trusted: msg
 * says what it is), -ENOSPC (does not fit: msg gives the sizes and the fixes), -EPROTO (magic,
 * layout or a dimension differs from cfg, or truncated: msg says which; with rebuild, also
 * while processes are attached to it), -EUSERS (process table full), -EUCLEAN (the process
 * table's lock is stuck), -ENOMEM, or any errno of open/mmap/fcntl.
 * msg (may be NULL) receives a one-line reason on failure; on success it is "", unless a
 * region was replaced (rebuild): then it says which and why, for the caller to log once.
 */
int kvs_cache_open(const struct kvs_cache_params *cfg, int flags, struct kvs_cache **out, char *msg,
		   size_t msglen);

/*
 * Whether a new region for cfg would be built: the check kvs_cache_open applies before it
 * creates one (the region's total size against the free space of /dev/shm less
 * cache.shm_headroom; with capacity = auto, room for the smallest region).  Returns 0, or
 * -ENOSPC (msg gives the sizes and the fixes) or another -errno with one line in msg.
 */
int kvs_cache_fits(const struct kvs_cache_params *cfg, char *msg, size_t msglen);

/*
 * Check a region opened with KVS_OPEN_WATCH (which takes it as built) against cfg as an
 * attacher would: every dimension, and the eviction policy.  Returns 0, or -EPROTO with the
 * attacher's mismatch message in msg ("region ... has shard_size 65536, the configuration
 * wants 131072 (run `kvshim reset` to rebuild it)").
 */
int kvs_cache_check_config(struct kvs_cache *c, const struct kvs_cache_params *cfg, char *msg,
			   size_t msglen);

/*
 * Give every slot of the region its pages now, on this thread and threads - 1 more (0: one
 * per CPU this process may run on; at most KVS_PREPARE_THREADS_MAX), and clear them (the
 * first touch of a fresh page, which a cold load would otherwise pay inside its storage
 * read), so that loads begin on prepared memory: `kvshim prepare`, before the engines start.
 * It stops, as a walk does, at the first slot for which the file system would go below
 * cache.shm_headroom.  Idempotent, and harmless on a region in use: a page that holds data is
 * left as it is.  *slots_done receives the slots that have their pages from the first on.  A
 * region of keys only has nothing to prepare (0, every slot done).
 * Returns 0, -ENOSPC (the headroom or a full file system stopped it), -EBADF for a
 * KVS_OPEN_WATCH mapping, or another -errno of the allocation.
 */
#define KVS_PREPARE_THREADS_MAX 64
int kvs_cache_prepare(struct kvs_cache *c, unsigned threads, uint32_t *slots_done);

/* Detach (fold this process's counters into the totals, free its process slot), unmap and free.
 * The caller must hold no pins.  NULL is accepted. */
void kvs_cache_close(struct kvs_cache *c);

/* Forget the mapping after fork() in the child, without touching shared state: the parent still
 * owns the process slot, the pins and the liveness lock.  Closes the inherited descriptor so
 * that the child does not keep the parent's liveness lock alive. */
void kvs_cache_forget(struct kvs_cache *c);

/* The program is about to close descriptor numbers lo to hi (close, close_range, a dup2 or dup3
 * onto one): the region's own descriptors among them (the handle's, the populate walk's) move
 * above hi first, keeping their open file descriptions and so the process's liveness lock and
 * the walk's.  One that cannot move (a close_range to the top) is lost: the cache then makes
 * no call on that number again (base/sys.h, kvs_ownfd_get), and this process's liveness rests on
 * its other descriptors of the region, if any (docs/design.md, "Known limitations").  c may be
 * NULL (not mapped yet): the walk's descriptor is the process's, not the handle's.  Waits for
 * the cache's own calls on the old numbers to end (base/sys.h, kvs_ownfd_closing).
 * Async-signal-safe. */
void kvs_cache_fds_closing(struct kvs_cache *c, unsigned int lo, unsigned int hi);
/* Is any of those descriptors among lo to hi now?  Loads only (no system call). */
bool kvs_cache_fds_in(struct kvs_cache *c, unsigned int lo, unsigned int hi);

/* Path of the region object for cfg: "/dev/shm/kvshim.<euid>.<name>". */
int kvs_cache_path(const struct kvs_cache_params *cfg, char *buf, size_t len);

/*
 * Open the region file at path (oflags: O_RDONLY or O_RDWR) without following a symbolic link
 * and without blocking (a FIFO or a device at the path), and keep it only if it can be
 * trusted: a regular file owned by the effective uid, with one link, and no permission bit
 * beyond mode (cache.mode).  Returns the descriptor (O_CLOEXEC, blocking), or -ENOENT, -EPERM
 * (not trusted; a symbolic link) or another -errno, with one line in msg (not for -ENOENT).
 */
int kvs_cache_open_file(const char *path, int oflags, uint32_t mode, char *msg, size_t msglen);

/* If the object st describes is not one kvs_cache_open_file trusts under mode, write why
 * ("owned by uid 1001, not 0", "has 2 links", "is a FIFO, not a regular file", "mode 0666 is
 * wider than cache.mode 0600") to why and return true. */
struct stat;
bool kvs_cache_distrust(const struct stat *st, uint32_t mode, char *why, size_t len);

/*
 * Pin key.  Returns KVS_PIN_HIT, KVS_PIN_OWNER or KVS_PIN_WAIT and fills *pin; the pin must be
 * released with kvs_cache_release.  On a miss a slot is allocated (CLOCK or FIFO eviction)
 * within the share that cls may use.  Errors: -ENOSPC, -ENOBUFS, -EUCLEAN.
 */
int kvs_cache_pin(struct kvs_cache *c, const struct kvs_key *key, enum kvs_alloc_class cls,
		  struct kvs_pin *pin);

/*
 * kvs_cache_pin for a load of bytes bytes (the shard's length in its file; 0: a whole shard)
 * whose bytes may be kept only until expires_ns (the node's clock, kvs_node_ns; 0: for good, as
 * kvs_cache_pin).  A slot allocated for fewer bytes than a shard is packed with others into
 * one frame and costs the cache its bytes rounded up to pages (at least shard_size /
 * per-frame slots; layout.h); kvs_cache_room says what a slot holds.  Whichever slot the key
 * has already is pinned as it is.  When the pin elects the caller owner, the slot carries that
 * expiry from then on.  Any lookup of the key at or after it (this process's or another's)
 * drops the slot, READY or still loading, and finds nothing, so the next pin loads the shard
 * again, once for the node (a READY one counts in shards_expired).  Pins held before the
 * expiry keep their bytes.
 */
int kvs_cache_pin_load(struct kvs_cache *c, const struct kvs_key *key, enum kvs_alloc_class cls,
		       uint32_t bytes, uint64_t expires_ns, struct kvs_pin *pin);

/* Pin key only if it is READY (KVS_PIN_HIT); never allocates or elects.  -EAGAIN otherwise,
 * or -EUCLEAN.  The calling-thread fast path of the loader. */
int kvs_cache_pin_ready(struct kvs_cache *c, const struct kvs_key *key, struct kvs_pin *pin);

/* Pin slot `slot` only while it is key's, LOADING under owner (a process-table slot:
 * kvs_cache_whoami) and pinned by it (KVS_PIN_WAIT); never allocates or elects.  -EAGAIN
 * otherwise: another slot of key (the owner's expired and was loaded anew), another owner,
 * another state.  For the remote helper's zero-copy gets: its pin keeps the slot from being
 * reused under a transfer that lands late, whatever its owner does meanwhile (remote/ring.c). */
int kvs_cache_pin_loading(struct kvs_cache *c, const struct kvs_key *key, uint32_t owner,
			  uint32_t slot, struct kvs_pin *pin);

/* Drop a pin.  The last pin of a FAILED slot sends it back to LOADING (the next pinner owns the
 * retry); the last pin of an invalidated slot frees it.  A release whose stripe lock is stuck
 * is deferred, not lost: the pin stays recorded (the slot stays pinned) and is returned by a
 * later release or kvs_cache_reap_maybe of this process once the lock can be had, or by the
 * reclaim of this process after it is gone.  Never allocates memory. */
void kvs_cache_release(struct kvs_cache *c, const struct kvs_pin *pin);

/* Owner only: publish length valid bytes as READY and wake waiters. */
void kvs_cache_mark_ready(struct kvs_cache *c, const struct kvs_pin *pin, uint32_t length);

/* Owner only: publish length valid bytes as READY to the pins held now, but do not keep them:
 * the key is unhashed first, so later pins miss (and load again), and the last release frees
 * the slot.  For bytes read while the file's identity could not be trusted. */
void kvs_cache_mark_ready_unkept(struct kvs_cache *c, const struct kvs_pin *pin, uint32_t length);

/* Owner only: publish FAILED with err (a positive errno), stored before the state. */
void kvs_cache_mark_failed(struct kvs_cache *c, const struct kvs_pin *pin, int err);

/* Sole pinner of a READY slot only: send it back to LOADING so the next pin reloads it
 * (loader.backend_only).  Returns 0, -EBUSY when other pins exist, or -EUCLEAN. */
int kvs_cache_mark_not_ready(struct kvs_cache *c, const struct kvs_pin *pin);

/*
 * Wait until the pinned slot leaves LOADING or timeout_ns passes.  Spins briefly, then sleeps
 * on the state word (futex mode) or yields (spin mode).  When it first sleeps, and every 50 ms
 * after, it checks the owner: a dead owner is reclaimed, and a load whose owner is no live
 * attached process (dead, a FREE table entry, an index out of range) is failed with
 * EOWNERDEAD, which wakes every waiter; the last release then lets the next pin retry.
 * Returns 0 when READY, -err when FAILED with err, -ETIMEDOUT, or -EUCLEAN.
 */
int kvs_cache_wait(struct kvs_cache *c, const struct kvs_pin *pin, uint64_t timeout_ns);

/* The pinned slot's data (kvs_cache_room bytes, page-aligned: at most shard_size, fewer for a
 * packed slot), and its valid length once READY. */
void *kvs_cache_data(struct kvs_cache *c, const struct kvs_pin *pin);
uint32_t kvs_cache_room(struct kvs_cache *c, const struct kvs_pin *pin);
uint32_t kvs_cache_length(struct kvs_cache *c, const struct kvs_pin *pin);
/* The data slots, all of them: what a process copying to a device registers with the driver. */
void kvs_cache_data_region(const struct kvs_cache *c, void **base, size_t *len);
/* Whether every slot [off, off+len) of that region overlaps has its pages already (pinning
 * them for a device, kvs_gpu_register_region, then allocates nothing).  Lock-free. */
bool kvs_cache_data_ready(const struct kvs_cache *c, size_t off, size_t len);

/* Existence query: the state of key's slot (enum kvs_slot_state; ALLOCATED for a LOADING slot
 * nobody owns yet, which the next pin will own), -ENOENT or -EUCLEAN.  Works on a
 * KVS_OPEN_WATCH mapping. */
int kvs_cache_lookup(struct kvs_cache *c, const struct kvs_key *key);

/* Allocate an unowned LOADING slot for key, of room for bytes bytes (as kvs_cache_pin_load),
 * unless present (-EEXIST), so that a later pin finds it without evicting.  Class
 * KVS_ALLOC_PREFETCH. */
int kvs_cache_prealloc(struct kvs_cache *c, const struct kvs_key *key, uint32_t bytes);

/* Remove shards [first, last] of block from the cache, any range (longer than the slot count:
 * every slot is looked at instead of every shard); pinned slots are unhashed now and freed by
 * their last release.  Returns the number of slots removed, or -EUCLEAN when a stripe could
 * not be locked or a chain is corrupt: the shards it guards may remain, all others are gone. */
int kvs_cache_invalidate(struct kvs_cache *c, const struct kvs_key *block, uint64_t first,
			 uint64_t last);

/* Reclaim every process whose liveness lock is gone: return its pins, fail the loads it owned,
 * free what it had claimed, fold its counters.  Returns the number reclaimed. */
int kvs_cache_reap(struct kvs_cache *c);

/* kvs_cache_reap, at most once per 250 ms in this process (the callers are hot paths that
 * notice symptoms of a dead process: a failed slot, no free slot); also retries this
 * process's deferred releases (kvs_cache_release). */
int kvs_cache_reap_maybe(struct kvs_cache *c);

/* True once after this process met a stuck lock or corrupt shared state (some call returned
 * -EUCLEAN and the caller read storage itself); clears it.  For the shim's one warning. */
bool kvs_cache_take_euclean(struct kvs_cache *c);

/* Add v to one of this process's counters (no-op for a watcher). */
void kvs_cache_count(struct kvs_cache *c, enum kvs_counter_id id, uint64_t v);
/* The bytes of the region's data frames (cache.capacity as built). */
uint64_t kvs_cache_capacity(const struct kvs_cache *c);
/* This process's counter id (0 before it attached); loads only. */
uint64_t kvs_cache_counted(const struct kvs_cache *c, enum kvs_counter_id id);
/* Has this process loaded more from storage than the region holds, and evicted at least half
 * the region's shards to make room (a load larger than the region: its shards evict each
 * other)?  Loads only. */
bool kvs_cache_outgrown(const struct kvs_cache *c);

/* This process's process-table slot, or -1 for a watcher. */
int kvs_cache_self(const struct kvs_cache *c);
/* Which process this is, in a form any process of the region can check, whatever its PID
 * namespace: its table slot and the moment it attached there (false before it attached). */
bool kvs_cache_whoami(const struct kvs_cache *c, uint32_t *slot, uint64_t *at);
/* Is the process kvs_cache_whoami named still attached (its slot's liveness lock held, and
 * the slot not taken since by another)?  One F_OFD_GETLK; true when it cannot tell. */
bool kvs_cache_still(struct kvs_cache *c, uint32_t slot, uint64_t at);

/* Dense rank among processes attached now, and their number (for loader.local_rank auto). */
void kvs_cache_ranks(struct kvs_cache *c, uint32_t *rank, uint32_t *nranks);

/* Record this process's rotation rank for `kvshim stat`. */
void kvs_cache_set_rank(struct kvs_cache *c, int rank);

uint64_t kvs_cache_shard_size(const struct kvs_cache *c);
/* The size of the region's pages: 4096, or a huge page's (pages.c); the data is aligned to
 * it. */
uint64_t kvs_cache_page_size(const struct kvs_cache *c);
uint32_t kvs_cache_slots(const struct kvs_cache *c);

/*
 * A file's identity (cache/key.c).  By change (the default): st_dev, st_ino, st_size,
 * st_mtim, st_ctim, so that any write gives the file a new block id.  By birth (write_once,
 * files.write_once roots): st_dev, st_ino, st_size, the birth time and the inode generation,
 * so that touches, chmod and renames keep it and a file created anew never has the old one's.
 */
struct kvs_time {
	int64_t sec;
	uint32_t nsec;
};
static inline bool kvs_time_eq(struct kvs_time a, struct kvs_time b)
{
	return a.sec == b.sec && a.nsec == b.nsec;
}
/* Nanoseconds since the epoch (0 before it). */
static inline uint64_t kvs_time_ns(struct kvs_time t)
{
	return t.sec < 0 ? 0 : (uint64_t)t.sec * 1000000000ull + t.nsec;
}
struct kvs_ident {
	uint64_t dev, ino, size;
	uint32_t mode;
	struct kvs_time mtime, ctime, atime, btime;
	uint32_t gen;
	bool has_btime, has_gen;
	bool write_once; /* keyed by birth: asked for, and the file system gives btime or gen */
};

/* The identity of fd's file: one statx (STATX_BTIME; fstat where there is none), and with
 * write_once an FS_IOC_GETVERSION ioctl (and fstatfs where it fails).  write_once asked for on
 * a file system that gives no generation (but tmpfs, with a birth time) leaves id->write_once
 * false: keyed by change.  Returns 0 or -errno of statx/fstat.  No hooked name is called. */
int kvs_ident_of_fd(int fd, bool write_once, struct kvs_ident *id);
/* May id (its has_btime and has_gen read) be keyed by birth on a file system of fs_type
 * (statfs f_type)?  The one rule kvs_ident_of_fd applies. */
bool kvs_ident_by_birth(const struct kvs_ident *id, unsigned long fs_type);
/* Only the generation of fd's file (id->has_gen, id->gen); 0 or -errno of the ioctl. */
int kvs_ident_generation(int fd, struct kvs_ident *id);
/* The identity by change of what fstat said (no birth time, write_once false). */
void kvs_ident_from_stat(const struct stat *st, struct kvs_ident *id);
/* The block id of an identity (shard 0): XXH3-128 of its words, under a tag per scheme. */
void kvs_ident_key(const struct kvs_ident *id, struct kvs_key *out);
/* Do a and b name the same bytes under their scheme (the words kvs_ident_key hashes)? */
bool kvs_ident_same(const struct kvs_ident *a, const struct kvs_ident *b);
/* The block id by change of what fstat said (kvs_ident_from_stat, kvs_ident_key). */
void kvs_block_id(const struct stat *st, struct kvs_key *out);

/*
 * When did this node first load a shard of block (a file identity: kvs_block_id, shard
 * ignored)?  The time recorded in the region's seen table, or, when none is, now_ns after
 * recording it (the node's clock, kvs_node_ns; never later than now_ns).  Lock-free.  A record may
 * be lost (the table is a cache): the answer is then later than the truth, never earlier.  A
 * watcher records nothing and gets now_ns.
 */
uint64_t kvs_cache_first_seen(struct kvs_cache *c, const struct kvs_key *block, uint64_t now_ns);

/*
 * Write-through (cache/stage.c): slots a writer fills with the bytes it writes to a KV file,
 * which no lookup finds until the writer publishes them under the file's final identity.
 *
 * kvs_cache_stage_claim takes a slot for this process (CLAIMED by it, in no chain; its
 * reclaim frees it if it dies) from the main share: a free frame, or one whose slots are
 * unpinned and were not used since the hand last passed (it takes no second chance from a
 * frame readers use, nor clears one: bytes that may never be published do not push out bytes
 * in use); it never waits for a load.  And only while the slots staged on the node, summed
 * over the processes attached (kvs_cache_stage_count), are below a quarter of the region's.
 * 0 with *slot, -ENOSPC (the node's share spent, nothing idle in the main share, or /dev/shm
 * at the headroom), -EPERM (a watcher, a region of keys only), -EUCLEAN.
 * kvs_cache_stage_count: this process holds n slots staged now (for the node's bound).
 * kvs_cache_stage_data: the slot's shard_size bytes.
 * kvs_cache_stage_publish hashes a staged slot under key as READY with length bytes, kept
 * until expires_ns (the node's clock, kvs_node_ns; 0: for good).  If key is there already (a reader
 * loaded it, or a writer published it, before), that slot is taken out of use first (freed, or left
 * to the pins that hold it): it may hold an older file's bytes under the same identity.
 * 1 published, -EINVAL (not a slot this process staged), -EUCLEAN (freed).
 * kvs_cache_stage_drop frees a staged slot.
 * kvs_cache_rekey moves the READY slot of key from, unless it is pinned, to key to (a rename
 * gave the file another identity), keeping its length and expiry; what to held is taken out
 * of use as by a publication.  1 moved, 0 not moved (absent, pinned), -errno.
 */
int kvs_cache_stage_claim(struct kvs_cache *c, uint32_t *slot);
void kvs_cache_stage_count(struct kvs_cache *c, uint32_t n);
void *kvs_cache_stage_data(struct kvs_cache *c, uint32_t slot);
int kvs_cache_stage_publish(struct kvs_cache *c, uint32_t slot, const struct kvs_key *key,
			    uint32_t length, uint64_t expires_ns);
void kvs_cache_stage_drop(struct kvs_cache *c, uint32_t slot);
int kvs_cache_rekey(struct kvs_cache *c, const struct kvs_key *from, const struct kvs_key *to);
/* kvs_cache_rekey, the slot's expiry brought down to cap_ns (kvs_node_ns) when it is
 * later or for good; 0: kept as it is. */
int kvs_cache_rekey_until(struct kvs_cache *c, const struct kvs_key *from, const struct kvs_key *to,
			  uint64_t cap_ns);

/*
 * Write sequences (cache/wseq.c): did another process under the shim write the file (st_dev,
 * st_ino) before, while or after this one did?  kvs_cache_write_begin before a write (t->foreign:
 * another process wrote the file since this one last did, or that cannot be told: bytes this
 * process wrote earlier may be covered), then kvs_cache_write_end after it: true when the write
 * was clean (no other process had a write of the file in flight meanwhile).  Writes of one
 * process may overlap in time; the caller tracks their ranges.  kvs_cache_write_last, at
 * publication, with the token of this process's last write to end: true when no write of the
 * file began since.  Lock-free; a dead writer or an entry shared with another file makes later
 * writes unclean or foreign, never another's write invisible.
 */
struct kvs_wtok {
	uint32_t entry, key, gen;
	bool held;    /* begun and not ended: end must be called */
	bool clean;   /* no other process's write seen so far */
	bool foreign; /* at begin: another process may have written the file since our last */
};
void kvs_cache_write_begin(struct kvs_cache *c, uint64_t dev, uint64_t ino, struct kvs_wtok *t);
bool kvs_cache_write_end(struct kvs_cache *c, struct kvs_wtok *t);
bool kvs_cache_write_last(struct kvs_cache *c, const struct kvs_wtok *t);
/* For a change that is not a write (a touch), or a load (loader/publish.c): kvs_cache_write_mark
 * takes the file's mark before it (false: a write of the file under the shim is in flight, or of
 * another file that shares its entry, or the region has no write sequences), kvs_cache_write_quiet
 * after it says whether no write under the shim began or ended since.  Lock-free; works on a
 * KVS_OPEN_WATCH mapping too. */
bool kvs_cache_write_mark(struct kvs_cache *c, uint64_t dev, uint64_t ino, uint64_t *mark);
bool kvs_cache_write_quiet(struct kvs_cache *c, uint64_t dev, uint64_t ino, uint64_t mark);

/* Files mapped shared and writable (maplock.c): kvs_cache_map_hold while this process holds
 * such a mapping of (dev, ino) (0, or -errno: not held, nothing to release), and
 * kvs_cache_map_release when it is gone; a process's holds end with it.  kvs_cache_map_busy:
 * may any process of the node, this one included, hold one now?  One system call (none when
 * this process holds one); true when it cannot tell.  Not on a KVS_OPEN_WATCH mapping. */
int kvs_cache_map_hold(struct kvs_cache *c, uint64_t dev, uint64_t ino);
void kvs_cache_map_release(struct kvs_cache *c, uint64_t dev, uint64_t ino);
bool kvs_cache_map_busy(struct kvs_cache *c, uint64_t dev, uint64_t ino);

/*
 * The memory of regions (cache/pages.c): what the file system of a directory gives a region.
 * A region's pages are of one kind, decided by its creator and recorded in its header.
 */
enum kvs_page_kind {
	KVS_PAGE_BASE = 0,	/* 4 KiB pages */
	KVS_PAGE_TMPFS = 1,	/* a tmpfs that gives every file huge pages (huge=always,
				 * huge=within_size, or THP's shmem_enabled = force) */
	KVS_PAGE_ADVISE = 2,	/* a tmpfs mounted huge=advise: huge pages by MADV_HUGEPAGE */
	KVS_PAGE_HUGETLBFS = 3, /* a hugetlbfs: pages of its size, reserved for the whole region */
};
struct kvs_memory {
	char fs[16]; /* "tmpfs", "hugetlbfs", else the file system's magic "0x..." */
	bool tmpfs, hugetlbfs;
	char huge[16];		/* tmpfs: its huge= mount option ("never" without one), else "" */
	char shmem_enabled[16]; /* THP's shmem_enabled choice ("deny" and "force" override every
				 * tmpfs), "" without THP */
	uint64_t thp_size;	/* the huge page size of THP (hpage_pmd_size), 0 without THP */
	uint32_t kind;		/* enum kvs_page_kind a region built there now gets */
	uint64_t page_size;	/* and the size of its pages */
	uint64_t free_bytes;	/* room for a region before the headroom: the file system's free
				 * space; hugetlbfs: its pool's pages neither used nor reserved,
				 * within the mount's size= */
	uint64_t pool_pages, pool_free; /* hugetlbfs: pages of its size on the node, and free
					 * ones not reserved */
	bool mount_limited;		/* hugetlbfs: the mount's size= bounds free_bytes */
};

/* What cfg->dir's file system gives a region built now under cfg->huge_pages.  0, or -errno
 * when the directory cannot be opened or its file system read (-EOPNOTSUPP: a hugetlbfs of a
 * page size above 1 GiB). */
int kvs_cache_memory(const struct kvs_cache_params *cfg, struct kvs_memory *m);

/* The one step that would give regions in dir (whose memory m describes) huge pages, into
 * buf: "`mount -o remount,huge=advise /dev/shm` gives a region 2 MiB pages", a command to
 * reserve a hugetlbfs pool, or why the node has none.  Returns buf. */
const char *kvs_memory_fix(const struct kvs_memory *m, const char *dir, char *buf, size_t len);

/* The word for a page kind: "none", "tmpfs", "advise", "hugetlbfs". */
const char *kvs_page_kind_word(uint32_t kind);

/* Figures for `kvshim stat`. */
struct kvs_region_info {
	uint64_t capacity_bytes, shard_size, total_bytes;
	/* slots: frames of shard_size bytes (capacity / shard_size), reserved_slots of them the
	 * reserve; slots_ready ... slots_pinned: slots (a frame holds one, or several packed) */
	uint32_t slots, slots_ready, slots_loading, slots_failed, slots_pinned, reserved_slots;
	uint64_t bytes_ready; /* valid bytes of the READY slots */
	uint32_t processes_attached, max_processes;
	uint32_t slots_populated;    /* frames whose pages are allocated */
	uint32_t slots_claimed;	     /* taken by a process, in no chain: being allocated, or
				      * staged by a writer (write-through) */
	int32_t populate_err;	     /* why the background population stopped (errno), or 0 */
	uint32_t populate_mode;	     /* enum kvs_populate: of the walk a process started, if any */
	const char *populate_reason; /* "headroom", "ENOSPC", ... with populate_err, else "" */
	uint64_t shm_free_bytes;     /* free bytes of the file system holding the region (of
				      * the huge page pool, not reserved, on hugetlbfs) */
	uint32_t page_kind;	     /* enum kvs_page_kind: how the region gets its pages */
	uint64_t page_size;	     /* and their size */
	uint32_t numa;		     /* enum kvs_numa: the placement its creator gave it */
	bool keys_only;		     /* keys without data: a region of shim.mode = observe */
	bool procs_unlocked;	     /* proc_lock was stuck: the process figures were read
				      * without it (a fold in progress may count twice) */
	uint64_t refused_attaches;   /* attaches refused for the region's dimensions */
	uint64_t created_ns;	     /* CLOCK_REALTIME when the region was built */
	char built_by[33];	     /* the version of kvshim that built it */
};
struct kvs_proc_info {
	int32_t pid;	/* in the process's own PID namespace */
	uint64_t pidns; /* that namespace: the inode of its /proc/self/ns/pid, 0 if unknown */
	int32_t rank;
	bool alive;
	struct kvs_counters ctr;
};

/* Region figures and totals (folded counters of gone processes plus those attached now).
 * procs (may be NULL) receives up to nprocs entries; returns the number of attached slots.
 * Answers within the lock timeout on any region: if proc_lock is stuck, the process table is
 * read without it and info->procs_unlocked says so. */
int kvs_cache_stat(struct kvs_cache *c, struct kvs_region_info *info, struct kvs_counters *totals,
		   struct kvs_proc_info *procs, int nprocs);

/* What a look at one object in /dev/shm found (kvs_cache_peek), for `kvshim ls`. */
enum kvs_peek_state {
	KVS_PEEK_OK = 0,	 /* a region of this layout */
	KVS_PEEK_LAYOUT = 1,	 /* a region of another layout version or header size */
	KVS_PEEK_NOT_REGION = 2, /* not a regular file, or no region's magic */
	KVS_PEEK_FOREIGN = 3,	 /* owned by another uid: not opened */
	KVS_PEEK_UNTRUSTED = 4,	 /* ours, but a second link or a mode wider than cache.mode */
};
struct kvs_peek {
	enum kvs_peek_state state;
	char why[96];	     /* what is wrong, for every state but OK */
	uint32_t uid;	     /* owner */
	uint64_t size;	     /* st_size */
	uint64_t created_ns; /* from the header (OK), else st_ctim */
	int live;	     /* processes holding a liveness lock (OK, LAYOUT), else -1 */
	uint64_t capacity_bytes, shard_size, refused_attaches; /* OK only */
	uint32_t slots;					       /* OK only */
	char built_by[33];				       /* OK only, else "" */
};

/*
 * Look at the object at path without blocking and without trusting it more than attach would:
 * lstat first; only what kvs_cache_distrust accepts under mode is opened (with
 * kvs_cache_open_file, read-only), its header read and its liveness locks counted.  Returns
 * 0 with *out filled, -ENOENT when nothing is there, or -errno.
 */
int kvs_cache_peek(const char *path, uint32_t mode, struct kvs_peek *out);

/* Processes holding a liveness lock on the region at path, or -errno.  It opens path
 * without the checks of kvs_cache_open_file: pass "/proc/self/fd/N" of a descriptor that
 * kvs_cache_open_file returned. */
int kvs_cache_live_processes(const char *path);

#endif
