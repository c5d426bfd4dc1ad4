/*
 * atime: see atime.h.
 *
 * DESIGN.  A queue of KVS_ATIME_JOBS entries, each a state word: FREE, then FILLING (claimed
 * by CAS by a reader thread, which holds its anchor and fills the entry), READY (release store),
 * TAKEN (CAS by the worker, which takes the anchor out of the entry), FREE again once the
 * worker has put its reference.  The worker is started at the attach (kvs_atime_start), never on
 * the read path, which may run in a signal handler.  The worker sleeps on a futex word every note
 * moves.  No lock anywhere: a note may come from a signal handler that interrupted a served read.
 * A full queue drops the note (the next hit notes again, a day later at the most).  recent[]
 * remembers, racily, which files were noted in the last day (a tag and a time per entry): a lost or
 * torn entry only lets a file be read twice.
 *
 * The worker takes a job (under relatime) KVS_ATIME_DELAY_NS after its note and checks the file
 * again before it reads (statx: still due?), so a file whose atime a storage read moved meanwhile
 * (the load that went with a cold pass's note) costs no read.  Its read is the first block of the
 * file through the dup (the same open file as the anchor, O_DIRECT or not), into a buffer aligned
 * for O_DIRECT; the bytes are dropped.  A file keyed by birth (a write-once root) whose owner
 * we are gets futimens(atime a second ahead, mtime as it is) instead: it moves ctime, which is
 * no part of that file's id, and reads nothing from storage; the atime past the new ctime keeps
 * it from being due again (relatime) until a day has passed.
 *
 * A job holds a reference on the reader's anchor (kvs_anchor_hold), not a descriptor of its
 * own: closing any descriptor of a file drops the process's POSIX record locks on it, and an
 * anchor is closed only as anchor.h allows (parked while the program may hold locks).  The
 * worker reads through the anchor, then puts its reference.  A program that closes every
 * descriptor with raw calls (a daemon's close loop, close_range) may be given the anchor's
 * number meanwhile: the worker acts on it only while it is still the file the job noted.  A
 * fork child forgets the queue (its anchors are anchor.c's to close).  At exit the jobs still
 * queued run on the exiting thread (atime_at_exit).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "anchor.h"
#include "atime.h"
#include "cache.h"
#include "sys.h"

#define KVS_ATIME_JOBS	   16
#define KVS_ATIME_RECENT   1024
#define KVS_ATIME_BUF	   65536 /* the most one read takes: O_DIRECT alignments are smaller */
#define DAY_S		   86400
#define KVS_ATIME_DELAY_NS 2000000000ull /* a job waits this long after its note */

enum { J_FREE, J_FILLING, J_READY, J_TAKEN };

struct job {
	_Atomic uint32_t state;
	int fd;
	int rule;	 /* the mount's atime rule (fdinfo.h) */
	bool write_once; /* keyed by birth: ctime is no part of its id */
	uint32_t len;
	uint64_t noted_ns; /* when it was noted (monotonic): the worker waits KVS_ATIME_DELAY_NS */
	uint64_t dev, ino; /* the file the job noted: fd (an anchor) is acted on while it is this */
	struct kvs_cache *c;
};

static struct job jobs[KVS_ATIME_JOBS];
static _Atomic uint64_t recent[KVS_ATIME_RECENT]; /* tag << 32 | monotonic seconds */
static _Atomic uint32_t wake;
static _Atomic int started; /* 0 no thread, 1 starting or running, 2 failed */
static pthread_t worker;

static uint64_t now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec;
}

/* Was the file noted within window seconds (racily: see DESIGN)? */
static bool noted_within(uint64_t dev, uint64_t ino, uint32_t window)
{
	uint64_t tag = kvs_hash_file(dev, ino) >> 32, t = now_s() & 0xffffffffu;
	uint64_t w = atomic_load_explicit(&recent[kvs_hash_file(dev, ino) % KVS_ATIME_RECENT],
					  memory_order_relaxed);

	return (w >> 32) == tag && ((t - w) & 0xffffffffu) < window;
}

/* The file's read is queued: note when. */
static void note_now(uint64_t dev, uint64_t ino)
{
	uint64_t tag = kvs_hash_file(dev, ino) >> 32, t = now_s() & 0xffffffffu;

	atomic_store_explicit(&recent[kvs_hash_file(dev, ino) % KVS_ATIME_RECENT], tag << 32 | t,
			      memory_order_relaxed);
}

/* One job: read the first block of its file through fd if its atime is still due. */
static void run(struct job *j, int fd)
{
	static char buf[KVS_ATIME_BUF] __attribute__((aligned(4096)));
	struct kvs_ident id;
	struct timespec times[2] = {{0, 0}, {0, UTIME_OMIT}};

	/* A file keyed by birth may have its atime set (which moves ctime, no part of its id):
	 * no storage read at all.  Set a second ahead of now, past the ctime the call itself
	 * gives the file: atime at or below ctime is due again under relatime (the kernel's rule
	 * and kvs_fdinfo_atime_due), and the next hit would set it again.  Anyone else's, or
	 * where that is not allowed (not the owner), gets the read. */
	clock_gettime(CLOCK_REALTIME, &times[0]);
	times[0].tv_sec += 1;

	/* A program that closes every descriptor with raw calls (close_range, syscall) may have
	 * been given our number again: act on it, and close it, only while it is our file. */
	if (kvs_ident_of_fd(fd, false, &id) == 0 && id.dev == j->dev && id.ino == j->ino &&
	    id.size && kvs_fdinfo_atime_due(j->rule, &id) &&
	    ((j->write_once && kvs_syscall(SYS_utimensat, fd, NULL, times, 0) == 0) ||
	     kvs_sys_pread(fd, buf, j->len, 0) > 0))
		kvs_cache_count(j->c, KVS_CTR_atime_updates, 1);
	kvs_anchor_put(fd);
}

/* Take job i if it is READY and, unless all, old enough (relatime's delay; *wait_ns: the least
 * a young job still waits), and run it.  True when it ran. */
static bool take_run(int i, uint64_t now, uint64_t *wait_ns, bool all)
{
	uint32_t ready = J_READY;

	/* Pairs with the release store of J_READY in kvs_atime_note. */
	if (atomic_load_explicit(&jobs[i].state, memory_order_acquire) != J_READY)
		return false;
	/* A young job waits (relatime: once a day, a moment late costs nothing): the read that
	 * noted it may be a load from storage, which moves the atime itself, a moment later (a
	 * cold pass).  strictatime's second is kept. */
	uint64_t age = now - jobs[i].noted_ns;
	if (!all && jobs[i].rule == KVS_ATIME_RELATIME && age < KVS_ATIME_DELAY_NS) {
		if (!*wait_ns || KVS_ATIME_DELAY_NS - age < *wait_ns)
			*wait_ns = KVS_ATIME_DELAY_NS - age;
		return false;
	}
	if (!atomic_compare_exchange_strong(&jobs[i].state, &ready, J_TAKEN))
		return false;
	/* The descriptor is the taker's from here on: a fork child that finds the job TAKEN must
	 * not close a number the worker may have closed and the program been given again. */
	int fd = jobs[i].fd;
	jobs[i].fd = -1;
	run(&jobs[i], fd);
	atomic_store_explicit(&jobs[i].state, J_FREE, memory_order_release);
	return true;
}

static void *worker_main(void *arg)
{
	(void)arg;
	for (;;) {
		uint32_t seen = atomic_load_explicit(&wake, memory_order_acquire);
		uint64_t now = kvs_mono_ns(), wait_ns = 0;
		bool any = false;

		for (int i = 0; i < KVS_ATIME_JOBS; i++)
			any |= take_run(i, now, &wait_ns, false);
		if (!any)
			kvs_futex_wait(&wake, seen, wait_ns, false);
	}
	return NULL;
}

/* At exit, the jobs still queued run on the exiting thread, young ones too: the process's
 * reads kept the cache's bytes, and the atime they would have moved is moved before it is
 * gone (a short-lived reader under strictatime otherwise left its hits unseen when it exited
 * before the worker ran).  Each still checks that the atime is due.  Not at _exit or a kill. */
__attribute__((destructor)) static void atime_at_exit(void)
{
	uint64_t wait_ns = 0;

	if (atomic_load_explicit(&started, memory_order_acquire) != 1)
		return;
	for (int i = 0; i < KVS_ATIME_JOBS; i++)
		take_run(i, kvs_mono_ns(), &wait_ns, true);
}

int kvs_atime_start(void)
{
	int not_yet = 0;

	if (!atomic_compare_exchange_strong(&started, &not_yet, 1))
		return atomic_load(&started) == 1 ? 0 : -EAGAIN;
	int r = kvs_thread_start(&worker, worker_main, NULL, KVS_STACK_OWN);
	atomic_store(&started, r ? 2 : 1);
	return r;
}

void kvs_atime_note(struct kvs_cache *c, int anchor, const struct kvs_fdinfo *fi)
{
	if (!fi->atime_due || anchor < 0 ||
	    atomic_load_explicit(&started, memory_order_acquire) != 1 ||
	    noted_within(fi->dev, fi->ino, fi->atime_rule == KVS_ATIME_STRICT ? 1 : DAY_S))
		return;
	int saved = errno;
	for (int i = 0; i < KVS_ATIME_JOBS; i++) {
		struct job *j = &jobs[i];
		uint32_t free_ = J_FREE;

		if (!atomic_compare_exchange_strong(&j->state, &free_, J_FILLING))
			continue;
		kvs_anchor_hold(anchor); /* the worker puts it */
		j->fd = anchor;
		uint32_t len = fi->dio_off_align > 4096 ? fi->dio_off_align : 4096;
		j->len = len < KVS_ATIME_BUF ? len : KVS_ATIME_BUF;
		j->c = c;
		j->dev = fi->dev;
		j->ino = fi->ino;
		j->rule = fi->atime_rule;
		j->write_once = fi->write_once;
		j->noted_ns = kvs_mono_ns();
		atomic_store_explicit(&j->state, J_READY,
				      memory_order_release); /* pairs in worker */
		note_now(fi->dev, fi->ino); /* queued: a full queue leaves it for the next hit */
		atomic_fetch_add_explicit(&wake, 1, memory_order_release);
		kvs_futex_wake(&wake, 1, false);
		break;
	}
	errno = saved;
}

void kvs_atime_atfork_child(void)
{
	/* A queued or taken job holds a reference on an anchor of the parent's tables, which the
	 * child closes and forgets (kvs_anchor_atfork_child): only the queue is forgotten here. */
	for (int i = 0; i < KVS_ATIME_JOBS; i++)
		atomic_store_explicit(&jobs[i].state, J_FREE, memory_order_relaxed);
	atomic_store(&started, 0);
}
