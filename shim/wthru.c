/*
 * wthru: write-through (see wthru.h).
 *
 * DESIGN
 *
 * What is kept.  For each KV file a process writes, a staged file (struct wt_file, keyed by
 * st_dev and st_ino) holds one entry per shard the writes touched: a slot staged in the region
 * (kvs_cache_stage_claim: CLAIMED by this process, found by no lookup, freed by the reclaim if
 * the process dies) and the bytes of the shard written so far, as one range [lo, hi).  Each
 * write copies its bytes into the slots while the kernel writes them (the copier thread, for
 * writes of KVS_WT_ASYNC_MIN and more; inline below that), and once the write has returned
 * with ret bytes, extends the ranges by what storage got.  A shard is published when its range
 * covers it whole: shard_size bytes, or up to the end of the file for its last shard.  A range
 * that would get a hole (writes out of order within a shard), a failed or short write whose
 * copy overwrote bytes already counted, or a slot that could not be staged make the shard not
 * kept; the other shards stay.
 *
 * When.  At close of the last descriptor the process wrote the file through, or at fsync or
 * fdatasync of one (then staging goes on for later writes), the file's identity is taken
 * (fstat) and the staged shards are published under it (kvs_cache_stage_publish), kept until
 * the last write's start plus files.settle (capped by files.revalidate), then loaded again
 * from storage once, as a load of an unsettled file would be: a write by a process not under
 * the shim that left the identity as it was (the same timestamp tick) is not visible to the
 * checks below, and that bound keeps the contract of operations.md for it.  A later rename of
 * the file by the same process moves the published shards to the new identity (rename moves
 * ctime; kvs_cache_rekey), if the file is otherwise as it was published.
 *
 * Only this process's bytes.  Nothing is published for a file when:
 *   - its identity at publication, or at the start of a write of this process with none of
 *     its own in flight, differs from the one fstat gave right after this process's last
 *     write to it (someone wrote or truncated it since: over bytes this process wrote, it may
 *     be);
 *   - the region's write sequence says another process under the shim (or another thread of
 *     this one) wrote it while or after this process did (kvs_cache_write_end, _last);
 *   - a write through the file position found the position moved by more than it wrote
 *     (another writer shares the open file description).
 *
 * Never waits for room, never harms the write.  Staging takes a slot only if one can be had
 * at once (no pinned slot is ever waited for); past KVS_WT_MAX_SLOTS staged slots, or with
 * the pools below exhausted, a write is simply not staged.  The real call is made exactly as
 * without the shim; its result and errno are the caller's.
 *
 * Threads and memory.  wt_mu guards the staged files (the list, each file's fields and
 * shard entries), the pools and the recent publications; it is never held across the real
 * write or a copy, and only while the shim's guard is set (so a signal handler on the same
 * thread goes to the real call, never to this lock).  Shard entries live in chunks that never
 * move, so a copy in flight keeps its destinations while other writes add shards.  A file
 * with a write in flight (refs) is never published or freed: a close that races a write marks
 * the file and the last write drops it.  Memory comes from pools mapped once (no malloc on
 * the write path).  The copier thread takes ops from a list under copy_mu and marks each done
 * with a release store that the writer's acquire (futex) wait pairs with.
 *
 * Fork: the child forgets everything (its parent's slots are its parent's) without freeing.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "atomics.h"
#include "config.h"
#include "copy.h"
#include "raw.h"
#include "sys.h"
#include "wthru.h"

#define KVS_WT_ASYNC_MIN    (256u << 10) /* writes copied by the copier thread */
#define KVS_WT_FDS	    8		 /* descriptors one staged file tracks */
#define KVS_WT_CHUNK	    64		 /* shard entries per chunk */
#define KVS_WT_FILES	    256		 /* staged files at once, per process */
#define KVS_WT_CHUNKS	    2048	 /* chunks at once, per process */
#define KVS_WT_RECENT	    32		 /* publications a rename may follow */
#define KVS_WT_FLY	    16		 /* writes of one file in flight at once, tracked */
#define KVS_WT_MAPS	    64		 /* files mapped shared and writable, recorded */
#define KVS_WT_NIL	    UINT32_MAX
#define KVS_WT_NO_STREAM    (-1)
#define KVS_WT_LOST	    INT64_MAX
#define KVS_WT_POPULATE_MIN (64u << 10) /* copies that map their pages first */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct wt_ident {
	uint64_t dev, ino, size, mtime_s, mtime_ns, ctime_s, ctime_ns;
};

struct wt_shard {
	uint32_t slot; /* staged slot, or KVS_WT_NIL */
	uint32_t lo, hi;
	bool holey; /* not kept: a gap, an overwrite storage did not get, no slot */
};

struct wt_chunk {
	struct wt_chunk *next;
	uint64_t first; /* shard index of e[0], a multiple of KVS_WT_CHUNK */
	struct wt_shard e[KVS_WT_CHUNK];
};

struct wt_file {
	struct wt_file *next;
	uint64_t dev, ino;
	int fds[KVS_WT_FDS];
	/* Where the stream on fds[i] stood after the last fwrite the shim saw through it (the
	 * bytes an fwrite buffers reach the file at that position when the stream flushes):
	 * KVS_WT_NO_STREAM when none, KVS_WT_LOST when it is not known. */
	int64_t spos[KVS_WT_FDS];
	int nfds;
	int refs;		    /* writes in flight */
	bool closing;		    /* its last descriptor closed while a write was in flight */
	bool poisoned;		    /* another writer, a moved position: nothing is kept */
	bool wrote;		    /* some write has ended since the last publication */
	struct wt_ident after;	    /* fstat right after this process's last write */
	uint32_t after_gen;	    /* moves with after */
	struct stat close_st;	    /* fstat just before the close that publishes it */
	struct kvs_key close_block; /* its block id then (by birth on a write-once root) */
	bool write_once;	    /* keyed by birth (fdinfo.h): no rename moves its id */
	struct kvs_wtok tok;	    /* of the last write */
	uint64_t t_first;	    /* kvs_node_ns start of the first write since publication */
	uint64_t settle_ns;
	struct wt_chunk *chunks;
	/* The writes of this process in flight on the file, and their ranges: two of them that
	 * overlap leave bytes no one can order, so the file keeps nothing. */
	struct {
		const struct kvs_wthru_op *op;
		uint64_t off, end;
	} fly[KVS_WT_FLY];
	int nfly;
};

/* What a rename may move: the shards [first, last] published under block. */
struct wt_recent {
	bool used;
	bool write_once; /* keyed by birth: a rename leaves the id as it is */
	struct wt_ident id;
	struct kvs_key block;
	struct kvs_wtok tok;
	uint64_t first, last;
};

static bool on;
static uint64_t revalidate_ns;
static kvs_copy_fn copy_fn; /* for copies of bytes the kernel has read already */

static pthread_mutex_t wt_mu = PTHREAD_MUTEX_INITIALIZER;
static struct wt_file *files;		       /* under wt_mu */
static _Atomic uint32_t nfiles;		       /* written under wt_mu, read by anyone */
static uint64_t staged_slots;		       /* under wt_mu */
static struct wt_recent recent[KVS_WT_RECENT]; /* under wt_mu */
static uint32_t recent_next;

/* Pools (under wt_mu): mapped at first use, free lists through next. */
static struct wt_file *file_pool, *free_files;
static struct wt_chunk *chunk_pool, *free_chunks;
static bool pools_failed;

/* The copier (copy_mu guards the list, started, stop). */
static pthread_mutex_t copy_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t copy_cond = PTHREAD_COND_INITIALIZER;
static struct kvs_wthru_op *copy_head, *copy_tail;
static bool copier_started, copier_failed;
static pthread_t copier;
static struct kvs_cache *copy_cache; /* the region the copier copies into (set before it starts) */

void kvs_wthru_configure(const struct kvs_config *cfg)
{
	on = cfg->files_write_through;
	revalidate_ns = cfg->files_revalidate * 1000000ull;
	copy_fn = kvs_copy_pick(cfg->loader_copy);
}

bool kvs_wthru_on(void)
{
	return on;
}

bool kvs_wthru_busy(void)
{
	return load_relaxed(&nfiles) != 0;
}

/* ------------------------------------------------------------------ pools */

static bool pools_locked(void)
{
	if (file_pool || pools_failed)
		return !pools_failed;
	size_t fl = KVS_WT_FILES * sizeof(struct wt_file);
	size_t cl = KVS_WT_CHUNKS * sizeof(struct wt_chunk);
	char *p =
	    kvs_sys_mmap(NULL, fl + cl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		pools_failed = true;
		return false;
	}
	file_pool = (struct wt_file *)p;
	chunk_pool = (struct wt_chunk *)(p + fl);
	for (int i = KVS_WT_FILES - 1; i >= 0; i--) {
		file_pool[i].next = free_files;
		free_files = &file_pool[i];
	}
	for (int i = KVS_WT_CHUNKS - 1; i >= 0; i--) {
		chunk_pool[i].next = free_chunks;
		free_chunks = &chunk_pool[i];
	}
	return true;
}

/* ------------------------------------------------------------------ identities */

static void ident_of(const struct stat *st, struct wt_ident *id)
{
	*id = (struct wt_ident){(uint64_t)st->st_dev,	       (uint64_t)st->st_ino,
				(uint64_t)st->st_size,	       (uint64_t)st->st_mtim.tv_sec,
				(uint64_t)st->st_mtim.tv_nsec, (uint64_t)st->st_ctim.tv_sec,
				(uint64_t)st->st_ctim.tv_nsec};
}

static bool ident_eq(const struct wt_ident *a, const struct wt_ident *b)
{
	return !memcmp(a, b, sizeof(*a));
}

/* f's identity after this process's last write.  Caller holds wt_mu. */
static void set_after_locked(struct wt_file *f, const struct stat *st)
{
	ident_of(st, &f->after);
	f->after_gen++;
}

/* ------------------------------------------------------------------ staged files */

static struct wt_file *find_locked(uint64_t dev, uint64_t ino)
{
	for (struct wt_file *f = files; f; f = f->next)
		if (f->dev == dev && f->ino == ino)
			return f;
	return NULL;
}

/* The entry of shard sh, created (with its chunk) if absent and create; NULL if none. */
static struct wt_shard *shard_locked(struct wt_file *f, uint64_t sh, bool create)
{
	uint64_t first = sh - sh % KVS_WT_CHUNK;
	struct wt_chunk *k;

	for (k = f->chunks; k; k = k->next)
		if (k->first == first)
			return &k->e[sh - first];
	if (!create || !free_chunks)
		return NULL;
	k = free_chunks;
	free_chunks = k->next;
	k->next = f->chunks;
	k->first = first;
	for (int i = 0; i < KVS_WT_CHUNK; i++)
		k->e[i] = (struct wt_shard){.slot = KVS_WT_NIL};
	f->chunks = k;
	return &k->e[sh - first];
}

/* Free every staged slot of f that is still staged, and its chunks (publish took the others). */
static void drop_shards_locked(struct kvs_cache *c, struct wt_file *f)
{
	while (f->chunks) {
		struct wt_chunk *k = f->chunks;

		f->chunks = k->next;
		for (int i = 0; i < KVS_WT_CHUNK; i++) {
			if (k->e[i].slot != KVS_WT_NIL) {
				kvs_cache_stage_drop(c, k->e[i].slot);
				staged_slots--;
			}
		}
		k->next = free_chunks;
		free_chunks = k;
	}
	kvs_cache_stage_count(c, (uint32_t)staged_slots); /* for the node's bound */
}

static void unlink_locked(struct wt_file *f)
{
	for (struct wt_file **pp = &files; *pp; pp = &(*pp)->next) {
		if (*pp == f) {
			*pp = f->next;
			store_relaxed(&nfiles, load_relaxed(&nfiles) - 1);
			return;
		}
	}
}

static void free_file_locked(struct kvs_cache *c, struct wt_file *f)
{
	drop_shards_locked(c, f);
	f->next = free_files;
	free_files = f;
}

/* The index of fd among f's descriptors, or -1. */
static int fd_index(const struct wt_file *f, int fd)
{
	for (int i = 0; i < f->nfds; i++)
		if (f->fds[i] == fd)
			return i;
	return -1;
}

static bool has_fd(const struct wt_file *f, int fd)
{
	return fd_index(f, fd) >= 0;
}

/* The staged file of (dev, ino) with fd among its descriptors, made if need be; NULL if the
 * pools are spent. */
static struct wt_file *file_for_locked(const struct kvs_fdinfo *fi, int fd)
{
	struct wt_file *f = find_locked(fi->dev, fi->ino);

	if (!f) {
		if (!pools_locked() || !free_files)
			return NULL;
		f = free_files;
		free_files = f->next;
		*f = (struct wt_file){.dev = fi->dev,
				      .ino = fi->ino,
				      .settle_ns = fi->settle_ns,
				      .write_once = fi->write_once};
		f->next = files;
		files = f;
		store_relaxed(&nfiles, load_relaxed(&nfiles) + 1);
	}
	if (!has_fd(f, fd)) {
		if (f->nfds == KVS_WT_FDS) {
			f->poisoned = true; /* cannot tell when it is done: keep nothing */
		} else {
			f->spos[f->nfds] = KVS_WT_NO_STREAM;
			f->fds[f->nfds++] = fd;
		}
	}
	return f;
}

/* ------------------------------------------------------------------ copies */

static uint64_t slot_cap(struct kvs_cache *c);

/* The staged slot of f's shard sh, staged now if it has none (a copy stages each shard as it
 * reaches it, so that a write that fails early, or names far more bytes than its buffer holds,
 * stages no more than it copies); KVS_WT_NIL when the shard is not kept.  Staging never waits
 * for room.  The entry and its slot stay while the copy's op holds a reference (refs). */
static uint32_t shard_slot(struct kvs_cache *c, struct wt_file *f, uint64_t sh)
{
	uint32_t slot = KVS_WT_NIL;

	pthread_mutex_lock(&wt_mu);
	struct wt_shard *e = shard_locked(f, sh, true);
	if (!e) {
		f->poisoned = true; /* no entry to account for it: keep nothing */
	} else if (!e->holey && e->slot == KVS_WT_NIL) {
		if (staged_slots >= slot_cap(c) || kvs_cache_stage_claim(c, &e->slot)) {
			e->slot = KVS_WT_NIL;
			e->holey = true; /* this shard is not kept */
		} else {
			staged_slots++;
			kvs_cache_stage_count(c, (uint32_t)staged_slots); /* for the node's bound */
		}
	}
	if (e && !e->holey)
		slot = e->slot;
	pthread_mutex_unlock(&wt_mu);
	return slot;
}

/* Copy the op's bytes [0, to) from its source (src_copy, for device memory) into their staged
 * slots: shard by shard. */
static void copy_src(struct kvs_cache *c, struct kvs_wthru_op *op, uint64_t to)
{
	uint64_t S = kvs_cache_shard_size(c);

	for (uint64_t pos = 0; pos < to && !op->copy_failed;) {
		uint64_t at = op->off + pos, sh = at / S, within = at - sh * S;
		uint64_t n = S - within < to - pos ? S - within : to - pos;
		uint32_t slot = shard_slot(c, op->f, sh);

		if (slot != KVS_WT_NIL &&
		    op->src_copy(op->src_ctx, pos, (char *)kvs_cache_stage_data(c, slot) + within,
				 n))
			op->copy_failed = true; /* the rest is not copied: the file keeps nothing */
		pos += n;
	}
}

/*
 * Copy n bytes of the program's buffer src into a slot, with the kernel's own checks: the
 * program's write gets EFAULT (or a short count) from a buffer it cannot read, where memcpy
 * would crash the process, on this thread or the copier.  process_vm_readv on ourselves does
 * the copy and answers EFAULT instead (about 85% of memcpy's speed here, benchmarks.md).
 * Where it is not allowed (a seccomp filter), the copies are made after the write instead,
 * of the bytes the kernel has just read (pvr_off).  Returns false when the copy is not whole.
 */
static _Atomic bool pvr_off;

static bool safe_copy(void *dst, const void *src, size_t n)
{
	struct iovec l = {dst, n}, r = {(void *)src, n};

	if (!atomic_load_explicit(&pvr_off, memory_order_relaxed)) {
		ssize_t got = kvs_syscall(SYS_process_vm_readv, getpid(), &l, 1, &r, 1, 0);

		if (got == (ssize_t)n)
			return true;
		if (got >= 0 || errno == EFAULT)
			return false;
		atomic_store(&pvr_off, true); /* EPERM, ENOSYS: not here */
	}
	return false;
}

/* Copy the op's bytes [0, to) of the request into their staged slots. */
static void copy_op(struct kvs_cache *c, struct kvs_wthru_op *op, uint64_t to)
{
	if (op->src_copy) {
		copy_src(c, op, to);
		return;
	}
	uint64_t S = kvs_cache_shard_size(c), pos = 0;
	int v = 0;
	uint64_t in_v = 0; /* bytes of iov[v] already used */

	while (pos < to && v < op->iovcnt) {
		uint64_t at = op->off + pos, sh = at / S, within = at - sh * S;
		uint64_t n = S - within;
		uint64_t left_v = op->iov[v].iov_len - in_v;

		if (left_v == 0) {
			v++;
			in_v = 0;
			continue;
		}
		if (n > left_v)
			n = left_v;
		if (n > to - pos)
			n = to - pos;
		uint32_t slot = shard_slot(c, op->f, sh);
		if (slot != KVS_WT_NIL) {
			char *dst = (char *)kvs_cache_stage_data(c, slot) + within;

			/* Map the slot's pages in one call, not one fault per page (the pages
			 * exist: a claimed slot is populated). */
			if (n >= KVS_WT_POPULATE_MIN) {
				uintptr_t a = (uintptr_t)dst & ~(uintptr_t)4095;
				uintptr_t z = ((uintptr_t)dst + n + 4095) & ~(uintptr_t)4095;

				madvise((void *)a, z - a, MADV_POPULATE_WRITE);
			}
			const char *src = (const char *)op->iov[v].iov_base + in_v;
			if (op->trusted) {
				copy_fn(dst, src, n); /* the kernel has just read these bytes */
			} else if (!safe_copy(dst, src, n)) {
				/* The kernel writes no further than this either (a short count or
				 * EFAULT): nothing past it is copied, or staged. */
				op->copy_failed = true;
				return;
			}
		}
		pos += n;
		in_v += n;
	}
}

static void *copier_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&copy_mu);
	for (;;) {
		while (!copy_head)
			pthread_cond_wait(&copy_cond, &copy_mu);
		struct kvs_wthru_op *op = copy_head;
		copy_head = op->next;
		if (!copy_head)
			copy_tail = NULL;
		pthread_mutex_unlock(&copy_mu);
		copy_op(copy_cache, op, op->len);
		_Atomic uint32_t *done = &op->copied;
		store_release(done, 1); /* pairs with wait_copied(); the op is the writer's again */
		kvs_futex_wake(done, 1, false);
		pthread_mutex_lock(&copy_mu);
	}
	return NULL;
}

/* Hand op to the copier; false if there is none (copy inline then). */
static bool copy_async(struct kvs_cache *c, struct kvs_wthru_op *op)
{
	bool ok;

	pthread_mutex_lock(&copy_mu);
	if (!copier_started && !copier_failed) {
		copy_cache = c;
		copier_started =
		    kvs_thread_start(&copier, copier_main, NULL, KVS_STACK_FOREIGN) == 0;
		copier_failed = !copier_started;
	}
	ok = copier_started && copy_cache == c;
	if (ok) {
		store_relaxed(&op->copied, 0);
		op->next = NULL;
		if (copy_tail)
			copy_tail->next = op;
		else
			copy_head = op;
		copy_tail = op;
		pthread_cond_signal(&copy_cond);
	}
	pthread_mutex_unlock(&copy_mu);
	return ok;
}

static void wait_copied(struct kvs_wthru_op *op)
{
	for (int spins = 0; !load_acquire(&op->copied); spins++) { /* pairs with copier_main */
		if (spins < 200) {
			cpu_relax();
			continue;
		}
		kvs_futex_wait(&op->copied, 0, 0, false);
	}
}

/* ------------------------------------------------------------------ shared mappings */

/*
 * Stores through a writable MAP_SHARED mapping change a file with no call the shim sees (and,
 * once its page is writable, with no new timestamp).  The mmap hook records the file
 * (kvs_wthru_mapped): a staged copy of it is poisoned then, and so is every write of it
 * staged while the record stands, and its publication is refused.  A publication that finds no
 * shared mapping of the file left in /proc/self/maps drops the record (the one look that
 * costs: a read of that file, at the publication of a file mapped that way); a record made
 * where /proc/self/maps does not name the file as fstat does (overlayfs, no /proc) is never
 * dropped, nor are records past KVS_WT_MAPS (maps_full: no file is published again).
 */
struct wt_map {
	uint64_t dev, ino;
	uint32_t gen; /* moved by every mapping of the file made */
	bool sticky;  /* /proc/self/maps does not show it: never dropped */
};

static struct wt_map maps[KVS_WT_MAPS]; /* under wt_mu */
static int nmaps;
static bool maps_full;
static _Atomic int maps_hint; /* nmaps + maps_full, written under wt_mu, read by anyone */

static int map_find_locked(uint64_t dev, uint64_t ino)
{
	for (int i = 0; i < nmaps; i++)
		if (maps[i].dev == dev && maps[i].ino == ino)
			return i;
	return -1;
}

/* Is (dev, ino) mapped by this process in a mapping /proc/self/maps marks shared?  Hex, then
 * decimal, parsed here (no stdio: this runs in close).  1 yes, 0 no, -1 cannot tell. */
static int maps_has(uint64_t dev, uint64_t ino)
{
	char buf[4096];
	size_t have = 0;
	int fd = kvs_sys_open("/proc/self/maps", O_RDONLY | O_CLOEXEC), found = 0;

	if (fd < 0)
		return -1;
	for (;;) {
		ssize_t n = kvs_sys_read(fd, buf + have, sizeof(buf) - have);

		if (n <= 0) {
			found = n < 0 ? -1 : found;
			break;
		}
		have += (size_t)n;
		char *line = buf, *nl;
		while (!found && (nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
			/* "start-end perms offset maj:min inode path" */
			char *p = line;
			int field = 0;
			uint64_t v[3] = {0, 0, 0}; /* major, minor, inode */
			bool shared = false;
			for (; p < nl && field < 5; p++) {
				if (*p == ' ') {
					field++;
					continue;
				}
				if (field == 1 && p - line > 0 && p[1] == ' ')
					shared = *p == 's'; /* the fourth letter of "rw-s" */
				if (field == 3 && *p == ':')
					v[0] = v[1], v[1] = 0;
				else if (field == 3)
					v[1] =
					    v[1] * 16 +
					    (uint64_t)(*p <= '9' ? *p - '0' : (*p | 32) - 'a' + 10);
				else if (field == 4)
					v[2] = v[2] * 10 + (uint64_t)(*p - '0');
			}
			found = shared && v[0] == major(dev) && v[1] == minor(dev) && v[2] == ino;
			line = nl + 1;
		}
		if (found)
			break;
		have -= (size_t)(line - buf);
		memmove(buf, line, have);
		/* A line longer than the buffer (a long path): not one this can read. */
		if (have == sizeof(buf))
			have = 0;
	}
	kvs_sys_close(fd);
	return found;
}

void kvs_wthru_mapped(uint64_t dev, uint64_t ino)
{
	if (!on)
		return;
	int seen = maps_has(dev, ino);
	pthread_mutex_lock(&wt_mu);
	int i = map_find_locked(dev, ino);
	if (i < 0 && nmaps < KVS_WT_MAPS) {
		i = nmaps++;
		maps[i] = (struct wt_map){.dev = dev, .ino = ino};
	}
	if (i < 0) {
		maps_full = true;
	} else {
		maps[i].gen++;
		maps[i].sticky = maps[i].sticky || seen != 1;
	}
	store_relaxed(&maps_hint, nmaps + maps_full);
	struct wt_file *f = find_locked(dev, ino);
	if (f)
		f->poisoned = true; /* stores may land over what it staged */
	pthread_mutex_unlock(&wt_mu);
}

/* May (dev, ino) be mapped shared and writable by this process now (its publication then keeps
 * nothing)?  A record whose mapping is gone is dropped here (the answer is still yes: the
 * writes staged meanwhile may have met the stores).  Not under wt_mu: it reads a file. */
static bool mapped_now(uint64_t dev, uint64_t ino)
{
	if (!load_relaxed(&maps_hint))
		return false;
	pthread_mutex_lock(&wt_mu);
	int i = map_find_locked(dev, ino);
	bool keep = maps_full || i < 0 || maps[i].sticky;
	uint32_t gen = i >= 0 ? maps[i].gen : 0;
	pthread_mutex_unlock(&wt_mu);
	if (i < 0 && !maps_full)
		return false;
	if (keep || maps_has(dev, ino) != 0)
		return true;
	pthread_mutex_lock(&wt_mu);
	i = map_find_locked(dev, ino);
	if (i >= 0 && maps[i].gen == gen) { /* no mapping made since the look */
		maps[i] = maps[--nmaps];
		store_relaxed(&maps_hint, nmaps + maps_full);
	}
	pthread_mutex_unlock(&wt_mu);
	return true;
}

/* ------------------------------------------------------------------ writes */

/* The most slots one process keeps staged: a quarter of the region (the node's writers
 * together stage no more: kvs_cache_stage_claim). */
static uint64_t slot_cap(struct kvs_cache *c)
{
	uint64_t n = kvs_cache_slots(c) / 4;

	return n ? n : 1;
}

/* The end of op's range, [off, end): everything from 0 for a write whose place is known only
 * afterwards (late) or never (whole); len UINT64_MAX: to any end. */
static void op_range(const struct kvs_wthru_op *op, uint64_t *off, uint64_t *end)
{
	if (op->late || op->whole) {
		*off = 0;
		*end = UINT64_MAX;
		return;
	}
	*off = op->off;
	*end = op->len > UINT64_MAX - op->off ? UINT64_MAX : op->off + op->len;
}

/* Note op's range among f's writes in flight; one that overlaps another (an O_APPEND one
 * overlaps every other) poisons the file.  Caller holds wt_mu. */
static void fly_add_locked(struct wt_file *f, const struct kvs_wthru_op *op)
{
	uint64_t off, end;

	op_range(op, &off, &end);
	for (int i = 0; i < f->nfly; i++)
		if (off < f->fly[i].end && f->fly[i].off < end)
			f->poisoned = true;
	if (f->nfly == KVS_WT_FLY) {
		f->poisoned = true; /* cannot track it */
		return;
	}
	f->fly[f->nfly].op = op;
	f->fly[f->nfly].off = off;
	f->fly[f->nfly].end = end;
	f->nfly++;
}

static void fly_remove_locked(struct wt_file *f, const struct kvs_wthru_op *op)
{
	for (int i = 0; i < f->nfly; i++) {
		if (f->fly[i].op == op) {
			f->fly[i] = f->fly[--f->nfly];
			return;
		}
	}
}

/* The shards of f that [off, off + len) touches keep nothing (a change whose bytes are not
 * copied).  Only shards staged already: one staged later is written after the change.  Caller
 * holds wt_mu. */
static void mark_locked(struct kvs_cache *c, struct wt_file *f, uint64_t off, uint64_t len)
{
	uint64_t S = kvs_cache_shard_size(c), first = off / S;
	uint64_t last = len - 1 > UINT64_MAX - off ? UINT64_MAX : (off + len - 1) / S;

	if (len == 0)
		return;
	for (struct wt_chunk *k = f->chunks; k; k = k->next)
		for (int i = 0; i < KVS_WT_CHUNK; i++)
			if (k->first + (uint64_t)i >= first && k->first + (uint64_t)i <= last)
				k->e[i].holey = true;
}

/*
 * Follow op (its range set) as a write of fi's file through fd: its staged file (made if need
 * be when fd is the program's, named), its place among the writes in flight, the region's
 * write sequence, and what the identity says of the file since this process's last write.
 * False when it cannot be followed (the pools are spent; no staged file for a change by path).
 */
static bool follow(struct kvs_cache *c, struct kvs_wthru_op *op, int fd,
		   const struct kvs_fdinfo *fi, bool named)
{
	pthread_mutex_lock(&wt_mu);
	struct wt_file *f = named ? file_for_locked(fi, fd) : find_locked(fi->dev, fi->ino);
	if (!f) {
		pthread_mutex_unlock(&wt_mu);
		return false;
	}
	if (op->whole)
		f->poisoned = true; /* its bytes land where nothing says: nothing is kept */
	if (load_relaxed(&maps_hint) && (maps_full || map_find_locked(fi->dev, fi->ino) >= 0))
		f->poisoned = true; /* mapped shared and writable: stores may land over it */
	int i = fd_index(f, fd);
	/* A stream that is not where the last fwrite the shim saw left it: something else wrote
	 * or moved it (fputc, fprintf, fwrite_unlocked, a seek), bytes the shim does not see,
	 * which may land over the bytes it keeps. */
	if (op->stream && i >= 0 && f->spos[i] != KVS_WT_NO_STREAM &&
	    f->spos[i] != (int64_t)op->off)
		f->poisoned = true;
	fly_add_locked(f, op);
	f->refs++;
	op->f = f;
	/* Alone on the file after an earlier write: its identity now says whether anything
	 * wrote it since (below). */
	bool look = f->wrote && f->refs == 1;
	uint32_t gen = f->after_gen;
	pthread_mutex_unlock(&wt_mu);
	kvs_cache_write_begin(c, fi->dev, fi->ino, &op->tok);
	struct stat st;
	look = look && fstat(fd, &st) == 0;
	if (op->tok.foreign || look) {
		struct wt_ident now;

		if (look)
			ident_of(&st, &now);
		pthread_mutex_lock(&wt_mu);
		/* Another process under the shim may have written the file since this one did
		 * (the write sequence), or one outside it (the identity moved since this
		 * process's last write ended, with no write of its own in flight since): what
		 * this one wrote before may be under its bytes. */
		if (op->tok.foreign && (f->wrote || f->refs > 1))
			f->poisoned = true;
		if (look && f->refs == 1 && f->after_gen == gen && !ident_eq(&now, &f->after))
			f->poisoned = true;
		pthread_mutex_unlock(&wt_mu);
	}
	return true;
}

bool kvs_wthru_before(struct kvs_cache *c, struct kvs_wthru_op *op, int fd,
		      const struct kvs_fdinfo *fi, const struct iovec *iov, int iovcnt,
		      uint64_t len, int64_t off, unsigned how,
		      int (*src_copy)(void *ctx, uint64_t pos, void *dst, size_t n), void *src_ctx)
{
	bool at_pos = off < 0, deferred = how & KVS_WT_DEFERRED;

	memset(op, 0, sizeof(*op));
	op->stream = (how & KVS_WT_STREAM) && !at_pos;
	op->src_copy = src_copy;
	op->src_ctx = src_ctx;
	if (!on || len == 0 || !fi->kv || (deferred && at_pos))
		return false; /* (asynchronous writes always have an offset) */
	if (at_pos) {
		off_t p = lseek(fd, 0, SEEK_CUR);

		if (p < 0)
			return false;
		off = p;
		op->late = fi->append; /* O_APPEND writes at the end, wherever the position is */
	} else if (fi->append) {
		/* Linux appends a write through an O_APPEND descriptor whatever offset it names
		 * (pwrite, pwritev, POSIX and kernel AIO, cuFileWrite), and leaves the position
		 * alone: where its bytes went is not known. */
		op->whole = true;
	}
	op->iov = iov;
	op->iovcnt = iovcnt;
	op->off = (uint64_t)off;
	op->len = len;
	op->t0 = kvs_node_ns(); /* expiries are shared: sys.h */
	op->at_pos = at_pos;
	op->deferred = deferred;
	if (!follow(c, op, fd, fi, true))
		return false;
	if (op->late || op->whole)
		return true; /* O_APPEND: copied after the write, where it went, or not at all */
	if (!src_copy && atomic_load_explicit(&pvr_off, memory_order_relaxed)) {
		/* No safe copy here: a synchronous write's bytes are copied after it, those the
		 * kernel has just read; an asynchronous one's cannot be, and keep nothing. */
		if (deferred)
			op->copy_failed = true;
		else
			op->late_copy = true;
		return true;
	}
	/* The copy overlaps the real write (the copier), or, for a write seen complete only later
	 * (aio), is made now: the program may reuse its buffer as soon as it knows the write is
	 * over, before the shim hears of it. */
	op->async = !deferred && len >= KVS_WT_ASYNC_MIN && copy_async(c, op);
	if (!op->async)
		copy_op(c, op, len);
	if (deferred)
		op->iov = NULL; /* copied: the caller's array is not looked at again */
	return true;		/* a copy that failed poisons the file at the write's end */
}

bool kvs_wthru_change(struct kvs_cache *c, struct kvs_wthru_op *op, int fd,
		      const struct kvs_fdinfo *fi, int64_t off, uint64_t len, bool named)
{
	memset(op, 0, sizeof(*op));
	if (!on || !fi->kv || len == 0)
		return false;
	op->change = true;
	if (off == KVS_WT_AT_POS) {
		off_t p = fi->append ? 0 : lseek(fd, 0, SEEK_CUR);

		op->whole = fi->append || p < 0; /* an O_APPEND write goes to the end */
		off = p < 0 ? 0 : p;
	} else if (off < 0) {
		op->whole = true; /* KVS_WT_ANYWHERE */
		off = 0;
	}
	op->off = (uint64_t)off;
	op->len = len;
	op->t0 = kvs_node_ns(); /* expiries are shared: sys.h */
	return follow(c, op, fd, fi, named);
}

/* Account for a write of the op's range that storage took ret bytes of (ret < 0: none):
 * extend each shard's range by what was written; a shard whose counted bytes the copy
 * overwrote beyond what was written is not kept.  Caller holds wt_mu. */
static void account_locked(struct kvs_cache *c, struct wt_file *f, uint64_t off, uint64_t len,
			   ssize_t ret)
{
	uint64_t S = kvs_cache_shard_size(c);
	uint64_t done = ret > 0 ? (uint64_t)ret : 0, end = off + done;

	for (uint64_t sh = off / S; sh <= (off + len - 1) / S; sh++) {
		struct wt_shard *e = shard_locked(f, sh, false);
		uint64_t s0 = sh * S;

		if (!e || e->holey)
			continue;
		/* Within the shard: the bytes written [a, b), and those copied but not written. */
		uint64_t a = off > s0 ? off - s0 : 0;
		uint64_t b = end > s0 ? (end - s0 < S ? end - s0 : S) : 0;
		uint64_t cend = off + len - s0 < S ? off + len - s0 : S;
		uint64_t ua = b > a ? b : a; /* the unwritten copy is [ua, cend) */
		if (ua < cend && e->hi > e->lo && ua < e->hi && cend > e->lo) {
			e->holey = true; /* bytes counted before were overwritten in the slot */
			continue;
		}
		if (b <= a)
			continue;
		if (e->hi == e->lo) {
			e->lo = (uint32_t)a;
			e->hi = (uint32_t)b;
		} else if (a <= e->hi && b >= e->lo) {
			e->lo = a < e->lo ? (uint32_t)a : e->lo;
			e->hi = b > e->hi ? (uint32_t)b : e->hi;
		} else {
			e->holey = true; /* a gap within the shard */
		}
	}
}

/* The end of op's write through f (ret from storage): account for it, note the identity it
 * left and its token, and drop the file if its last descriptor closed meanwhile. */
static void end_write(struct kvs_cache *c, struct kvs_wthru_op *op, int fd, ssize_t ret, bool clean)
{
	struct wt_file *f = op->f;
	struct stat st;
	bool stat_ok = fstat(fd, &st) == 0;

	pthread_mutex_lock(&wt_mu);
	fly_remove_locked(f, op);
	if (op->change)
		mark_locked(c, f, op->off, op->len); /* its bytes are not in the slots */
	else if (op->len)
		account_locked(c, f, op->off, op->len, ret);
	if (!clean || !stat_ok || op->copy_failed)
		f->poisoned = true;
	if (stat_ok)
		set_after_locked(f, &st);
	int i = op->stream ? fd_index(f, fd) : -1;
	if (i >= 0) /* a short fwrite leaves the stream where it cannot be told */
		f->spos[i] = ret == (ssize_t)op->len ? (int64_t)(op->off + op->len) : KVS_WT_LOST;
	f->tok = op->tok;
	if (!f->wrote || op->t0 < f->t_first)
		f->t_first = op->t0;
	f->wrote = true;
	if (--f->refs == 0 && f->closing)
		free_file_locked(c, f); /* closed during a write: what is on storage is unknown */
	pthread_mutex_unlock(&wt_mu);
}

void kvs_wthru_after(struct kvs_cache *c, struct kvs_wthru_op *op, int fd, ssize_t ret)
{
	bool moved = false;

	if (!op->f)
		return;
	if (op->async)
		wait_copied(op);
	if (op->whole && !op->change) {
		op->len = 0; /* landed where nothing says (the file was poisoned at its start) */
	} else if (op->change) {
		/* Its range keeps nothing (end_write), whatever it wrote. */
	} else if (op->late_copy && ret > 0) {
		/* No safe copy here: the bytes the kernel has just read, copied now. */
		op->trusted = true;
		copy_op(c, op, (uint64_t)ret < op->len ? (uint64_t)ret : op->len);
	} else if (op->late) {
		/* O_APPEND: the bytes went where the position is now, less what was written. */
		off_t p = ret > 0 ? lseek(fd, 0, SEEK_CUR) : -1;

		op->len = 0;
		if (ret > 0 && p >= ret) {
			op->off = (uint64_t)(p - ret);
			op->len = (uint64_t)ret;
			op->trusted = true; /* the kernel has just read them */
			copy_op(c, op, op->len);
		} else if (ret > 0) {
			moved = true;
		}
	} else if (op->at_pos && ret > 0) {
		/* Another writer on the same open file description moved the position. */
		off_t p = lseek(fd, 0, SEEK_CUR);

		moved = p < 0 || (uint64_t)p != op->off + (uint64_t)ret;
	}
	bool clean = kvs_cache_write_end(c, &op->tok) && !moved;
	end_write(c, op, fd, ret, clean);
}

struct wt_file *kvs_wthru_truncating(struct kvs_cache *c, int fd, struct kvs_wtok *tok)
{
	struct stat st;
	struct wt_file *f;

	if (!kvs_wthru_busy() || fstat(fd, &st) != 0)
		return NULL;
	pthread_mutex_lock(&wt_mu);
	f = find_locked((uint64_t)st.st_dev, (uint64_t)st.st_ino);
	if (f && has_fd(f, fd)) {
		if (f->nfly)
			f->poisoned = true; /* a write in flight: which lands first is unknown */
		f->refs++; /* as a write in flight: not published or freed meanwhile */
	} else
		f = NULL;
	pthread_mutex_unlock(&wt_mu);
	if (f)
		kvs_cache_write_begin(c, (uint64_t)st.st_dev, (uint64_t)st.st_ino, tok);
	return f;
}

void kvs_wthru_truncated(struct kvs_cache *c, struct wt_file *f, int fd, struct kvs_wtok *tok,
			 int ret)
{
	struct stat st;
	bool clean = kvs_cache_write_end(c, tok) && ret == 0;
	bool stat_ok = fstat(fd, &st) == 0;

	pthread_mutex_lock(&wt_mu);
	/* A shard the new end cuts keeps only what was written of it before the end; one past it
	 * counts nothing written (if the file grows again, those bytes are zeros, not what the
	 * slot holds, until a later write covers them again). */
	if (stat_ok) {
		uint64_t S = kvs_cache_shard_size(c), end = (uint64_t)st.st_size;

		for (struct wt_chunk *k = f->chunks; k; k = k->next) {
			for (int i = 0; i < KVS_WT_CHUNK; i++) {
				struct wt_shard *e = &k->e[i];
				uint64_t s0 = (k->first + (uint64_t)i) * S;

				if (s0 >= end) {
					e->lo = e->hi = 0;
					e->holey = e->slot == KVS_WT_NIL;
				} else if (end - s0 < e->hi)
					e->hi = (uint32_t)(end - s0) > e->lo ? (uint32_t)(end - s0)
									     : e->lo;
			}
		}
	}
	if (!clean || !stat_ok)
		f->poisoned = true;
	if (stat_ok)
		set_after_locked(f, &st);
	f->tok = *tok;
	f->wrote = true;
	if (--f->refs == 0 && f->closing)
		free_file_locked(c, f);
	pthread_mutex_unlock(&wt_mu);
}

/* ------------------------------------------------------------------ publication */

/* f's block id now, through fd (a descriptor of its file) whose fstat gave st: by birth on a
 * write-once root (one more statx and the generation), else by change from st. */
static void block_of(struct wt_file *f, int fd, const struct stat *st, struct kvs_key *block)
{
	struct kvs_ident id;

	if (f->write_once && kvs_ident_of_fd(fd, true, &id) == 0 && id.write_once &&
	    id.dev == (uint64_t)st->st_dev && id.ino == (uint64_t)st->st_ino &&
	    id.size == (uint64_t)st->st_size)
		kvs_ident_key(&id, block);
	else
		kvs_block_id(st, block);
}

/* Publish f's shards written whole under the identity st (taken now), whose block id is
 * block, drop the others, and remember what was published for a rename.  Caller holds wt_mu;
 * no write of f is in flight. */
static void publish_locked(struct kvs_cache *c, struct wt_file *f, const struct stat *st,
			   const struct kvs_key *block_now)
{
	struct wt_ident now;
	struct kvs_key block = *block_now;
	uint64_t S = kvs_cache_shard_size(c), size = (uint64_t)st->st_size;
	uint64_t first = UINT64_MAX, last = 0, bytes = 0;

	ident_of(st, &now);
	bool ok = !f->poisoned && f->wrote && ident_eq(&now, &f->after) &&
		  kvs_cache_write_last(c, &f->tok);
	/* Kept until files.settle after the first of these writes began (capped by
	 * files.revalidate): a writer the checks cannot see (not under the shim, in the same
	 * timestamp tick) wrote after that, so the contract holds for it as for a load of an
	 * unsettled file that began then. */
	uint64_t until = f->settle_ns ? f->t_first + f->settle_ns : 0;
	if (revalidate_ns && (!until || f->t_first + revalidate_ns < until))
		until = f->t_first + revalidate_ns;
	while (f->chunks) {
		struct wt_chunk *k = f->chunks;

		f->chunks = k->next;
		for (int i = 0; i < KVS_WT_CHUNK; i++) {
			struct wt_shard *e = &k->e[i];
			uint64_t sh = k->first + (uint64_t)i, s0 = sh * S;
			uint64_t len = s0 < size ? (size - s0 < S ? size - s0 : S) : 0;

			/* A shard this process wrote and does not publish: whatever the cache holds
			 * under this identity may be older than what storage holds now (an identity
			 * can come back: a same-size rewrite in one tick of whole-second stamps, a
			 * deleted file's inode), so it goes. */
			if (e->slot == KVS_WT_NIL) {
				if (e->holey)
					kvs_cache_invalidate(c, &block, sh, sh);
				continue;
			}
			staged_slots--;
			if (!ok || e->holey || !len || e->lo != 0 || e->hi != len) {
				kvs_cache_stage_drop(c, e->slot);
				kvs_cache_invalidate(c, &block, sh, sh);
				continue;
			}
			struct kvs_key key = {block.block_lo, block.block_hi, sh};
			if (kvs_cache_stage_publish(c, e->slot, &key, (uint32_t)len, until) == 1) {
				bytes += len;
				first = sh < first ? sh : first;
				last = sh > last ? sh : last;
			}
		}
		k->next = free_chunks;
		free_chunks = k;
	}
	kvs_cache_stage_count(c, (uint32_t)staged_slots); /* for the node's bound */
	f->wrote = false;
	f->poisoned = false;
	if (!bytes)
		return;
	/* A write that began while the shards went in may be under some of them: then none of
	 * them stays (its writer's own publication may have met ours and been dropped). */
	if (!kvs_cache_write_last(c, &f->tok)) {
		kvs_cache_invalidate(c, &block, first, last);
		return;
	}
	kvs_cache_count(c, KVS_CTR_write_through_bytes, bytes);
	struct wt_recent *r = &recent[recent_next++ % KVS_WT_RECENT];
	*r = (struct wt_recent){.used = true,
				.write_once = f->write_once,
				.id = now,
				.block = block,
				.tok = f->tok,
				.first = first,
				.last = last};
}

struct wt_file *kvs_wthru_closing(struct kvs_cache *c, int fd, int64_t stream_pos)
{
	struct wt_file *take = NULL;
	struct stat st;

	if (!kvs_wthru_busy())
		return NULL;
	bool st_ok = fstat(fd, &st) == 0;
	pthread_mutex_lock(&wt_mu);
	for (struct wt_file *f = files, *next; f; f = next) {
		next = f->next;
		int i = fd_index(f, fd);
		if (i < 0)
			continue;
		/* The stream about to be flushed and closed: not where the last fwrite the shim saw
		 * left it (see follow). */
		if (stream_pos != KVS_WT_CLOSE && f->spos[i] != KVS_WT_NO_STREAM &&
		    f->spos[i] != stream_pos)
			f->poisoned = true;
		f->nfds--;
		f->fds[i] = f->fds[f->nfds];
		f->spos[i] = f->spos[f->nfds];
		bool ours = st_ok && (uint64_t)st.st_dev == f->dev && (uint64_t)st.st_ino == f->ino;
		if (!ours)
			f->poisoned = true; /* the number was closed unseen and reused: unknown */
		if (f->nfds)
			continue;
		unlink_locked(f);
		if (f->refs) {
			f->closing = true; /* the write in flight frees it */
		} else if (!ours || take) {
			free_file_locked(c, f);
		} else {
			f->close_st = st;
			block_of(f, fd, &st, &f->close_block);
			take = f;
		}
	}
	pthread_mutex_unlock(&wt_mu);
	return take;
}

void kvs_wthru_closed(struct kvs_cache *c, struct wt_file *f, int ret)
{
	if (!f)
		return;
	bool mapped = mapped_now(f->dev, f->ino);
	pthread_mutex_lock(&wt_mu);
	if (mapped)
		f->poisoned = true;
	if (ret == 0) /* a failed close (NFS reports a write error there) keeps nothing */
		publish_locked(c, f, &f->close_st, &f->close_block);
	free_file_locked(c, f);
	pthread_mutex_unlock(&wt_mu);
}

void kvs_wthru_stream_closed(struct kvs_cache *c, struct wt_file *f, int dupfd, int ret)
{
	struct stat st;
	struct wt_ident before;
	bool ok = ret == 0 && dupfd >= 0 && fstat(dupfd, &st) == 0;

	if (!f) {
		if (dupfd >= 0)
			kvs_syscall(SYS_close, dupfd); /* ours: the program's is closed already */
		return;
	}
	bool mapped = mapped_now(f->dev, f->ino);
	pthread_mutex_lock(&wt_mu);
	if (mapped)
		f->poisoned = true;
	ident_of(&f->close_st, &before);
	/* Only the flush may have moved the identity since the last fwrite. */
	if (ok && ident_eq(&before, &f->after) && (uint64_t)st.st_ino == f->ino) {
		struct kvs_key block;

		block_of(f, dupfd, &st, &block);
		set_after_locked(f, &st);
		publish_locked(c, f, &st, &block);
	}
	free_file_locked(c, f);
	pthread_mutex_unlock(&wt_mu);
	if (dupfd >= 0)
		kvs_syscall(SYS_close, dupfd); /* ours: the program's is closed already */
}

void kvs_wthru_synced(struct kvs_cache *c, int fd)
{
	struct stat st;

	if (!kvs_wthru_busy() || fstat(fd, &st) != 0)
		return;
	bool mapped = mapped_now((uint64_t)st.st_dev, (uint64_t)st.st_ino);
	pthread_mutex_lock(&wt_mu);
	struct wt_file *f = find_locked((uint64_t)st.st_dev, (uint64_t)st.st_ino);
	if (f && has_fd(f, fd) && f->refs == 0) {
		struct kvs_key block;

		if (mapped)
			f->poisoned = true;
		block_of(f, fd, &st, &block);
		publish_locked(c, f, &st, &block);
	}
	pthread_mutex_unlock(&wt_mu);
}

void kvs_wthru_renamed(struct kvs_cache *c, int dirfd, const char *path)
{
	struct stat st;
	struct wt_ident now;

	if (!on || !path || fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
	    !S_ISREG(st.st_mode))
		return;
	ident_of(&st, &now);
	pthread_mutex_lock(&wt_mu);
	for (int i = 0; i < KVS_WT_RECENT; i++) {
		struct wt_recent *r = &recent[i];

		if (!r->used || r->id.dev != now.dev || r->id.ino != now.ino)
			continue;
		if (r->write_once)
			break; /* keyed by birth: the rename left its id as it was */
		r->used = false;
		/* Only ctime may have moved (the rename's own), and nobody written since. */
		if (r->id.size != now.size || r->id.mtime_s != now.mtime_s ||
		    r->id.mtime_ns != now.mtime_ns || !kvs_cache_write_last(c, &r->tok))
			break;
		struct kvs_key block;
		kvs_block_id(&st, &block);
		for (uint64_t sh = r->first; sh <= r->last; sh++) {
			struct kvs_key from = {r->block.block_lo, r->block.block_hi, sh};
			struct kvs_key to = {block.block_lo, block.block_hi, sh};

			kvs_cache_rekey(c, &from, &to);
		}
		r->used = true; /* a second rename moves them again */
		r->id = now;
		r->block = block;
		break;
	}
	pthread_mutex_unlock(&wt_mu);
}

void kvs_wthru_atfork_child(void)
{
	/* The parent's threads do not exist here; its slots are its own.  Forget, free nothing
	 * of the region's. */
	pthread_mutex_init(&wt_mu, NULL);
	pthread_mutex_init(&copy_mu, NULL);
	pthread_cond_init(&copy_cond, NULL);
	if (file_pool)
		kvs_sys_munmap(file_pool, KVS_WT_FILES * sizeof(struct wt_file) +
					      KVS_WT_CHUNKS * sizeof(struct wt_chunk));
	file_pool = free_files = NULL;
	chunk_pool = free_chunks = NULL;
	pools_failed = false;
	files = NULL;
	store_relaxed(&nfiles, 0);
	staged_slots = 0;
	memset(recent, 0, sizeof(recent));
	copy_head = copy_tail = NULL;
	copier_started = copier_failed = false;
	copy_cache = NULL;
}
