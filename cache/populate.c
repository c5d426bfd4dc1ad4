/*
 * populate: allocate the region's data pages before a slot on them is used.
 *
 * DESIGN.  A tmpfs file is sparse: ftruncate reserves nothing, and the first touch of a page
 * that /dev/shm cannot back raises SIGBUS in whichever process touched it: an engine.  So no
 * slot is used before its pages exist, and the cache never takes /dev/shm below
 * cache.shm_headroom, which is left for the node's other users (NCCL, torch, the engine).
 * Each slot records its pages in slot.pages:
 *
 *   UNKNOWN -> OK      the allocator that claims a FREE slot (evict.c), or the background
 *                      walker, first checks that free space stays above the headroom, then
 *                      allocates the slot's pages (fallocate; MADV_POPULATE_WRITE where the
 *                      file system lacks it: kvs_populate_range), then stores OK.  Both may do
 *                      it at once: harmless.
 *   UNKNOWN            stays UNKNOWN when there is no room (at the headroom, or ENOSPC from
 *                      the file system): the slot is left free for now, the allocator evicts
 *                      instead, and for KVS_ROOM_RETRY_NS this process makes no further
 *                      attempt (no system call per slot while /dev/shm is full).  Room made
 *                      later (a neighbour frees its shared memory) is used again.
 *   UNKNOWN -> NOROOM  allocation failed for another reason: the slot is never used.
 *
 * cache.populate = lazy allocates only in the allocator: pages exist for the slots that have
 * been used, and a cache that is never filled costs only what it holds.  The other two modes
 * add the walk: a background thread of one process (the holder of an OFD lock on byte
 * KVS_POPULATE_BYTE) allocates slots in index order, several at a time, ahead of the
 * allocators, so that loads do not pay for page allocation (the allocators take FREE slots in
 * index order too: the hand starts at 0).
 *
 *   eager  walks every slot at once.
 *   ahead  keeps the walk a window (KVS_AHEAD_BYTES of slots, at least one) ahead of the hand
 *          over the main share, so the pages in use exceed what the cache holds by at most
 *          that window.  It sleeps on hdr.populate_wake; an allocator (of any mode, while the
 *          region's populate_mode says ahead and no error stopped the walk) that claims a FREE
 *          slot within half a window of the walk's end bumps the word and wakes it
 *          (kvs_populate_note_claim).  The bump is a release and the walker's read of it an
 *          acquire, so a walker that saw the bump sees the hand that caused it: no wake-up is
 *          lost between its look at the hand and its sleep (it sleeps only while the word
 *          still holds what it read first).  A missed wake-up would cost only speed anyway:
 *          allocators allocate the pages of a slot they claim whatever the walk does.  The
 *          sleep ends every KVS_WALK_IDLE_NS to see whether the region's file was removed (a
 *          reset or a rebuild), and the walk then ends rather than keep its pages alive; it
 *          turns into an eager walk when an eager process has set the region's mode.
 *
 * `kvshim prepare` runs the eager walk on threads of its own (one per CPU), to the end, before
 * the engines start (kvs_cache_prepare, struct prep), and also clears the pages it allocates
 * (clear_range).  It takes no lock on the region, since walks over the same slots only repeat
 * each other's work; its threads share a mutex of their own, under which they decide in order
 * which slots get memory, so that it stops where one thread would.  The background walks
 * do not clear: during a load that keeps the CPUs busy, clearing there only moved the zeroing
 * between threads, and once the hand passed the walk, the walk's fallocate zeroed the
 * allocators' fresh pages under the file's lock, one allocator waiting at a time (pages_ns
 * 0.2 s -> 4-11 s summed over 8 ranks).
 *
 * Both stop at the headroom, recording why in the header (populate_err, populate_why), and at
 * the end of their walk.  An ahead walk at the headroom stays, looks again every
 * KVS_WALK_IDLE_NS, and clears populate_err once it allocates again (room came back); an eager
 * one, or any walk after another error, ends.  If the walking process dies the lock drops and
 * the next process of a walking mode to attach or reap carries on (an ahead walk that was
 * waiting at the headroom too).  The thread owns a descriptor and a mapping of its
 * own, so it never touches the handle that started it, which may be closed, or forgotten after
 * fork, while it runs.  That descriptor is published in walker before the lock is taken, so a
 * fork at any later point closes the child's copy and no child keeps the lock alive; one walk
 * per process.
 *
 * The headroom check and the allocation are not atomic across processes: N processes claiming
 * at once can each pass the check and take the file system at most N slots below the headroom,
 * and a walk or `kvshim prepare`, which check a chunk of KVS_WALK_CHUNK slots at a time, a
 * chunk each.  On huge pages a check counts the whole pages an allocation touches
 * (page_bytes).  Where the pages come from faults rather than fallocate (by_fault: huge=advise,
 * hugetlbfs) the allocation maps them into the allocating process, one fault per huge page; on
 * a hugetlbfs nothing is checked (reserved), since the creator reserved every page.
 * The creator's check (region.c) is what keeps a region from being bigger than /dev/shm.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "config.h"
#include "internal.h"
#include "raw.h"
#include "sys.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* After finding no room, a process leaves slots without pages alone this long. */
#define KVS_ROOM_RETRY_NS 100000000ull

/* cache.populate = ahead: how far the walk stays ahead of the hand. */
#define KVS_AHEAD_BYTES (128ull << 20)

/* Slots the walk allocates with one fallocate: fewer turns of the file's lock, which the
 * allocators' own fallocates and the slot loads contend for. */
#define KVS_WALK_CHUNK 16u

/* An ahead walk with nothing to do looks this often whether its region was removed. */
#define KVS_WALK_IDLE_NS 1000000000ull

/* The walker's descriptor: for the fork child to close (O_CLOEXEC acts only at exec, and a
 * child holding a copy would keep the walker's lock after the walker's process is gone), and
 * for the close hooks to move when the program closes its number (kvs_populate_fds_closing).
 * The walker makes every call on it between kvs_ownfd_get and kvs_ownfd_put (base/sys.h): a
 * number the program took (a raw system call, a close_range to the top) ends the walk without
 * a call on it.  The walk's lock goes with the last descriptor of its open file description:
 * closed, never unlocked. */
static struct kvs_ownfd walker = KVS_OWNFD_INIT;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

void kvs_populate_fds_closing(unsigned int lo, unsigned int hi)
{
	kvs_ownfd_closing(&walker, lo, hi);
}

bool kvs_populate_fds_in(unsigned int lo, unsigned int hi)
{
	return kvs_ownfd_in(&walker, lo, hi);
}

static void atfork_child(void)
{
	/* The child's copy only (the parent's lock stays), and only if the number is still
	 * ours: the program may have closed and reused it.  The parent's users are not here. */
	kvs_ownfd_atfork_child(&walker);
	kvs_ownfd_close(&walker);
}

/* The thread opening the walk's descriptor, from its open until walker holds it (or it is
 * closed): a fork in that window would give the child a copy atfork_child does not know of
 * (hostile's forkfds saw one).  A fork waits for it, a few system calls, unless the forking
 * thread is the opener itself (a handler on it: waiting would never end). */
static _Atomic uint32_t opening_tid;

static void atfork_prepare(void)
{
	uint32_t me = (uint32_t)kvs_syscall(SYS_gettid);

	for (uint32_t t; (t = load_acquire(&opening_tid)) && t != me;)
		sched_yield();
}

static void register_atfork(void)
{
	pthread_atfork(atfork_prepare, NULL, atfork_child);
}

struct populator {
	int fd;
	uint64_t headroom;
	char *base;
	size_t len;
	_Atomic uint32_t *fpages; /* of the frames: the walk's unit is a frame */
	uint64_t off_data, shard_size;
	uint32_t nframes, nmain;
	uint32_t window; /* ahead: slots to stay ahead of the hand; eager: 0 */
	bool clear;	 /* kvshim prepare: clear the pages too (clear_range) */
	bool by_fault;	 /* pages are allocated by faults in base, not fallocate (pages.c) */
	bool reserved;	 /* hugetlbfs: every page is reserved, no room to check (pages.c) */
	uint64_t page;	 /* the region's page size: what an allocation takes at least */
};

bool kvs_populate_test_no_fallocate;
unsigned kvs_prepare_test_fault_ms;

/*
 * Allocate the pages of [off, off + len) of the region's file.  fallocate allocates them
 * without mapping them (tmpfs zeroes each at its first touch: clear_range);
 * MADV_POPULATE_WRITE also maps each page into this process, one fault at a time, and zeroes
 * it, and with 8 ranks populating at once it cost 3x the time (pages_ns, in one sitting:
 * 9.8-15.3 s against 3.1-4.7 s summed over ranks for 1 GiB), so on the allocators' path it is
 * the fallback for a file system without fallocate, and the way for regions whose pages must
 * come from faults (by_fault: huge=advise, hugetlbfs; pages.c), where a fault is one per huge
 * page.  A kernel without MADV_POPULATE_WRITE (before 5.14) falls back to fallocate: 4 KiB
 * pages on huge=advise, the same pages on hugetlbfs.  Either way no room is ENOSPC, never a
 * SIGBUS at the first touch.
 */
int kvs_populate_range(int fd, char *base, uint64_t off, uint64_t len, bool by_fault)
{
	int r = -1;

	if (by_fault) {
		if (madvise(base + off, len, MADV_POPULATE_WRITE) == 0)
			return 0;
		if (errno != EINVAL)
			return errno == EFAULT ? ENOSPC : errno;
	}
	if (fd < 0)
		return ENOSPC; /* no descriptor and no MADV_POPULATE_WRITE: not now */
	if (kvs_populate_test_no_fallocate)
		errno = EOPNOTSUPP; /* what a file system without fallocate answers */
	else
		r = kvs_sys_fallocate(fd, 0, (off_t)off, (off_t)len);
	if (r == 0)
		return 0;
	if (errno != EOPNOTSUPP && errno != ENOSYS)
		return errno;
	if (madvise(base + off, len, MADV_POPULATE_WRITE) == 0)
		return 0;
	return errno == EFAULT ? ENOSPC : errno; /* SIGBUS averted: no room in /dev/shm */
}

bool kvs_populate_has_room(int fd, uint64_t len, uint64_t headroom)
{
	struct statvfs sv;

	if (fstatvfs(fd, &sv) < 0)
		return true; /* cannot tell: the allocation itself will say */
	return (uint64_t)sv.f_bavail * sv.f_frsize >= headroom + len;
}

/* Bytes an allocation of [off, off + len) of the file may take on pages of page bytes: the
 * whole pages it touches (a frame smaller than a huge page takes all of it). */
static uint64_t page_bytes(uint64_t off, uint64_t len, uint64_t page)
{
	return (off + len + page - 1) / page * page - off / page * page;
}

/* Whether [off, off + len) of p's region, plus more bytes allocated meanwhile, may get pages:
 * always on hugetlbfs, whose pages were all reserved when it was built. */
static bool room_for(const struct populator *p, uint64_t off, uint64_t len, uint64_t more)
{
	return p->reserved ||
	       kvs_populate_has_room(p->fd, page_bytes(off, len, p->page) + more, p->headroom);
}

/* Make sure slot i's pages exist.  Returns 0, or a positive errno: ENOSPC leaves the slot
 * UNKNOWN (there may be room later), another error marks it NOROOM. */
static int populate_slot(_Atomic uint32_t *s, int fd, char *base, uint64_t off, uint64_t len,
			 bool by_fault)
{
	uint32_t pages = load_acquire(s); /* pairs with the release stores below */
	int err;

	if (pages == KVS_PAGES_OK)
		return 0;
	if (pages == KVS_PAGES_NOROOM)
		return ENOSPC;
	err = kvs_populate_range(fd, base, off, len, by_fault);
	if (err == ENOSPC)
		return err; /* pages it did get stay allocated, to be completed by a retry */
	/* Only from UNKNOWN: a late failure must not mark a slot another process populated and
	 * may be using.  Pairs with the acquire above. */
	uint32_t expect = KVS_PAGES_UNKNOWN;
	if (!cas_acq_rel(s, &expect, err ? KVS_PAGES_NOROOM : KVS_PAGES_OK))
		return expect == KVS_PAGES_OK ? 0 : ENOSPC;
	return err;
}

bool kvs_populate_may_grow(struct kvs_cache *c)
{
	return kvs_mono_ns() >= load_relaxed(&c->room_retry_ns);
}

int kvs_populate_claimed(struct kvs_cache *c, uint32_t i)
{
	_Atomic uint32_t *s = &c->fpages[i];
	int err;

	if (load_acquire(s) == KVS_PAGES_OK) /* pairs with populate_slot's CAS */
		return 0;
	/* Without the region's descriptor (the program took it: cache.h), the pages come by
	 * faults in the mapping, which needs none. */
	unsigned int ticket = 0;
	int fd = kvs_ownfd_get(&c->own, &ticket);
	if (c->page_kind != KVS_PAGE_HUGETLBFS &&
	    !kvs_populate_has_room(
		fd, page_bytes(c->hdr->off_data + i * c->shard_size, c->shard_size, c->page_size),
		c->headroom)) {
		err = ENOSPC;
	} else {
		uint64_t t0 = kvs_mono_ns();

		err = populate_slot(s, fd, c->base, c->hdr->off_data + i * c->shard_size,
				    c->shard_size, fd < 0 || kvs_pages_by_fault(c));
		kvs_cache_count(c, KVS_CTR_pages_ns, kvs_mono_ns() - t0);
	}
	if (fd >= 0)
		kvs_ownfd_put(&c->own, ticket);
	if (err == ENOSPC)
		store_relaxed(&c->room_retry_ns, kvs_mono_ns() + KVS_ROOM_RETRY_NS);
	return err;
}

const char *kvs_populate_reason(uint32_t why, int32_t err)
{
	if (!err)
		return "";
	if (why == KVS_POPULATE_WHY_HEADROOM)
		return "headroom";
	switch (err) {
	case ENOSPC:
		return "ENOSPC";
	case ENOMEM:
		return "ENOMEM";
	case EIO:
		return "EIO";
	case EINVAL:
		return "EINVAL";
	default:
		return "error";
	}
}

int kvs_populate_control(int fd, char *base, uint64_t len)
{
	return -kvs_populate_range(fd, base, 0, len, false);
}

/* ahead: the window in slots (at least one, at most the main share). */
uint32_t kvs_populate_window(uint64_t shard_size, uint32_t nmain)
{
	uint64_t w = KVS_AHEAD_BYTES / shard_size;

	if (w < 1)
		w = 1;
	return w < nmain ? (uint32_t)w : nmain;
}

void kvs_populate_note_claim(struct kvs_cache *c, uint32_t i)
{
	struct kvs_hdr *h = c->hdr;

	/* The region's walk, not this process's setting: a lazy process wakes an ahead walk. */
	if (i >= c->nmain || load_relaxed(&h->populate_mode) != KVS_POPULATE_AHEAD ||
	    load_relaxed(&h->populate_err))
		return;
	uint32_t done = load_relaxed(&h->populated);
	if (done >= c->nmain || i + c->ahead_window / 2 < done)
		return;
	atomic_fetch_add_explicit(&h->populate_wake, 1, memory_order_release); /* pairs in walk */
	kvs_futex_wake(&h->populate_wake, 1, true);
}

/* Where the walk should have got to now: every slot (eager), or a window past the hand. */
static uint32_t walk_target(const struct populator *p, const struct kvs_hdr *h)
{
	if (!p->window)
		return p->nframes;
	uint64_t hand = load_relaxed(&h->hand);
	uint64_t t = (hand < p->nmain ? hand : p->nmain) + p->window;
	return t < p->nmain ? (uint32_t)t : p->nmain;
}

/*
 * Clear the pages of slots [from, to), which have their pages (frame pages OK).  tmpfs's fallocate
 * does not zero a page: it marks it not up to date, and the first touch zeroes it, which in a
 * cold load is the owner's O_DIRECT read (its pinning of the slot faults each page in).  That
 * first write is also where a virtual machine's host backs the page, and on the development VM
 * it cost 40% of all CPU in a cold demo-shape load, ahead of the read's submission (perf,
 * clear_page_rep under pread64).  A populating fault here, in kvshim prepare, does it before
 * the loads.  A fault clears only a page not yet up to date, under the page's lock, so a slot
 * an allocator has claimed meanwhile keeps whatever its owner has read into it; prepare then
 * drops its own mappings (MADV_DONTNEED on a shared mapping unmaps, the pages stay in the
 * file), so its resident size does not grow with the region.  Best effort: a kernel without
 * MADV_POPULATE_WRITE (before 5.14) leaves the zeroing where it was.
 */
static void clear_range(struct populator *p, uint32_t from, uint32_t to)
{
	char *at = p->base + p->off_data + from * p->shard_size;
	size_t len = (to - from) * p->shard_size;

	if (!p->clear || from == to)
		return;
	if (madvise(at, len, MADV_POPULATE_WRITE) < 0 && errno == EINVAL)
		p->clear = false;
	madvise(at, len, MADV_DONTNEED);
}

/* Allocate the pages of slots [from, to): in one call when there is room for all of them, else
 * (or when that call fails) one slot at a time from the first, so that the walk stops exactly at
 * the first slot without room.  Returns the slots done and, in *err and *why, what stopped it
 * short. */
static uint32_t walk_range(struct populator *p, uint32_t from, uint32_t to, int *err, uint32_t *why)
{
	uint64_t off = p->off_data + from * p->shard_size, len = (to - from) * p->shard_size;

	*err = 0;
	if (room_for(p, off, len, 0) &&
	    kvs_populate_range(p->fd, p->base, off, len, p->by_fault) == 0) {
		for (uint32_t i = from; i < to; i++) {
			uint32_t expect =
			    KVS_PAGES_UNKNOWN; /* pairs with populate_slot's acquire */

			cas_acq_rel(&p->fpages[i], &expect, KVS_PAGES_OK);
		}
		return to - from;
	}
	for (uint32_t i = from; i < to; i++) {
		*why = KVS_POPULATE_WHY_ERROR;
		if (load_relaxed(&p->fpages[i]) != KVS_PAGES_OK &&
		    !room_for(p, p->off_data + i * p->shard_size, p->shard_size, 0)) {
			*err = ENOSPC;
			*why = KVS_POPULATE_WHY_HEADROOM;
		} else {
			*err = populate_slot(&p->fpages[i], p->fd, p->base,
					     p->off_data + i * p->shard_size, p->shard_size,
					     p->by_fault);
		}
		if (*err)
			return i - from;
	}
	return to - from;
}

/* Sleep until an allocator asks (the word moves from wake) or KVS_WALK_IDLE_NS pass; false when
 * the region's file was removed meanwhile (a reset, a rebuild): then the walk must end rather
 * than keep the old region's pages alive through its own mapping. */
static bool idle(struct populator *p, struct kvs_hdr *h, uint32_t wake)
{
	struct stat st;

	kvs_futex_wait(&h->populate_wake, wake, KVS_WALK_IDLE_NS, true);
	unsigned int ticket;
	int fd = kvs_ownfd_get(&walker, &ticket);
	if (fd < 0)
		return false; /* the program took the walk's descriptor */
	bool removed = fstat(fd, &st) == 0 && st.st_nlink == 0;
	kvs_ownfd_put(&walker, ticket);
	return !removed;
}

static void *populate_main(void *arg)
{
	struct populator *p = arg;
	struct kvs_hdr *h = (struct kvs_hdr *)p->base;
	uint32_t end = p->window ? p->nmain : p->nframes;

	for (;;) {
		uint32_t wake = load_acquire(&h->populate_wake); /* pairs with note_claim */
		uint32_t done = load_relaxed(&h->populated), target = walk_target(p, h);
		uint32_t why;
		int err;

		if (p->window && load_relaxed(&h->populate_mode) == KVS_POPULATE_EAGER) {
			p->window = 0; /* an eager process attached: walk everything */
			end = p->nframes;
			continue;
		}
		if (done >= end)
			break;
		if (done >= target) {
			if (!idle(p, h, wake))
				break;
			continue;
		}
		uint32_t to = done + KVS_WALK_CHUNK < target ? done + KVS_WALK_CHUNK : target;
		unsigned int ticket;
		p->fd = kvs_ownfd_get(&walker, &ticket);
		if (p->fd < 0)
			break; /* the program took the walk's descriptor, and its lock with it */
		uint32_t got = walk_range(p, done, to, &err, &why);
		kvs_ownfd_put(&walker, ticket);
		store_relaxed(&h->populated, done + got);
		if (got && load_relaxed(&h->populate_err)) {
			/* Room came back: the walk goes on, and stat no longer says it stopped. */
			store_release(&h->populate_err, 0);
			store_relaxed(&h->populate_why, 0);
		}
		if (err) {
			/* The reason before the errno: a reader that sees the errno sees why. */
			store_relaxed(&h->populate_why, why);
			store_release(&h->populate_err, err); /* pairs with kvs_cache_stat */
			/* ahead, at the headroom: a neighbour may free its memory, so look again
			 * once in a while rather than leave the region lazy for good. */
			if (!p->window || why != KVS_POPULATE_WHY_HEADROOM || !idle(p, h, wake))
				break;
		}
	}
	kvs_ownfd_close(&walker); /* the lock goes with it */
	kvs_sys_munmap(p->base, p->len);
	free(p);
	return NULL;
}

void kvs_populate_start(struct kvs_cache *c)
{
	struct flock fl = {
	    .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = KVS_POPULATE_BYTE, .l_len = 1};
	struct populator *p;
	int fd;

	if (c->watch || c->populate == KVS_POPULATE_LAZY || c->keys_only)
		return; /* a region of keys only has every frame's pages from its build */
	/* For `kvshim stat`: the mode of the walk, eager winning over ahead; lazy processes
	 * never set it back. */
	uint32_t mode = load_relaxed(&c->hdr->populate_mode);
	while (mode != KVS_POPULATE_EAGER && mode != (uint32_t)c->populate &&
	       !cas_acq_rel(&c->hdr->populate_mode, &mode, (uint32_t)c->populate))
		;
	uint32_t end = c->populate == KVS_POPULATE_EAGER ? c->nframes : c->nmain;
	int32_t err = load_acquire(&c->hdr->populate_err); /* pairs with populate_main */
	if (load_relaxed(&c->hdr->populated) >= end ||
	    (err && !(c->populate == KVS_POPULATE_AHEAD &&
		      load_relaxed(&c->hdr->populate_why) == KVS_POPULATE_WHY_HEADROOM)))
		return; /* done, or stopped for good (an ahead walk at the headroom is resumed) */
	/* A descriptor of our own: a new open file description of the same inode (not of the
	 * name, which a reset may have given to another region), so the lock is the thread's and
	 * not shared with the handle's descriptor. */
	char self[64];
	struct stat st;
	unsigned int ticket;
	int rfd = kvs_ownfd_get(&c->own, &ticket);
	if (rfd < 0)
		return; /* the program took the region's descriptor: no walk from this process */
	snprintf(self, sizeof(self), "/proc/self/fd/%d", rfd);
	/* Published before the lock is taken, so that a fork at any point after closes the
	 * child's copy (atfork_child): a child must never keep the walk's lock alive; a fork
	 * before waits until it is published (atfork_prepare).  One walk per process. */
	pthread_once(&atfork_once, register_atfork);
	store_release(&opening_tid, (uint32_t)kvs_syscall(SYS_gettid));
	fd = kvs_fd_move_high(kvs_sys_open(self, O_RDWR | O_CLOEXEC));
	kvs_ownfd_put(&c->own, ticket);
	if (fd < 0) {
		store_release(&opening_tid, 0);
		return;
	}
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_dev != c->own.dev ||
	    (uint64_t)st.st_ino != c->own.ino)
		goto err_close; /* not the region: never lock another file */
	walker.dev = c->own.dev;
	walker.ino = c->own.ino;
	if (!kvs_ownfd_publish(&walker, fd))
		goto err_close;
	store_release(&opening_tid, 0);
	fd = kvs_ownfd_get(&walker, &ticket); /* from here on, the number may move */
	if (fd < 0)
		return; /* the program took it already, and closes it */
	if (kvs_sys_fcntl(fd, F_OFD_SETLK, &fl) < 0)
		goto err_unpublish; /* someone populates already */
	p = calloc(1, sizeof(*p));
	if (!p)
		goto err_unpublish;
	p->fd = -1; /* the walker gets its number at each use */
	p->headroom = c->headroom;
	p->len = c->map_len;
	p->off_data = c->hdr->off_data;
	p->shard_size = c->shard_size;
	p->nframes = c->nframes;
	p->nmain = c->nmain;
	p->window = c->populate == KVS_POPULATE_AHEAD ? c->ahead_window : 0;
	p->by_fault = kvs_pages_by_fault(c);
	p->reserved = c->page_kind == KVS_PAGE_HUGETLBFS;
	p->page = c->page_size;
	p->base = kvs_sys_mmap(NULL, p->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p->base == MAP_FAILED)
		goto err_free;
	/* Its faults allocate pages: they must be huge (advise) and placed (hugetlbfs). */
	kvs_memory_map_hints(c, p->base, p->len);
	/* A fork child gets neither the mapping nor (atfork_child) the descriptor. */
	madvise(p->base, p->len, MADV_DONTFORK);
	p->fpages = (_Atomic uint32_t *)(p->base + c->hdr->off_frames);
	kvs_ownfd_put(&walker, ticket);
	if (kvs_thread_start(NULL, populate_main, p, KVS_STACK_OWN) == 0)
		return;
	kvs_sys_munmap(p->base, p->len);
	free(p);
	kvs_ownfd_close(&walker); /* drops the lock with the last reference */
	return;
err_free:
	free(p);
err_unpublish:
	kvs_ownfd_put(&walker, ticket);
	kvs_ownfd_close(&walker);
	return;
err_close:
	kvs_sys_close(fd);
	store_release(&opening_tid, 0);
}

/*
 * One `kvshim prepare` (kvs_cache_prepare): threads that take the region's frames in chunks, in
 * index order.  What takes memory from the file system, and where its headroom stops the walk,
 * is decided under mu, in order, so that the walk stops at the first frame without room as a
 * walk on one thread would: fallocate (cheap: it does not zero) runs under mu; where pages are
 * allocated by faults (pages.c), a chunk's room is checked under mu against the free space
 * less the bytes other threads are faulting in now (pending), and the chunk is faulted in
 * outside it; at the edge of the headroom, a thread waits for those to land (statfs then
 * counts them) and walks one frame at a time under mu.  The zeroing, which is the cost,
 * runs outside mu on every thread.
 */
struct prep {
	struct populator p; /* read-only once the threads start; each copies it */
	uint32_t chunk;	    /* frames a thread takes at once: whole pages */
	pthread_mutex_t mu;
	pthread_cond_t idle; /* pending went back to 0 */
	uint32_t at;	     /* under mu: the next frame to take */
	uint32_t stop;	     /* under mu: the first frame the walk could not give pages */
	uint64_t pending;    /* under mu: bytes faulted in by threads outside mu */
	int err;	     /* under mu: what stopped the walk (positive errno), or 0 */
	_Atomic uint32_t prepared;
};

/* Count the frames of [from, to) that have their pages, into pr->prepared. */
static void prep_count(struct prep *pr, uint32_t from, uint32_t to)
{
	uint32_t n = 0;

	for (uint32_t i = from; i < to; i++) /* not a NOROOM slot the chunk went over */
		n += load_relaxed(&pr->p.fpages[i]) == KVS_PAGES_OK;
	add_relaxed(&pr->prepared, n);
}

static void *prep_main(void *arg)
{
	struct prep *pr = arg;
	struct populator p = pr->p; /* clear_range turns p.clear off for this thread alone */
	uint32_t why = 0;
	int err = 0;

	pthread_mutex_lock(&pr->mu);
	while (!pr->err && pr->at < p.nframes) {
		uint32_t from = pr->at,
			 to = from + pr->chunk < p.nframes ? from + pr->chunk : p.nframes;
		uint64_t len = (uint64_t)(to - from) * p.shard_size, got;

		if (p.by_fault &&
		    room_for(&p, p.off_data + from * p.shard_size, len, pr->pending)) {
			/* Fault the chunk in outside mu, beside the other threads. */
			pr->at = to;
			pr->pending += len;
			pthread_mutex_unlock(&pr->mu);
			if (kvs_prepare_test_fault_ms) /* the other threads decide meanwhile */
				usleep(kvs_prepare_test_fault_ms * 1000u);
			err = kvs_populate_range(p.fd, p.base, p.off_data + from * p.shard_size,
						 len, true);
			for (uint32_t i = from; !err && i < to; i++) {
				uint32_t expect = KVS_PAGES_UNKNOWN; /* pairs with populate_slot */

				cas_acq_rel(&p.fpages[i], &expect, KVS_PAGES_OK);
			}
			clear_range(&p, from, err ? from : to);
			prep_count(pr, from, to);
			pthread_mutex_lock(&pr->mu);
			pr->pending -= len;
			if (!pr->pending)
				pthread_cond_broadcast(&pr->idle);
			if (err && from < pr->stop) { /* another process took the room meanwhile */
				pr->stop = from;
				pr->err = err;
			}
			continue;
		}
		/* In order, under mu: fallocate, or faults one frame at a time at the headroom
		 * once what other threads fault in has landed. */
		while (p.by_fault && pr->pending)
			pthread_cond_wait(&pr->idle, &pr->mu);
		if (pr->err || pr->at != from)
			continue; /* it moved on while this thread waited */
		got = walk_range(&p, from, to, &err, &why);
		pr->at = from + (uint32_t)got;
		if (err && load_relaxed(&p.fpages[pr->at]) == KVS_PAGES_NOROOM)
			pr->at++; /* never used (an allocation failed for good): nothing to prepare
				   */
		else if (err && pr->at < pr->stop) {
			pr->stop = pr->at;
			pr->err = err;
		}
		pthread_mutex_unlock(&pr->mu);
		/* walk_range counts slots that have their pages already, and an earlier walk may
		 * have allocated them without clearing them. */
		clear_range(&p, from, from + (uint32_t)got);
		prep_count(pr, from, from + (uint32_t)got);
		pthread_mutex_lock(&pr->mu);
	}
	pthread_mutex_unlock(&pr->mu);
	return NULL;
}

/* Frames a prepare thread takes at once: KVS_WALK_CHUNK, rounded up to whole pages of
 * page bytes, so that no two threads fault in one page and DONTNEED is aligned. */
static uint32_t prep_chunk(uint64_t shard_size, uint64_t page)
{
	uint64_t a = shard_size, b = page, per_page;

	while (b) { /* gcd */
		uint64_t t = a % b;

		a = b;
		b = t;
	}
	per_page = page / a; /* frames of a multiple of page bytes */
	return (uint32_t)((KVS_WALK_CHUNK + per_page - 1) / per_page * per_page);
}

/* The CPUs this process may run on (at least 1). */
static unsigned cpus_allowed(void)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return 1;
	return CPU_COUNT(&set) > 0 ? (unsigned)CPU_COUNT(&set) : 1;
}

int kvs_cache_prepare(struct kvs_cache *c, unsigned threads, uint32_t *slots_done)
{
	struct kvs_hdr *h = c->hdr;
	struct prep pr = {
	    .p =
		{
		    .fd = kvs_ownfd_peek(&c->own),
		    .headroom = c->headroom,
		    .base = c->base,
		    .fpages = c->fpages,
		    .off_data = h->off_data,
		    .shard_size = c->shard_size,
		    .nframes = c->nframes,
		    .nmain = c->nmain,
		    .clear = true,
		    .by_fault = kvs_pages_by_fault(c),
		    .reserved = c->page_kind == KVS_PAGE_HUGETLBFS,
		    .page = c->page_size,
		},
	    .chunk = prep_chunk(c->shard_size, c->page_size),
	    .stop = c->nframes,
	};
	pthread_t th[KVS_PREPARE_THREADS_MAX];
	unsigned n = 0;

	*slots_done = 0;
	if (c->watch)
		return -EBADF;
	if (c->keys_only) { /* no data: every frame has what it needs from the build */
		*slots_done = c->nframes;
		return 0;
	}
	if (!threads)
		threads = cpus_allowed();
	if (threads > KVS_PREPARE_THREADS_MAX)
		threads = KVS_PREPARE_THREADS_MAX;
	if (threads > (c->nframes + pr.chunk - 1) / pr.chunk)
		threads = (c->nframes + pr.chunk - 1) / pr.chunk;
	pthread_mutex_init(&pr.mu, NULL);
	pthread_cond_init(&pr.idle, NULL);
	while (n + 1 < threads && kvs_thread_start(&th[n], prep_main, &pr, KVS_STACK_OWN) == 0)
		n++;
	prep_main(&pr); /* this thread is one of them */
	for (unsigned i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	pthread_cond_destroy(&pr.idle);
	pthread_mutex_destroy(&pr.mu);

	uint32_t at = pr.at < pr.stop ? pr.at : pr.stop;
	/* A walk that starts later begins where this one ended.  A walk running now may store
	 * a smaller figure over it: it then goes over slots that have their pages, which costs
	 * a fallocate each and changes nothing. */
	uint32_t was = load_relaxed(&h->populated);
	while (was < at && !cas_acq_rel(&h->populated, &was, at))
		;
	if (at == c->nframes && load_acquire(&h->populate_err)) { /* pairs with populate_main */
		/* Every slot has its pages now: a walk that stopped has nothing left to say. */
		store_release(&h->populate_err, 0);
		store_relaxed(&h->populate_why, 0);
	}
	*slots_done = load_relaxed(&pr.prepared);
	return at == c->nframes ? 0 : -pr.err;
}
