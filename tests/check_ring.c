/*
 * check_ring: the request ring between a node's engines and its helper (remote/ring.c), across
 * real processes.  Each case forks its helper (kvs_ring_lock, kvs_ring_create, then take, done
 * and beat on the parent's word) and, where the case says, its engines (kvs_ring_map, get,
 * wait, release, put); the parent is an engine too.  Processes are SIGKILLed and SIGSTOPped as
 * in the crash table of ring.c's essay, and what each state allows is seen through the ring's
 * own functions: an entry is free when a get can claim it (count_free).
 *
 * An entry's owner.  Most cases name it by the engine's pid and let the helper's beat judge it
 * with kill(pid, 0) (still_pid): liveness by process, as the contract says, without a region.
 * test_other_namespace_engine judges it as production does: the engine attaches to a real
 * region from a PID namespace of its own and posts as kvs_cache_whoami names it; the helper,
 * attached to the same region, beats with kvs_cache_still (the slot's liveness lock).
 *
 * Each case's ring lives in a private temporary folder, mode 0600, under one removed at the
 * end whatever failed.  Children report their first failure through an anonymous shared
 * mapping and _exit; none calls Check.
 */
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache_params.h"
#include "ring.h"
#include "sys.h"

#define NENT	   16u
#define SHARD	   4096u
#define MODE	   0600u
#define MS	   1000000ull
#define SLACK	   (300 * MS) /* how late past its deadline a wait may end on a busy machine */
#define PER_THREAD 320	      /* gets of each engine thread in test_many_engines */

/* The helper's commands (struct shared.cmd). */
enum { H_TAKE = 1, H_PEEK, H_FILL, H_DONE, H_BEAT, H_BEATS, H_LEAVE, H_SERVE, H_HOLD };

struct shared {
	_Atomic int seq, ack; /* the parent's last command, the helper's last answered */
	int cmd, ret;
	int64_t a, b;
	struct kvs_ring_job jobs[NENT]; /* what H_TAKE took (staging: the helper's address) */
	_Atomic int ready; /* 1: the helper's ring is built; < 0: -errno; -1000: no new PID ns */
	int lock_ret;
	_Atomic int stop;     /* H_SERVE: finish */
	_Atomic int stage;    /* an engine's progress */
	_Atomic long gets[8]; /* per engine thread: HITs checked */
	_Atomic int failed;
	char why[256]; /* a child's first failure */
	/* test_other_namespace_engine's engines.  stage: 1, its get posted; 2, its HIT held;
	 * 3, the staging checked and another get posted. */
	struct nseng {
		_Atomic int stage;
		_Atomic int go;	     /* the parent's: check the staging and post another */
		_Atomic int refused; /* no PID namespace for it */
		_Atomic pid_t pid;   /* the engine, in the parent's namespace */
		int ns_pid;	     /* the engine's own getpid(), in its namespace */
		uint32_t slot;	     /* kvs_cache_whoami's */
		uint64_t at;
	} ne[2];
};

static char top[64], dir[96], path[128];
static struct shared *sh;

/* The region of test_other_namespace_engine (its helper's and its engines'). */
static struct kvs_config cfg;
static struct kvs_cache_params rp;
static char rname[64];

/* This process as an entry's owner where there is no region: its pid, judged by still_pid. */
static _Thread_local struct kvs_ring_owner own;

static const struct kvs_ring_owner *me(void)
{
	own = (struct kvs_ring_owner){.slot = (uint32_t)getpid(), .at = 0};
	return &own;
}

/* The beat's question without a region: does the owner's pid name a process?  A reaped
 * engine's does not (no case runs long enough for its pid to be reused). */
static bool still_pid(void *arg, const struct kvs_ring_owner *o)
{
	(void)arg;
	return kill((pid_t)o->slot, 0) == 0 || errno != ESRCH;
}

/* The beat's question in production (remote/helper.c): the region's liveness lock. */
static bool still_cache(void *arg, const struct kvs_ring_owner *o)
{
	return kvs_cache_still(arg, o->slot, o->at);
}

static void setup(void)
{
	snprintf(dir, sizeof(dir), "%s/XXXXXX", top);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/region.remote", dir);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(sh, MAP_FAILED);
}

static int remove_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	return remove(p);
}

static _Noreturn void child_fail(int line, const char *what)
{
	if (!atomic_exchange(&sh->failed, 1))
		snprintf(sh->why, sizeof(sh->why), "child %d, line %d: %s", (int)getpid(), line,
			 what);
	_exit(3);
}
#define CHILD_CHECK(c)                                                                             \
	do {                                                                                       \
		if (!(c))                                                                          \
			child_fail(__LINE__, #c);                                                  \
	} while (0)

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};

	nanosleep(&ts, NULL);
}

/* The bytes a helper answers for seed: byte j of every answer is pat(seed, j). */
static uint8_t pat(uint64_t seed, size_t j)
{
	uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull + j;

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	return (uint8_t)(x >> 56);
}

static void fill(void *p, size_t n, uint64_t seed)
{
	for (size_t j = 0; j < n; j++)
		((uint8_t *)p)[j] = pat(seed, j);
}

/* The first byte of p that is not seed's, or n. */
static size_t first_bad(const void *p, size_t n, uint64_t seed)
{
	for (size_t j = 0; j < n; j++)
		if (((const uint8_t *)p)[j] != pat(seed, j))
			return j;
	return n;
}

/* The seed a key names (FNV-1a): a helper that serves keys answers this pattern. */
static uint64_t key_seed(const char *k)
{
	uint64_t h = 0xcbf29ce484222325ull;

	while (*k)
		h = (h ^ (uint8_t)*k++) * 0x100000001b3ull;
	return h;
}

/* ------------------------------------------------------------------ the helper */

static struct kvs_ring *hr;
static struct kvs_cache *hc; /* the helper's region, where the case has one */

static int beat(void)
{
	return hc ? kvs_ring_beat(hr, still_cache, hc) : kvs_ring_beat(hr, still_pid, NULL);
}

/* Answer every get until told to stop (and nothing is left), beating as a helper does. */
static int serve(struct kvs_ring_job *jobs)
{
	uint64_t last = 0;
	int served = 0;

	for (;;) {
		int stop = atomic_load(&sh->stop);
		int got = kvs_ring_take(hr, KVS_RING_GET, jobs, NENT, 20 * MS);

		for (int i = 0; i < got; i++) {
			fill(jobs[i].staging, jobs[i].len, key_seed(jobs[i].rkey));
			kvs_ring_done(hr, jobs[i].entry, jobs[i].len);
		}
		served += got;
		if (kvs_mono_ns() - last >= KVS_RING_BEAT_NS) {
			beat();
			last = kvs_mono_ns();
		}
		if (stop && !got)
			return served;
	}
}

/* The helper: with region, attached to rp's region first (created there), as kvshim remote
 * is, and its beat asks kvs_cache_still. */
static _Noreturn void helper_main(bool region)
{
	struct kvs_ring_job jobs[NENT];
	bool beating = false;
	uint64_t last = 0;
	void *base;
	size_t n;
	char msg[200] = "";
	int lk = kvs_ring_lock(path, MODE), e, seen = atomic_load(&sh->seq);

	sh->lock_ret = lk < 0 ? lk : 0;
	e = lk;
	if (e >= 0 && region)
		e = kvs_cache_open(&rp, KVS_OPEN_CREATE, &hc, msg, sizeof(msg));
	if (e >= 0)
		e = kvs_ring_create(path, NENT, SHARD, MODE, &hr, msg, sizeof(msg));
	if (e) {
		snprintf(sh->why, sizeof(sh->why), "helper: %s %s", strerror(-e), msg);
		atomic_store(&sh->ready, e);
		_exit(0);
	}
	atomic_store(&sh->ready, 1);
	for (;;) {
		if (atomic_load(&sh->seq) == seen) { /* PR_SET_PDEATHSIG ends it with the case */
			if (beating && kvs_mono_ns() - last >= KVS_RING_BEAT_NS) {
				beat();
				last = kvs_mono_ns();
			}
			sleep_ns(100000);
			continue;
		}
		seen = atomic_load(&sh->seq);
		int ret = 0, got = 0;
		uint64_t end = kvs_mono_ns() + (sh->cmd == H_TAKE ? 2000 : 100) * MS;
		switch (sh->cmd) {
		case H_TAKE: /* take b entries of op a, waiting up to 2 s */
		case H_PEEK: /* take what is there of op a within 100 ms */
			for (uint64_t now; got < sh->b && (now = kvs_mono_ns()) < end;)
				got += kvs_ring_take(hr, (unsigned)sh->a, jobs + got,
						     (int)sh->b - got, end - now);
			for (int i = 0; i < got; i++)
				sh->jobs[i] = jobs[i];
			ret = got;
			break;
		case H_FILL: /* staging of entry a: seed b's bytes (the helper's transfer) */
			kvs_ring_staging(hr, &base, &n);
			fill((char *)base + sh->a * SHARD, SHARD, (uint64_t)sh->b);
			break;
		case H_DONE:
			kvs_ring_done(hr, (uint32_t)sh->a, sh->b);
			break;
		case H_BEAT:
			ret = beat();
			break;
		case H_BEATS: /* beat every KVS_RING_BEAT_NS while idle, as a helper's thread */
			beating = true;
			break;
		case H_LEAVE:
			beating = false;
			kvs_ring_leave(hr);
			break;
		case H_SERVE:
			ret = serve(jobs);
			break;
		case H_HOLD: /* a failed get's buffer is out of use a ms */
			kvs_ring_set_hold(hr, (uint64_t)sh->a * MS);
			break;
		}
		sh->ret = ret;
		atomic_store(&sh->ack, seen);
	}
}

/* Fork a helper (attached to rp's region with region) and wait until its ring is built.
 * Returns its pid. */
static pid_t spawn_helper(bool region)
{
	atomic_store(&sh->ready, 0);
	pid_t p = fork();

	ck_assert_int_ge(p, 0);
	if (p == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		helper_main(region);
	}
	for (int i = 0; i < 10000 && !atomic_load(&sh->ready); i++)
		sleep_ns(MS);
	int r = atomic_load(&sh->ready);
	ck_assert_msg(r == 1, "the helper did not build its ring (%d): %s", r, sh->why);
	return p;
}

static int hpost(int cmd, int64_t a, int64_t b)
{
	sh->cmd = cmd;
	sh->a = a;
	sh->b = b;
	return atomic_fetch_add(&sh->seq, 1) + 1;
}

static int hwait(int seq)
{
	for (int i = 0; i < 200000 && atomic_load(&sh->ack) != seq; i++)
		sleep_ns(100000);
	ck_assert_msg(atomic_load(&sh->ack) == seq, "the helper did not answer command %d",
		      sh->cmd);
	return sh->ret;
}

static int hcall(int cmd, int64_t a, int64_t b)
{
	return hwait(hpost(cmd, a, b));
}

/* Wait for p up to secs seconds (then SIGKILL it); its wait status. */
static int reap(pid_t p, int secs)
{
	int st = -1;

	for (int i = 0; i < secs * 1000; i++) {
		if (waitpid(p, &st, WNOHANG) == p)
			return st;
		sleep_ns(MS);
	}
	kill(p, SIGKILL);
	waitpid(p, &st, 0);
	return -1;
}

static void end_helper(pid_t h)
{
	kill(h, SIGKILL);
	reap(h, 10);
}

/* ------------------------------------------------------------------ the engines */

static struct kvs_ring *map_ok(void)
{
	struct kvs_ring *r = NULL;
	int e = kvs_ring_map(path, SHARD, MODE, &r);

	ck_assert_msg(e == 0, "kvs_ring_map: %s", strerror(-e));
	ck_assert_uint_eq(kvs_ring_entries(r), NENT);
	return r;
}

/* How many entries a get can claim now (each claimed one is given back at once: a wait past
 * its deadline frees a POSTED entry).  Only while no helper takes gets. */
static uint32_t count_free(struct kvs_ring *r)
{
	struct kvs_ring_ticket t[NENT + 1];
	const void *s;
	uint32_t n = 0;

	while (n <= NENT && kvs_ring_get(r, me(), "count", 1, &t[n]) == 0)
		n++;
	for (uint32_t i = 0; i < n; i++)
		ck_assert_int_eq(kvs_ring_wait(r, &t[i], 0, &s), KVS_RING_TIMEOUT);
	return n;
}

static void get_ok(struct kvs_ring *r, const char *key, uint32_t len, struct kvs_ring_ticket *t)
{
	int e = kvs_ring_get(r, me(), key, len, t);

	ck_assert_msg(e == 0, "kvs_ring_get(%s): %s", key, strerror(-e));
}

/* A get posted under another owner than this process. */
static void get_ok_as(struct kvs_ring *r, const struct kvs_ring_owner *o, const char *key,
		      struct kvs_ring_ticket *t)
{
	int e = kvs_ring_get(r, o, key, 100, t);

	ck_assert_msg(e == 0, "kvs_ring_get(%s): %s", key, strerror(-e));
}

/* Take the one get posted (it must be t's), answer seed's bytes with result, and wait. */
static int answer(struct kvs_ring *r, struct kvs_ring_ticket *t, uint64_t seed, int64_t result,
		  const void **s)
{
	ck_assert_int_eq(hcall(H_TAKE, KVS_RING_GET, 1), 1);
	ck_assert_uint_eq(sh->jobs[0].entry, t->entry);
	hcall(H_FILL, t->entry, (int64_t)seed);
	hcall(H_DONE, t->entry, result);
	return kvs_ring_wait(r, t, kvs_mono_ns() + 5000 * MS, s);
}

/* 1: a get answered with its bytes, a miss, an error and wrong lengths. */
START_TEST(test_get_answered)
{
	pid_t h = spawn_helper(false);
	struct kvs_ring *r = map_ok();
	struct kvs_ring_ticket t;
	const void *s = NULL;

	/* The helper sleeps on the bell when the get comes, the engine in its wait when the
	 * answer does: each is woken at once. */
	int taking = hpost(H_TAKE, KVS_RING_GET, 1);
	sleep_ns(50 * MS);
	uint64_t t0 = kvs_mono_ns();
	get_ok(r, "k.hit", 1000, &t);
	ck_assert_int_eq(hwait(taking), 1);
	ck_assert_uint_lt(kvs_mono_ns() - t0, SLACK);
	ck_assert_uint_eq(sh->jobs[0].op, KVS_RING_GET);
	ck_assert_uint_eq(sh->jobs[0].len, 1000);
	ck_assert_str_eq(sh->jobs[0].rkey, "k.hit");
	ck_assert_uint_eq(count_free(r), NENT - 1); /* BUSY */
	hcall(H_FILL, t.entry, 7);
	int done = hpost(H_DONE, t.entry, 1000);
	t0 = kvs_mono_ns();
	ck_assert_int_eq(kvs_ring_wait(r, &t, t0 + 5000 * MS, &s), KVS_RING_HIT);
	ck_assert_uint_lt(kvs_mono_ns() - t0, SLACK);
	hwait(done);
	ck_assert_uint_eq(first_bad(s, 1000, 7), 1000);
	ck_assert_uint_eq(count_free(r), NENT - 1); /* DONE: staging is the engine's */
	kvs_ring_release(r, &t);
	ck_assert_uint_eq(count_free(r), NENT);

	/* A miss gives the entry back at once; an error or a wrong length leaves it ABANDONED (a
	 * failed transfer might still write its buffer), freed by a beat after the helper's hold
	 * (0 here: kvs_ring_set_hold is not called). */
	const int64_t other[] = {-ENOENT, -EIO, 999, 1001, 0}; /* a miss, errors, wrong lengths */
	for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
		get_ok(r, "k.other", 1000, &t);
		ck_assert_int_eq(answer(r, &t, 8, other[i], &s),
				 i ? KVS_RING_ERROR : KVS_RING_MISS);
		ck_assert_uint_eq(count_free(r), i ? NENT - 1 : NENT);
		if (i)
			ck_assert_int_eq(hcall(H_BEAT, 0, 0), 1);
		ck_assert_uint_eq(count_free(r), NENT);
	}
	/* -ECANCELED (refused before any transfer started): an error, but free at once. */
	get_ok(r, "k.refused", 1000, &t);
	ck_assert_int_eq(answer(r, &t, 8, -ECANCELED, &s), KVS_RING_ERROR);
	ck_assert_uint_eq(count_free(r), NENT);
	/* With a hold, the failed get's buffer stays out of use until it passes. */
	hcall(H_HOLD, 300, 0);
	get_ok(r, "k.held", 1000, &t);
	ck_assert_int_eq(answer(r, &t, 8, -EIO, &s), KVS_RING_ERROR);
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 0);
	ck_assert_uint_eq(count_free(r), NENT - 1);
	sleep_ns(350 * MS);
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 1);
	ck_assert_uint_eq(count_free(r), NENT);
	end_helper(h);
}
END_TEST

/* 2: nobody takes the get: TIMEOUT at the deadline, and the entry is FREE. */
START_TEST(test_deadline_untaken)
{
	pid_t h = spawn_helper(false);
	struct kvs_ring *r = map_ok();
	struct kvs_ring_ticket t;
	const void *s;

	get_ok(r, "k.nobody", 100, &t);
	uint64_t t0 = kvs_mono_ns();
	ck_assert_int_eq(kvs_ring_wait(r, &t, t0 + 100 * MS, &s), KVS_RING_TIMEOUT);
	uint64_t el = kvs_mono_ns() - t0;
	ck_assert_msg(el >= 100 * MS && el < 100 * MS + SLACK, "waited %llu ms",
		      (unsigned long long)(el / MS));
	ck_assert_uint_eq(count_free(r), NENT);
	ck_assert_int_eq(hcall(H_PEEK, KVS_RING_GET, 1), 0); /* nothing left posted */
	end_helper(h);
}
END_TEST

/* 3: the helper answers after the engine gave up: the entry is free only then, and the next
 * get on it does not see that answer. */
START_TEST(test_late_answer)
{
	pid_t h = spawn_helper(false);
	struct kvs_ring *r = map_ok();
	struct kvs_ring_ticket t, t2;
	const void *s;

	get_ok(r, "k.late", 500, &t);
	ck_assert_int_eq(hcall(H_TAKE, KVS_RING_GET, 1), 1); /* BUSY */
	uint64_t t0 = kvs_mono_ns();
	ck_assert_int_eq(kvs_ring_wait(r, &t, t0 + 100 * MS, &s), KVS_RING_TIMEOUT);
	ck_assert_uint_lt(kvs_mono_ns() - t0, 100 * MS + SLACK);
	ck_assert_uint_eq(count_free(r), NENT - 1); /* ABANDONED: the helper's still */
	hcall(H_FILL, t.entry, 1);		    /* the late transfer lands in staging */
	ck_assert_uint_eq(count_free(r), NENT - 1);
	hcall(H_DONE, t.entry, 500);
	ck_assert_uint_eq(count_free(r), NENT);

	/* The same thread claims the same entry first: its new get is not answered by the old. */
	get_ok(r, "k.next", 500, &t2);
	ck_assert_uint_eq(t2.entry, t.entry);
	ck_assert_int_eq(kvs_ring_wait(r, &t2, kvs_mono_ns() + 50 * MS, &s), KVS_RING_TIMEOUT);
	get_ok(r, "k.next", 500, &t2);
	ck_assert_uint_eq(t2.entry, t.entry);
	ck_assert_int_eq(answer(r, &t2, 2, 500, &s), KVS_RING_HIT);
	ck_assert_uint_eq(first_bad(s, 500, 2), 500);
	kvs_ring_release(r, &t2);
	ck_assert_uint_eq(count_free(r), NENT);
	end_helper(h);
}
END_TEST

static void *post_and_exit(void *arg)
{
	struct kvs_ring_ticket t;

	CHILD_CHECK(kvs_ring_get(arg, me(), "k.thread", 10, &t) == 0);
	return NULL;
}

/* 4: liveness is by process (ring.c, "Crashes"): the entry of an engine thread that is gone
 * stays while its process lives; a SIGKILLed engine's entries come back by beats. */
START_TEST(test_engine_killed)
{
	pid_t h = spawn_helper(false);
	struct kvs_ring *r = map_ok();
	int freed = 0;

	pid_t e = fork();
	ck_assert_int_ge(e, 0);
	if (e == 0) {
		struct kvs_ring *er;
		struct kvs_ring_ticket t;
		const void *s;
		pthread_t th;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		CHILD_CHECK(kvs_ring_map(path, SHARD, MODE, &er) == 0);
		CHILD_CHECK(kvs_ring_get(er, me(), "k.a", 100, &t) == 0);
		atomic_store(&sh->stage, 1);
		CHILD_CHECK(kvs_ring_wait(er, &t, kvs_mono_ns() + 5000 * MS, &s) == KVS_RING_HIT);
		CHILD_CHECK(first_bad(s, 100, 3) == 100); /* kept: DONE */
		CHILD_CHECK(pthread_create(&th, NULL, post_and_exit, er) == 0);
		CHILD_CHECK(pthread_join(th, NULL) == 0);
		CHILD_CHECK(kvs_ring_get(er, me(), "k.b", 100, &t) == 0);
		CHILD_CHECK(kvs_ring_get(er, me(), "k.c", 100, &t) == 0);
		atomic_store(&sh->stage, 2);
		for (;;)
			pause();
	}
	for (int i = 0; i < 5000 && atomic_load(&sh->stage) < 1; i++)
		sleep_ns(MS);
	ck_assert_int_eq(hcall(H_TAKE, KVS_RING_GET, 1), 1);
	hcall(H_FILL, sh->jobs[0].entry, 3);
	hcall(H_DONE, sh->jobs[0].entry, 100);
	for (int i = 0; i < 5000 && atomic_load(&sh->stage) < 2 && !sh->failed; i++)
		sleep_ns(MS);
	ck_assert_msg(atomic_load(&sh->stage) == 2, "the engine: %s", sh->why);

	/* The thread that posted k.thread is gone (joined), its process is not: beats keep its
	 * entry, as they keep k.a (DONE), k.b and k.c (POSTED). */
	for (int i = 0; i < 10; i++, sleep_ns(10 * MS))
		freed += hcall(H_BEAT, 0, 0);
	ck_assert_msg(freed == 0, "beats freed %d entries of a live engine process", freed);
	ck_assert_uint_eq(count_free(r), NENT - 4);
	ck_assert_int_eq(hcall(H_TAKE, KVS_RING_GET, 1), 1); /* one of the three: BUSY */
	uint32_t busy = sh->jobs[0].entry;

	kill(e, SIGKILL);
	ck_assert_int_ne(reap(e, 10), -1);
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 3); /* DONE and 2 POSTED of the dead; BUSY is ours */
	ck_assert_uint_eq(count_free(r), NENT - 1);
	hcall(H_DONE, busy, 100); /* DONE under a dead owner */
	ck_assert_uint_eq(count_free(r), NENT - 1);
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 1);
	ck_assert_uint_eq(count_free(r), NENT);
	end_helper(h);
}
END_TEST

struct waiter {
	struct kvs_ring *r;
	struct kvs_ring_ticket t;
	int answer;
	uint64_t ns;
};

static void *wait_long(void *arg)
{
	struct waiter *w = arg;
	const void *s;
	uint64_t t0 = kvs_mono_ns();

	w->answer = kvs_ring_wait(w->r, &w->t, t0 + 5000 * MS, &s);
	w->ns = kvs_mono_ns() - t0;
	return NULL;
}

/* 5: the helper dies holding two gets: one engine gives up at its deadline, the other is
 * still waiting when the next helper takes the ring over and answers it with an error. */
START_TEST(test_helper_killed)
{
	pid_t h = spawn_helper(false);
	struct kvs_ring *r = map_ok();
	struct waiter w = {.r = r};
	struct kvs_ring_ticket t;
	const void *s;
	pthread_t th;

	ck_assert_int_eq(kvs_ring_lock(path, MODE), -EWOULDBLOCK);
	get_ok(r, "k.gives-up", 100, &t);
	get_ok(r, "k.waits", 100, &w.t);
	ck_assert_int_eq(hcall(H_TAKE, KVS_RING_GET, 2), 2);
	kill(h, SIGKILL);
	ck_assert_int_ne(reap(h, 10), -1);

	uint64_t t0 = kvs_mono_ns();
	ck_assert_int_eq(kvs_ring_wait(r, &t, t0 + 100 * MS, &s), KVS_RING_TIMEOUT);
	ck_assert_uint_lt(kvs_mono_ns() - t0, 100 * MS + SLACK);
	ck_assert_uint_eq(count_free(r), NENT - 2); /* ABANDONED and BUSY */
	ck_assert_int_eq(pthread_create(&th, NULL, wait_long, &w), 0);
	sleep_ns(20 * MS);

	h = spawn_helper(false); /* the lock is free again; same dimensions: taken over */
	ck_assert_int_eq(sh->lock_ret, 0);
	ck_assert(!kvs_ring_replaced(r, path));
	pthread_join(th, NULL);
	ck_assert_int_eq(w.answer, KVS_RING_ERROR);
	ck_assert_uint_lt(w.ns, 2000 * MS);
	ck_assert_uint_eq(count_free(r), NENT - 1); /* the error left ABANDONED for a beat */
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 1);
	ck_assert_uint_eq(count_free(r), NENT);
	end_helper(h);
}
END_TEST

struct eng {
	struct kvs_ring *r;
	int slot;
};

static void *engine_thread(void *arg)
{
	struct eng *en = arg;
	char key[64];

	for (int i = 0; i < PER_THREAD; i++) {
		struct kvs_ring_ticket t;
		const void *s;
		int e;

		snprintf(key, sizeof(key), "k.%d.%d.%d", (int)getpid(), en->slot, i);
		uint32_t len = 1 + (uint32_t)(key_seed(key) % SHARD);
		uint64_t until = kvs_mono_ns() + 5000 * MS;
		while ((e = kvs_ring_get(en->r, me(), key, len, &t)) == -EBUSY &&
		       kvs_mono_ns() < until)
			sleep_ns(200000);
		CHILD_CHECK(e == 0);
		CHILD_CHECK(kvs_ring_wait(en->r, &t, kvs_mono_ns() + 5000 * MS, &s) ==
			    KVS_RING_HIT);
		CHILD_CHECK(first_bad(s, len, key_seed(key)) == len);
		kvs_ring_release(en->r, &t);
		atomic_fetch_add(&sh->gets[en->slot], 1);
	}
	return NULL;
}

/* 6: 4 engine processes of 2 threads each against one helper, every byte of every HIT
 * checked against its key; one engine SIGKILLed in the middle. */
START_TEST(test_many_engines)
{
	pid_t h = spawn_helper(false), e[4];
	struct kvs_ring *r = map_ok();
	int serving = hpost(H_SERVE, 0, 0);

	for (int p = 0; p < 4; p++) {
		e[p] = fork();
		ck_assert_int_ge(e[p], 0);
		if (e[p] == 0) {
			struct eng en[2];
			pthread_t th[2];

			prctl(PR_SET_PDEATHSIG, SIGKILL);
			CHILD_CHECK(kvs_ring_map(path, SHARD, MODE, &en[0].r) == 0);
			for (int i = 0; i < 2; i++) {
				en[i] = (struct eng){en[0].r, p * 2 + i};
				CHILD_CHECK(pthread_create(&th[i], NULL, engine_thread, &en[i]) ==
					    0);
			}
			for (int i = 0; i < 2; i++)
				pthread_join(th[i], NULL);
			_exit(0);
		}
	}
	for (int i = 0; i < 20000 && atomic_load(&sh->gets[0]) + atomic_load(&sh->gets[1]) < 50;
	     i++)
		sleep_ns(MS);
	kill(e[0], SIGKILL);
	ck_assert_int_ne(reap(e[0], 10), -1);
	ck_assert_int_lt(atomic_load(&sh->gets[0]) + atomic_load(&sh->gets[1]), 2 * PER_THREAD);
	for (int p = 1; p < 4; p++) {
		int st = reap(e[p], 60);
		ck_assert_msg(st == 0, "engine %d: status %#x: %s", p, st, sh->why);
	}
	ck_assert_msg(!sh->failed, "%s", sh->why);
	long total = 0;
	for (int i = 0; i < 8; i++) {
		total += atomic_load(&sh->gets[i]);
		if (i >= 2)
			ck_assert_int_eq(atomic_load(&sh->gets[i]), PER_THREAD);
	}
	atomic_store(&sh->stop, 1);
	ck_assert_int_ge(hwait(serving), total);
	hcall(H_BEAT, 0, 0); /* what the killed engine left, answered or not */
	ck_assert_uint_eq(count_free(r), NENT);
	end_helper(h);
}
END_TEST

/* 7: a put is taken by the put side only and simply given back; a full ring says -EBUSY. */
START_TEST(test_put_and_full)
{
	pid_t h = spawn_helper(false);
	struct kvs_ring *r = map_ok();
	struct kvs_key k = {0x1111, 0x2222, 3};
	struct kvs_ring_ticket t[NENT], x;
	const void *s;

	ck_assert_int_eq(kvs_ring_put(r, me(), "rk.put", &k, 777), 0);
	ck_assert_int_eq(hcall(H_PEEK, KVS_RING_GET, 1), 0);
	ck_assert_int_eq(hcall(H_TAKE, KVS_RING_PUT, 1), 1);
	struct kvs_ring_job *j = &sh->jobs[0];
	ck_assert_uint_eq(j->op, KVS_RING_PUT);
	ck_assert_uint_eq(j->len, 777);
	ck_assert_str_eq(j->rkey, "rk.put");
	ck_assert(j->key.block_lo == k.block_lo && j->key.block_hi == k.block_hi &&
		  j->key.shard == k.shard);
	ck_assert_uint_eq(count_free(r), NENT - 1);
	hcall(H_DONE, j->entry, 777);
	ck_assert_uint_eq(count_free(r), NENT);

	ck_assert_int_eq(kvs_ring_get(r, me(), "k.zero", 0, &x), -EINVAL);
	ck_assert_int_eq(kvs_ring_get(r, me(), "k.big", SHARD + 1, &x), -EINVAL);
	for (uint32_t i = 0; i < NENT; i++)
		get_ok(r, "k.full", 10, &t[i]);
	ck_assert_int_eq(kvs_ring_get(r, me(), "k.one-more", 10, &x), -EBUSY);
	ck_assert_int_eq(kvs_ring_put(r, me(), "rk.one-more", &k, 10), -EBUSY);
	for (uint32_t i = 0; i < NENT; i++)
		ck_assert_int_eq(kvs_ring_wait(r, &t[i], 0, &s), KVS_RING_TIMEOUT);
	ck_assert_uint_eq(count_free(r), NENT);
	end_helper(h);
}
END_TEST

static bool alive_within(struct kvs_ring *r, bool want, uint64_t ns)
{
	for (uint64_t end = kvs_mono_ns() + ns; kvs_ring_alive(r) != want;) {
		if (kvs_mono_ns() > end)
			return false;
		sleep_ns(MS);
	}
	return true;
}

/* 8: the beat: none before the first, young while beating, old once the helper is stopped,
 * young again on SIGCONT, cleared by kvs_ring_leave. */
START_TEST(test_alive)
{
	pid_t h = spawn_helper(false);
	struct kvs_ring *r = map_ok();

	ck_assert(!kvs_ring_alive(r));
	ck_assert_int_eq(hcall(H_BEATS, 0, 0), 0);
	ck_assert(alive_within(r, true, 1000 * MS));
	kill(h, SIGSTOP);
	sleep_ns(KVS_RING_DEAD_NS / 2);
	ck_assert(kvs_ring_alive(r)); /* a stop shorter than KVS_RING_DEAD_NS goes unnoticed */
	sleep_ns(KVS_RING_DEAD_NS / 2 + 200 * MS);
	ck_assert(!kvs_ring_alive(r));
	kill(h, SIGCONT);
	ck_assert(alive_within(r, true, 1000 * MS));
	hcall(H_LEAVE, 0, 0);
	ck_assert(!kvs_ring_alive(r));
	end_helper(h);
}
END_TEST

/* A map refused for its dimensions (a ring of another shard size at the path: a helper of
 * the old configuration) must not cost the process one of its few maps: the engine looks
 * again every second until the right helper comes. */
START_TEST(test_refused_maps_cost_nothing)
{
	pid_t h = spawn_helper(false);
	struct kvs_ring *r = NULL;
	int refused = 0;

	for (int i = 0; i < 16; i++)
		refused += kvs_ring_map(path, 2 * SHARD, MODE, &r) == -EPROTO;
	int e = kvs_ring_map(path, SHARD, MODE, &r);
	ck_assert_msg(e == 0,
		      "after 16 maps refused (%d of them -EPROTO) the right ring cannot be "
		      "mapped: %s",
		      refused, strerror(-e));
	ck_assert_int_eq(refused, 16);
	end_helper(h);
}
END_TEST

/* rp: a real region in the case's folder, small, for a helper and two engines. */
static void region_params(void)
{
	kvs_config_defaults(&cfg);
	rp = kvs_cache_params_of(&cfg);
	snprintf(rname, sizeof(rname), "ring.%d.%llx", (int)getpid(),
		 (unsigned long long)time(NULL));
	rp.name = rname;
	rp.dir = dir;
	rp.capacity = 16ull << 20;
	rp.shard_size = 64ull << 10;
	rp.reserved = 0;
	rp.max_processes = 8;
	rp.mode = MODE;
	rp.shm_headroom = 0;
	rp.populate = KVS_POPULATE_LAZY;
}

/* An engine as the loader is one: attached to rp's region, its entries' owner what
 * kvs_cache_whoami says.  It gets key (the parent has it answered seed's bytes) and holds the
 * HIT; told to go, it checks that the staging still holds seed's bytes and posts one more get,
 * then waits to be killed. */
static _Noreturn void ns_engine_main(struct nseng *n, const char *key, uint64_t seed)
{
	struct kvs_cache *c;
	struct kvs_ring *r;
	struct kvs_ring_owner o;
	struct kvs_ring_ticket t, t2;
	const void *s;
	char msg[200] = "";
	int e;

	n->ns_pid = (int)getpid();
	if ((e = kvs_cache_open(&rp, 0, &c, msg, sizeof(msg))) != 0) {
		char why[240];

		snprintf(why, sizeof(why), "attach: %s %s", strerror(-e), msg);
		child_fail(__LINE__, why);
	}
	CHILD_CHECK(kvs_cache_whoami(c, &o.slot, &o.at));
	n->slot = o.slot;
	n->at = o.at;
	CHILD_CHECK(kvs_ring_map(path, SHARD, MODE, &r) == 0);
	CHILD_CHECK(kvs_ring_get(r, &o, key, 100, &t) == 0);
	atomic_store(&n->stage, 1);
	CHILD_CHECK(kvs_ring_wait(r, &t, kvs_mono_ns() + 10000 * MS, &s) == KVS_RING_HIT);
	CHILD_CHECK(first_bad(s, 100, seed) == 100);
	atomic_store(&n->stage, 2);
	while (!atomic_load(&n->go))
		sleep_ns(MS);
	size_t bad = first_bad(s, 100, seed);
	if (bad != 100) {
		char why[200];

		snprintf(why, sizeof(why),
			 "the staging of a live engine's HIT was answered again (byte %zu "
			 "changed): a beat freed its DONE entry",
			 bad);
		child_fail(__LINE__, why);
	}
	CHILD_CHECK(kvs_ring_get(r, &o, "k.posted", 100, &t2) == 0);
	atomic_store(&n->stage, 3);
	for (;;)
		pause();
}

/* Fork an engine in a PID namespace of its own (unshare, then its first child: pid 1 there).
 * Returns the pid of the process between, which reaps it; 0 where the namespace is refused. */
static pid_t spawn_ns_engine(struct nseng *n, const char *key, uint64_t seed)
{
	*n = (struct nseng){0};
	pid_t p = fork();

	ck_assert_int_ge(p, 0);
	if (p == 0) {
		int st;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (unshare(CLONE_NEWPID) != 0) {
			atomic_store(&n->refused, 1);
			_exit(0);
		}
		pid_t g = fork();
		if (g == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			ns_engine_main(n, key, seed);
		}
		if (g < 0)
			child_fail(__LINE__, "fork in the new PID namespace");
		atomic_store(&n->pid, g);
		_exit(waitpid(g, &st, 0) == g ? 0 : 5);
	}
	for (int i = 0; i < 10000 && !atomic_load(&n->refused) && !atomic_load(&n->pid); i++)
		sleep_ns(MS);
	if (atomic_load(&n->refused)) {
		reap(p, 10);
		return 0;
	}
	ck_assert_msg(atomic_load(&n->pid) > 0, "no engine in a new PID namespace: %s", sh->why);
	return p;
}

static void wait_stage(struct nseng *n, int stage)
{
	for (int i = 0; i < 10000 && atomic_load(&n->stage) < stage && !sh->failed; i++)
		sleep_ns(MS);
	ck_assert_msg(atomic_load(&n->stage) == stage, "the engine (stage %d, not %d): %s",
		      atomic_load(&n->stage), stage, sh->why);
}

/* Have the helper answer n's first get with seed's bytes; n then holds the HIT (DONE). */
static void answer_ns(struct nseng *n, const char *key, uint64_t seed)
{
	wait_stage(n, 1);
	ck_assert_int_eq(hcall(H_TAKE, KVS_RING_GET, 1), 1);
	uint32_t i = sh->jobs[0].entry;
	ck_assert_str_eq(sh->jobs[0].rkey, key);
	hcall(H_FILL, i, (int64_t)seed);
	hcall(H_DONE, i, 100);
	wait_stage(n, 2);
}

/* Kill n's engine (pid 1 of its namespace) and reap it through the process between. */
static void kill_ns(struct nseng *n, pid_t between)
{
	kill(atomic_load(&n->pid), SIGKILL);
	ck_assert_int_eq(reap(between, 10), 0);
}

/*
 * The owner judged as production judges it, whatever the PID namespaces: an engine in a
 * namespace of its own (a pod's) attached to a real region, a helper in ours attached to the
 * same region and beating with kvs_cache_still.  While the engine lives, beats free none of its
 * entries and the staging of its HIT is never answered again; once it is killed and reaped (its
 * OFD liveness lock goes with it), a beat frees its entries.  An entry naming a table slot a new
 * process has taken since (another attach time) is freed; the new process's are kept.
 * Skipped where unshare(CLONE_NEWPID) is refused.
 */
START_TEST(test_other_namespace_engine)
{
	region_params();
	pid_t h = spawn_helper(true);
	struct kvs_ring *r = map_ok();
	struct nseng *e1 = &sh->ne[0], *e2 = &sh->ne[1];
	struct kvs_ring_ticket t[NENT], forged;
	const void *s;
	uint32_t n = 0;
	int freed = 0;

	pid_t b1 = spawn_ns_engine(e1, "k.held", 5);
	if (!b1) {
		fprintf(stderr, "test_other_namespace_engine: SKIP: no PID namespace\n");
		end_helper(h);
		return;
	}
	answer_ns(e1, "k.held", 5);
	ck_assert_int_eq(e1->ns_pid, 1); /* another namespace indeed */
	ck_assert_int_ne(atomic_load(&e1->pid), 1);

	/* Beats while it lives, and every other entry answered other bytes meanwhile. */
	for (int i = 0; i < 5; i++)
		freed += hcall(H_BEAT, 0, 0);
	while (n < NENT && kvs_ring_get(r, me(), "k.other", 100, &t[n]) == 0)
		n++;
	ck_assert_int_eq(hcall(H_TAKE, KVS_RING_GET, n), (int)n);
	for (uint32_t i = 0; i < n; i++) {
		hcall(H_FILL, sh->jobs[i].entry, 6);
		hcall(H_DONE, sh->jobs[i].entry, 100);
	}
	for (uint32_t i = 0; i < n; i++) {
		ck_assert_int_eq(kvs_ring_wait(r, &t[i], kvs_mono_ns() + 5000 * MS, &s),
				 KVS_RING_HIT);
		ck_assert_uint_eq(first_bad(s, 100, 6), 100);
		kvs_ring_release(r, &t[i]);
	}
	atomic_store(&e1->go, 1);
	wait_stage(e1, 3); /* its staging intact, and k.posted POSTED */
	ck_assert_msg(freed == 0, "beats freed %d entries of a live engine in another namespace",
		      freed);
	ck_assert_uint_eq(n, NENT - 1);
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 0);
	ck_assert_uint_eq(count_free(r), NENT - 2);

	/* Killed and reaped: nobody has reaped its table slot, only its lock is gone. */
	struct kvs_ring_owner dead = {e1->slot, e1->at};
	kill_ns(e1, b1);
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 2); /* its DONE and its POSTED */
	ck_assert_uint_eq(count_free(r), NENT);

	/* A new engine takes its table slot (its attach reaps the dead one): the slot's lock is
	 * held again, under another attach time.  An entry naming the dead process (posted here
	 * under its name) is freed, the new engine's are not. */
	pid_t b2 = spawn_ns_engine(e2, "k.next", 7);
	ck_assert_msg(b2 > 0, "a second PID namespace refused");
	answer_ns(e2, "k.next", 7);
	get_ok_as(r, &dead, "k.forged", &forged);
	ck_assert_uint_eq(e2->slot, dead.slot);
	ck_assert(e2->at != dead.at);
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 1); /* the forged one; the new engine's DONE kept */
	ck_assert_int_eq(kvs_ring_wait(r, &forged, kvs_mono_ns() + 100 * MS, &s), KVS_RING_ERROR);
	atomic_store(&e2->go, 1);
	wait_stage(e2, 3);
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 0);
	ck_assert_uint_eq(count_free(r), NENT - 2);
	kill_ns(e2, b2);
	ck_assert_int_eq(hcall(H_BEAT, 0, 0), 2);
	ck_assert_uint_eq(count_free(r), NENT);
	ck_assert_msg(!sh->failed, "%s", sh->why);
	end_helper(h);
}
END_TEST

static void *stall_page;

/* A's owner lies on a PROT_NONE page: its first read faults, here, and waits for the parent. */
static void stall(int sig, siginfo_t *si, void *uc)
{
	atomic_store(&sh->stage, 1);
	while (!atomic_load(&sh->stop))
		sleep_ns(MS);
	mprotect(stall_page, 4096, PROT_READ | PROT_WRITE);
}

/*
 * An engine off the CPU between its claim and the store of its owner (a preemption, a cgroup
 * freeze, a SIGSTOP; made certain here by a fault on the page of its owner) holds the entry
 * CLAIMED while the entry's owner field still names whoever used the entry before.  When that
 * one is gone, a beat must not take the claim for a dead process's: the entry freed under the
 * engine is claimed by another, and the two fill and post one entry (wrong bytes for one of
 * them when the helper answers both into one staging buffer).
 */
START_TEST(test_claimed_stale_owner)
{
	pid_t h = spawn_helper(false);
	struct kvs_ring *r = map_ok();
	struct kvs_ring_ticket t[NENT];
	const void *s;

	pid_t d = fork(); /* D uses every entry and is gone: each owner field names it */
	ck_assert_int_ge(d, 0);
	if (d == 0) {
		for (uint32_t i = 0; i < NENT; i++)
			CHILD_CHECK(kvs_ring_get(r, me(), "k.d", 1, &t[i]) == 0);
		for (uint32_t i = 0; i < NENT; i++)
			CHILD_CHECK(kvs_ring_wait(r, &t[i], 0, &s) == KVS_RING_TIMEOUT);
		_exit(0);
	}
	ck_assert_int_eq(reap(d, 10), 0);
	for (uint32_t i = 0; i < NENT - 1; i++) /* all but one, posted by this live engine */
		get_ok(r, "k.filler", 100, &t[i]);

	pid_t a = fork();
	ck_assert_int_ge(a, 0);
	if (a == 0) {
		struct sigaction sa = {.sa_sigaction = stall, .sa_flags = SA_SIGINFO};
		struct kvs_ring_ticket ta;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		stall_page =
		    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		CHILD_CHECK(stall_page != MAP_FAILED);
		struct kvs_ring_owner *o = stall_page;
		*o = *me();
		CHILD_CHECK(sigaction(SIGSEGV, &sa, NULL) == 0);
		CHILD_CHECK(mprotect(stall_page, 4096, PROT_NONE) == 0);
		CHILD_CHECK(kvs_ring_get(r, o, "k.A", 100, &ta) == 0);
		CHILD_CHECK(kvs_ring_wait(r, &ta, kvs_mono_ns() + 5000 * MS, &s) == KVS_RING_HIT);
		CHILD_CHECK(first_bad(s, 100, key_seed("k.A")) == 100);
		kvs_ring_release(r, &ta);
		_exit(0);
	}
	for (int i = 0; i < 5000 && !atomic_load(&sh->stage) && !sh->failed; i++)
		sleep_ns(MS);
	ck_assert_msg(atomic_load(&sh->stage) == 1, "A did not stall: %s", sh->why);
	int freed = hcall(H_BEAT, 0, 0);
	atomic_store(&sh->stop, 1); /* A writes its owner and posts */
	ck_assert_msg(freed == 0,
		      "a beat freed %d entry of a live engine caught between its claim and its "
		      "owner store, judging the entry's previous owner (a dead process)",
		      freed);
	int got = hcall(H_TAKE, KVS_RING_GET, NENT);
	ck_assert_int_eq(got, NENT);
	for (int i = 0; i < got; i++) {
		uint32_t e = sh->jobs[i].entry;

		hcall(H_FILL, e, (int64_t)key_seed(sh->jobs[i].rkey));
		hcall(H_DONE, e, 100);
	}
	for (uint32_t i = 0; i < NENT - 1; i++) {
		ck_assert_int_eq(kvs_ring_wait(r, &t[i], kvs_mono_ns() + 5000 * MS, &s),
				 KVS_RING_HIT);
		kvs_ring_release(r, &t[i]);
	}
	int st = reap(a, 10);
	ck_assert_msg(st == 0, "A: status %#x: %s", st, sh->why);
	ck_assert_uint_eq(count_free(r), NENT);
	end_helper(h);
}
END_TEST

static Suite *ring_suite(void)
{
	Suite *s = suite_create("ring");
	TCase *tc = tcase_create("ring");

	tcase_add_test(tc, test_get_answered);
	tcase_add_test(tc, test_deadline_untaken);
	tcase_add_test(tc, test_late_answer);
	tcase_add_test(tc, test_put_and_full);
	tcase_add_test(tc, test_alive);
	tcase_add_test(tc, test_refused_maps_cost_nothing);
	tcase_add_test(tc, test_many_engines);
	tcase_add_test(tc, test_engine_killed);
	tcase_add_test(tc, test_helper_killed);
	tcase_add_test(tc, test_other_namespace_engine);
	tcase_add_test(tc, test_claimed_stale_owner);
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(ring_suite());
	int failed;

	snprintf(top, sizeof(top), "/tmp/check_ring.XXXXXX");
	if (!mkdtemp(top))
		return EXIT_FAILURE;
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	nftw(top, remove_one, 16, FTW_DEPTH | FTW_PHYS);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
