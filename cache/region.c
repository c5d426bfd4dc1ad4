/*
 * region: creating and attaching the node-wide shared region (its dimensions are geometry.c's,
 * its file shmfile.c's, what it says of itself stat.c's).
 *
 * DESIGN: the shared-memory protocol (this essay covers all of cache/)
 *
 * The region is a file in cache.dir (/dev/shm by default; a tmpfs or a hugetlbfs: the kind and
 * size of its pages, and its placement, are pages.c's), mapped MAP_SHARED by every process that
 * uses it.
 *
 * Trust.  /dev/shm is a world-writable sticky directory: any local user can put anything at
 * our path (a hard link to a region they can write, a FIFO, a symbolic link).  A region is
 * shared memory that the engine copies from and locks live in, so a process uses the object
 * at its path only if it is a regular file, owned by this process's effective uid, with one
 * link, and with no permission bit beyond cache.mode: then nobody but us (and the group
 * cache.mode names) can have written it, and no other name reaches it.  Every open of the path
 * (attach, `kvshim stat`, `kvshim reset`) goes through kvs_cache_open_file: O_NOFOLLOW, so a
 * symbolic link is not followed, and O_NONBLOCK, so a FIFO or a device cannot block the open;
 * then fstat of what was opened (not of the name, which may change meanwhile) decides.
 * Anything else is refused with -EPERM and one line saying what the object is, and the engine
 * reads from storage.  The name itself is predictable by design; an object another user put
 * there is removed by root (`kvshim reset`), or avoided with another cache.name.
 *
 * Publication.  The creator builds the region in an unnamed file (O_TMPFILE in cache.dir),
 * mode 0600 then fchmod to cache.mode, sized, its control plane allocated and written, and
 * only then gives it the name with linkat(/proc/self/fd/N): no process ever maps a half-built
 * region, no name exists that another user could guess and take first, and two racing
 * creators agree on one winner (linkat fails with EEXIST for the loser, which attaches to the
 * winner's).  Where the file system has no O_TMPFILE the file gets a name with 128 random
 * bits (getrandom), created O_EXCL | O_NOFOLLOW, renamed into place without replacing
 * (RENAME_NOREPLACE), and unlinked on every failure.  Before it builds anything, the creator
 * checks that the region fits in the file system's free space (a hugetlbfs: its pool's pages
 * neither used nor reserved) less cache.shm_headroom (or, with cache.capacity = auto, shrinks
 * it to fit).  On a hugetlbfs the creator's mapping reserves the region's pages before it
 * publishes, so creators there take turns (flock of the directory, bounded: lock_creators),
 * and one that finds the region published when its turn comes attaches to it.  Attachers check
 * magic, layout version and every dimension against their own configuration (with capacity = auto,
 * against the region's own slot count).
 *
 * Mismatch.  A process that refuses a region of this layout for its geometry adds one to
 * hdr.refused_attaches (relaxed fetch-add, through a mapping of the header alone): it may,
 * since kvs_cache_open_file opened the file read-write only because it is ours.  A file of
 * another layout is not written (the field may be elsewhere); that refusal is only reported.
 * With cache.on_mismatch = rebuild, a creating attacher instead replaces the region, if no
 * live process is attached to it (the liveness locks `kvshim reset` counts): it takes
 * flock(LOCK_EX | LOCK_NB) on the old file, so two rebuilders do not both replace it (the
 * loser attaches again and finds the winner's region), checks that the path still names that
 * file, builds the new region unnamed as above, links it to a random name and renames that
 * over the path.  A process of the old configuration that attaches to the old file between
 * the liveness check and the rename keeps that file, now nameless, until it detaches, as
 * after `kvshim reset --force`.
 *
 * Upgrades.  A creating attacher that refused the region for its layout version, when that is
 * an older layout whose hand-over contract it knows (handover.h), replaces it whatever is
 * attached: flock of the old file as a rebuilder (another upgrader waits up to a minute for its
 * publication), the path checked again, its region built unnamed, this process attached to it
 * (its liveness lock is on the new file from the start), filled from the old file mapped
 * read-only (no lock of the old region is taken, nothing of it is written), and only then
 * renamed over the path.  The old processes keep the old file, nameless, until they detach.  An
 * upgrader that dies before the rename leaves nothing behind but its unnamed file, which the
 * kernel frees, and its flock, which its death releases: the next upgrader starts again.
 *
 * Every index read from shared memory is checked against its bound
 * before use; a chain walk stops after nslots steps.  Corruption yields -EUCLEAN, never an access
 * out of bounds.
 *
 * Slots.  A slot caches one (block, shard).  Its 32-bit state word (alone on its cache line)
 * is FREE, CLAIMED (by process p, encoded in the word), LOADING, READY or FAILED, plus a
 * waiters bit.  Its other fields live on the second line.
 *
 * Frames.  The data is cut into frames of shard_size bytes (hdr.nslots of them: the "slots"
 * of `kvshim stat`), each with per_frame slot records of its own: frame f has the records
 * [f * per_frame, (f + 1) * per_frame).  A whole shard takes the first record of a frame and
 * leaves the others FREE; a load of fewer bytes than a shard (a small file, a file's tail)
 * takes a packed slot, a run of pages of the open frame (pack.c), so that it costs the cache
 * its own size.  A slot's at and room say where in its frame its bytes are: written by its
 * allocator while the slot is CLAIMED by it, before the insert that hashes it, and never
 * changed while it is hashed or pinned.  Frames, not slots, are what eviction takes, all the
 * slots of one at once (evict.c): so a frame's bytes are reused only when none of its slots
 * is pinned or claimed, and a slot's bytes only by the claimer of its whole frame.
 *
 *   field        written by                                  read without a lock by
 *   state        FREE->CLAIMED: allocator (CAS)               waiters (acquire), evictor peek
 *                ->LOADING/FREE: under the stripe lock
 *                ->READY/FAILED: owner (exchange, release)
 *   refs         under the stripe lock                        evictor peek (rechecked locked)
 *   bucket       under the stripe lock                        release/reclaim (rechecked)
 *   next, key    under the stripe lock                        nobody
 *   owner        under the stripe lock, at election           waiters (liveness check only)
 *   err, length  owner, before its release store of state     waiters after an acquire load
 *
 * A slot is hashed into bucket b (chain head buckets[b], link next) while it is LOADING,
 * READY or FAILED.  Bucket b is guarded by stripe mutex b & (nstripes - 1): process-shared,
 * robust, one per cache line.  No code holds two stripes at once, and nothing holds a stripe
 * across I/O or a wait.  Lock order: proc_lock, then one stripe.  pack_lock (the open frame,
 * pack.c) is held alone, never with a stripe or proc_lock.
 *
 * Pins.  refs counts pins.  Each pin is also recorded in the pinning process's pin table
 * (slot + 1 in an entry); an entry changes only under the stripe lock of the slot it names,
 * together with refs, so while a stripe is held the entries naming its slots add up to their
 * refs.  The first pin of a slot that is not READY (refs 0 -> 1) elects the pinner owner: it
 * loads, publishes READY or FAILED (error code stored before the state, both release), and
 * releases.  A pinned slot is never evicted.  The last release of a FAILED slot sends it back
 * to LOADING (the next pinner retries); the last release of an invalidated (orphan) slot frees
 * it.  Orphans keep their former bucket with KVS_ORPHAN set so their stripe stays known.
 *
 * Allocation (evict.c, pack.c).  An allocator takes a frame by taking each of its slots to
 * CLAIMED-by-itself, either FREE -> CLAIMED by CAS, or by unhashing an unpinned victim under
 * the victim's stripe; it keeps the first slot (a whole shard) or cuts its packed slot from
 * the frame and gives the rest to the pack or back to FREE.  Then it takes the key's stripe,
 * looks the key up again (another process may have inserted it: the claim goes back to FREE)
 * and inserts: key, owner, refs 1, bucket, then state LOADING, then the link.
 *
 * Waiting (wait.c).  Waiters spin on acquire loads of the state word, then set the waiters bit
 * and FUTEX_WAIT (shared) on the word with a bounded slice.  The owner's exchange to READY or
 * FAILED returns the old word; only if the waiters bit was set does it FUTEX_WAKE.  Before its
 * first sleep and after each slice the waiter checks the owner: a dead one is reclaimed, a load
 * no live process owns is taken over (wait.c).
 *
 * Processes (proc.c).  Each attached process holds slot i of the process table and an
 * open-file-description (OFD) write lock on byte i of the region file.  The kernel drops the
 * lock when the last descriptor of that open file description closes: at death, at exec
 * (O_CLOEXEC), never at an unrelated close() as a classic POSIX lock would; a fork child closes
 * its inherited descriptor (kvs_cache_forget) so it cannot keep its parent looking alive.  A
 * process whose byte is unlocked while its slot is ACTIVE is dead.  Whoever notices first
 * reclaims it, holding its byte lock so no second reclaimer runs: each recorded pin is returned
 * under its stripe (a load it owned becomes FAILED with EOWNERDEAD, waking the waiters), slots
 * it had CLAIMED go back to FREE, its counters fold into the totals, its slot becomes FREE.
 *
 * Regions of keys only (hdr.keys_only: shim.mode = observe).  The same control plane, built
 * from the same dimensions, and no data section: the build marks every frame's pages
 * allocated and the walk done, so nothing ever allocates a page or touches a slot's bytes;
 * every protocol above holds as written (its owners publish READY with a length and no byte).
 *
 * Tallies (tally.c): figures by pod and by root, added to by any process without a lock; a
 * pod's entry is joined, and recycled, under proc_lock.
 *
 * Crashes.  A process dying inside a stripe leaves the mutex EOWNERDEAD; the next locker
 * rebuilds that stripe's chains from slot metadata (every slot whose state is hashed and whose
 * bucket maps to the stripe) and recounts refs from all pin tables, then marks the mutex
 * consistent.  A process dying inside proc_lock can at worst count its counters twice.
 *
 *   dies ...                          seen as                       repaired by
 *   holding a pin / owning a load     byte unlocked, slot ACTIVE    reclaim (waiter or attach)
 *   between claim and insert          state CLAIMED by it           reclaim
 *   inside a stripe                   EOWNERDEAD                    stripe rebuild, then reclaim
 *   inside pack_lock                  EOWNERDEAD                    the open frame is sealed
 *                                                                   (pack.c), then reclaim
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "geometry.h"
#include "handover.h"
#include "internal.h"
#include "raw.h"
#include "shmfile.h"
#include "sys.h"
#include "value.h"

unsigned kvs_region_test_publish_ms;

/* The wall clock in nanoseconds: when a region was created, as `stat` shows it. */
#define KVS_UPGRADE_WAITS 3000 /* 20 ms naps while another process upgrades: a minute */

static uint64_t wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Point the handle's section pointers into the mapping described by d. */
static void bind(struct kvs_cache *c, const struct dims *d)
{
	char *b = c->base;

	c->hdr = (struct kvs_hdr *)b;
	c->procs = b + d->off_procs;
	c->tally = (struct kvs_tally *)(b + d->off_tally);
	c->keys_only = d->keys_only;
	c->stripes = (struct kvs_stripe *)(b + d->off_stripes);
	c->buckets = (_Atomic uint32_t *)(b + d->off_buckets);
	c->slots = (struct kvs_slot *)(b + d->off_slots);
	c->fpages = (_Atomic uint32_t *)(b + d->off_frames);
	c->access = (_Atomic uint8_t *)(b + d->off_access);
	c->seen = (struct kvs_seen *)(b + d->off_seen);
	c->wseq = (_Atomic uint64_t *)(b + d->off_wseq);
	c->nseen = d->nseen;
	c->data = b + d->off_data;
	c->nslots = d->nslots;
	c->nframes = d->nframes;
	c->nmain = d->nframes - d->nreserved;
	c->per_frame = d->per_frame;
	c->frame_shift = (uint32_t)__builtin_ctz(d->per_frame);
	c->frame_pages = (uint32_t)(d->shard_size / KVS_PAGE);
	c->nbuckets = d->nbuckets;
	c->nstripes = d->nstripes;
	c->nprocs = d->nprocs;
	c->shard_size = d->shard_size;
	c->page_size = d->page;
	c->ahead_window = kvs_populate_window(c->shard_size, c->nmain);
}

/* Build a fresh region in the mapping: everything but the magic, which goes last. */
static int build(struct kvs_cache *c, const struct dims *d, const struct kvs_cache_params *cfg)
{
	struct kvs_hdr *h = c->hdr;
	int r;

	h->version = KVS_LAYOUT_VERSION;
	h->hdr_bytes = sizeof(*h);
	h->total_bytes = d->total;
	h->capacity = d->capacity;
	h->shard_size = d->shard_size;
	h->nslots = d->nframes;
	h->nreserved = d->nreserved;
	h->nbuckets = d->nbuckets;
	h->nstripes = d->nstripes;
	h->nprocs = d->nprocs;
	h->npins = KVS_PINS_PER_PROC;
	h->eviction = (uint32_t)cfg->eviction;
	/* A region of keys only has no pages to walk: every frame has its pages (below). */
	h->populate_mode = d->keys_only ? KVS_POPULATE_LAZY : (uint32_t)cfg->populate;
	h->keys_only = d->keys_only;
	h->off_procs = d->off_procs;
	h->off_tally = d->off_tally;
	h->off_stripes = d->off_stripes;
	h->off_buckets = d->off_buckets;
	h->off_slots = d->off_slots;
	h->off_access = d->off_access;
	h->off_data = d->off_data;
	h->off_seen = d->off_seen;
	h->nseen = d->nseen;
	h->off_wseq = d->off_wseq;
	h->off_frames = d->off_frames;
	h->per_frame = d->per_frame;
	h->page_kind = c->page_kind;
	h->page_size = d->page;
	h->numa = c->numa;
	h->pack_frame = KVS_NIL;
	h->created_ns = wall_ns();
	/* NUL-padded: the file is zero from ftruncate; a longer version is cut to the field. */
	size_t vlen = strlen(KVS_VERSION);
	memcpy(h->built_by, KVS_VERSION, vlen < sizeof(h->built_by) ? vlen : sizeof(h->built_by));
	r = kvs_mutex_init_shared(&h->proc_lock);
	if (!r)
		r = kvs_mutex_init_shared(&h->pack_lock);
	if (r)
		return r;
	for (uint32_t i = 0; i < d->nstripes; i++) {
		r = kvs_mutex_init_shared(&c->stripes[i].mu);
		if (r)
			return r;
	}
	for (uint32_t i = 0; i < d->nbuckets; i++)
		store_relaxed(&c->buckets[i], KVS_NIL);
	for (uint32_t i = 0; i < d->nslots; i++) {
		store_relaxed(&c->slots[i].bucket, KVS_NIL);
		store_relaxed(&c->slots[i].next, KVS_NIL);
		store_relaxed(&c->slots[i].owner, KVS_NIL);
	}
	for (uint32_t f = 0; d->keys_only && f < d->nframes; f++)
		store_relaxed(&c->fpages[f], KVS_PAGES_OK); /* nothing to allocate, ever */
	if (d->keys_only)
		store_relaxed(&h->populated, d->nframes);
	kvs_tally_build(c);
	/* Pairs with the acquire load of magic in kvs_region_check (geometry.c): readers of a
	 * published region see every field above. */
	atomic_thread_fence(memory_order_release);
	h->magic = KVS_MAGIC;
	return 0;
}

/* Append one line to the handle's notes (said once by the caller, kvs_cache_open). */
__attribute__((format(printf, 2, 3))) static void note(struct kvs_cache *c, const char *fmt, ...)
{
	size_t n = strlen(c->note);
	va_list ap;

	if (n && n + 2 < sizeof(c->note)) {
		memcpy(c->note + n, "; ", 3);
		n += 2;
	}
	va_start(ap, fmt);
	vsnprintf(c->note + n, sizeof(c->note) - n, fmt, ap);
	va_end(ap);
}

/* The memory a new region gets (pages.c): its kind, page size and placement, on the mapping
 * base of total bytes, before any page of the file exists.  What the configuration asked for
 * and did not get is noted, once. */
static void choose_memory(struct kvs_cache *c, const struct kvs_memory *mem, const char *dir,
			  const struct kvs_cache_params *cfg, char *base, uint64_t total,
			  uint64_t off_data)
{
	char fix[256];
	int nodes, r;

	c->page_kind = mem->kind;
	if (cfg->huge_pages == KVS_HUGE_ON && mem->kind == KVS_PAGE_BASE)
		note(c,
		     "cache.huge_pages = on, but %s (%s%s%s) gives no huge pages: %s has 4 KiB "
		     "pages; %s",
		     dir, mem->fs, *mem->huge ? ", huge=" : "", mem->huge, c->path,
		     kvs_memory_fix(mem, dir, fix, sizeof(fix)));
	if (mem->kind == KVS_PAGE_ADVISE)
		madvise(base + off_data, total - off_data, MADV_HUGEPAGE);
	c->numa = (uint32_t)cfg->numa;
	r = kvs_memory_place(base, total, c->numa, &nodes);
	if (r) {
		/* Nothing to place on one node; elsewhere the operator asked for it. */
		if (nodes != 1)
			note(
			    c,
			    "cannot place the pages of %s (cache.numa = %s): %s; they go where the "
			    "kernel puts them",
			    c->path, kvs_config_numa_word(c->numa), strerror(-r));
		c->numa = KVS_NUMA_OFF;
	}
}

/* Sleep ms milliseconds. */
static void nap_ms(long ms)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};

	nanosleep(&ts, NULL);
}

/* How long a creator on a hugetlbfs waits for another one to publish (lock_creators). */
#define KVS_CREATE_WAIT_NS (10ull * 1000000000ull)

/*
 * On a hugetlbfs, creators of regions in dirfd one at a time: flock of the directory, taken
 * before the free space is measured and let go when the descriptor is closed.  The winner's
 * mapping reserves its pages before it publishes the region, so a second creator measuring
 * the pool meanwhile would find it short and give up, where it should wait and attach (ranks
 * that start together on a pool reserved for one region).  Bounded: a lock held longer (by
 * anyone: another user may flock the directory too) is given up on, and the creator goes on
 * as without it.  Whether it got the lock.
 */
static bool lock_creators(int dirfd)
{
	uint64_t until = kvs_mono_ns() + KVS_CREATE_WAIT_NS;

	while (flock(dirfd, LOCK_EX | LOCK_NB) < 0) {
		if (errno != EWOULDBLOCK || kvs_mono_ns() >= until)
			return false;
		nap_ms(5);
	}
	return true;
}

/* Build the region (sized by kvs_region_fit, which may change d) and publish it; with replace, over
 * the region there, whose reclaim bytes it frees.  Returns the descriptor of the published
 * region, -EEXIST when another process published first, or -errno. */
static int create(struct kvs_cache *c, struct dims *d, const struct kvs_cache_params *cfg,
		  bool replace, uint64_t reclaim, int from, struct kvs_handover *ho, char *msg,
		  size_t msglen)
{
	char dir[sizeof(c->path)], name[sizeof(c->path) + 64];
	const char *slash = strrchr(c->path, '/'), *base = slash ? slash + 1 : c->path;
	struct kvs_memory mem;
	int dirfd, fd, r;

	name[0] = '\0';
	dirfd = kvs_shm_open_dir(c->path, cfg, dir, sizeof(dir), &mem, msg, msglen);
	if (dirfd < 0)
		return dirfd;
	if (mem.hugetlbfs && lock_creators(dirfd) && !replace &&
	    faccessat(dirfd, base, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		r = -EEXIST; /* published while this one waited: attach to it */
		goto out_dir;
	}
	/* On a hugetlbfs, what the pool has now, the winner's reservation counted. */
	r = mem.hugetlbfs ? kvs_memory_probe(dirfd, cfg->huge_pages, &mem) : 0;
	if (r) {
		snprintf(msg, msglen, "cannot tell what memory %s (cache.dir) gives: %s", dir,
			 strerror(-r));
		goto out_dir;
	}
	/* The geometry follows the pages this file system gives. */
	r = kvs_dims_of(cfg, mem.page_size, d); /* with capacity = auto, fit() sizes it */
	if (r) {
		snprintf(msg, msglen, "the cache dimensions are out of range");
		goto out_dir;
	}
	r = kvs_region_fit(&mem, dir, d, cfg, reclaim, c->path, msg, msglen);
	if (r)
		goto out_dir;
	fd = kvs_shm_open_unnamed(dirfd, c->path, name, sizeof(name));
	if (fd < 0) {
		r = fd;
		snprintf(msg, msglen, "cannot create a region in %s: %s", dir, strerror(-r));
		goto out_dir;
	}
	if (fchmod(fd, (mode_t)cfg->mode) < 0 || kvs_sys_ftruncate(fd, (off_t)d->total) < 0) {
		r = -errno;
		snprintf(msg, msglen, "cannot size %s to %" PRIu64 " bytes: %s", c->path, d->total,
			 strerror(-r));
		goto err_close;
	}
	/* On hugetlbfs this reserves every page of the region from the pool. */
	c->base = kvs_sys_mmap(NULL, d->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (c->base == MAP_FAILED) {
		r = -errno;
		c->base = NULL;
		snprintf(msg, msglen, "cannot map %s: %s%s", c->path, strerror(-r),
			 mem.hugetlbfs && r == -ENOMEM
			     ? " (the huge page pool could not reserve it: see vm.nr_hugepages)"
			     : "");
		goto err_close;
	}
	c->map_len = d->total;
	bind(c, d);
	choose_memory(c, &mem, dir, cfg, c->base, d->total, d->off_data);
	/* Allocate before writing: a file system too small must be an error here, not a
	 * SIGBUS. */
	r = kvs_populate_control(fd, c->base, d->off_data);
	if (r) {
		snprintf(msg, msglen, "cannot allocate %s in %s: %s", c->path, dir, strerror(-r));
		goto err_unmap;
	}
	r = build(c, d, cfg);
	if (r) {
		snprintf(msg, msglen, "cannot initialise %s: %s", c->path, strerror(-r));
		goto err_unmap;
	}
	/* An upgrade: this process attaches to the region before anyone can see it, and fills
	 * it from the older release's (handover.c); publication then shows it full. */
	if (from >= 0) {
		struct stat fst, was, now;

		kvs_ownfd_set(&c->own, fd);
		if (fstat(fd, &fst) == 0) { /* what kvs_ownfd_* check (base/sys.h) */
			c->own.dev = (uint64_t)fst.st_dev;
			c->own.ino = (uint64_t)fst.st_ino;
		}
		r = kvs_proc_attach(c);
		if (!r)
			r = kvs_handover_fill(c, from, ho);
		if (r) { /* the old region stays at the path, as warm as it was */
			snprintf(msg, msglen, "the hand-over to a new region failed: %s",
				 strerror(-r));
			goto err_unmap;
		}
		/* Still the old file at the path, after a fill that may have taken seconds: a
		 * `kvshim reset` and a fresh creator meanwhile keep their region. */
		if (fstat(from, &was) < 0 || lstat(c->path, &now) < 0 || now.st_dev != was.st_dev ||
		    now.st_ino != was.st_ino) {
			r = -EAGAIN;
			goto err_unmap;
		}
	}
	if (kvs_region_test_publish_ms) /* a creator slow to publish what it reserved */
		nap_ms((long)kvs_region_test_publish_ms);
	r = kvs_shm_publish(fd, name, c->path, replace);
	if (r) {
		if (r != -EEXIST)
			snprintf(msg, msglen, "cannot publish %s: %s", c->path, strerror(-r));
		goto err_unmap;
	}
	kvs_sys_close(dirfd);
	return fd;

err_unmap:
	kvs_sys_munmap(c->base, c->map_len);
	c->base = NULL;
	c->self = -1; /* attached to a region nobody else saw (an upgrade's): gone with it */
	c->me = NULL;
err_close:
	if (*name)
		unlink(name);
	kvs_ownfd_set(&c->own, -1);
	kvs_sys_close(fd);
out_dir:
	c->note[0] = '\0'; /* nothing was built: nothing to say but msg */
	kvs_sys_close(dirfd);
	return r;
}

/* Map an existing region and check it against d (with capacity = auto, against the region's
 * own slot count, written back to d).  Returns 0 or -errno. */
static int attach(struct kvs_cache *c, struct dims *d, const struct kvs_cache_params *cfg,
		  bool autosize, char *msg, size_t msglen)
{
	struct kvs_hdr built;
	struct dims mine;
	struct stat st;
	size_t len;
	int r;

	r = kvs_fd_move_high(kvs_cache_open_file(c->path, O_RDWR, c->mode, msg, msglen));
	kvs_ownfd_set(&c->own, r < 0 ? -1 : r);
	if (r < 0) {
		return r;
	}
	if (fstat(kvs_ownfd_peek(&c->own), &st) < 0) {
		r = -errno;
		goto err_close;
	}
	if (c->watch && kvs_dims_of_file(kvs_ownfd_peek(&c->own), &mine) == 0)
		*d = mine; /* a watcher reads the region as it was built */
	else if (kvs_region_read_header(kvs_ownfd_peek(&c->own), &built) == 0 &&
		 (autosize ? kvs_dims_for(cfg, built.nslots, built.page_size, &mine)
			   : kvs_dims_of(cfg, built.page_size, &mine)) == 0)
		/* Its pages are those its creator's file system gave (pages.c); with capacity =
		 * auto, free space has changed since it was built: take its slot count too. */
		*d = mine;
	if ((uint64_t)st.st_size != d->total) {
		c->base = NULL;
		c->hdr = NULL;
		/* Map the header alone to say what differs. */
		if ((size_t)st.st_size >= sizeof(struct kvs_hdr)) {
			void *h = kvs_sys_mmap(NULL, sizeof(struct kvs_hdr), PROT_READ, MAP_SHARED,
					       kvs_ownfd_peek(&c->own), 0);
			if (h != MAP_FAILED) {
				c->hdr = h;
				r = kvs_region_check(c, d, (size_t)st.st_size, msg, msglen);
				kvs_sys_munmap(h, sizeof(struct kvs_hdr));
				c->hdr = NULL;
				if (r)
					goto err_close;
			}
		}
		snprintf(msg, msglen, "region %s is %lld bytes, the configuration wants %" PRIu64,
			 c->path, (long long)st.st_size, d->total);
		r = -EPROTO;
		goto err_close;
	}
	len = c->watch ? d->off_data : d->total;
	c->base =
	    kvs_sys_mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, kvs_ownfd_peek(&c->own), 0);
	if (c->base == MAP_FAILED) {
		r = -errno;
		c->base = NULL;
		snprintf(msg, msglen, "cannot map %s: %s", c->path, strerror(-r));
		goto err_close;
	}
	c->map_len = len;
	bind(c, d);
	r = kvs_region_check(c, d, (size_t)st.st_size, msg, msglen);
	if (r)
		goto err_unmap;
	c->eviction = (int)c->hdr->eviction;
	c->page_kind = c->hdr->page_kind;
	c->numa = c->hdr->numa;
	if (!c->watch) {
		kvs_memory_map_hints(c, c->base, c->map_len);
		if (cfg->huge_pages == KVS_HUGE_ON && c->page_kind == KVS_PAGE_BASE)
			note(c,
			     "cache.huge_pages = on, but %s has 4 KiB pages (it was built where "
			     "they were all there was; `kvshim reset` with no engine running "
			     "rebuilds it)",
			     c->path);
	}
	return 0;

err_unmap:
	kvs_sys_munmap(c->base, c->map_len);
	c->base = NULL;
err_close:
	/* A refused region is kept open for kvs_cache_open: to count the refusal, or to
	 * replace it (cache.on_mismatch = rebuild). */
	if (r == -EPROTO && !c->watch) {
		if (c->mismatch_fd >= 0)
			kvs_sys_close(c->mismatch_fd);
		c->mismatch_fd = kvs_ownfd_peek(&c->own);
	} else {
		kvs_sys_close(kvs_ownfd_peek(&c->own));
	}
	kvs_ownfd_set(&c->own, -1);
	return r;
}

/* Add one to hdr.refused_attaches of the region fd, if it is a region of this layout (else
 * the field may be elsewhere) and fd is open for writing, which kvs_cache_open_file allows
 * only for a region of this euid.  Maps the header alone, for the one add. */
static void count_refusal(int fd)
{
	struct kvs_hdr *h;
	struct stat st;

	if ((kvs_sys_fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR || fstat(fd, &st) < 0 ||
	    (uint64_t)st.st_size < sizeof(*h))
		return;
	h = kvs_sys_mmap(NULL, sizeof(*h), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED)
		return;
	if (h->magic == KVS_MAGIC) {
		atomic_thread_fence(memory_order_acquire); /* pairs with the fence in build() */
		if (h->version == KVS_LAYOUT_VERSION && h->hdr_bytes == sizeof(*h))
			add_relaxed(&h->refused_attaches, 1); /* a statistic: read by stat only */
	}
	kvs_sys_munmap(h, sizeof(*h));
}

/*
 * cache.on_mismatch = rebuild: replace the region at c->path, open as old and refused with
 * the reason in msg, by one built for cfg, unless live processes are attached to it (see the
 * essay).  Returns the new region's descriptor with a line saying what it did in msg;
 * -EAGAIN when another process is replacing it now or the path names another file by now
 * (attach again); -EPROTO with msg when live processes are attached; or -errno with msg.
 */
static int rebuild(struct kvs_cache *c, struct dims *d, const struct kvs_cache_params *cfg, int old,
		   char *msg, size_t msglen)
{
	char why[512], self[32];
	struct stat was, now;
	char *cut;
	int n, r;

	snprintf(why, sizeof(why), "%s", msg);
	cut = strstr(why, " (run `kvshim reset`");
	if (cut)
		*cut = '\0';
	if (fstat(old, &was) < 0)
		return -errno;
	if (flock(old, LOCK_EX | LOCK_NB) < 0) /* released below, or when old is closed */
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	if (lstat(c->path, &now) < 0 || now.st_dev != was.st_dev || now.st_ino != was.st_ino) {
		r = -EAGAIN;
		goto out;
	}
	/* The liveness locks, counted through the descriptor, as `kvshim reset` does. */
	snprintf(self, sizeof(self), "/proc/self/fd/%d", old);
	n = kvs_cache_live_processes(self);
	if (n != 0) {
		r = n < 0 ? n : -EPROTO;
		snprintf(msg, msglen,
			 "%s; cache.on_mismatch = rebuild, but %d processes are attached to it "
			 "(it is rebuilt once none is)",
			 why, n < 0 ? 0 : n);
		if (n < 0)
			snprintf(msg, msglen, "cannot count the processes attached to %s: %s",
				 c->path, strerror(-n));
		goto out;
	}
	r = create(c, d, cfg, true, (uint64_t)was.st_blocks * 512, -1, NULL, msg, msglen);
	if (r >= 0)
		snprintf(
		    msg, msglen,
		    "cache.on_mismatch = rebuild: replaced %s, which no process was attached to "
		    "(%s)",
		    c->path, why);
out:
	flock(old, LOCK_UN);
	return r;
}

/*
 * An upgrade (see the essay, and handover.h): the region at c->path, open as old and refused with
 * the reason in msg, is of an older layout whose hand-over contract this build knows.  Build a
 * region for cfg, fill it from old's READY shards, and give it the name over old's, whatever
 * processes are attached to old: they keep that file, nameless, until the last of them
 * detaches, as after `kvshim reset --force`.  Both count against the file system's room
 * (nothing is reclaimed). Returns the new region's descriptor with a line saying what it did in
 * msg; -EPROTO (msg untouched) when old is no source; -EAGAIN when another process is upgrading
 * it now or the path names another file by now (attach again); or -errno with msg.
 */
static int upgrade(struct kvs_cache *c, struct dims *d, const struct kvs_cache_params *cfg, int old,
		   char *msg, size_t msglen)
{
	struct kvs_handover h;
	struct stat was, now;
	int r;

	if (kvs_handover_source(old, &h))
		return -EPROTO;
	if (fstat(old, &was) < 0)
		return -errno;
	if (flock(old, LOCK_EX | LOCK_NB) < 0) /* released below, or when old is closed */
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	if (lstat(c->path, &now) < 0 || now.st_dev != was.st_dev || now.st_ino != was.st_ino) {
		r = -EAGAIN;
		goto out;
	}
	/* Sized as if the old region were gone (its blocks counted free), as a rebuild is: its
	 * pages come as the fill and the loads need them, within cache.shm_headroom, so that
	 * while the old processes live the fill stops where memory does, and the region grows
	 * to its size once they are gone (with capacity = auto, the size the node allows). */
	r = create(c, d, cfg, true, (uint64_t)was.st_blocks * 512, old, &h, msg, msglen);
	if (r >= 0)
		snprintf(
		    msg, msglen,
		    "kvshim upgraded: %s of layout %u replaced by one of layout %u, filled with "
		    "%" PRIu64 " shards (%" PRIu64 " bytes) of the old one in %.2f s, none read "
		    "from storage%s%s; processes of the older release keep the old one until "
		    "they exit",
		    c->path, h.version, KVS_LAYOUT_VERSION, h.shards, h.bytes,
		    (double)h.took_ns / 1e9, h.stopped ? ", stopped: " : "",
		    h.stopped ? h.stopped : "");
out:
	flock(old, LOCK_UN);
	return r;
}

int kvs_cache_open(const struct kvs_cache_params *cfg, int flags, struct kvs_cache **out, char *msg,
		   size_t msglen)
{
	char scratch[8];
	bool rebuilt = false;
	struct kvs_cache *c;
	struct dims d;
	int r;

	if (!msg) {
		msg = scratch;
		msglen = sizeof(scratch);
	}
	kvs_node_clock_init(); /* the shared times are the initial time namespace's */
	msg[0] = '\0';
	r = kvs_dims_of(cfg, KVS_PAGE, &d); /* the pages: those of a region there, or of create() */
	if (r) {
		snprintf(msg, msglen, "the cache dimensions are out of range");
		return r;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	kvs_ownfd_set(&c->own, -1);
	c->mismatch_fd = -1;
	c->self = -1;
	c->pod = KVS_NIL;
	c->stage_spare = KVS_NIL;
	c->watch = flags & KVS_OPEN_WATCH;
	c->wait_mode = cfg->wait_mode;
	c->eviction = cfg->eviction;
	c->populate = cfg->populate;
	c->mode = (uint32_t)cfg->mode;
	c->headroom = cfg->shm_headroom;
	c->lock_timeout_ns =
	    c->watch ? KVS_LOCK_TIMEOUT_WATCH_NS : cfg->wait_timeout_ms * 1000000ull; /* lock.c */
	pthread_mutex_init(&c->reclaim_mu, NULL);
	pthread_mutex_init(&c->maplock_mu, NULL);
	r = kvs_cache_path(cfg, c->path, sizeof(c->path));
	if (r)
		goto err_free;

	for (int tries = 0, busy = 0, upgrading = 0; tries < 8; tries++) {
		r = attach(c, &d, cfg, !cfg->capacity, msg, msglen);
		if (r == -EPROTO && (flags & KVS_OPEN_CREATE) && !c->watch) {
			char refused[512];

			snprintf(refused, sizeof(refused), "%s", msg);
			int u = upgrade(c, &d, cfg, c->mismatch_fd, msg, msglen);

			if (u >= 0) {
				kvs_ownfd_set(&c->own, kvs_fd_move_high(u));
				r = 0;
				rebuilt = true;
				break;
			}
			/* Another process is filling its region: wait for it to publish (a minute
			 * at most, a copy of tens of GiB), then attach to that. */
			if (u == -EAGAIN && upgrading++ < KVS_UPGRADE_WAITS) {
				nap_ms(20);
				tries--;
				continue;
			}
			if (u == -EAGAIN) {
				snprintf(msg, msglen, "%s is being upgraded by another process",
					 c->path);
				continue;
			}
			if (u != -EPROTO) { /* no hand-over: refused as before, or rebuilt */
				char why[256];

				snprintf(why, sizeof(why), "%s", msg);
				snprintf(msg, msglen, "%s; no hand-over: %s", refused, why);
				if (cfg->on_mismatch != KVS_MISMATCH_REBUILD) {
					r = -EPROTO;
					break;
				}
				snprintf(msg, msglen, "%s", refused);
			}
		}
		if (r == -EPROTO && (flags & KVS_OPEN_CREATE) && !c->watch &&
		    cfg->on_mismatch == KVS_MISMATCH_REBUILD) {
			r = rebuild(c, &d, cfg, c->mismatch_fd, msg, msglen);
			if (r >= 0) {
				kvs_ownfd_set(&c->own, kvs_fd_move_high(r));
				r = 0;
				rebuilt = true;
				break;
			}
			/* Another rebuilder holds the old file: wait for it (2 s at most). */
			if (r == -EAGAIN && busy++ < 100) {
				nap_ms(20);
				tries--;
			}
			if (r == -EAGAIN) {
				snprintf(msg, msglen, "%s is being replaced by another process",
					 c->path);
				r = -EPROTO;
				continue;
			}
			break;
		}
		if (r != -ENOENT || !(flags & KVS_OPEN_CREATE))
			break;
		r = create(c, &d, cfg, false, 0, -1, NULL, msg, msglen);
		if (r >= 0) {
			kvs_ownfd_set(&c->own, kvs_fd_move_high(r));
			r = 0;
			break;
		}
		if (r != -EEXIST)
			break;
	}
	if (r == -EPROTO && c->mismatch_fd >= 0)
		count_refusal(c->mismatch_fd);
	if (c->mismatch_fd >= 0)
		kvs_sys_close(c->mismatch_fd);
	c->mismatch_fd = -1;
	if (r)
		goto err_free;
	struct stat fst;
	if (fstat(kvs_ownfd_peek(&c->own), &fst) == 0) { /* what kvs_ownfd_* check (base/sys.h) */
		c->own.dev = (uint64_t)fst.st_dev;
		c->own.ino = (uint64_t)fst.st_ino;
	}
	if (!c->watch) {
		kvs_populate_start(c);
		if (cfg->prefault && !c->keys_only)
			kvs_memory_prefault_start(c);
		r = c->self >= 0 ? 0 : kvs_proc_attach(c); /* an upgrader attached to fill it */
		if (r) {
			snprintf(msg, msglen, "cannot attach to %s: %s", c->path,
				 r == -EUSERS ? "the process table is full" : strerror(-r));
			goto err_unmap;
		}
	}
	if (!rebuilt)
		msg[0] = '\0';
	if (c->note[0]) /* said once by the caller, after a rebuild's line if there is one */
		snprintf(msg + strlen(msg), msglen - strlen(msg), "%s%s", msg[0] ? "; " : "",
			 c->note);
	*out = c;
	return 0;

err_unmap:
	kvs_sys_munmap(c->base, c->map_len);
	kvs_ownfd_close(&c->own); /* the walk may have started: the hooks may have moved it */
err_free:
	pthread_mutex_destroy(&c->reclaim_mu);
	pthread_mutex_destroy(&c->maplock_mu);
	free(c);
	return r;
}

void kvs_cache_close(struct kvs_cache *c)
{
	if (!c)
		return;
	kvs_memory_prefault_stop(c); /* it uses the mapping */
	if (!c->watch && c->self >= 0)
		kvs_proc_detach(c);
	if (c->base)
		kvs_sys_munmap(c->base, c->map_len);
	kvs_ownfd_close(&c->own);
	pthread_mutex_destroy(&c->reclaim_mu);
	pthread_mutex_destroy(&c->maplock_mu);
	free(c);
}

void kvs_cache_fds_closing(struct kvs_cache *c, unsigned int lo, unsigned int hi)
{
	if (c)
		kvs_ownfd_closing(&c->own, lo, hi);
	kvs_populate_fds_closing(lo, hi);
}

bool kvs_cache_fds_in(struct kvs_cache *c, unsigned int lo, unsigned int hi)
{
	return (c && kvs_ownfd_in(&c->own, lo, hi)) || kvs_populate_fds_in(lo, hi);
}

void kvs_cache_forget(struct kvs_cache *c)
{
	if (!c)
		return;
	if (c->base)
		kvs_sys_munmap(c->base, c->map_len);
	/* Only if the number is still ours: a program that closed it (closing every descriptor
	 * from 3 up, as daemons do) may have reused it for its own. */
	kvs_ownfd_close(&c->own);
	/* The reclaim mutex may have been held by a thread that does not exist in the child:
	 * do not touch it; the handle's memory is abandoned with it. */
}
