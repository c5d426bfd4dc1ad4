/*
 * anchor: the shim's own descriptors of the KV files it reads (see anchor.h).
 *
 * DESIGN
 *
 * Tables, mapped once (mmap, never malloc: a read may come from a signal handler), indexed by
 * descriptor number below FD_SLOTS:
 *   slot[fd]  the anchor for the program's number fd, plus one (0: none);
 *   refs[a]   for anchor number a: bit 31 RETIRING, bit 30 GONE (retired, and the number is
 *             the program's now: never closed), bits 0-29 the reads holding it now;
 *   made[a]   the (dev, ino) anchor a was made for;
 *   ours      a bitmap: a is an anchor of ours (in a slot, parked, or retiring).
 *
 *   field    written by                                  read without a lock by
 *   slot[fd] an installer under anchor_mu (exchange);     readers (acquire)
 *            the closing program thread (exchange)
 *   refs[a]  readers (CAS up, fetch-sub down), retirers   all of them
 *            (fetch-or RETIRING), the closer (store 0)
 *   made[a]  the installer, before slot[] names a         retirers, the fork child
 *   ours     installer (set), closer (clear)             retirers, /proc scans, fork child
 *
 * A reader loads slot[fd], takes a reference (a CAS that fails once RETIRING is set), checks
 * that slot[fd] still names the anchor (else it was retired in between: it puts the reference
 * back), then checks with fstat that it is the read's file.  An anchor leaves its slot by
 * exchange, so exactly one thread retires it, before the RETIRING bit is set: no reader can
 * take a new reference after the retirer sets it.  Whoever brings the count to zero with
 * RETIRING set (the retirer, or the last put) closes it, once; its refs word is cleared
 * before the close, so the number starts afresh if dup hands it out again (a stale reader
 * that races that clear takes and returns a reference on the new anchor: balanced, and its
 * slot check fails).
 *
 * Retiring: an anchor whose file the program may have locked (locked[] below) is parked
 * instead, and retried at later retirements (scan of /proc/self/fd: does any descriptor of the
 * program, not ours, name the file?); at most MAX_PARKED, beyond that it stays open for the
 * life of the process (a descriptor, never a lock).  Any other is released at once.  So the
 * scan, whose cost grows with the program's descriptors, is paid only for locked files.
 *
 * locked[]: hashes of (dev, ino) of files the program locked, inserted by CAS into an empty
 * entry, never removed; full: every file counts as locked.  A hash collision makes an
 * unlocked file look locked: the careful path, never the unsafe one.
 *
 * anchor_mu serialises installing (kvs_anchor_get's slow path) and retiring (closing, a
 * replaced slot, the parked list): a few system calls (dup, fstat, statx, close) while it is
 * held, never I/O.  Both wait for it: a thread that gave up when another was installing would
 * send its read to storage, and with many threads opening a descriptor per read (UCM's psync
 * engine: 128 of them) that was 1 read in 10.  The one caller that must not wait is a signal
 * handler that interrupted this very thread while it holds the lock, or is taking it: in_mu,
 * per thread and set before the lock is taken, makes such a nested call give up (-EBUSY, or
 * leave the anchor for a later retirement) instead of waiting for itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "anchor.h"
#include "cache.h"
#include "raw.h"
#include "sys.h"

#define FD_SLOTS     65536
#define MAX_PARKED   64
#define LOCKED_SLOTS 256
#define RETIRING     0x80000000u
#define GONE	     0x40000000u /* with RETIRING: the number is no longer ours: never close it */
#define COUNT	     0x3fffffffu

struct made {
	uint64_t dev, ino;
};

struct tables {
	_Atomic int32_t slot[FD_SLOTS];
	_Atomic uint32_t refs[FD_SLOTS];
	struct made made[FD_SLOTS];
};

static _Atomic(struct tables *) tables;
static _Atomic uint64_t ours[FD_SLOTS / 64];
static _Atomic uint64_t closing[FD_SLOTS / 64]; /* finish() is closing this number now */
static __thread int in_finish __attribute__((tls_model("initial-exec"))); /* in finish() */
static _Atomic uint64_t locked[LOCKED_SLOTS];
static _Atomic bool locked_full;
static pthread_mutex_t anchor_mu = PTHREAD_MUTEX_INITIALIZER;
static int parked[MAX_PARKED]; /* under anchor_mu */
static int nparked;
/* This thread holds anchor_mu or is taking it (a signal handler on it must not wait). */
static __thread int in_mu __attribute__((tls_model("initial-exec")));

/* Take anchor_mu, waiting for it.  False, without waiting, when this thread holds it already or
 * is taking it: a signal handler that interrupted it. */
static bool lock_anchors(void)
{
	if (in_mu)
		return false;
	in_mu = 1;
	atomic_signal_fence(memory_order_seq_cst); /* a handler on this thread sees in_mu first */
	pthread_mutex_lock(&anchor_mu);
	return true;
}

static void unlock_anchors(void)
{
	pthread_mutex_unlock(&anchor_mu);
	atomic_signal_fence(memory_order_seq_cst); /* released before in_mu says so */
	in_mu = 0;
}

static struct tables *tables_get(bool create)
{
	struct tables *t = atomic_load_explicit(&tables, memory_order_acquire); /* pairs below */

	if (t || !create)
		return t;
	t = kvs_sys_mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			 0);
	if (t == MAP_FAILED)
		return NULL;
	struct tables *expect = NULL;
	if (!atomic_compare_exchange_strong(&tables, &expect, t)) { /* release: the zeroed map */
		kvs_sys_munmap(t, sizeof(*t));
		t = expect;
	}
	return t;
}

static void mark_ours(int fd, bool on)
{
	uint64_t bit = 1ull << (fd % 64);

	if (on)
		atomic_fetch_or(&ours[fd / 64], bit);
	else
		atomic_fetch_and(&ours[fd / 64], ~bit);
}

static bool is_ours(int fd)
{
	return fd >= 0 && fd < FD_SLOTS && (atomic_load(&ours[fd / 64]) >> (fd % 64)) & 1;
}

/* ------------------------------------------------------------------ locked files */

void kvs_anchor_note_lock(int fd)
{
	struct stat st;
	int saved = errno, r = fstat(fd, &st);

	errno = saved; /* the program's lock call sets errno, not this look */
	if (r != 0 || !S_ISREG(st.st_mode))
		return;
	uint64_t h = kvs_hash_file((uint64_t)st.st_dev, (uint64_t)st.st_ino) | 1; /* 0: empty */
	for (uint32_t i = 0; i < LOCKED_SLOTS; i++) {
		uint64_t e = atomic_load(&locked[(h + i) % LOCKED_SLOTS]), zero = 0;

		if (e == h)
			return;
		if (e == 0 &&
		    atomic_compare_exchange_strong(&locked[(h + i) % LOCKED_SLOTS], &zero, h))
			return;
		if (zero == h)
			return; /* another thread inserted it */
	}
	atomic_store(&locked_full, true);
}

static bool locked_maybe(uint64_t dev, uint64_t ino)
{
	if (atomic_load(&locked_full))
		return true;
	uint64_t h = kvs_hash_file(dev, ino) | 1; /* 0: empty */
	for (uint32_t i = 0; i < LOCKED_SLOTS; i++) {
		uint64_t e = atomic_load(&locked[(h + i) % LOCKED_SLOTS]);

		if (e == h)
			return true;
		if (e == 0)
			return false;
	}
	return true;
}

/* Does any descriptor of the program (not an anchor) name (dev, ino)?  On any doubt, yes. */
static bool program_holds(uint64_t dev, uint64_t ino)
{
	char buf[4096];
	bool held = false;
	int dir = kvs_sys_open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dir < 0)
		return true;
	for (;;) {
		long n = kvs_syscall(SYS_getdents64, dir, buf, sizeof(buf));

		if (n < 0)
			held = true;
		if (n <= 0)
			break;
		for (long off = 0; off < n && !held;) {
			struct {
				uint64_t ino;
				int64_t off;
				unsigned short reclen;
				unsigned char type;
				char name[];
			} *d = (void *)(buf + off);
			struct stat st;
			char *end;
			long fd = strtol(d->name, &end, 10);

			off += d->reclen;
			if (*end || end == d->name || fd == dir || is_ours((int)fd))
				continue;
			if (fstat((int)fd, &st) == 0 && (uint64_t)st.st_dev == dev &&
			    (uint64_t)st.st_ino == ino)
				held = true;
		}
		if (held)
			break;
	}
	kvs_sys_close(dir);
	return held;
}

/* ------------------------------------------------------------------ references */

/* Anchor a's count reached zero with RETIRING set (w: its flags): close it, unless GONE.
 * Once per retirement.  Closed only by whoever clears its bit in ours (the program's close
 * clears it first: kvs_anchor_numbers_closing), and only if it is still a descriptor of its
 * file (a close the hooks did not see, glibc's closefrom, may have given the number away). */
static void finish(struct tables *t, int a, uint32_t w)
{
	struct made m = t->made[a];
	uint64_t bit = 1ull << (a % 64);

	atomic_store(&t->refs[a], 0); /* a fresh start if dup hands the number out again */
	if (w & GONE)
		return; /* the program's number now */
	/* Announced before the bit is taken: a program's close of a that finds the bit gone
	 * waits for this close (kvs_anchor_numbers_closing), so ours lands first. */
	in_finish++;
	atomic_fetch_or(&closing[a / 64], bit);
	if (atomic_fetch_and(&ours[a / 64], ~bit) & bit)
		kvs_close_if_ours(a, m.dev, m.ino);
	atomic_fetch_and(&closing[a / 64], ~bit);
	in_finish--;
}

/* Retire anchor a (out of every slot) with flags (RETIRING, and GONE): closed now if no read
 * holds it, else by the last put. */
static void release(struct tables *t, int a, uint32_t flags)
{
	uint32_t w = atomic_fetch_or(&t->refs[a], flags);

	if (w == 0)
		finish(t, a, flags);
}

void kvs_anchor_put(int a)
{
	struct tables *t = tables_get(false);

	if (a < 0 || a >= FD_SLOTS || !t)
		return;
	uint32_t w = atomic_load(&t->refs[a]);
	do {
		if (!(w & COUNT))
			return; /* not held (a bug, or the fork child's fresh tables) */
	} while (!atomic_compare_exchange_weak(&t->refs[a], &w, w - 1));
	if ((w & COUNT) == 1 && (w & RETIRING))
		finish(t, a, w); /* the last read of a retired anchor */
}

void kvs_anchor_hold(int a)
{
	struct tables *t = tables_get(false);

	if (a >= 0 && a < FD_SLOTS && t)
		atomic_fetch_add(&t->refs[a], 1); /* the caller's own reference keeps it open */
}

static bool take(struct tables *t, int a)
{
	uint32_t w = atomic_load(&t->refs[a]);

	do {
		if (w & RETIRING)
			return false;
	} while (!atomic_compare_exchange_weak(&t->refs[a], &w, w + 1));
	return true;
}

/* ------------------------------------------------------------------ retirement */

/* Anchor a, out of its slot: release it, or park it while the program may hold locks on its
 * file.  Caller holds anchor_mu. */
static void retire_locked(struct tables *t, int a)
{
	struct made m = t->made[a];

	/* Still ours?  A program that closed our number may have reused it: then it is not ours
	 * to close, and no read can be using it (its reads check with fstat). */
	if (!kvs_fd_is(a, m.dev, m.ino)) {
		mark_ours(a, false);
		release(t, a, RETIRING | GONE);
		return;
	}
	if (locked_maybe(m.dev, m.ino) && program_holds(m.dev, m.ino)) {
		if (nparked < MAX_PARKED)
			parked[nparked++] = a;
		return; /* else: kept open for the life of the process */
	}
	release(t, a, RETIRING);
}

/* Retry the parked anchors.  Caller holds anchor_mu. */
static void unpark_locked(struct tables *t)
{
	int n = nparked;

	nparked = 0;
	for (int i = 0; i < n; i++)
		retire_locked(t, parked[i]);
}

void kvs_anchor_closing(int fd)
{
	struct tables *t = tables_get(false);

	if (!t || fd < 0 || fd >= FD_SLOTS ||
	    !atomic_load_explicit(&t->slot[fd], memory_order_relaxed))
		return;
	int saved = errno;
	if (lock_anchors()) {
		int a = atomic_exchange(&t->slot[fd], 0) - 1;

		if (a >= 0 && is_ours(a))
			retire_locked(t, a);
		unlock_anchors();
	}
	/* Not taken (a signal handler that interrupted this thread inside this file): the anchor
	 * stays in its slot and is retired when the number names another file. */
	errno = saved;
}

/* A number the program closes: GONE, so that no retirement or last put closes it. */
static void gone(unsigned int a, void *arg)
{
	struct tables *t = arg;

	atomic_fetch_or(&t->refs[a], GONE);
}

void kvs_anchor_numbers_closing(unsigned int lo, unsigned int hi)
{
	struct tables *t = tables_get(false);

	if (!t)
		return;
	kvs_bitmap_take_range(ours, FD_SLOTS, lo, hi, gone, t);
	if (!in_finish) /* not a handler that interrupted a finish on this thread */
		kvs_bitmap_wait_clear(closing, FD_SLOTS, lo, hi, KVS_OWNFD_WAIT_NS);
}

bool kvs_anchor_numbers_in(unsigned int lo, unsigned int hi)
{
	return kvs_bitmap_any(ours, FD_SLOTS, lo, hi) || kvs_bitmap_any(closing, FD_SLOTS, lo, hi);
}

/* ------------------------------------------------------------------ readers */

/* Does anchor a serve fi?  a itself when it names fi's file with fi's identity; -ESTALE when
 * it names fi's file but the file changed since fi was taken (a write landed between the two
 * looks: pass through); -ENOENT when another anchor is needed.  A rewritten file keeps its
 * anchor: an anchor is a descriptor of an inode, whatever its times. */
static int fits(int a, const struct kvs_fdinfo *fi)
{
	struct kvs_ident id;
	struct kvs_key k;

	if (kvs_ident_of_fd(a, fi->write_once, &id) < 0 || id.dev != fi->dev || id.ino != fi->ino)
		return -ENOENT;
	kvs_ident_key(&id, &k);
	return k.block_lo == fi->block.block_lo && k.block_hi == fi->block.block_hi ? a : -ESTALE;
}

/* The anchor in slot[fd], referenced, if it serves fi; else -ENOENT or -ESTALE, nothing held. */
static int get_slot(struct tables *t, int fd, const struct kvs_fdinfo *fi)
{
	int a = atomic_load_explicit(&t->slot[fd], memory_order_acquire) - 1; /* pairs below */

	if (a < 0 || a >= FD_SLOTS || !is_ours(a) || !take(t, a))
		return -ENOENT;
	int r = atomic_load_explicit(&t->slot[fd], memory_order_acquire) - 1 == a ? fits(a, fi)
										  : -ENOENT;
	if (r < 0)
		kvs_anchor_put(a);
	return r;
}

int kvs_anchor_get(int fd, const struct kvs_fdinfo *fi)
{
	struct tables *t = tables_get(true);
	struct stat st;
	int d, r, saved = errno;

	if (!t || fd < 0 || fd >= FD_SLOTS)
		return -EBADF;
	r = get_slot(t, fd, fi);
	if (r != -ENOENT)
		goto out;
	if (!lock_anchors()) {
		r = -EBUSY; /* a signal handler that interrupted this thread inside this file */
		goto out;
	}
	r = get_slot(t, fd, fi); /* another thread may have installed one meanwhile */
	if (r != -ENOENT)
		goto out_unlock;
	d = kvs_fd_dup_high(fd); /* a dup2 onto a small number never closes it */
	if (d < 0 || d >= FD_SLOTS) {
		r = -EMFILE;
		if (d >= 0)
			kvs_sys_close(d); /* beyond our tables: never an anchor */
		goto out_unlock;
	}
	if (fstat(d, &st) < 0) {
		r = -errno;
		kvs_sys_close(d); /* a descriptor of nothing we can name: no lock to keep */
		goto out_unlock;
	}
	/* d may be a parked anchor's old number, which the program closed and the kernel gave out
	 * again: it names this new anchor now, not that one. */
	for (int i = 0; i < nparked; i++)
		if (parked[i] == d)
			parked[i--] = parked[--nparked];
	t->made[d] = (struct made){(uint64_t)st.st_dev, (uint64_t)st.st_ino};
	atomic_store(&t->refs[d], 0);
	mark_ours(d, true);
	if ((uint64_t)st.st_dev != fi->dev || (uint64_t)st.st_ino != fi->ino) {
		/* fd names another file than a moment ago: retire d by the rules, never a bare
		 * close (it may be the program's only other descriptor of that file's locks). */
		retire_locked(t, d);
		r = -ESTALE;
		goto out_unlock;
	}
	take(t, d); /* the caller's reference, before any other thread can see d */
	int old = atomic_exchange_explicit(&t->slot[fd], d + 1, memory_order_acq_rel) - 1;
	if (old >= 0 && is_ours(old))
		retire_locked(t, old);
	unpark_locked(t);
	r = fits(d, fi); /* a write landed between the looks: -ESTALE, next time */
	if (r < 0)
		kvs_anchor_put(d);
out_unlock:
	unlock_anchors();
out:
	errno = saved;
	return r;
}

void kvs_anchor_atfork_child(void)
{
	struct tables *t = tables_get(false);

	/* The child runs one thread; a parent thread may have held anchor_mu. */
	pthread_mutex_init(&anchor_mu, NULL);
	in_mu = 0;
	nparked = 0;
	/* Close every anchor the child still holds (it holds no record locks yet: nothing to
	 * lose), and nothing else: a number the program closed and reused since is its own (its
	 * file is another, or it lacks our FD_CLOEXEC). */
	for (int w = 0; w < FD_SLOTS / 64; w++) {
		uint64_t bits = atomic_exchange(&ours[w], 0);

		for (int b = 0; bits; b++, bits >>= 1) {
			int fd = w * 64 + b;

			if ((bits & 1) && t)
				kvs_close_if_ours(fd, t->made[fd].dev, t->made[fd].ino);
		}
	}
	/* Forget the slots and counts (written only where set: the child's pages stay shared). */
	for (int fd = 0; t && fd < FD_SLOTS; fd++) {
		if (atomic_load_explicit(&t->slot[fd], memory_order_relaxed))
			atomic_store(&t->slot[fd], 0);
		if (atomic_load_explicit(&t->refs[fd], memory_order_relaxed))
			atomic_store(&t->refs[fd], 0);
	}
}
