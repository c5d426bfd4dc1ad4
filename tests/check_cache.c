/*
 * check_cache: the shared region and its slot protocol, across real processes.
 *
 * Each case builds its own region (a unique cache.name) and removes it at the end.  The
 * multi-process cases fork real children that attach on their own (a child never uses the
 * parent's handle), and report through an anonymous shared mapping.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cache_params.h"
#include "config.h"
#include "internal.h"

static int case_seq;

/* A thread id no thread can have: above the largest pid_max the kernel allows (2^22). */
#define NO_TID 0x3ffffff0

static void test_config(struct kvs_config *cfg, uint64_t slots, uint64_t shard)
{
	kvs_config_defaults(cfg);
	/* Check forks a child per case, so the pid alone repeats across runs (pid reuse) and the
	 * sequence restarts in each child: the time makes a name no earlier run left behind. */
	snprintf(cfg->cache_name, sizeof(cfg->cache_name), "check.%d.%llx.%d", (int)getpid(),
		 (unsigned long long)time(NULL), case_seq++);
	cfg->cache_shard_size = shard;
	cfg->cache_capacity = slots * shard;
	cfg->cache_reserved = 0;
	cfg->cache_max_processes = 16;
	/* These cases were written for the background walk and an unbounded /dev/shm; the lazy
	 * default and the headroom have their own cases in check_region. */
	cfg->cache_populate = KVS_POPULATE_EAGER;
	cfg->cache_shm_headroom = 0;
}

static void remove_region(const struct kvs_config *cfg)
{
	char path[256];

	kvs_cache_path(KVS_CACHE_PARAMS(cfg), path, sizeof(path));
	unlink(path);
}

static struct kvs_cache *open_ok(const struct kvs_config *cfg)
{
	struct kvs_cache *c = NULL;
	char msg[256];
	int r = kvs_cache_open(KVS_CACHE_PARAMS(cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));

	ck_assert_msg(r == 0, "open: %d %s", r, msg);
	return c;
}

/* This process's thread count. */
static int threads_now(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	int n = 0;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %d", &n) == 1)
			break;
	if (f)
		fclose(f);
	return n;
}

/* fork() once this process is down to one thread.  A case's child does what POSIX allows
 * only in a child of a one-thread process (malloc, pthread_create, kvs_cache_open), and a
 * thread that ends as it forks (the background walk of the region just opened) can leave a
 * lock held for ever in the child: ASan's allocator's, for one.  5 s at most. */
static pid_t fork_alone(void)
{
	for (int i = 0; i < 5000 && threads_now() > 1; i++)
		usleep(1000);
	return fork();
}

static struct kvs_key key_of(uint64_t block, uint64_t shard)
{
	struct kvs_key k = {block * 0x9e3779b97f4a7c15ull + 1, block, shard};

	return k;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Wait for child pid to set *ready.  A child that ends first, or says nothing for 20 s, fails
 * the case at once with its status (and is killed), rather than at Check's timeout. */
static void wait_ready(_Atomic int *ready, pid_t pid)
{
	uint64_t t0 = mono_ms();
	int st = 0;

	while (!atomic_load(ready)) {
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w != 0 || mono_ms() - t0 > 20000) {
			if (w == 0) {
				kill(pid, SIGKILL);
				waitpid(pid, &st, 0);
			}
			ck_abort_msg("child %d %s (status %#x)", (int)pid,
				     w ? "ended before it was ready" : "was not ready after 20 s",
				     st);
		}
		usleep(1000);
	}
}

/* Load key as owner: fill the slot with a pattern derived from the key, publish READY. */
static void load_pattern(struct kvs_cache *c, const struct kvs_pin *pin, const struct kvs_key *k)
{
	memset(kvs_cache_data(c, pin), (int)(k->shard * 7 + k->block_hi) & 0xff, 4096);
	kvs_cache_mark_ready(c, pin, 4096);
}

static bool pattern_ok(struct kvs_cache *c, const struct kvs_pin *pin, const struct kvs_key *k)
{
	const unsigned char *d = kvs_cache_data(c, pin);
	unsigned char want = (unsigned char)((k->shard * 7 + k->block_hi) & 0xff);

	for (int i = 0; i < 4096; i++)
		if (d[i] != want)
			return false;
	return kvs_cache_length(c, pin) == 4096;
}

static void *shared_anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	ck_assert(p != MAP_FAILED);
	memset(p, 0, len);
	return p;
}

/* Wait for every child; fail the test if one did not exit 0. */
static void reap_children(pid_t *pids, int n)
{
	for (int i = 0; i < n; i++) {
		int st = 0;

		if (pids[i] <= 0)
			continue;
		ck_assert(waitpid(pids[i], &st, 0) == pids[i]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d status %#x", i, st);
	}
}

static uint32_t pinned_slots(struct kvs_cache *c)
{
	struct kvs_region_info info;
	struct kvs_counters tot;

	ck_assert(kvs_cache_stat(c, &info, &tot, NULL, 0) >= 0);
	return info.slots_pinned;
}

/* ------------------------------------------------------------------ core */

START_TEST(test_layout_pinned)
{
	/* The shared structures' offsets are the layout; moving one must bump the version. */
	ck_assert_uint_eq(sizeof(struct kvs_slot), 128);
	ck_assert_uint_eq(offsetof(struct kvs_slot, state), 0);
	ck_assert_uint_eq(offsetof(struct kvs_slot, refs), 64);
	ck_assert_uint_eq(offsetof(struct kvs_slot, bucket), 68);
	ck_assert_uint_eq(offsetof(struct kvs_slot, next), 72);
	ck_assert_uint_eq(offsetof(struct kvs_slot, owner), 76);
	ck_assert_uint_eq(offsetof(struct kvs_slot, err), 80);
	ck_assert_uint_eq(offsetof(struct kvs_slot, length), 84);
	ck_assert_uint_eq(offsetof(struct kvs_slot, key), 88);
	ck_assert_uint_eq(offsetof(struct kvs_slot, at), 112);
	ck_assert_uint_eq(offsetof(struct kvs_slot, room), 116);
	ck_assert_uint_eq(offsetof(struct kvs_slot, expires), 120);
	ck_assert_uint_eq(sizeof(struct kvs_seen), 32);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, magic), 0);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, nslots), 40);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, off_procs), 72);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, off_data), 112);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, hand), 128);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, rhand), 192);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, populated), 256);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, proc_lock), 320);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, totals), 384);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, refused_attaches), 896);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, built_by), 904);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, off_seen), 936);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, nseen), 944);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, pack_lock), 960);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, off_frames), 1024);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, per_frame), 1032);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, keys_only), 1052);
	ck_assert_uint_eq(offsetof(struct kvs_hdr, off_tally), 1056);
	ck_assert_uint_eq(sizeof(struct kvs_hdr), 1088);
	ck_assert_uint_eq(offsetof(struct kvs_proc, ctr), 64);
	ck_assert_uint_eq(offsetof(struct kvs_proc, pod), 32);
	ck_assert_uint_eq(offsetof(struct kvs_proc, pin), 576);
	ck_assert_uint_eq(offsetof(struct kvs_tally, kind), 0);
	ck_assert_uint_eq(offsetof(struct kvs_tally, key), 8);
	ck_assert_uint_eq(offsetof(struct kvs_tally, name), 24);
	ck_assert_uint_eq(offsetof(struct kvs_tally, v), 192);
	ck_assert_uint_eq(sizeof(struct kvs_tally), 256);
	ck_assert_uint_eq(sizeof(struct kvs_stripe), 64);
	ck_assert_uint_eq(KVS_LAYOUT_VERSION, 7);

	struct kvs_config cfg;
	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_uint_eq((uintptr_t)c->data % 4096, 0);
	ck_assert_uint_eq((uintptr_t)c->stripes % 64, 0);
	ck_assert_uint_eq((uintptr_t)c->slots % 64, 0);
	ck_assert_uint_eq(c->nbuckets, 8);
	ck_assert_uint_eq(c->hdr->off_data % 4096, 0);
	ck_assert_uint_eq(c->nseen, 64);
	ck_assert_uint_ge(c->hdr->off_seen, c->hdr->off_access + 8);
	ck_assert_uint_le(c->hdr->off_seen + 64 * sizeof(struct kvs_seen), c->hdr->off_data);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

static uint64_t mono_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t counter_of(struct kvs_cache *c, enum kvs_counter_id id)
{
	struct kvs_region_info info;
	struct kvs_counters tot;

	ck_assert_int_ge(kvs_cache_stat(c, &info, &tot, NULL, 0), 0);
	return tot.v[id];
}

/* A load kept with an expiry is served until then, dropped at the first look after it, and
 * loaded again by one pinner; pins held across it keep their bytes; a reader that comes after
 * the expiry while the load is still in flight does not join it. */
/* kvs_cache_pin_loading: the remote helper's pin on the very slot an owner loads, and no other
 * (remote.zero_copy).  Never allocates, never elects; a slot of the key loaded anew after the
 * owner's expired is not the owner's. */
START_TEST(test_pin_loading)
{
	struct kvs_config cfg;
	struct kvs_pin own, zc, other, again;
	struct kvs_key k = key_of(11, 2), missing = key_of(11, 3);
	uint32_t me, other_owner;
	uint64_t at;

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg), *h = open_ok(&cfg);
	ck_assert(kvs_cache_whoami(c, &me, &at));
	ck_assert(kvs_cache_whoami(h, &other_owner, &at));
	uint64_t t0 = mono_now_ns();
	ck_assert_int_eq(kvs_cache_pin_load(c, &k, KVS_ALLOC_LOAD, 0, t0 + 200000000ull, &own),
			 KVS_PIN_OWNER);
	/* Not the owner, not the slot, not a key there: nothing pinned. */
	ck_assert_int_eq(kvs_cache_pin_loading(h, &k, other_owner, own.slot, &zc), -EAGAIN);
	ck_assert_int_eq(kvs_cache_pin_loading(h, &k, me, own.slot + 1, &zc), -EAGAIN);
	ck_assert_int_eq(kvs_cache_pin_loading(h, &missing, me, own.slot, &zc), -EAGAIN);
	ck_assert_int_eq(kvs_cache_lookup(h, &missing), -ENOENT); /* nothing allocated */
	/* The owner's slot: pinned, the owner still the owner. */
	ck_assert_int_eq(kvs_cache_pin_loading(h, &k, me, own.slot, &zc), KVS_PIN_WAIT);
	ck_assert_uint_eq(zc.slot, own.slot);
	load_pattern(c, &own, &k);
	ck_assert(pattern_ok(h, &zc, &k));
	/* READY now: not a loading slot any more. */
	ck_assert_int_eq(kvs_cache_pin_loading(h, &k, me, own.slot, &other), -EAGAIN);
	kvs_cache_release(h, &zc);
	kvs_cache_release(c, &own);
	/* Expired, then loaded anew by the same process in another slot: the old slot's number
	 * does not pin the new one. */
	while (mono_now_ns() < t0 + 200000000ull)
		usleep(10000);
	ck_assert_int_eq(kvs_cache_pin_load(c, &k, KVS_ALLOC_LOAD, 0, 0, &again), KVS_PIN_OWNER);
	if (again.slot != own.slot)
		ck_assert_int_eq(kvs_cache_pin_loading(h, &k, me, own.slot, &zc), -EAGAIN);
	ck_assert_int_eq(kvs_cache_pin_loading(h, &k, me, again.slot, &zc), KVS_PIN_WAIT);
	kvs_cache_release(h, &zc);
	load_pattern(c, &again, &k);
	kvs_cache_release(c, &again);
	kvs_cache_close(h);
	kvs_cache_close(c);
}
END_TEST

START_TEST(test_expiry)
{
	struct kvs_config cfg;
	struct kvs_pin own, w, hit, again;
	struct kvs_key k = key_of(9, 1);

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg), *d = open_ok(&cfg);
	uint64_t t0 = mono_now_ns();
	ck_assert_int_eq(kvs_cache_pin_load(c, &k, KVS_ALLOC_LOAD, 0, t0 + 300000000ull, &own),
			 KVS_PIN_OWNER);
	ck_assert_int_eq(kvs_cache_pin(d, &k, KVS_ALLOC_LOAD, &w), KVS_PIN_WAIT); /* joins */
	load_pattern(c, &own, &k);
	ck_assert_int_eq(kvs_cache_wait(d, &w, 1000000000ull), 0);
	ck_assert(pattern_ok(d, &w, &k));
	kvs_cache_release(c, &own);
	kvs_cache_release(d, &w);
	/* Before the expiry: a hit, through both doors. */
	ck_assert_int_eq(kvs_cache_pin_ready(d, &k, &hit), KVS_PIN_HIT);
	ck_assert(pattern_ok(d, &hit, &k));
	kvs_cache_release(d, &hit);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &hit), KVS_PIN_HIT); /* held */
	ck_assert_int_eq(kvs_cache_lookup(d, &k), KVS_SLOT_READY);
	while (mono_now_ns() < t0 + 300000000ull)
		usleep(10000);
	/* After it: gone for a watcher, which changes nothing. */
	struct kvs_cache *wt = NULL;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_WATCH, &wt, NULL, 0), 0);
	ck_assert_int_eq(kvs_cache_lookup(wt, &k), -ENOENT);
	ck_assert_uint_eq(counter_of(c, KVS_CTR_shards_expired), 0);
	/* Not a hit any more; the first pin owns the reload, the next one waits for it. */
	ck_assert_int_eq(kvs_cache_pin_ready(d, &k, &again), -EAGAIN);
	ck_assert_uint_eq(counter_of(c, KVS_CTR_shards_expired), 1);
	ck_assert_int_eq(kvs_cache_pin(d, &k, KVS_ALLOC_LOAD, &again), KVS_PIN_OWNER);
	ck_assert_uint_ne(again.slot, hit.slot);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &w), KVS_PIN_WAIT);
	ck_assert(pattern_ok(c, &hit, &k)); /* the held pin keeps the old bytes */
	kvs_cache_release(c, &hit);	    /* the orphan's last pin: it is freed */
	load_pattern(d, &again, &k);
	kvs_cache_release(d, &again);
	ck_assert_int_eq(kvs_cache_wait(c, &w, 1000000000ull), 0);
	kvs_cache_release(c, &w);
	/* The reload was pinned with no expiry: kept for good. */
	usleep(50000);
	ck_assert_int_eq(kvs_cache_pin_ready(c, &k, &hit), KVS_PIN_HIT);
	kvs_cache_release(c, &hit);
	ck_assert_uint_eq(pinned_slots(c), 0);

	/* A load still in flight at its expiry is not joined: the late reader loads anew, and
	 * the first load's readers still get their bytes from the orphan. */
	struct kvs_key k2 = key_of(9, 2);
	struct kvs_pin late, first_w;
	t0 = mono_now_ns();
	ck_assert_int_eq(kvs_cache_pin_load(c, &k2, KVS_ALLOC_LOAD, 0, t0 + 100000000ull, &own),
			 KVS_PIN_OWNER);
	ck_assert_int_eq(kvs_cache_pin(d, &k2, KVS_ALLOC_LOAD, &first_w), KVS_PIN_WAIT);
	while (mono_now_ns() < t0 + 100000000ull)
		usleep(10000);
	ck_assert_int_eq(kvs_cache_pin(d, &k2, KVS_ALLOC_LOAD, &late), KVS_PIN_OWNER);
	ck_assert_uint_ne(late.slot, own.slot);
	load_pattern(c, &own, &k2);
	ck_assert_int_eq(kvs_cache_wait(d, &first_w, 1000000000ull), 0);
	ck_assert(pattern_ok(d, &first_w, &k2));
	kvs_cache_release(c, &own);
	kvs_cache_release(d, &first_w);
	load_pattern(d, &late, &k2);
	kvs_cache_release(d, &late);
	ck_assert_int_eq(kvs_cache_pin_ready(c, &k2, &hit), KVS_PIN_HIT);
	ck_assert_uint_eq(hit.slot, late.slot);
	kvs_cache_release(c, &hit);

	/* A failed load's expiry goes with it: the retry after the last release is not dropped
	 * for it, and is kept as its own election says. */
	struct kvs_key k3 = key_of(9, 3);
	t0 = mono_now_ns();
	ck_assert_int_eq(kvs_cache_pin_load(c, &k3, KVS_ALLOC_LOAD, 0, t0 + 1000000ull, &own),
			 KVS_PIN_OWNER);
	kvs_cache_mark_failed(c, &own, EIO);
	kvs_cache_release(c, &own);
	usleep(5000);
	ck_assert_int_eq(kvs_cache_pin(c, &k3, KVS_ALLOC_LOAD, &again), KVS_PIN_OWNER);
	ck_assert_uint_eq(again.slot, own.slot);
	load_pattern(c, &again, &k3);
	kvs_cache_release(c, &again);
	ck_assert_int_eq(kvs_cache_pin_ready(c, &k3, &hit), KVS_PIN_HIT);
	kvs_cache_release(c, &hit);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(wt);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

static uint32_t slots_in(struct kvs_cache *c, uint32_t state)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < c->nslots; i++)
		n += (load_relaxed(&c->slots[i].state) & KVS_ST_MASK) == state;
	return n;
}

/* Staged slots: found by nobody until published; a publication that meets the key present
 * replaces what it held (an older file's bytes may be there under the same identity), the
 * pins on the old slot reading on; a rekey moves a READY slot nobody pins; a stager that dies
 * is reclaimed. */
START_TEST(test_stage_publish_rekey)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(21, 0), k2 = key_of(22, 0), kt = key_of(23, 4);
	struct kvs_pin p;
	uint32_t s1, s2;

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg), *d = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_stage_claim(c, &s1), 0);
	ck_assert_uint_eq(slots_in(c, KVS_SLOT_CLAIMED), 1);
	memset(kvs_cache_stage_data(c, s1), 0x5a, 4096);
	ck_assert_int_eq(kvs_cache_lookup(d, &k), -ENOENT); /* invisible while staged */
	ck_assert_int_eq(kvs_cache_stage_publish(d, s1, &k, 4096, 0), -EINVAL); /* not d's */
	ck_assert_int_eq(kvs_cache_stage_publish(c, s1, &k, 4096, 0), 1);
	ck_assert_int_eq(kvs_cache_pin_ready(d, &k, &p), KVS_PIN_HIT);
	ck_assert_uint_eq(p.slot, s1);
	ck_assert_uint_eq(kvs_cache_length(d, &p), 4096);
	ck_assert_int_eq(((unsigned char *)kvs_cache_data(d, &p))[4095], 0x5a);
	/* A second publication of the key replaces the first: new pins find its bytes, the pin
	 * held on the first reads on, and its release frees it. */
	struct kvs_pin q;
	ck_assert_int_eq(kvs_cache_stage_claim(c, &s2), 0);
	memset(kvs_cache_stage_data(c, s2), 0xa5, 4096);
	ck_assert_int_eq(kvs_cache_stage_publish(c, s2, &k, 4096, 0), 1);
	ck_assert_int_eq(kvs_cache_pin_ready(d, &k, &q), KVS_PIN_HIT);
	ck_assert_uint_eq(q.slot, s2);
	ck_assert_int_eq(((unsigned char *)kvs_cache_data(d, &q))[4095], 0xa5);
	ck_assert_int_eq(((unsigned char *)kvs_cache_data(d, &p))[4095], 0x5a);
	kvs_cache_release(d, &p);
	ck_assert_uint_eq(load_relaxed(&c->slots[s1].state), KVS_SLOT_FREE);
	/* A pinned slot is not moved; an unpinned one is, with its length and expiry. */
	ck_assert_int_eq(kvs_cache_rekey(c, &k, &k2), 0);
	kvs_cache_release(d, &q);
	ck_assert_int_eq(kvs_cache_rekey(c, &k, &k2), 1);
	ck_assert_int_eq(kvs_cache_lookup(d, &k), -ENOENT);
	ck_assert_int_eq(kvs_cache_pin_ready(d, &k2, &p), KVS_PIN_HIT);
	ck_assert_uint_eq(p.slot, s2);
	kvs_cache_release(d, &p);
	ck_assert_int_eq(kvs_cache_rekey(c, &kt, &k2), 0); /* nothing to move */
	/* An expiry given at publication is kept. */
	ck_assert_int_eq(kvs_cache_stage_claim(c, &s2), 0);
	ck_assert_int_eq(kvs_cache_stage_publish(c, s2, &kt, 100, mono_now_ns() - 1), 1);
	ck_assert_int_eq(kvs_cache_pin_ready(d, &kt, &p), -EAGAIN);
	/* Dropped: free again. */
	ck_assert_int_eq(kvs_cache_stage_claim(c, &s2), 0);
	kvs_cache_stage_drop(d, s2); /* not d's claim: nothing happens */
	ck_assert_uint_eq(slots_in(c, KVS_SLOT_CLAIMED), 1);
	kvs_cache_stage_drop(c, s2);
	ck_assert_uint_eq(slots_in(c, KVS_SLOT_CLAIMED), 0);
	/* A stager SIGKILLed with slots staged: its reclaim frees them. */
	_Atomic int *ready = shared_anon(4096);
	pid_t kid = fork_alone();
	ck_assert_int_ge(kid, 0);
	if (kid == 0) {
		struct kvs_cache *m = NULL;
		uint32_t x;

		if (kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &m, NULL, 0))
			_exit(3);
		for (int i = 0; i < 3; i++)
			if (kvs_cache_stage_claim(m, &x))
				_exit(4);
		atomic_store(ready, 1);
		pause();
		_exit(0);
	}
	wait_ready(ready, kid);
	ck_assert_uint_eq(slots_in(c, KVS_SLOT_CLAIMED), 3);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	ck_assert_int_eq(kvs_cache_reap(c), 1);
	ck_assert_uint_eq(slots_in(c, KVS_SLOT_CLAIMED), 0);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Write sequences: one process's writes, even several at once, are clean; another process's
 * write in flight makes both unclean; another's write since ours makes ours foreign and
 * refuses our publication. */
START_TEST(test_write_sequences)
{
	struct kvs_config cfg;
	struct kvs_wtok a, b, x;

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg), *d = open_ok(&cfg);
	kvs_cache_write_begin(c, 7, 100, &a);
	ck_assert(a.held && a.clean && a.foreign); /* a new entry: no history */
	kvs_cache_write_begin(c, 7, 100, &b);	   /* ours, at once */
	ck_assert(b.held && b.clean && !b.foreign);
	ck_assert(kvs_cache_write_end(c, &a));
	ck_assert(kvs_cache_write_end(c, &b));
	ck_assert(kvs_cache_write_last(c, &b));
	ck_assert(!kvs_cache_write_last(d, &b)); /* not d's writes */
	/* Another process writes after us: our publication is refused; its own is not. */
	kvs_cache_write_begin(d, 7, 100, &x);
	ck_assert(x.clean && x.foreign);
	ck_assert(kvs_cache_write_end(d, &x));
	ck_assert(!kvs_cache_write_last(c, &b));
	ck_assert(kvs_cache_write_last(d, &x));
	/* Our next write: foreign (what we wrote before may be under its bytes). */
	kvs_cache_write_begin(c, 7, 100, &a);
	ck_assert(a.clean && a.foreign);
	/* ... and another process's write while ours is in flight: both unclean. */
	kvs_cache_write_begin(d, 7, 100, &x);
	ck_assert(!x.clean);
	ck_assert(!kvs_cache_write_end(c, &a));
	ck_assert(!kvs_cache_write_end(d, &x));
	ck_assert(!kvs_cache_write_last(c, &a));
	ck_assert(!kvs_cache_write_last(d, &x));
	/* Another file's entry is not ours to count in. */
	kvs_cache_write_begin(c, 8, 100, &a);
	ck_assert(kvs_cache_write_end(c, &a));
	ck_assert(kvs_cache_write_last(c, &a));
	/* A writer that dies in flight: the file's later writes are unclean until the dead one is
	 * reaped, which ends its writes; then the next is clean, and foreign. */
	pid_t kid = fork_alone();
	ck_assert_int_ge(kid, 0);
	if (kid == 0) {
		struct kvs_cache *m = NULL;
		struct kvs_wtok t;

		if (kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &m, NULL, 0))
			_exit(3);
		kvs_cache_write_begin(m, 9, 100, &t);
		_exit(t.held ? 0 : 4);
	}
	int st;
	waitpid(kid, &st, 0);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	kvs_cache_write_begin(c, 9, 100, &a);
	ck_assert(!a.clean);
	ck_assert(!kvs_cache_write_end(c, &a));
	ck_assert_int_eq(kvs_cache_reap(c), 1);
	kvs_cache_write_begin(c, 9, 100, &a);
	ck_assert(a.held && a.clean && a.foreign);
	ck_assert(kvs_cache_write_end(c, &a));
	ck_assert(kvs_cache_write_last(c, &a));
	/* A watcher is never clean. */
	struct kvs_cache *w = NULL;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_WATCH, &w, NULL, 0), 0);
	kvs_cache_write_begin(w, 10, 100, &a);
	ck_assert(!a.held && !a.clean);
	kvs_cache_close(w);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* The seen table: the first time recorded is the answer, never a later one for a block that
 * is still there and never an earlier one for any block. */
START_TEST(test_first_seen)
{
	struct kvs_config cfg;
	struct kvs_key a = key_of(11, 0), b = key_of(12, 0);

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg), *d = open_ok(&cfg);
	ck_assert_uint_eq(kvs_cache_first_seen(c, &a, 1000), 1000);
	ck_assert_uint_eq(kvs_cache_first_seen(d, &a, 5000), 1000); /* node-wide */
	ck_assert_uint_eq(kvs_cache_first_seen(c, &a, 500), 500);   /* never after now */
	ck_assert_uint_eq(kvs_cache_first_seen(c, &b, 7000), 7000);
	ck_assert_uint_eq(kvs_cache_first_seen(c, &a, 9000), 1000);
	/* A watcher records nothing. */
	struct kvs_cache *w = NULL;
	struct kvs_key n = key_of(13, 0);
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_WATCH, &w, NULL, 0), 0);
	ck_assert_uint_eq(kvs_cache_first_seen(w, &n, 3000), 3000);
	ck_assert_uint_eq(kvs_cache_first_seen(c, &n, 4000), 4000);
	/* Many more blocks than entries: old ones are lost, and then answer "now" (later than
	 * the truth, never earlier); every answer is one of the block's own times. */
	for (uint64_t i = 0; i < 1000; i++) {
		struct kvs_key x = key_of(100 + i, 0);
		ck_assert_uint_eq(kvs_cache_first_seen(c, &x, 10000 + i), 10000 + i);
	}
	for (uint64_t i = 0; i < 1000; i++) {
		struct kvs_key x = key_of(100 + i, 0);
		uint64_t t = kvs_cache_first_seen(c, &x, 20000);
		ck_assert(t == 10000 + i || t == 20000);
	}
	/* A writer that died inside an entry (seq left odd): the entry is skipped for good. */
	for (uint32_t e = 0; e < c->nseen; e++)
		atomic_store(&c->seen[e].seq, 1);
	ck_assert_uint_eq(kvs_cache_first_seen(c, &a, 30000), 30000);
	ck_assert_uint_eq(kvs_cache_first_seen(c, &a, 31000), 31000);
	kvs_cache_close(w);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Processes racing on the seen table never read a torn entry: every answer for block i is a
 * time some process recorded for block i. */
START_TEST(test_first_seen_concurrent)
{
	struct kvs_config cfg;
	enum { KIDS = 4, BLOCKS = 512, ROUNDS = 40 };
	pid_t pids[KIDS];

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	kvs_cache_close(c);
	for (int k = 0; k < KIDS; k++) {
		pids[k] = fork_alone();
		ck_assert_int_ge(pids[k], 0);
		if (pids[k] == 0) {
			struct kvs_cache *m = NULL;
			char msg[256];
			int bad = 0;

			if (kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &m, msg, sizeof(msg)))
				_exit(3);
			for (int r = 0; r < ROUNDS; r++) {
				for (uint64_t i = 0; i < BLOCKS; i++) {
					struct kvs_key x = key_of(1000 + i, 0);
					/* Times of block i are i * 1e6 + a small number. */
					uint64_t now =
					    i * 1000000ull + 1000 + (uint64_t)(r * KIDS + k);
					uint64_t t = kvs_cache_first_seen(m, &x, now);

					if (t / 1000000ull != i || t > now)
						bad++;
				}
			}
			_exit(bad ? 1 : 0);
		}
	}
	reap_children(pids, KIDS);
	remove_region(&cfg);
}
END_TEST

START_TEST(test_create_attach_mismatch)
{
	struct kvs_config cfg, other;
	struct kvs_cache *a, *b = NULL;
	char path[256], msg[256];
	struct stat st;

	test_config(&cfg, 8, 4096);
	cfg.cache_mode = 0640;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &b, msg, sizeof(msg)), -ENOENT);
	a = open_ok(&cfg);
	kvs_cache_path(KVS_CACHE_PARAMS(&cfg), path, sizeof(path));
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 0777, 0640);
	b = open_ok(&cfg);
	ck_assert_int_ne(kvs_cache_self(a), kvs_cache_self(b));
	kvs_cache_close(b);

	other = cfg;
	other.cache_shard_size = 8192;
	other.cache_capacity = 8 * 8192;
	ck_assert_int_eq(
	    kvs_cache_open(KVS_CACHE_PARAMS(&other), KVS_OPEN_CREATE, &b, msg, sizeof(msg)),
	    -EPROTO);
	ck_assert_msg(strstr(msg, "shard_size"), "msg: %s", msg);
	other = cfg;
	other.cache_max_processes = 17;
	ck_assert_int_eq(
	    kvs_cache_open(KVS_CACHE_PARAMS(&other), KVS_OPEN_CREATE, &b, msg, sizeof(msg)),
	    -EPROTO);
	ck_assert_msg(strstr(msg, "max_processes"), "msg: %s", msg);
	other = cfg;
	other.cache_eviction = KVS_EVICT_FIFO;
	ck_assert_int_eq(
	    kvs_cache_open(KVS_CACHE_PARAMS(&other), KVS_OPEN_CREATE, &b, msg, sizeof(msg)),
	    -EPROTO);
	ck_assert_msg(strstr(msg, "eviction"), "msg: %s", msg);
	kvs_cache_close(a);
	remove_region(&cfg);
}
END_TEST

START_TEST(test_pin_owner_hit)
{
	struct kvs_config cfg;
	struct kvs_pin p1, p2;
	struct kvs_key k = key_of(1, 0);

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_lookup(c, &k), -ENOENT);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p1), KVS_PIN_OWNER);
	ck_assert_int_eq(kvs_cache_lookup(c, &k), KVS_SLOT_LOADING);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p2), KVS_PIN_WAIT);
	ck_assert_uint_eq(p1.slot, p2.slot);
	load_pattern(c, &p1, &k);
	ck_assert_int_eq(kvs_cache_wait(c, &p2, 1000000), 0);
	ck_assert(pattern_ok(c, &p2, &k));
	ck_assert_uint_eq(pinned_slots(c), 1);
	kvs_cache_release(c, &p1);
	kvs_cache_release(c, &p2);
	ck_assert_uint_eq(pinned_slots(c), 0);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p1), KVS_PIN_HIT);
	ck_assert(pattern_ok(c, &p1, &k));
	kvs_cache_release(c, &p1);
	ck_assert_int_eq(kvs_cache_lookup(c, &k), KVS_SLOT_READY);
	/* A watcher maps the control plane only, and can still answer the existence query. */
	struct kvs_cache *w = NULL;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_WATCH, &w, NULL, 0), 0);
	ck_assert_uint_lt(w->map_len, c->map_len);
	ck_assert_int_eq(kvs_cache_lookup(w, &k), KVS_SLOT_READY);
	struct kvs_key absent = key_of(1, 1);
	ck_assert_int_eq(kvs_cache_lookup(w, &absent), -ENOENT);
	ck_assert_int_eq(kvs_cache_pin(w, &k, KVS_ALLOC_LOAD, &p1), -EPERM);
	kvs_cache_close(w);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

START_TEST(test_failed_then_retry)
{
	struct kvs_config cfg;
	struct kvs_pin own, w, again;
	struct kvs_key k = key_of(2, 3);

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &own), KVS_PIN_OWNER);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &w), KVS_PIN_WAIT);
	kvs_cache_mark_failed(c, &own, ENOMSG);
	ck_assert_int_eq(kvs_cache_wait(c, &w, 1000000), -ENOMSG);
	kvs_cache_release(c, &own);
	/* A pin while FAILED slots still hold pins waits and sees the failure too. */
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &again), KVS_PIN_WAIT);
	ck_assert_int_eq(kvs_cache_wait(c, &again, 1000000), -ENOMSG);
	kvs_cache_release(c, &again);
	kvs_cache_release(c, &w);
	/* Last pin dropped: back to LOADING, unowned, and the next pinner owns the retry. */
	ck_assert_int_eq(kvs_cache_lookup(c, &k), KVS_SLOT_ALLOCATED);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &own), KVS_PIN_OWNER);
	load_pattern(c, &own, &k);
	kvs_cache_release(c, &own);
	ck_assert_int_eq(kvs_cache_lookup(c, &k), KVS_SLOT_READY);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Load key as owner and release at once. */
static uint32_t load_one(struct kvs_cache *c, uint64_t block)
{
	struct kvs_key k = key_of(block, 0);
	struct kvs_pin p;

	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	load_pattern(c, &p, &k);
	kvs_cache_release(c, &p);
	return p.slot;
}

static void touch(struct kvs_cache *c, uint64_t block)
{
	struct kvs_key k = key_of(block, 0);
	struct kvs_pin p;

	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_HIT);
	kvs_cache_release(c, &p);
}

static bool present(struct kvs_cache *c, uint64_t block)
{
	struct kvs_key k = key_of(block, 0);

	return kvs_cache_lookup(c, &k) == KVS_SLOT_READY;
}

/* The walk-through of the issue: 4 slots, A B C D; E evicts A; touch B; F evicts C. */
static void walkthrough(int eviction, bool *b_survives)
{
	struct kvs_config cfg;
	enum { A = 10, B, C, D, E, F };

	test_config(&cfg, 4, 4096);
	cfg.cache_eviction = eviction;
	struct kvs_cache *c = open_ok(&cfg);
	uint32_t sa = load_one(c, A), sb = load_one(c, B), sc = load_one(c, C);
	load_one(c, D);
	ck_assert_uint_eq(load_one(c, E), sa);
	ck_assert(!present(c, A));
	touch(c, B);
	uint32_t sf = load_one(c, F);
	*b_survives = present(c, B);
	if (eviction == KVS_EVICT_CLOCK) {
		ck_assert_uint_eq(sf, sc);
		ck_assert(!present(c, C));
	} else {
		ck_assert_uint_eq(sf, sb);
	}
	ck_assert(present(c, D) && present(c, E) && present(c, F));
	kvs_cache_close(c);
	remove_region(&cfg);
}

START_TEST(test_clock_walkthrough)
{
	bool clock_b, fifo_b;

	walkthrough(KVS_EVICT_CLOCK, &clock_b);
	walkthrough(KVS_EVICT_FIFO, &fifo_b);
	ck_assert(clock_b);
	ck_assert(!fifo_b);
}
END_TEST

START_TEST(test_reserved_share)
{
	struct kvs_config cfg;
	struct kvs_pin pins[8], p;

	test_config(&cfg, 8, 4096);
	cfg.cache_reserved = 25; /* slots 6 and 7 */
	struct kvs_cache *c = open_ok(&cfg);
	for (uint64_t b = 0; b < 40; b++) {
		struct kvs_key k = key_of(100 + b, 0);

		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_NORMAL, &p), KVS_PIN_OWNER);
		ck_assert_uint_lt(p.slot, 6);
		load_pattern(c, &p, &k);
		kvs_cache_release(c, &p);
	}
	/* Pin the whole main share: normal allocations fail, loads take the reserve. */
	for (int i = 0; i < 6; i++) {
		struct kvs_key k = key_of(200 + (uint64_t)i, 0);
		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_NORMAL, &pins[i]), KVS_PIN_OWNER);
	}
	struct kvs_key k = key_of(300, 0);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_NORMAL, &p), -ENOSPC);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	ck_assert_uint_ge(p.slot, 6);
	struct kvs_key k2 = key_of(301, 0);
	ck_assert_int_eq(kvs_cache_pin(c, &k2, KVS_ALLOC_PREFETCH, &pins[6]), KVS_PIN_OWNER);
	ck_assert_uint_ge(pins[6].slot, 6);
	struct kvs_key k3 = key_of(302, 0);
	ck_assert_int_eq(kvs_cache_pin(c, &k3, KVS_ALLOC_LOAD, &pins[7]), -ENOSPC);
	kvs_cache_release(c, &p);
	for (int i = 0; i < 7; i++)
		kvs_cache_release(c, &pins[i]);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

START_TEST(test_prealloc_invalidate_not_ready)
{
	struct kvs_config cfg;
	struct kvs_pin p, q;
	struct kvs_key k = key_of(7, 1);

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_prealloc(c, &k, 0), 0);
	ck_assert_int_eq(kvs_cache_prealloc(c, &k, 0), -EEXIST);
	ck_assert_int_eq(kvs_cache_lookup(c, &k), KVS_SLOT_ALLOCATED);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	load_pattern(c, &p, &k);
	/* backend_only: the sole pinner sends it back, so the next pin reloads. */
	ck_assert_int_eq(kvs_cache_mark_not_ready(c, &p), 0);
	kvs_cache_release(c, &p);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	load_pattern(c, &p, &k);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &q), KVS_PIN_HIT);
	ck_assert_int_eq(kvs_cache_mark_not_ready(c, &q), -EBUSY);
	/* Invalidate while pinned: unhashed now, freed by the last release. */
	struct kvs_key blk = key_of(7, 0);
	ck_assert_int_eq(kvs_cache_invalidate(c, &blk, 0, 3), 1);
	ck_assert_int_eq(kvs_cache_lookup(c, &k), -ENOENT);
	ck_assert(pattern_ok(c, &q, &k));
	kvs_cache_release(c, &p);
	kvs_cache_release(c, &q);
	ck_assert_uint_eq(st_of(c->slots[p.slot].state), KVS_SLOT_FREE);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* ------------------------------------------------------------------ limits */

START_TEST(test_pin_table_full)
{
	struct kvs_config cfg;
	static struct kvs_pin pins[KVS_PINS_PER_PROC];
	struct kvs_pin extra;
	struct kvs_key k = key_of(1, 0);

	test_config(&cfg, 4, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	for (unsigned i = 0; i < KVS_PINS_PER_PROC; i++)
		ck_assert_int_ge(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &pins[i]), 0);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &extra), -ENOBUFS);
	ck_assert_uint_eq(c->slots[pins[0].slot].refs, KVS_PINS_PER_PROC);
	for (unsigned i = 0; i < KVS_PINS_PER_PROC; i++)
		kvs_cache_release(c, &pins[i]);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

START_TEST(test_process_table_full)
{
	struct kvs_config cfg;
	struct kvs_cache *a, *b, *x = NULL;
	char msg[256];

	test_config(&cfg, 4, 4096);
	cfg.cache_max_processes = 2;
	a = open_ok(&cfg);
	b = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &x, msg, sizeof(msg)), -EUSERS);
	kvs_cache_close(b);
	b = open_ok(&cfg);
	kvs_cache_close(b);
	kvs_cache_close(a);
	remove_region(&cfg);
}
END_TEST

START_TEST(test_corrupt_header_refused)
{
	struct kvs_config cfg;
	struct kvs_cache *c, *x = NULL;
	char msg[256];

	test_config(&cfg, 8, 4096);
	c = open_ok(&cfg);
	c->hdr->magic = 0xdeadbeef;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &x, msg, sizeof(msg)), -EPROTO);
	ck_assert_msg(strstr(msg, "magic"), "%s", msg);
	c->hdr->magic = KVS_MAGIC;
	c->hdr->nslots = 1u << 30;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &x, msg, sizeof(msg)), -EPROTO);
	c->hdr->nslots = 8;
	c->hdr->off_slots = 12;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &x, msg, sizeof(msg)), -EPROTO);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

START_TEST(test_corrupt_chains_contained)
{
	struct kvs_config cfg;
	struct kvs_pin p;

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	for (uint64_t b = 0; b < 8; b++)
		load_one(c, b);
	/* Garbage in every bucket head and chain link, then a loop. */
	srand(1);
	for (uint32_t i = 0; i < c->nbuckets; i++)
		c->buckets[i] = (uint32_t)rand() | 0x10000u;
	for (uint32_t i = 0; i < c->nslots; i++) {
		c->slots[i].next = (i + 1) % 4; /* a cycle among 0..3 */
		c->slots[i].bucket = (uint32_t)rand();
	}
	for (uint64_t b = 0; b < 64; b++) {
		struct kvs_key k = key_of(b, 0);
		int r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p);

		ck_assert_msg(r == -EUCLEAN || r == -ENOSPC || r >= 0, "pin %d", r);
		if (r >= 0)
			kvs_cache_release(c, &p);
		r = kvs_cache_lookup(c, &k);
		ck_assert(r == -EUCLEAN || r == -ENOENT || r >= 0);
	}
	/* Cycles inside chains: head points into the cycle. */
	for (uint32_t i = 0; i < c->nbuckets; i++)
		c->buckets[i] = 0;
	for (uint64_t b = 0; b < 16; b++) {
		struct kvs_key k = key_of(1000 + b, 0);
		ck_assert_int_eq(kvs_cache_lookup(c, &k), -EUCLEAN);
	}
	/* An invalidation walks the cycle too, shard by shard or (a range longer than the
	 * cache) bucket by bucket: it says so, and ends. */
	struct kvs_key blk = key_of(2000, 0);
	ck_assert_int_eq(kvs_cache_invalidate(c, &blk, 0, 3), -EUCLEAN);
	ck_assert_int_eq(kvs_cache_invalidate(c, &blk, 0, 1000), -EUCLEAN);
	/* A pin entry naming a slot out of bounds is ignored by reclaim and repair. */
	c->me->pin[5] = 0xffffff;
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Staging's bounds: the node's writers together stage at most a quarter of the frames (each
 * process says how many it holds), and a stager takes a frame only by CLOCK's sweeps with
 * second chances (it ages what readers left, as a load would), from the main share. */
START_TEST(test_stage_bound)
{
	struct kvs_config cfg;
	uint32_t a, b, x;

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg), *d = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_stage_claim(c, &a), 0);
	kvs_cache_stage_count(c, 1);
	ck_assert_int_eq(kvs_cache_stage_claim(d, &b), 0);
	kvs_cache_stage_count(d, 1);
	ck_assert_int_eq(kvs_cache_stage_claim(d, &x), -ENOSPC); /* 2 of 8 on the node */
	kvs_cache_stage_drop(c, a);
	kvs_cache_stage_count(c, 0);
	ck_assert_int_eq(kvs_cache_stage_claim(d, &x), 0);
	kvs_cache_stage_drop(d, x);
	kvs_cache_stage_drop(d, b);
	kvs_cache_stage_count(d, 0);
	/* Every frame of the main share loaded (an allocation sets its access byte): the first
	 * sweep ages them all, the second takes one of the main share, never of the reserve. */
	for (uint32_t i = 0; i < c->nmain; i++)
		load_one(c, 100 + i);
	ck_assert_int_eq(kvs_cache_stage_claim(c, &a), 0);
	ck_assert_uint_lt(frame_of(c, a), c->nmain);
	for (uint32_t f = 0; f < c->nmain; f++)
		ck_assert_uint_eq(load_relaxed(&c->access[f]), 0); /* aged, as by a load */
	kvs_cache_stage_drop(c, a);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Write-through's edges: a publication of a key already cached (a slot that is not slot 0)
 * replaces the cached slot and leaves the stripe unlocked; a slot claimed by another process is
 * not ours to publish; a rekey moves only READY slots (not one left for a retry after a
 * failure) and, when the stripe cannot be had, says so and touches nothing. */
START_TEST(test_stage_edges)
{
	struct kvs_config cfg;
	struct kvs_key a = key_of(31, 0), f = key_of(32, 0), to = key_of(33, 0);
	struct kvs_pin p;
	uint32_t s;

	test_config(&cfg, 8, 4096);
	cfg.loader_wait_timeout_ms = 5000;
	struct kvs_cache *c = open_ok(&cfg), *d = open_ok(&cfg);
	load_one(c, 30); /* slot 0 */
	uint32_t old = load_one(c, 31);
	ck_assert_uint_ne(old, 0);
	ck_assert_int_eq(kvs_cache_stage_claim(c, &s), 0);
	memset(kvs_cache_stage_data(c, s), (int)(a.shard * 7 + a.block_hi) & 0xff, 4096);
	ck_assert_int_eq(kvs_cache_stage_publish(c, s, &a, 4096, 0), 1);
	ck_assert_uint_eq(load_relaxed(&c->slots[old].state), KVS_SLOT_FREE);
	uint64_t t0 = mono_ms();
	ck_assert_int_eq(kvs_cache_pin_ready(d, &a, &p), KVS_PIN_HIT); /* the stripe is free */
	ck_assert_uint_eq(p.slot, s);
	ck_assert(pattern_ok(d, &p, &a));
	kvs_cache_release(d, &p);
	ck_assert_int_eq(kvs_cache_pin_ready(c, &a, &p), KVS_PIN_HIT); /* for its own too */
	kvs_cache_release(c, &p);
	ck_assert_uint_lt(mono_ms() - t0, 100);
	/* d's claim, published by c (whose process slot is the lower one). */
	ck_assert_int_eq(kvs_cache_stage_claim(d, &s), 0);
	ck_assert_int_eq(kvs_cache_stage_publish(c, s, &to, 4096, 0), -EINVAL);
	ck_assert_int_eq(kvs_cache_lookup(c, &to), -ENOENT);
	kvs_cache_stage_drop(d, s);
	/* A failed load, its last pin gone: left for a retry, not moved. */
	ck_assert_int_eq(kvs_cache_pin(c, &f, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	kvs_cache_mark_failed(c, &p, EIO);
	kvs_cache_release(c, &p);
	ck_assert_int_eq(kvs_cache_rekey(c, &f, &to), 0);
	ck_assert_int_eq(kvs_cache_lookup(c, &to), -ENOENT);
	/* The stripe of a's key stuck (a word of no thread): an error, nothing moved. */
	pthread_mutex_t *mu = &c->stripes[bucket_stripe(c, key_bucket(c, &a))].mu;
	mu->__data.__lock = NO_TID;
	ck_assert_int_eq(kvs_cache_rekey(c, &a, &to), -EUCLEAN);
	mu->__data.__lock = 0;
	ck_assert_int_eq(kvs_cache_lookup(c, &to), -ENOENT);
	ck_assert_int_eq(kvs_cache_pin_ready(c, &a, &p), KVS_PIN_HIT);
	kvs_cache_release(c, &p);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* ------------------------------------------------------------------ concurrency */

#define NPROC 8
#define NKEYS 64

struct race_board {
	_Atomic int owners[NKEYS];
	_Atomic int bad[NPROC];
	_Atomic int go;
};

START_TEST(test_one_owner_per_key)
{
	struct kvs_config cfg;
	pid_t pids[NPROC];

	test_config(&cfg, 128, 4096);
	struct kvs_cache *parent = open_ok(&cfg); /* creates the region */
	struct race_board *bd = shared_anon(sizeof(*bd));
	for (int n = 0; n < NPROC; n++) {
		pids[n] = fork_alone();
		ck_assert(pids[n] >= 0);
		if (pids[n])
			continue;
		kvs_cache_forget(parent);
		struct kvs_cache *c = NULL;
		if (kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &c, NULL, 0))
			_exit(2);
		while (!bd->go)
			;
		for (int i = 0; i < NKEYS; i++) {
			int kk = (i + n * 8) % NKEYS; /* rotated, so ranks collide differently */
			struct kvs_key k = key_of(5, (uint64_t)kk);
			struct kvs_pin p;
			int r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p);

			if (r == KVS_PIN_OWNER) {
				atomic_fetch_add(&bd->owners[kk], 1);
				usleep(200);
				load_pattern(c, &p, &k);
			} else if (r == KVS_PIN_WAIT) {
				if (kvs_cache_wait(c, &p, 5000000000ull))
					atomic_fetch_add(&bd->bad[n], 1);
			} else if (r != KVS_PIN_HIT) {
				_exit(3);
			}
			if (!pattern_ok(c, &p, &k))
				atomic_fetch_add(&bd->bad[n], 1);
			kvs_cache_release(c, &p);
		}
		kvs_cache_close(c);
		_exit(0);
	}
	bd->go = 1;
	reap_children(pids, NPROC);
	for (int i = 0; i < NKEYS; i++)
		ck_assert_int_eq(bd->owners[i], 1);
	for (int n = 0; n < NPROC; n++)
		ck_assert_int_eq(bd->bad[n], 0);
	ck_assert_uint_eq(pinned_slots(parent), 0);
	kvs_cache_close(parent);
	remove_region(&cfg);
}
END_TEST

START_TEST(test_failure_reaches_waiters)
{
	struct kvs_config cfg;
	pid_t pids[NPROC - 1];
	struct kvs_key k = key_of(9, 9);
	struct kvs_pin own;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	_Atomic int *res = shared_anon(4096);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &own), KVS_PIN_OWNER);
	for (int n = 0; n < NPROC - 1; n++) {
		pids[n] = fork_alone();
		if (pids[n])
			continue;
		kvs_cache_forget(c);
		struct kvs_cache *cc = NULL;
		struct kvs_pin p;
		if (kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &cc, NULL, 0) ||
		    kvs_cache_pin(cc, &k, KVS_ALLOC_LOAD, &p) != KVS_PIN_WAIT)
			_exit(2);
		atomic_fetch_add(&res[0], 1);
		res[1 + n] = kvs_cache_wait(cc, &p, 10000000000ull);
		kvs_cache_release(cc, &p);
		kvs_cache_close(cc);
		_exit(0);
	}
	while (res[0] < NPROC - 1)
		usleep(1000);
	usleep(100000); /* let them reach the futex */
	kvs_cache_mark_failed(c, &own, ENOMSG);
	kvs_cache_release(c, &own);
	reap_children(pids, NPROC - 1);
	for (int n = 0; n < NPROC - 1; n++)
		ck_assert_int_eq(res[1 + n], -ENOMSG);
	/* Retry after the failure: the next pinner owns it. */
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &own), KVS_PIN_OWNER);
	load_pattern(c, &own, &k);
	kvs_cache_release(c, &own);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* ------------------------------------------------------------------ crash */

/* Fork a child that attaches, runs hold() and then waits to be killed; return once it has
 * run hold(). */
static pid_t spawn_holder(struct kvs_cache *parent, const struct kvs_config *cfg,
			  void (*hold)(struct kvs_cache *), _Atomic int *ready)
{
	pid_t pid = fork_alone();

	ck_assert(pid >= 0);
	if (pid) {
		wait_ready(ready, pid);
		return pid;
	}
	kvs_cache_forget(parent);
	struct kvs_cache *c = NULL;
	if (kvs_cache_open(KVS_CACHE_PARAMS(cfg), 0, &c, NULL, 0))
		_exit(2);
	hold(c);
	*ready = 1;
	for (;;)
		pause();
}

static void hold_load(struct kvs_cache *c)
{
	struct kvs_key k = key_of(11, 0);
	struct kvs_pin p;

	if (kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p) != KVS_PIN_OWNER)
		_exit(4);
}

/* Run NPROC-2 waiters on key (11, 0): each must see the owner's death within a second, then
 * load it themselves (exactly one owner of the retry). */
static void waiters_survive(struct kvs_cache *parent, const struct kvs_config *cfg, pid_t victim,
			    struct kvs_key k)
{
	pid_t pids[NPROC - 2];
	_Atomic int *res = shared_anon(4096);

	for (int n = 0; n < NPROC - 2; n++) {
		pids[n] = fork_alone();
		if (pids[n])
			continue;
		kvs_cache_forget(parent);
		struct kvs_cache *c = NULL;
		struct kvs_pin p;
		if (kvs_cache_open(KVS_CACHE_PARAMS(cfg), 0, &c, NULL, 0))
			_exit(2);
		atomic_fetch_add(&res[0], 1);
		uint64_t t0 = mono_ms();
		int r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p);
		if (r == KVS_PIN_WAIT) {
			/* The owner died: the load fails and a waiter reads the data itself. */
			r = kvs_cache_wait(c, &p, 10000000000ull);
			if (r == -EOWNERDEAD)
				atomic_fetch_add(&res[1], 1);
			else if (r || !pattern_ok(c, &p, &k))
				_exit(5);
		} else if (r == KVS_PIN_OWNER) {
			/* Everyone before us released the failed slot: we own the retry. */
			atomic_fetch_add(&res[2], 1);
			load_pattern(c, &p, &k);
		} else if (r != KVS_PIN_HIT) {
			_exit(6);
		}
		kvs_cache_release(c, &p);
		res[3 + n] = (int)(mono_ms() - t0);
		kvs_cache_close(c);
		_exit(0);
	}
	while (res[0] < NPROC - 2)
		usleep(1000);
	usleep(50000);
	uint64_t t0 = mono_ms();
	kill(victim, SIGKILL);
	waitpid(victim, NULL, 0);
	reap_children(pids, NPROC - 2);
	ck_assert_uint_lt(mono_ms() - t0, 1000);
	for (int n = 0; n < NPROC - 2; n++)
		ck_assert_int_lt(res[3 + n], 1500);
	ck_assert_int_ge(res[1], 1); /* the death reached the waiters as EOWNERDEAD */
	kvs_cache_reap(parent);
	ck_assert_uint_eq(pinned_slots(parent), 0);
	/* The retry after the failure: the next pinner owns it (or hits a retry's result). */
	struct kvs_pin p;
	int r = kvs_cache_pin(parent, &k, KVS_ALLOC_LOAD, &p);
	ck_assert(r == KVS_PIN_OWNER || r == KVS_PIN_HIT);
	if (r == KVS_PIN_OWNER)
		load_pattern(parent, &p, &k);
	ck_assert(pattern_ok(parent, &p, &k));
	kvs_cache_release(parent, &p);
	ck_assert_uint_eq(pinned_slots(parent), 0);
}

START_TEST(test_owner_killed)
{
	struct kvs_config cfg;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	_Atomic int *ready = shared_anon(4096);
	pid_t victim = spawn_holder(c, &cfg, hold_load, ready);
	waiters_survive(c, &cfg, victim, key_of(11, 0));
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

static void hold_lock(struct kvs_cache *c)
{
	struct kvs_key k = key_of(11, 0);
	struct kvs_pin p;

	/* Own the load and sit inside the key's stripe. */
	if (kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p) != KVS_PIN_OWNER)
		_exit(4);
	if (kvs_cache_test_lock_key(c, &k))
		_exit(5);
}

START_TEST(test_lock_holder_killed)
{
	struct kvs_config cfg;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	_Atomic int *ready = shared_anon(4096);
	pid_t victim = spawn_holder(c, &cfg, hold_lock, ready);
	waiters_survive(c, &cfg, victim, key_of(11, 0));
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

START_TEST(test_dead_process_reaped_on_attach)
{
	struct kvs_config cfg;
	struct kvs_region_info info;
	struct kvs_counters tot;

	test_config(&cfg, 16, 4096);
	cfg.cache_max_processes = 2;
	struct kvs_cache *c = open_ok(&cfg);
	_Atomic int *ready = shared_anon(4096);
	pid_t victim = spawn_holder(c, &cfg, hold_load, ready);
	kvs_cache_count(c, KVS_CTR_requests, 5);
	kill(victim, SIGKILL);
	waitpid(victim, NULL, 0);
	/* The table is full of one live and one dead process: attach reclaims the dead one. */
	struct kvs_cache *d = open_ok(&cfg);
	ck_assert_uint_eq(pinned_slots(c), 0);
	ck_assert_int_eq(kvs_cache_stat(c, &info, &tot, NULL, 0), 2);
	ck_assert_uint_eq(info.processes_attached, 2);
	kvs_cache_close(d);
	kvs_cache_close(c);
	/* Totals survive the processes. */
	struct kvs_cache *w = NULL;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_WATCH, &w, NULL, 0), 0);
	ck_assert_int_eq(kvs_cache_stat(w, &info, &tot, NULL, 0), 0);
	ck_assert_uint_eq(tot.v[KVS_CTR_requests], 5);
	kvs_cache_close(w);
	remove_region(&cfg);
}
END_TEST

/* A waiter dies holding its pin; the owner fails and releases.  The slot must come back for a
 * retry without anyone calling kvs_cache_reap by hand: the failure itself triggers reaping. */
START_TEST(test_dead_waiter_does_not_keep_failure)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(12, 0);
	struct kvs_pin own, p;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	_Atomic int *ready = shared_anon(4096);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &own), KVS_PIN_OWNER);
	pid_t pid = fork_alone();
	if (pid == 0) {
		struct kvs_cache *cc = NULL;
		kvs_cache_forget(c);
		if (kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &cc, NULL, 0) ||
		    kvs_cache_pin(cc, &k, KVS_ALLOC_LOAD, &p) != KVS_PIN_WAIT)
			_exit(2);
		*ready = 1;
		for (;;)
			pause();
	}
	wait_ready(ready, pid);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	kvs_cache_mark_failed(c, &own, EIO);
	kvs_cache_release(c, &own);
	int r = -1;
	uint64_t t0 = mono_ms();
	while (mono_ms() - t0 < 2000) {
		r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p);
		if (r == KVS_PIN_OWNER)
			break;
		ck_assert_int_eq(r, KVS_PIN_WAIT);
		ck_assert_int_eq(kvs_cache_wait(c, &p, 1000000), -EIO);
		kvs_cache_release(c, &p);
		usleep(20000);
	}
	ck_assert_int_eq(r, KVS_PIN_OWNER);
	load_pattern(c, &p, &k);
	kvs_cache_release(c, &p);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* A slot whose pages could not be allocated is never handed out. */
START_TEST(test_noroom_slots_unused)
{
	struct kvs_config cfg;
	struct kvs_pin p;

	test_config(&cfg, 8, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	/* Let the background walk finish first, or it would overwrite what we pretend. */
	for (int i = 0; i < 5000 && c->hdr->populated < 8; i++)
		usleep(1000);
	for (uint32_t i = 3; i < 8; i++)
		c->fpages[i] = KVS_PAGES_NOROOM; /* as if /dev/shm had filled up */
	for (uint64_t b = 0; b < 20; b++) {
		struct kvs_key k = key_of(400 + b, 0);
		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
		ck_assert_uint_lt(p.slot, 3);
		ck_assert_uint_eq(c->fpages[frame_of(c, p.slot)], KVS_PAGES_OK);
		load_pattern(c, &p, &k);
		kvs_cache_release(c, &p);
	}
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Wait (5 s at most) until the walk has reached at least min, then 200 ms more for it to go
 * past it if it would; returns where it is then. */
static uint32_t walk_reached(struct kvs_cache *c, uint32_t min)
{
	for (int i = 0; i < 500 && load_relaxed(&c->hdr->populated) < min; i++)
		usleep(10000);
	usleep(200000);
	return load_relaxed(&c->hdr->populated);
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec / 1e6;
}

/* cache.populate = ahead: the walk stays one window (128 slots of 1 MiB) past the hand, sleeps
 * without burning CPU, and follows the allocators when they come within half a window. */
START_TEST(test_populate_ahead)
{
	struct kvs_config cfg;
	struct kvs_region_info info;
	struct kvs_counters t;
	struct kvs_pin p;

	test_config(&cfg, 320, 1u << 20);
	cfg.cache_populate = KVS_POPULATE_AHEAD;
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_uint_eq(c->ahead_window, 128);
	ck_assert_uint_eq(walk_reached(c, 128), 128);
	double cpu0 = cpu_s();
	usleep(300000);
	ck_assert_msg(cpu_s() - cpu0 < 0.05, "an idle walk burnt %.3f s of CPU in 0.3 s",
		      cpu_s() - cpu0);
	for (uint64_t b = 0; b < 80; b++) {
		struct kvs_key k = key_of(700 + b, 0);
		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
		ck_assert_uint_eq(load_relaxed(&c->fpages[frame_of(c, p.slot)]), KVS_PAGES_OK);
		load_pattern(c, &p, &k);
		kvs_cache_release(c, &p);
	}
	/* Woken within half a window of its end, the walk reads the hand then: it ends at least
	 * half a window past the last claim, and never more than a window and a chunk. */
	uint32_t at = walk_reached(c, 80 + 64);
	ck_assert_msg(at >= 80 + 64 && at <= 80 + 128 + 16, "the walk stopped at %u", at);
	ck_assert_int_eq(kvs_cache_stat(c, &info, &t, NULL, 0), 1);
	ck_assert_uint_eq(info.populate_mode, KVS_POPULATE_AHEAD);
	ck_assert_int_eq(info.populate_err, 0);
	ck_assert_uint_eq(t.v[KVS_CTR_pages_ns] > 0, 0); /* no allocator allocated pages itself */
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* A region is usable at once; a background walk allocates its pages. */
START_TEST(test_background_population)
{
	struct kvs_config cfg;
	struct kvs_region_info info;
	struct kvs_counters t;

	test_config(&cfg, 96, 1u << 20);
	struct kvs_cache *c = open_ok(&cfg);
	for (int i = 0; i < 5000 && c->hdr->populated < 96; i++)
		usleep(1000);
	ck_assert_int_eq(kvs_cache_stat(c, &info, &t, NULL, 0), 1);
	ck_assert_uint_eq(info.slots_populated, 96);
	ck_assert_int_eq(info.populate_err, 0);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Where /dev/shm cannot back the pages, population reports ENOSPC instead of a SIGBUS, by
 * fallocate and by faults. */
START_TEST(test_populate_full_tmpfs)
{
	char dir[] = "/tmp/kvs_tmpfs.XXXXXX", path[64], cmd[128];

	ck_assert(mkdtemp(dir));
	snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=1M tmpfs %s 2>/dev/null", dir);
	if (system(cmd) != 0) {
		rmdir(dir);
		fprintf(stderr, "check_cache: cannot mount a small tmpfs here; skipped\n");
		return;
	}
	snprintf(path, sizeof(path), "%s/region", dir);
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	ck_assert(fd >= 0);
	ck_assert_int_eq(ftruncate(fd, 8 << 20), 0);
	char *m = mmap(NULL, 8 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert(m != MAP_FAILED);
	ck_assert_int_eq(kvs_populate_range(fd, m, 0, 512 << 10, false), 0);
	ck_assert_int_eq(kvs_populate_range(fd, m, 0, 8 << 20, false), ENOSPC);
	/* By faults (huge=advise, hugetlbfs): the same ENOSPC, never a SIGBUS. */
	ck_assert_int_eq(kvs_populate_range(fd, m, 512 << 10, 256 << 10, true), 0);
	ck_assert_int_eq(kvs_populate_range(fd, m, 0, 8 << 20, true), ENOSPC);
	munmap(m, 8 << 20);
	close(fd);
	snprintf(cmd, sizeof(cmd), "umount %s", dir);
	ck_assert_int_eq(system(cmd), 0);
	rmdir(dir);
}
END_TEST

/* Remove the regions of a case that failed before removing its own. */
static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -f /dev/shm/kvshim.%u.check.%d.*", (unsigned)getuid(),
		 (int)getpid());
	if (system(cmd) != 0)
		fprintf(stderr, "check_cache: %s failed\n", cmd);
}

/* Run fn in a child process that sees a tmpfs of `size` as /dev/shm (a private mount
 * namespace).  Returns the child's wait status, or -1 when this machine cannot do it. */
static int with_small_shm(const char *size, void (*fn)(void))
{
	pid_t pid = fork_alone();
	int st;

	ck_assert(pid >= 0);
	if (pid == 0) {
		if (unshare(CLONE_NEWNS) || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
		    mount("tmpfs", "/dev/shm", "tmpfs", 0, size))
			_exit(77);
		fn();
		_exit(0);
	}
	ck_assert(waitpid(pid, &st, 0) == pid);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
		fprintf(stderr,
			"check_cache: no private /dev/shm here (unshare, mount); skipped\n");
		return -1;
	}
	return st;
}

/* A region too big for /dev/shm: an error at creation, no SIGBUS, nothing left behind. */
static void create_too_big(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	char msg[256];

	test_config(&cfg, 200000, 4096); /* ~30 MiB of control plane */
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	if (r != -ENOSPC || !strstr(msg, "No space"))
		_exit(3);
	if (system("ls /dev/shm | grep -q kvshim") == 0)
		_exit(4); /* a temporary region was left behind */
}

START_TEST(test_region_too_big_for_shm)
{
	int st = with_small_shm("size=2M", create_too_big);

	if (st != -1)
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
}
END_TEST

/* /dev/shm fills up after the region is built: loads go on, into the slots that exist. */
static void fill_then_load(void)
{
	struct kvs_config cfg;
	struct kvs_pin p;

	test_config(&cfg, 4096, 4096); /* 16 MiB of data in a 40 MiB /dev/shm */
	struct kvs_cache *c = open_ok(&cfg);
	for (int i = 0; i < 100; i++)
		kvs_cache_reap_maybe(c); /* no-op but for the walker restart path */
	int fd = open("/dev/shm/filler", O_RDWR | O_CREAT, 0600);
	/* Fill before the walk is done: most slots have no pages when space runs out. */
	while (fd >= 0 && fallocate(fd, 0, 0, 64 << 20) == 0)
		;
	if (fd >= 0)
		while (fallocate(fd, 0, lseek(fd, 0, SEEK_END), 4096) == 0)
			lseek(fd, 4096, SEEK_END);
	for (uint64_t b = 0; b < 8192; b++) {
		struct kvs_key k = key_of(b, 0);
		int r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p);

		if (r == -ENOSPC)
			continue;
		if (r != KVS_PIN_OWNER)
			_exit(5);
		memset(kvs_cache_data(c, &p), 1, 4096); /* a SIGBUS here would kill the child */
		kvs_cache_mark_ready(c, &p, 4096);
		kvs_cache_release(c, &p);
	}
	kvs_cache_close(c);
}

START_TEST(test_shm_fills_up_later)
{
	int st = with_small_shm("size=40M", fill_then_load);

	if (st != -1)
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
}
END_TEST

/* On a file system without fallocate the fallback (MADV_POPULATE_WRITE) must work too. */
START_TEST(test_populate_without_fallocate)
{
	struct kvs_config cfg;
	struct kvs_pin p;
	struct kvs_key k = key_of(3, 3);

	kvs_populate_test_no_fallocate = true;
	test_config(&cfg, 64, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	ck_assert_uint_eq(c->fpages[frame_of(c, p.slot)], KVS_PAGES_OK);
	load_pattern(c, &p, &k);
	kvs_cache_release(c, &p);
	kvs_cache_close(c);
	remove_region(&cfg);
	kvs_populate_test_no_fallocate = false;
}
END_TEST

/* How many of this process's descriptors are of the file (dev, ino), and whether one of its
 * mappings is.  By inode, since a region's descriptors are named "/dev/shm/#N (deleted)" in
 * the process that built it (an O_TMPFILE then linked).  System calls and no malloc: it runs
 * in a fork child of a process whose walk is running. */
struct d64 {
	uint64_t ino;
	int64_t off;
	unsigned short reclen;
	unsigned char type;
	char name[];
};

static int fds_of(dev_t dev, ino_t ino)
{
	char buf[4096];
	int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC), n = 0;
	long got;

	while (dfd >= 0 && (got = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
		for (long at = 0; at < got; at += ((struct d64 *)(buf + at))->reclen) {
			const char *name = ((struct d64 *)(buf + at))->name;
			struct stat st;
			int fd = 0;

			if (name[0] < '0' || name[0] > '9')
				continue;
			for (; *name >= '0' && *name <= '9'; name++)
				fd = fd * 10 + (*name - '0');
			if (fd != dfd && fstat(fd, &st) == 0 && st.st_dev == dev &&
			    st.st_ino == ino)
				n++;
		}
	}
	if (dfd >= 0)
		close(dfd);
	return n;
}

static bool maps_of(dev_t dev, ino_t ino)
{
	static char buf[1 << 16]; /* one line at a time: "start-end perms offset MAJ:MIN inode" */
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	size_t have = 0;
	bool found = false;
	long got;

	while (fd >= 0 && !found && (got = read(fd, buf + have, sizeof(buf) - 1 - have)) > 0) {
		have += (size_t)got;
		char *line = buf, *nl;
		while (!found && (nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
			char *f = line;
			unsigned long v[3] = {0, 0, 0}; /* major, minor, inode */
			int field = 0;

			for (; f < nl && field < 3; f++)
				field += *f == ' ';
			for (int k = 0; k < 3 && f < nl; k++, f++)
				for (; f < nl && *f != ':' && *f != ' '; f++)
					v[k] = v[k] * (k < 2 ? 16 : 10) +
					       (unsigned long)(*f <= '9' ? *f - '0'
									 : (*f | 32) - 'a' + 10);
			found = v[2] == ino && v[0] == major(dev) && v[1] == minor(dev);
			line = nl + 1;
		}
		have -= (size_t)(line - buf);
		memmove(buf, line, have);
	}
	if (fd >= 0)
		close(fd);
	return found;
}

/* A fork child holds neither the walker's descriptor nor its mapping of the region, nor the
 * handle's: the parent, whose walk is running as it forks, holds both descriptors. */
START_TEST(test_fork_child_drops_walker)
{
	struct kvs_config cfg;
	struct stat rs;
	char path[256];

	test_config(&cfg, 512, 1u << 20); /* a walk long enough to be running at fork */
	struct kvs_cache *c = open_ok(&cfg);
	kvs_cache_path(KVS_CACHE_PARAMS(&cfg), path, sizeof(path));
	ck_assert_int_eq(stat(path, &rs), 0);
	int before = fds_of(rs.st_dev, rs.st_ino);
	pid_t pid = fork(); /* not fork_alone: the walk must be running (the child only forgets) */
	if (pid == 0) {
		kvs_cache_forget(c);
		_exit(fds_of(rs.st_dev, rs.st_ino) ? 6 : maps_of(rs.st_dev, rs.st_ino) ? 7 : 0);
	}
	ck_assert_msg(before == 2,
		      "%d descriptors of the region before the fork: the walk has "
		      "ended, and the case tests nothing",
		      before);
	ck_assert(maps_of(rs.st_dev, rs.st_ino));
	int st;
	ck_assert(waitpid(pid, &st, 0) == pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "child status %#x (6: a descriptor of the region, 7: a mapping)", st);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* ------------------------------------------------------------------ bounded waits */

static pthread_mutex_t *stripe_mutex(struct kvs_cache *c, const struct kvs_key *k)
{
	return &c->stripes[bucket_stripe(c, key_bucket(c, k))].mu;
}

/* A lock word naming a thread that does not exist: every locker gives up fast, stat answers. */
START_TEST(test_lock_word_of_no_thread)
{
	struct kvs_config cfg;
	struct kvs_region_info info;
	struct kvs_counters tot;
	struct kvs_key k = key_of(21, 0);
	struct kvs_pin p;

	test_config(&cfg, 16, 4096); /* loader.wait_timeout_ms stays 30 s */
	struct kvs_cache *c = open_ok(&cfg);
	pthread_mutex_t *mu = stripe_mutex(c, &k);
	mu->__data.__lock = NO_TID;
	uint64_t t0 = mono_ms();
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), -EUCLEAN);
	ck_assert_uint_lt(mono_ms() - t0, 300);
	/* Remembered: the next lockers do not wait again. */
	t0 = mono_ms();
	ck_assert_int_eq(kvs_cache_lookup(c, &k), -EUCLEAN);
	ck_assert_int_eq(kvs_cache_pin_ready(c, &k, &p), -EUCLEAN);
	ck_assert_uint_lt(mono_ms() - t0, 20);
	/* The same in proc_lock: stat answers from what it can read, and says so. */
	c->hdr->proc_lock.__data.__lock = NO_TID;
	struct kvs_cache *w = NULL;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_WATCH, &w, NULL, 0), 0);
	t0 = mono_ms();
	ck_assert_int_eq(kvs_cache_stat(w, &info, &tot, NULL, 0), 1);
	ck_assert(info.procs_unlocked);
	ck_assert_int_eq(kvs_cache_stat(c, &info, &tot, NULL, 0), 1);
	ck_assert(info.procs_unlocked);
	ck_assert_uint_lt(mono_ms() - t0, 3000);
	/* Attaching needs proc_lock: refused, not hung. */
	struct kvs_cache *d = NULL;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &d, NULL, 0), -EUCLEAN);
	/* Once the words are sane again, everything works. */
	mu->__data.__lock = 0;
	c->hdr->proc_lock.__data.__lock = 0;
	ck_assert_int_eq(kvs_cache_stat(w, &info, &tot, NULL, 0), 1);
	ck_assert(!info.procs_unlocked);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	load_pattern(c, &p, &k);
	kvs_cache_release(c, &p);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(w);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* A release that cannot take its stripe is kept and retried: by the next release, of any slot,
 * or by the periodic reap. */
START_TEST(test_deferred_release_retried)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(23, 0), k2;
	struct kvs_pin p, q;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	pthread_mutex_t *mu = stripe_mutex(c, &k);
	for (uint64_t sh = 1;; sh++) {
		k2 = key_of(23, sh);
		if (stripe_mutex(c, &k2) != mu)
			break;
	}
	for (int round = 0; round < 2; round++) {
		int r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p);

		ck_assert_int_eq(r, round ? KVS_PIN_HIT : KVS_PIN_OWNER);
		if (!round)
			load_pattern(c, &p, &k);
		mu->__data.__lock = NO_TID;
		kvs_cache_release(c, &p);
		ck_assert_uint_eq(c->me->pin[p.entry], p.slot + 1); /* still counted */
		ck_assert_uint_eq(c->slots[p.slot].refs, 1);
		mu->__data.__lock = 0;
		if (round == 0) {
			ck_assert_int_ge(kvs_cache_pin(c, &k2, KVS_ALLOC_LOAD, &q), 0);
			kvs_cache_release(c, &q);
		} else {
			c->last_reap_ns = 0; /* due now */
			kvs_cache_reap_maybe(c);
		}
		ck_assert_uint_eq(c->me->pin[p.entry], 0);
		ck_assert_uint_eq(pinned_slots(c), 0);
	}
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Fork a process that attaches, takes key's stripe and stops itself there (SIGSTOP: a
 * throttled pod, a debugger); return once it is stopped.  Continued, it exits inside the
 * stripe, and the next locker repairs it. */
static pid_t stopped_in_stripe(struct kvs_cache *parent, const struct kvs_config *cfg,
			       const struct kvs_key *key)
{
	pid_t pid = fork_alone();
	int st;

	ck_assert(pid >= 0);
	if (pid == 0) {
		struct kvs_cache *cc = NULL;

		kvs_cache_forget(parent);
		if (kvs_cache_open(KVS_CACHE_PARAMS(cfg), 0, &cc, NULL, 0) ||
		    kvs_cache_test_lock_key(cc, key))
			_exit(2);
		raise(SIGSTOP);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, WUNTRACED), pid);
	ck_assert_msg(WIFSTOPPED(st), "stripe holder status %#x", st);
	return pid;
}

/* A process stopped inside a stripe: another process's pin gives up after
 * loader.wait_timeout_ms, and once the holder is gone nothing is stuck and no pin leaks. */
START_TEST(test_stopped_lock_holder)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(22, 0);
	struct kvs_pin p, q;
	int st;

	test_config(&cfg, 16, 4096);
	cfg.loader_wait_timeout_ms = 500;
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	load_pattern(c, &p, &k);
	pid_t pid = stopped_in_stripe(c, &cfg, &k);
	uint64_t t0 = mono_ms();
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &q), -EUCLEAN);
	uint64_t took = mono_ms() - t0;
	ck_assert_uint_ge(took, 400);
	ck_assert_uint_lt(took, 1500);
	/* Our own release cannot take the stripe either: deferred, the pin still counts, and
	 * the stuck stripe costs it no second wait. */
	t0 = mono_ms();
	kvs_cache_release(c, &p);
	ck_assert_uint_lt(mono_ms() - t0, 100);
	ck_assert_uint_eq(c->me->pin[p.entry], p.slot + 1);
	ck_assert_uint_eq(pinned_slots(c), 1);
	kill(pid, SIGCONT);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &q), KVS_PIN_HIT);
	ck_assert(pattern_ok(c, &q, &k));
	kvs_cache_release(c, &q); /* returns the deferred pin too */
	ck_assert_uint_eq(c->me->pin[p.entry], 0);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_reap(c);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* What the holder-word thread of test_lock_wait_sleeps_and_sees_a_holder_go does: 400 ms into
 * the wait, with the lock word steady (the stopped holder's TID), the holder word comes to name
 * a process slot whose liveness lock nobody holds, as when the holder's process has gone
 * without the kernel's repair (a robust list it corrupted). */
struct holder_job {
	struct kvs_cache *c;
	uint32_t stripe;
};

static void *holder_goes(void *arg)
{
	struct holder_job *j = arg;
	uint32_t slot = j->c->nprocs - 1; /* free: only two processes are attached */

	usleep(400000);
	store_relaxed(&j->c->stripes[j->stripe].holder, (slot + 1) << 16 | 1);
	return NULL;
}

/* A wait for a stripe sleeps between its looks at the lock word (a waiter costs no CPU), and
 * looks at the holder for as long as it waits: a holder found gone 400 ms into the wait is
 * given up on within a slice or two, not at the timeout. */
START_TEST(test_lock_wait_sleeps_and_sees_a_holder_go)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(27, 0);
	struct kvs_pin p;
	pthread_t t;
	int st;

	test_config(&cfg, 16, 4096);
	cfg.loader_wait_timeout_ms = 5000;
	struct kvs_cache *c = open_ok(&cfg);
	pid_t pid = stopped_in_stripe(c, &cfg, &k);
	struct holder_job j = {c, bucket_stripe(c, key_bucket(c, &k))};
	ck_assert_int_eq(pthread_create(&t, NULL, holder_goes, &j), 0);
	double cpu0 = cpu_s();
	uint64_t t0 = mono_ms();
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), -EUCLEAN);
	uint64_t took = mono_ms() - t0;
	double cpu = cpu_s() - cpu0;
	pthread_join(t, NULL);
	ck_assert_msg(took >= 400 && took < 400 + 500, "gave up after %llu ms",
		      (unsigned long long)took);
	ck_assert_msg(cpu < 0.1, "a wait of %llu ms burnt %.3f s of CPU", (unsigned long long)took,
		      cpu);
	kill(pid, SIGKILL);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* What the holder thread of test_live_holder_thread_waited_for does: take the key's stripe
 * on the shared handle, say so, hold it for 300 ms while running, let go. */
struct hold_job {
	struct kvs_cache *c;
	struct kvs_key k;
	_Atomic int held;
};

static void *hold_a_while(void *arg)
{
	struct hold_job *j = arg;

	if (kvs_cache_test_lock_key(j->c, &j->k)) {
		atomic_store(&j->held, -1);
		return NULL;
	}
	atomic_store(&j->held, 1);
	usleep(300000);
	kvs_stripe_unlock(j->c, bucket_stripe(j->c, key_bucket(j->c, &j->k)));
	return NULL;
}

/* A live holder that is another thread of this process (an engine's threads share one
 * handle) is waited for, however long it holds the stripe within the timeout: judged by its
 * TID, which names a thread that exists, not taken for dead after two slices. */
START_TEST(test_live_holder_thread_waited_for)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(28, 0);
	struct kvs_pin p;
	pthread_t t;

	test_config(&cfg, 16, 4096);
	cfg.loader_wait_timeout_ms = 5000;
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	load_pattern(c, &p, &k);
	kvs_cache_release(c, &p);
	struct hold_job j = {c, k, 0};
	ck_assert_int_eq(pthread_create(&t, NULL, hold_a_while, &j), 0);
	while (!atomic_load(&j.held))
		usleep(1000);
	ck_assert_int_eq(atomic_load(&j.held), 1);
	uint64_t t0 = mono_ms();
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_HIT);
	ck_assert_uint_ge(mono_ms() - t0, 200);
	ck_assert(pattern_ok(c, &p, &k));
	kvs_cache_release(c, &p);
	pthread_join(t, NULL);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* The reap of a process that died owning a load fails that load at once, with no waiter
 * needed to notice: EOWNERDEAD is recorded and counted, the slot (its last pin returned) is
 * left for a retry, and the next pin owns it at once. */
START_TEST(test_reap_fails_a_dead_owners_load)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(11, 0);
	struct kvs_pin p;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	_Atomic int *ready = shared_anon(4096);
	pid_t victim = spawn_holder(c, &cfg, hold_load, ready);
	kill(victim, SIGKILL);
	waitpid(victim, NULL, 0);
	uint64_t failures = c->me->ctr[KVS_CTR_failures];
	ck_assert_int_eq(kvs_cache_reap(c), 1);
	ck_assert_uint_eq(c->me->ctr[KVS_CTR_failures] - failures, 1);
	int failed = 0;
	for (uint32_t i = 0; i < c->nslots; i++)
		failed += c->slots[i].key[1] == k.block_hi && c->slots[i].err == EOWNERDEAD;
	ck_assert_int_eq(failed, 1);
	uint64_t t0 = mono_ms();
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	ck_assert_uint_lt(mono_ms() - t0, 100);
	load_pattern(c, &p, &k);
	kvs_cache_release(c, &p);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* A process that dies inside proc_lock: the next locker repairs it and has it (0), and
 * attaching, stat and detaching all work afterwards. */
START_TEST(test_proc_lock_holder_killed)
{
	struct kvs_config cfg;
	struct kvs_region_info info;
	struct kvs_counters tot;
	int st;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	pid_t pid = fork_alone();
	ck_assert(pid >= 0);
	if (pid == 0) {
		struct kvs_cache *cc = NULL;

		kvs_cache_forget(c);
		if (kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &cc, NULL, 0) || kvs_proc_lock(cc))
			_exit(2);
		_exit(0); /* inside proc_lock */
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ck_assert_int_eq(kvs_proc_lock(c), 0);
	kvs_proc_unlock(c);
	struct kvs_cache *d = open_ok(&cfg); /* reaps the dead one under proc_lock */
	ck_assert_int_eq(kvs_cache_stat(c, &info, &tot, NULL, 0), 2);
	ck_assert(!info.procs_unlocked);
	kvs_cache_close(d);
	ck_assert_int_eq(kvs_cache_stat(c, &info, &tot, NULL, 0), 1);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* At /dev/shm's headroom (no page allocation for a while), the sweep still takes free frames
 * whose pages exist, before it evicts anything, and passes over frames without pages
 * without a system call on them. */
START_TEST(test_sweep_at_the_headroom)
{
	struct kvs_config cfg;
	struct kvs_pin p;
	uint32_t used[4];

	test_config(&cfg, 8, 4096);
	cfg.cache_populate = KVS_POPULATE_LAZY;
	struct kvs_cache *c = open_ok(&cfg);
	for (uint64_t b = 0; b < 4; b++) {
		struct kvs_key k = key_of(800 + b, 0);

		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
		load_pattern(c, &p, &k);
		used[b] = frame_of(c, p.slot);
		kvs_cache_release(c, &p);
	}
	uint32_t unknown = 0;
	for (uint32_t f = 0; f < c->nframes; f++)
		unknown += load_relaxed(&c->fpages[f]) == KVS_PAGES_UNKNOWN;
	ck_assert_uint_eq(unknown, c->nframes - 4);
	/* Two files rewritten: their frames are free, with pages. */
	for (uint64_t b = 0; b < 2; b++) {
		struct kvs_key blk = key_of(800 + b, 0);

		ck_assert_int_eq(kvs_cache_invalidate(c, &blk, 0, 0), 1);
	}
	store_relaxed(&c->room_retry_ns, UINT64_MAX); /* as after an ENOSPC */
	uint64_t evictions = c->me->ctr[KVS_CTR_evictions];
	for (uint64_t b = 0; b < 3; b++) {
		struct kvs_key k = key_of(900 + b, 0);

		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
		uint32_t f = frame_of(c, p.slot);
		ck_assert_msg(f == used[0] || f == used[1] || f == used[2] || f == used[3],
			      "frame %u had no pages, and was taken at the headroom", f);
		load_pattern(c, &p, &k);
		kvs_cache_release(c, &p);
		/* The two free frames first; then one of the others is evicted. */
		ck_assert_uint_eq(c->me->ctr[KVS_CTR_evictions] - evictions, b < 2 ? 0 : 1);
	}
	unknown = 0;
	for (uint32_t f = 0; f < c->nframes; f++)
		unknown += load_relaxed(&c->fpages[f]) == KVS_PAGES_UNKNOWN;
	ck_assert_uint_eq(unknown, c->nframes - 4); /* no pages were allocated for the others */
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* What the processes of test_other_namespace_holder say on their pipe: a code and an errno.
 *   L  the holder has the key's stripe          E  it could not attach or lock (a failure)
 *   S  unshare(CLONE_NEWPID) refused            N  ns_last_pid not settable
 *   F  no first process in the new namespace    T  no thread with the chosen TID
 * S, N, F and T are the kernel refusing what the case needs: it skips. */
struct ns_word {
	char code;
	int err;
};

static void ns_say(int fd, char code, int err)
{
	struct ns_word w = {code, err};

	if (write(fd, &w, sizeof(w)) != (ssize_t)sizeof(w))
		_exit(2);
}

/* What the holder thread does: attach, take the key's stripe, say so, hold it for 1.5 s (a
 * throttled or stopped pod), let go. */
struct ns_holder {
	const struct kvs_config *cfg;
	struct kvs_key k;
	int say;
};

static void *ns_hold(void *arg)
{
	struct ns_holder *h = arg;
	struct kvs_cache *cc = NULL;
	int r = kvs_cache_open(KVS_CACHE_PARAMS(h->cfg), 0, &cc, NULL, 0);

	if (!r)
		r = kvs_cache_test_lock_key(cc, &h->k);
	ns_say(h->say, r ? 'E' : 'L', -r);
	if (r)
		return NULL;
	usleep(1500000);
	kvs_stripe_unlock(cc, bucket_stripe(cc, key_bucket(cc, &h->k)));
	return NULL;
}

/* The middle process: a PID namespace of its own, its first process (pid 1 there) with
 * ns_last_pid set so that the holder thread's TID is tid, which names no thread of the
 * test's namespace. */
static int ns_chain(const struct kvs_config *cfg, struct kvs_key k, long tid, int say)
{
	int st;

	if (unshare(CLONE_NEWPID)) {
		ns_say(say, 'S', errno);
		return 0;
	}
	pid_t g = fork();
	if (g < 0) {
		ns_say(say, 'F', errno);
		return 0;
	}
	if (g == 0) {
		struct ns_holder h = {cfg, k, say};
		FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
		pthread_t t;
		int r;

		if (!f || fprintf(f, "%ld", tid - 1) < 0 || fclose(f)) {
			ns_say(say, 'N', errno);
			_exit(0);
		}
		r = pthread_create(&t, NULL, ns_hold, &h);
		if (r) {
			ns_say(say, 'T', r);
			_exit(0);
		}
		pthread_join(t, NULL);
		_exit(0);
	}
	return waitpid(g, &st, 0) == g && WIFEXITED(st) ? WEXITSTATUS(st) : 2;
}

/* Say on stderr where the processes under pid are: each thread's state, wait channel, kernel
 * stack and (with gdb) its own stack, for a case that waited in vain.  Then kill them. */
static void ns_dump(pid_t pid)
{
	char cmd[512], line[512];
	long kids[8];
	int n = 0;

	snprintf(cmd, sizeof(cmd), "/proc/%d/task/%d/children", (int)pid, (int)pid);
	FILE *f = fopen(cmd, "r");
	while (f && n < 7 && fscanf(f, "%ld", &kids[n]) == 1)
		n++;
	if (f)
		fclose(f);
	kids[n++] = pid;
	for (int i = 0; i < n; i++) {
		snprintf(cmd, sizeof(cmd),
			 "for t in /proc/%ld/task/*; do echo \"$t: $(cut -d' ' -f3 $t/stat) "
			 "$(cat $t/wchan)\"; cat $t/stack; done 2>&1; timeout 30 gdb -p %ld -batch "
			 "-ex 'thread apply all bt' 2>&1 | grep '^#\\|^Thread'",
			 kids[i], kids[i]);
		FILE *sh = popen(cmd, "r");
		while (sh && fgets(line, sizeof(line), sh))
			fprintf(stderr, "test_other_namespace_holder: %s", line);
		if (sh)
			pclose(sh);
		kill((pid_t)kids[i], SIGKILL); /* a namespace's first process takes it all along */
	}
}

/* Pods that share /dev/shm each have a PID namespace of their own.  A live holder of a stripe
 * in another namespace, whose TID names no thread of this one, holds it for 1.5 s: a pin here
 * waits for it, as for a holder in its own namespace, and finds the slot (not -EUCLEAN after
 * two slices); stat tells the two processes' namespaces apart. */
START_TEST(test_other_namespace_holder)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(23, 0);
	struct kvs_pin p, q;
	struct ns_word w = {0, 0};
	int say[2], st;

	test_config(&cfg, 16, 4096);
	cfg.loader_wait_timeout_ms = 5000;
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	load_pattern(c, &p, &k);
	kvs_cache_release(c, &p);
	ck_assert_int_eq(pipe(say), 0);
	/* A TID for the holder that no thread of this namespace has. */
	long pid_max = 0;
	FILE *pm = fopen("/proc/sys/kernel/pid_max", "r");
	ck_assert(pm && fscanf(pm, "%ld", &pid_max) == 1);
	fclose(pm);
	long tid = pid_max - 2;
	while (tid > 300 && !(kill((pid_t)tid, 0) < 0 && errno == ESRCH))
		tid--;
	pid_t pid = fork_alone();
	ck_assert(pid >= 0);
	if (pid == 0) {
		kvs_cache_forget(c);
		close(say[0]);
		_exit(ns_chain(&cfg, k, tid, say[1]));
	}
	/* Only the chain holds the pipe's write end: if it dies without a word, read sees the
	 * end of the pipe; if it says nothing for 20 s, where it waits is shown and it is
	 * killed.  Neither waits for Check's timeout. */
	close(say[1]);
	struct pollfd pf = {.fd = say[0], .events = POLLIN};
	int ready = poll(&pf, 1, 20000);
	ssize_t got = ready == 1 ? read(say[0], &w, sizeof(w)) : -1;
	if (ready != 1)
		ns_dump(pid);
	if (got != (ssize_t)sizeof(w)) {
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		ck_abort_msg("the holder's chain %s (exit status %#x)",
			     ready != 1 ? "said nothing for 20 s" : "ended without a word", st);
	}
	if (w.code && strchr("SNFT", w.code)) {
		const char *what[] = {"unshare(CLONE_NEWPID) is refused",
				      "ns_last_pid cannot be set in a new PID namespace",
				      "no process can be started in a new PID namespace",
				      "no thread can be started with the chosen TID"};
		fprintf(stderr, "test_other_namespace_holder: SKIP: %s: %s\n",
			what[strchr("SNFT", w.code) - "SNFT"], strerror(w.err));
	} else {
		ck_assert_msg(w.code == 'L', "the holder could not attach or lock: %s",
			      strerror(w.err));
		struct kvs_region_info info;
		struct kvs_counters totals;
		struct kvs_proc_info procs[4];
		int n = kvs_cache_stat(c, &info, &totals, procs, 4);
		ck_assert_int_eq(n, 2);
		ck_assert(procs[0].pidns && procs[1].pidns && procs[0].pidns != procs[1].pidns);
		ck_assert(procs[0].pid == 1 || procs[1].pid == 1);
		uint64_t t0 = mono_ms();
		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &q), KVS_PIN_HIT);
		uint64_t took = mono_ms() - t0;
		ck_assert_uint_ge(took, 1000);
		ck_assert(pattern_ok(c, &q, &k));
		kvs_cache_release(c, &q);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(say[0]);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* A LOADING slot with pins and no live owner (garbage index, KVS_NIL, a FREE table entry) is
 * failed by its first waiter at once, and the next pin owns the retry. */
START_TEST(test_ownerless_load_taken_over)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(24, 0);
	struct kvs_pin p, q;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	struct kvs_cache *d = open_ok(&cfg);
	const uint32_t owners[] = {0xdeadbeef, KVS_NIL, (uint32_t)cfg.cache_max_processes - 1};

	ck_assert_uint_eq(proc_at(c, owners[2])->state, KVS_PROC_FREE);
	for (int n = 0; n < 3; n++) {
		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
		ck_assert_int_eq(kvs_cache_pin(d, &k, KVS_ALLOC_LOAD, &q), KVS_PIN_WAIT);
		c->slots[p.slot].owner = owners[n];
		uint64_t t0 = mono_ms();
		ck_assert_int_eq(kvs_cache_wait(d, &q, 10000000000ull), -EOWNERDEAD);
		ck_assert_uint_lt(mono_ms() - t0, 1000);
		kvs_cache_release(d, &q);
		kvs_cache_release(c, &p);
	}
	ck_assert_int_eq(kvs_cache_pin(d, &k, KVS_ALLOC_LOAD, &q), KVS_PIN_OWNER);
	load_pattern(d, &q, &k);
	kvs_cache_release(d, &q);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Invalidating more shards than the cache has slots still removes every one of them. */
START_TEST(test_invalidate_longer_than_cache)
{
	struct kvs_config cfg;
	struct kvs_key other = key_of(26, 0), k25 = key_of(25, 25), blk = key_of(25, 0);
	struct kvs_pin p, held;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	for (uint64_t sh = 20; sh < 35; sh++) {
		struct kvs_key k = key_of(25, sh);

		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
		load_pattern(c, &p, &k);
		kvs_cache_release(c, &p);
	}
	ck_assert_int_eq(kvs_cache_pin(c, &other, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	load_pattern(c, &p, &other);
	kvs_cache_release(c, &p);
	ck_assert_int_eq(kvs_cache_pin(c, &k25, KVS_ALLOC_LOAD, &held), KVS_PIN_HIT);
	ck_assert_int_eq(kvs_cache_invalidate(c, &blk, 0, 40), 15);
	for (uint64_t sh = 0; sh <= 40; sh++) {
		struct kvs_key k = key_of(25, sh);

		ck_assert_int_eq(kvs_cache_lookup(c, &k), -ENOENT);
	}
	ck_assert_int_eq(kvs_cache_lookup(c, &other), KVS_SLOT_READY);
	ck_assert(pattern_ok(c, &held, &k25)); /* unhashed, its bytes intact until released */
	kvs_cache_release(c, &held);
	ck_assert_uint_eq(st_of(c->slots[held.slot].state), KVS_SLOT_FREE);
	/* The far end of the shard space: no wrap-around. */
	ck_assert_int_eq(kvs_cache_invalidate(c, &blk, UINT64_MAX - 2, UINT64_MAX), 0);
	ck_assert_int_eq(kvs_cache_invalidate(c, &other, 0, UINT64_MAX), 1);
	ck_assert_int_eq(kvs_cache_lookup(c, &other), -ENOENT);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* What the publisher's slot holds at the instant its state becomes visible (slot.c hook). */
static struct {
	uint32_t state, err, length;
	int calls;
} published;

static void record_published(const struct kvs_slot *s, uint32_t state)
{
	published.state = state;
	published.err = s->err;
	published.length = s->length;
	published.calls++;
}

/* A waiter reads err (or length) as soon as it sees FAILED (or READY): both are stored before
 * the state is published, never after.  The hook runs right after the publishing exchange, so
 * it sees exactly what a waiter woken at that instant would read: the order is checked
 * deterministically, not by a race. */
START_TEST(test_publish_order)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(27, 0);
	struct kvs_pin p, q;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	struct kvs_cache *d = open_ok(&cfg);
	kvs_slot_test_published = record_published;
	/* mark_failed: the waiter gets the owner's errno (the smallest, EPERM, too), not EIO for
	 * a zero. */
	const int errs[] = {EXDEV, EPERM};
	for (int n = 0; n < 2; n++) {
		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
		ck_assert_int_eq(kvs_cache_pin(d, &k, KVS_ALLOC_LOAD, &q), KVS_PIN_WAIT);
		memset(&published, 0, sizeof(published));
		kvs_cache_mark_failed(c, &p, errs[n]);
		ck_assert_int_eq(published.calls, 1);
		ck_assert_uint_eq(published.state, KVS_SLOT_FAILED);
		ck_assert_uint_eq(published.err, errs[n]);
		ck_assert_int_eq(kvs_cache_wait(d, &q, 1000000000ull), -errs[n]);
		kvs_cache_release(d, &q);
		kvs_cache_release(c, &p);
	}
	/* A take-over (kvs_slot_fail_locked) publishes EOWNERDEAD the same way. */
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	ck_assert_int_eq(kvs_cache_pin(d, &k, KVS_ALLOC_LOAD, &q), KVS_PIN_WAIT);
	c->slots[p.slot].owner = KVS_NIL;
	memset(&published, 0, sizeof(published));
	ck_assert_int_eq(kvs_cache_wait(d, &q, 1000000000ull), -EOWNERDEAD);
	ck_assert_int_eq(published.calls, 1);
	ck_assert_uint_eq(published.state, KVS_SLOT_FAILED);
	ck_assert_uint_eq(published.err, EOWNERDEAD);
	kvs_cache_release(d, &q);
	kvs_cache_release(c, &p);
	/* mark_ready: the length is there when READY is. */
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	memset(&published, 0, sizeof(published));
	kvs_cache_mark_ready(c, &p, 1234);
	ck_assert_int_eq(published.calls, 1);
	ck_assert_uint_eq(published.state, KVS_SLOT_READY);
	ck_assert_uint_eq(published.length, 1234);
	kvs_cache_release(c, &p);
	kvs_slot_test_published = NULL;
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

struct pin_job {
	struct kvs_cache *c;
	struct kvs_key k;
	struct kvs_pin p;
	int r;
};

static void *pin_job_run(void *arg)
{
	struct pin_job *j = arg;

	j->r = kvs_cache_pin(j->c, &j->k, KVS_ALLOC_LOAD, &j->p);
	return NULL;
}

/* A pin that lands between the sweep's unlocked look at a victim (refs 0) and its lock of the
 * victim's stripe: the victim is pinned now and must not be evicted.  Deterministic: the test
 * holds the victim's stripe, so the evictor stops exactly there, then pins under that lock. */
START_TEST(test_pin_between_look_and_lock)
{
	struct kvs_config cfg;
	struct kvs_pin p[4];
	struct kvs_key k[4];

	test_config(&cfg, 4, 4096);
	cfg.loader_wait_timeout_ms = 10000;
	struct kvs_cache *c = open_ok(&cfg);
	struct kvs_cache *d = open_ok(&cfg);
	for (int i = 0; i < 4; i++) {
		k[i] = key_of(28, (uint64_t)i);
		ck_assert_int_eq(kvs_cache_pin(c, &k[i], KVS_ALLOC_LOAD, &p[i]), KVS_PIN_OWNER);
		load_pattern(c, &p[i], &k[i]);
	}
	/* Only k[0] is unpinned: the one victim. */
	kvs_cache_release(c, &p[0]);
	uint32_t v = p[0].slot, stripe = bucket_stripe(c, key_bucket(c, &k[0]));
	struct pin_job j = {.c = d};
	for (uint64_t sh = 0;; sh++) { /* a new key guarded by another stripe */
		j.k = key_of(29, sh);
		if (bucket_stripe(c, key_bucket(c, &j.k)) != stripe)
			break;
	}
	ck_assert_int_eq(kvs_cache_test_lock_key(c, &k[0]), 0);
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, pin_job_run, &j), 0);
	/* The evictor passed its look (refs 0) and sleeps on the stripe: glibc has set the
	 * waiters bit of the lock word. */
	uint64_t t0 = mono_ms();
	while (!(__atomic_load_n(&c->stripes[stripe].mu.__data.__lock, __ATOMIC_RELAXED) &
		 0x80000000u)) {
		ck_assert_msg(mono_ms() - t0 < 5000, "the evictor never waited for the stripe");
		usleep(100);
	}
	/* Pin it as pin_found_locked would, under the stripe. */
	uint32_t e = KVS_PINS_PER_PROC - 1;
	ck_assert_uint_eq(c->me->pin[e], 0);
	c->me->pin[e] = v + 1;
	c->slots[v].refs = 1;
	kvs_stripe_unlock(c, stripe);
	pthread_join(t, NULL);
	ck_assert_int_eq(j.r, -ENOSPC);
	ck_assert_int_eq(kvs_cache_lookup(c, &k[0]), KVS_SLOT_READY);
	struct kvs_pin late = {.slot = v, .entry = e};
	kvs_cache_release(c, &late);
	for (int i = 1; i < 4; i++)
		kvs_cache_release(c, &p[i]);
	/* Unpinned now: it can go. */
	ck_assert_int_eq(kvs_cache_pin(d, &j.k, KVS_ALLOC_LOAD, &j.p), KVS_PIN_OWNER);
	kvs_cache_release(d, &j.p);
	ck_assert_uint_eq(pinned_slots(c), 0);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

struct wait_job {
	struct kvs_cache *c;
	struct kvs_pin q;
	int r;
	uint64_t woke_ns;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *wait_job_run(void *arg)
{
	struct wait_job *j = arg;

	j->r = kvs_cache_wait(j->c, &j->q, 5000000000ull);
	j->woke_ns = mono_ns();
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* A sleeping waiter is woken by the publish, not by its 50 ms liveness slice: the publish
 * comes right after the waiter set the waiters bit, so a missed wake costs it about a whole
 * slice.  Median of 7 tries, so one slow schedule does not decide. */
START_TEST(test_wake_latency)
{
	struct kvs_config cfg;
	uint64_t lat[7];

	test_config(&cfg, 16, 4096);
	cfg.loader_wait = KVS_WAIT_FUTEX;
	struct kvs_cache *c = open_ok(&cfg);
	struct kvs_cache *d = open_ok(&cfg);
	for (int n = 0; n < 7; n++) {
		struct kvs_key k = key_of(30, (uint64_t)n);
		struct kvs_pin p;
		struct wait_job j = {.c = d};
		pthread_t t;

		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
		ck_assert_int_eq(kvs_cache_pin(d, &k, KVS_ALLOC_LOAD, &j.q), KVS_PIN_WAIT);
		ck_assert_int_eq(pthread_create(&t, NULL, wait_job_run, &j), 0);
		uint64_t t0 = mono_ms();
		while (!(__atomic_load_n(&c->slots[p.slot].state, __ATOMIC_ACQUIRE) &
			 KVS_ST_WAITERS)) {
			ck_assert_msg(mono_ms() - t0 < 5000,
				      "the waiter never set the waiters bit");
			usleep(100);
		}
		uint64_t pub = mono_ns();
		load_pattern(c, &p, &k);
		pthread_join(t, NULL);
		ck_assert_int_eq(j.r, 0);
		lat[n] = j.woke_ns - pub;
		kvs_cache_release(d, &j.q);
		kvs_cache_release(c, &p);
	}
	qsort(lat, 7, sizeof(lat[0]), cmp_u64);
	ck_assert_msg(lat[3] < 20000000ull, "median wake latency %lu us (slice: 50 ms)",
		      (unsigned long)(lat[3] / 1000));
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Pin-table entries no stripe counts are forgotten, not kept for ever: an entry naming no slot
 * (garbage past the slot count) when a process detaches, and a pin of a slot found unhashed
 * (bucket KVS_NIL) when it is released.  Kept, the first would hold the process's table entry
 * (detach and reclaim retry it for ever), the second would be deferred and retried at every
 * release. */
START_TEST(test_uncounted_pins_forgotten)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(31, 0);
	struct kvs_pin p;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	struct kvs_cache *d = open_ok(&cfg);
	int self = kvs_cache_self(d);
	d->me->pin[7] = d->nslots + 5;
	kvs_cache_close(d);
	ck_assert_uint_eq(proc_at(c, (uint32_t)self)->state, KVS_PROC_FREE);
	ck_assert_uint_eq(proc_at(c, (uint32_t)self)->pin[7], 0);

	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	load_pattern(c, &p, &k);
	uint32_t b = c->slots[p.slot].bucket;
	c->slots[p.slot].bucket = KVS_NIL;
	kvs_cache_release(c, &p);
	ck_assert_uint_eq(c->me->pin[p.entry], 0);
	ck_assert_uint_eq(c->deferred[p.entry / 64], 0);
	c->slots[p.slot].bucket = b;
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* A slot whose bucket word is corrupt (past the bucket count, or an orphan that no pin holds)
 * is never taken as a victim: its bucket would index past the chains.  The others still are,
 * and once they are pinned the allocation says ENOSPC. */
START_TEST(test_corrupt_bucket_not_evicted)
{
	struct kvs_config cfg;
	struct kvs_pin p[4];
	const uint32_t bad[] = {0x7ffffff0u, KVS_ORPHAN | 1u};

	for (int n = 0; n < 2; n++) {
		test_config(&cfg, 4, 4096);
		struct kvs_cache *c = open_ok(&cfg);
		for (int i = 0; i < 4; i++) {
			struct kvs_key k = key_of(32, (uint64_t)i);

			ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p[i]),
					 KVS_PIN_OWNER);
			load_pattern(c, &p[i], &k);
			kvs_cache_release(c, &p[i]);
		}
		uint32_t v = p[0].slot;
		c->slots[v].bucket = bad[n];
		for (int i = 0; i < 3; i++) {
			struct kvs_key k = key_of(33, (uint64_t)i);

			ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p[i]),
					 KVS_PIN_OWNER);
			ck_assert_uint_ne(p[i].slot, v);
		}
		struct kvs_key k = key_of(33, 3);
		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p[3]), -ENOSPC);
		ck_assert_uint_eq(c->slots[v].bucket, bad[n]);
		for (int i = 0; i < 3; i++)
			kvs_cache_release(c, &p[i]);
		kvs_cache_close(c);
		remove_region(&cfg);
	}
}
END_TEST

/* A victim whose bucket chain is corrupt (a loop that never reaches it) cannot be unlinked: it
 * is skipped, never claimed while still chained (a claim nobody would ever give back). */
START_TEST(test_victim_in_corrupt_chain_skipped)
{
	struct kvs_config cfg;
	struct kvs_pin p[4];

	test_config(&cfg, 4, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	for (int i = 0; i < 4; i++) {
		struct kvs_key k = key_of(34, (uint64_t)i);

		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p[i]), KVS_PIN_OWNER);
		load_pattern(c, &p[i], &k);
		kvs_cache_release(c, &p[i]);
	}
	uint32_t v = p[0].slot, b = c->slots[v].bucket, w = p[1].slot;
	/* Keys for the new loads whose buckets stay clear of the loop. */
	struct kvs_key fresh[3];
	int nfresh = 0;
	for (uint64_t j = 0; nfresh < 3 && j < 10000; j++) {
		struct kvs_key k = key_of(35, j);

		if (key_bucket(c, &k) != b && key_bucket(c, &k) != c->slots[w].bucket)
			fresh[nfresh++] = k;
	}
	ck_assert_int_eq(nfresh, 3);
	c->buckets[b] = w; /* b's chain: w, w, w, ... never v */
	c->slots[w].next = w;
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(kvs_cache_pin(c, &fresh[i], KVS_ALLOC_LOAD, &p[i]), KVS_PIN_OWNER);
		ck_assert_uint_ne(p[i].slot, v);
	}
	ck_assert_uint_eq(st_of(c->slots[v].state), KVS_SLOT_READY);
	for (int i = 0; i < 2; i++)
		kvs_cache_release(c, &p[i]);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Pinned slots are no candidates: the sweep passes them without touching their access byte
 * (their second chance is kept for when they are unpinned) and without taking their stripe. */
START_TEST(test_pinned_keep_second_chance)
{
	struct kvs_config cfg;
	struct kvs_key a = key_of(34, 0), b = key_of(34, 1), n = key_of(34, 2);
	struct kvs_pin pa, pb, pn;

	test_config(&cfg, 2, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_pin(c, &a, KVS_ALLOC_LOAD, &pa), KVS_PIN_OWNER);
	load_pattern(c, &pa, &a);
	ck_assert_int_eq(kvs_cache_pin(c, &b, KVS_ALLOC_LOAD, &pb), KVS_PIN_OWNER);
	load_pattern(c, &pb, &b);
	kvs_cache_release(c, &pb);
	ck_assert_uint_eq(c->access[frame_of(c, pa.slot)], 1);
	ck_assert_int_eq(kvs_cache_pin(c, &n, KVS_ALLOC_LOAD, &pn), KVS_PIN_OWNER);
	ck_assert_uint_eq(pn.slot, pb.slot);
	ck_assert_uint_eq(c->access[frame_of(c, pa.slot)], 1);
	kvs_cache_release(c, &pn);
	kvs_cache_release(c, &pa);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* A pinned slot is hashed, so LOADING, READY or FAILED: a waiter that finds any other state
 * (corruption) says so at once instead of waiting out its timeout. */
START_TEST(test_wait_on_corrupt_state)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(35, 0);
	struct kvs_pin p, q;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	struct kvs_cache *d = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	ck_assert_int_eq(kvs_cache_pin(d, &k, KVS_ALLOC_LOAD, &q), KVS_PIN_WAIT);
	c->slots[p.slot].state = KVS_SLOT_FREE;
	uint64_t t0 = mono_ms();
	ck_assert_int_eq(kvs_cache_wait(d, &q, 2000000000ull), -EUCLEAN);
	ck_assert_uint_lt(mono_ms() - t0, 1000);
	c->slots[p.slot].state = KVS_SLOT_LOADING;
	kvs_cache_mark_failed(c, &p, EIO);
	kvs_cache_release(d, &q);
	kvs_cache_release(c, &p);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

static void *timeout_job_run(void *arg)
{
	struct wait_job *j = arg;
	struct timespec a, b;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
	j->r = kvs_cache_wait(j->c, &j->q, 400000000ull);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
	j->woke_ns = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000ull + (uint64_t)b.tv_nsec -
		     (uint64_t)a.tv_nsec;
	return NULL;
}

/* A waiter for a load that takes long sleeps on the futex: over a 400 ms wait it spends a few
 * milliseconds of CPU (the spin, a check per slice), not the whole wait (a busy loop takes
 * every cycle it is given, at least a quarter of a core even on a busy two-core machine). */
START_TEST(test_waiter_sleeps)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(36, 0);
	struct kvs_pin p;
	struct wait_job j;
	pthread_t t;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	struct kvs_cache *d = open_ok(&cfg);
	j.c = d;
	ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
	ck_assert_int_eq(kvs_cache_pin(d, &k, KVS_ALLOC_LOAD, &j.q), KVS_PIN_WAIT);
	ck_assert_int_eq(pthread_create(&t, NULL, timeout_job_run, &j), 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(j.r, -ETIMEDOUT);
	ck_assert_msg(j.woke_ns < 40000000ull, "the waiter used %lu ms of CPU in a 400 ms wait",
		      (unsigned long)(j.woke_ns / 1000000));
	kvs_cache_mark_failed(c, &p, EIO);
	kvs_cache_release(d, &j.q);
	kvs_cache_release(c, &p);
	kvs_cache_close(d);
	/* Rank counts are never zero, even seen by a watcher of a region nobody attached to. */
	kvs_cache_close(c);
	struct kvs_cache *w = NULL;
	uint32_t rank = 7, nranks = 0;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_WATCH, &w, NULL, 0), 0);
	kvs_cache_ranks(w, &rank, &nranks);
	ck_assert_uint_eq(rank, 0);
	ck_assert_uint_eq(nranks, 1);
	kvs_cache_close(w);
	remove_region(&cfg);
}
END_TEST

/* Ranks count the attached processes (each sees its own index among them), and a reap says
 * how many dead processes it reclaimed. */
START_TEST(test_ranks_and_reap_count)
{
	struct kvs_config cfg;
	uint32_t rank = 7, nranks = 0;

	test_config(&cfg, 16, 4096);
	struct kvs_cache *c = open_ok(&cfg);
	struct kvs_cache *d = open_ok(&cfg);
	kvs_cache_ranks(c, &rank, &nranks);
	ck_assert_uint_eq(rank, 0);
	ck_assert_uint_eq(nranks, 2);
	kvs_cache_ranks(d, &rank, &nranks);
	ck_assert_uint_eq(rank, 1);
	ck_assert_uint_eq(nranks, 2);
	pid_t pid = fork_alone();
	ck_assert(pid >= 0);
	if (pid == 0) {
		struct kvs_cache *cc = NULL;

		kvs_cache_forget(c);
		kvs_cache_forget(d);
		_exit(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &cc, NULL, 0)
			  ? 2
			  : 0); /* dies attached */
	}
	reap_children(&pid, 1);
	kvs_cache_ranks(c, &rank, &nranks);
	ck_assert_uint_eq(nranks, 3);
	ck_assert_int_eq(kvs_cache_reap(c), 1);
	ck_assert_int_eq(kvs_cache_reap(c), 0);
	kvs_cache_ranks(c, &rank, &nranks);
	ck_assert_uint_eq(nranks, 2);
	kvs_cache_close(d);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* ------------------------------------------------------------------ pack */

/* The byte at position i of key k's bytes: differs between keys and along the slot, so that a
 * slot overlapping another, or a frame reused under a pin, shows. */
static unsigned char pack_byte(const struct kvs_key *k, uint32_t i)
{
	return (unsigned char)((k->block_hi * 131 + k->shard * 31 + i / 4096 * 7 + i) & 0xff);
}

static void pack_fill(struct kvs_cache *c, const struct kvs_pin *p, const struct kvs_key *k,
		      uint32_t len)
{
	unsigned char *d = kvs_cache_data(c, p);

	for (uint32_t i = 0; i < len; i++)
		d[i] = pack_byte(k, i);
	kvs_cache_mark_ready(c, p, len);
}

static bool pack_ok(struct kvs_cache *c, const struct kvs_pin *p, const struct kvs_key *k,
		    uint32_t len)
{
	const unsigned char *d = kvs_cache_data(c, p);

	if (kvs_cache_length(c, p) != len)
		return false;
	for (uint32_t i = 0; i < len; i++)
		if (d[i] != pack_byte(k, i))
			return false;
	return true;
}

/* Every slot in use lies inside its frame, page-aligned, and no two of a frame overlap. */
static void pack_layout_ok(struct kvs_cache *c)
{
	for (uint32_t f = 0; f < c->nframes; f++) {
		uint64_t used[KVS_MAX_PER_FRAME][2];
		uint32_t n = 0;

		for (uint32_t j = 0; j < c->per_frame; j++) {
			struct kvs_slot *s = &c->slots[frame_first(c, f) + j];
			uint32_t w = s->state;

			if (st_of(w) == KVS_SLOT_FREE || w == KVS_ST_CLAIMED_BY(KVS_PACK_OWNER))
				continue;
			ck_assert_uint_le((uint64_t)s->at + s->room, c->frame_pages);
			ck_assert_uint_le(s->length, (uint64_t)s->room * KVS_PAGE);
			used[n][0] = s->at;
			used[n][1] = (uint64_t)s->at + s->room;
			for (uint32_t m = 0; m < n; m++)
				ck_assert_msg(used[n][1] <= used[m][0] || used[m][1] <= used[n][0],
					      "frame %u: slots overlap", f);
			n++;
		}
	}
}

/* Pin nframes whole shards at once: possible only if no frame is lost to a leaked claim. */
static void all_frames_takeable(struct kvs_cache *c, uint64_t block)
{
	struct kvs_pin p[64];

	ck_assert_uint_le(c->nframes, 64);
	for (uint32_t i = 0; i < c->nframes; i++) {
		struct kvs_key k = key_of(block, i);

		int r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p[i]);

		if (r != KVS_PIN_OWNER)
			for (uint32_t j = 0; j < c->nslots; j++)
				if (c->slots[j].state != KVS_SLOT_FREE)
					fprintf(stderr, "slot %u (frame %u): state %#x refs %u\n",
						j, frame_of(c, j), c->slots[j].state,
						c->slots[j].refs);
		ck_assert_msg(r == KVS_PIN_OWNER, "frame %u of %u: %d", i, c->nframes, r);
		ck_assert_uint_eq(kvs_cache_room(c, &p[i]), c->shard_size);
		pack_fill(c, &p[i], &k, 4096);
	}
	pack_layout_ok(c);
	for (uint32_t i = 0; i < c->nframes; i++)
		kvs_cache_release(c, &p[i]);
}

/* 100 files of 64 KiB in a region of 8 frames of 1 MiB: all kept (6.25 frames' worth), each
 * costing 64 KiB, and whole shards after them evict frames without touching the rest. */
START_TEST(test_pack_small_files)
{
	struct kvs_config cfg;
	struct kvs_region_info info;
	struct kvs_counters tot;
	struct kvs_pin p;

	test_config(&cfg, 8, 1 << 20);
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_uint_eq(c->per_frame, 16);
	for (uint64_t b = 0; b < 100; b++) {
		struct kvs_key k = key_of(500 + b, 0);

		ck_assert_int_eq(kvs_cache_pin_load(c, &k, KVS_ALLOC_LOAD, 65536, 0, &p),
				 KVS_PIN_OWNER);
		ck_assert_uint_eq(kvs_cache_room(c, &p), 65536);
		ck_assert_uint_eq((uintptr_t)kvs_cache_data(c, &p) % KVS_PAGE, 0);
		pack_fill(c, &p, &k, 65536);
		kvs_cache_release(c, &p);
	}
	pack_layout_ok(c);
	for (uint64_t b = 0; b < 100; b++) {
		struct kvs_key k = key_of(500 + b, 0);

		ck_assert_int_eq(kvs_cache_pin_ready(c, &k, &p), KVS_PIN_HIT);
		ck_assert_msg(pack_ok(c, &p, &k, 65536), "file %d", (int)b);
		kvs_cache_release(c, &p);
	}
	ck_assert_int_ge(kvs_cache_stat(c, &info, &tot, NULL, 0), 0);
	ck_assert_uint_eq(info.slots, 8);
	ck_assert_uint_eq(info.slots_ready, 100);
	ck_assert_uint_eq(info.bytes_ready, 100 * 65536);
	ck_assert_uint_eq(info.slots_claimed, 0);
	/* Two whole shards: two frames go (up to 32 files), the others' bytes stay right. */
	for (uint64_t sh = 0; sh < 2; sh++) {
		struct kvs_key k = key_of(900, sh);

		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p), KVS_PIN_OWNER);
		pack_fill(c, &p, &k, 1 << 20);
		kvs_cache_release(c, &p);
	}
	uint32_t kept = 0;
	for (uint64_t b = 0; b < 100; b++) {
		struct kvs_key k = key_of(500 + b, 0);

		if (kvs_cache_pin_ready(c, &k, &p) != KVS_PIN_HIT)
			continue;
		ck_assert_msg(pack_ok(c, &p, &k, 65536), "file %d after eviction", (int)b);
		kvs_cache_release(c, &p);
		kept++;
	}
	ck_assert_uint_ge(kept, 100 - 32);
	pack_layout_ok(c);
	all_frames_takeable(c, 901);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* Three processes at once, keys of every size from a page to a shard, through a region far
 * smaller than they are, holding pins across allocations: every hit has its own bytes, and
 * the slots of a frame never overlap. */
START_TEST(test_pack_mixed_sizes)
{
	struct kvs_config cfg;
	pid_t pids[3];

	test_config(&cfg, 16, 256 << 10);
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_uint_eq(c->per_frame, 4);
	for (int n = 0; n < 3; n++) {
		pids[n] = fork_alone();
		ck_assert(pids[n] >= 0);
		if (pids[n])
			continue;
		kvs_cache_forget(c);
		struct kvs_cache *cc = NULL;
		if (kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &cc, NULL, 0))
			_exit(2);
		struct kvs_pin held[4];
		struct kvs_key hk[4];
		uint32_t hlen[4], nheld = 0, seed = 77u + (uint32_t)n;

		for (int op = 0; op < 3000; op++) {
			seed = seed * 1103515245u + 12345u;
			uint64_t b = (seed >> 8) % 300;
			struct kvs_key k = key_of(2000 + b, 0);
			uint32_t len = (uint32_t)(b * 2654435761u % (256 << 10)) + 1, w;
			struct kvs_pin p;
			int r = kvs_cache_pin_load(cc, &k, KVS_ALLOC_LOAD, len, 0, &p);

			if (r == -ENOSPC)
				continue; /* all pinned by the three of us */
			if (r < 0)
				_exit(3);
			if (r == KVS_PIN_OWNER)
				pack_fill(cc, &p, &k, len);
			else if (r == KVS_PIN_WAIT &&
				 (w = (uint32_t)-kvs_cache_wait(cc, &p, 5000000000ull)))
				_exit(4);
			if (!pack_ok(cc, &p, &k, len))
				_exit(5);
			if (nheld < 4 && (seed & 1)) {
				held[nheld] = p, hk[nheld] = k, hlen[nheld++] = len;
				continue;
			}
			kvs_cache_release(cc, &p);
			if (nheld && (seed & 6) == 0) {
				nheld--;
				if (!pack_ok(cc, &held[nheld], &hk[nheld], hlen[nheld]))
					_exit(6); /* its frame was reused under the pin */
				kvs_cache_release(cc, &held[nheld]);
			}
		}
		while (nheld--)
			if (!pack_ok(cc, &held[nheld], &hk[nheld], hlen[nheld]))
				_exit(6);
		_exit(0);
	}
	reap_children(pids, 3);
	pack_layout_ok(c);
	kvs_cache_reap(c);
	all_frames_takeable(c, 3000);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* A write-through publication of a partial shard is copied into a packed slot of its size,
 * and the staged frame goes back: a small file saved through the shim costs what it holds. */
START_TEST(test_pack_stage_publish)
{
	struct kvs_config cfg;
	struct kvs_key k = key_of(1200, 0);
	struct kvs_pin p;
	uint32_t staged, len = 100 * 1024 + 5;

	test_config(&cfg, 8, 1 << 20);
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_int_eq(kvs_cache_stage_claim(c, &staged), 0);
	unsigned char *d = kvs_cache_stage_data(c, staged);
	for (uint32_t i = 0; i < len; i++)
		d[i] = pack_byte(&k, i);
	ck_assert_int_eq(kvs_cache_stage_publish(c, staged, &k, len, 0), 1);
	ck_assert_int_eq(kvs_cache_pin_ready(c, &k, &p), KVS_PIN_HIT);
	ck_assert_uint_eq(kvs_cache_room(c, &p), 26 * 4096);
	ck_assert_uint_ne(frame_of(c, p.slot), frame_of(c, staged));
	ck_assert(pack_ok(c, &p, &k, len));
	kvs_cache_release(c, &p);
	ck_assert_uint_eq(st_of(c->slots[staged].state), KVS_SLOT_FREE);
	/* A whole shard stays where it was staged. */
	struct kvs_key w = key_of(1201, 0);
	ck_assert_int_eq(kvs_cache_stage_claim(c, &staged), 0);
	d = kvs_cache_stage_data(c, staged);
	for (uint32_t i = 0; i < (1u << 20); i++)
		d[i] = pack_byte(&w, i);
	ck_assert_int_eq(kvs_cache_stage_publish(c, staged, &w, 1u << 20, 0), 1);
	ck_assert_int_eq(kvs_cache_pin_ready(c, &w, &p), KVS_PIN_HIT);
	ck_assert_uint_eq(p.slot, staged);
	ck_assert(pack_ok(c, &p, &w, 1u << 20));
	kvs_cache_release(c, &p);
	pack_layout_ok(c);
	all_frames_takeable(c, 1300);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* A writer saving small files one after another (SGLang's one page per file): each is staged in
 * a frame, published packed, and the frame given back is the next one's stage, so the hand
 * never sweeps over what was just published.  100 files of 40 KiB through 8 frames: all kept
 * (with a sweep per stage the hand went round 12 times, clearing and evicting them). */
START_TEST(test_pack_stage_small_files)
{
	struct kvs_config cfg;
	struct kvs_pin p;
	uint32_t staged, len = 40 << 10;

	test_config(&cfg, 8, 1 << 20);
	struct kvs_cache *c = open_ok(&cfg);
	for (uint64_t b = 0; b < 100; b++) {
		struct kvs_key k = key_of(1400 + b, 0);

		ck_assert_int_eq(kvs_cache_stage_claim(c, &staged), 0);
		unsigned char *d = kvs_cache_stage_data(c, staged);
		for (uint32_t i = 0; i < len; i++)
			d[i] = pack_byte(&k, i);
		ck_assert_int_eq(kvs_cache_stage_publish(c, staged, &k, len, 0), 1);
	}
	for (uint64_t b = 0; b < 100; b++) {
		struct kvs_key k = key_of(1400 + b, 0);

		ck_assert_msg(kvs_cache_pin_ready(c, &k, &p) == KVS_PIN_HIT, "file %d", (int)b);
		ck_assert(pack_ok(c, &p, &k, len));
		kvs_cache_release(c, &p);
	}
	pack_layout_ok(c);
	all_frames_takeable(c, 1500);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

static void hold_pack_lock(struct kvs_cache *c)
{
	if (kvs_pack_lock(c))
		_exit(4);
}

/* Die in the middle of opening a frame, as kvs_pack_claim does it: the old open frame sealed,
 * the header naming the new one, half of its records the pack's already, the rest still the
 * dying process's own. */
static void hold_pack_switch(struct kvs_cache *c)
{
	uint32_t f;

	if (kvs_evict_frame(c, KVS_ALLOC_LOAD, &f) || !kvs_pack_seal(c) || kvs_pack_lock(c))
		_exit(4);
	c->hdr->pack_frame = f;
	c->hdr->pack_next = 1;
	c->hdr->pack_fill = 1;
	for (uint32_t j = 1; j < c->per_frame / 2; j++)
		c->slots[frame_first(c, f) + j].state = KVS_ST_CLAIMED_BY(KVS_PACK_OWNER);
}

/* Cut a packed slot, own its load, and die with it. */
static void hold_pack_load(struct kvs_cache *c)
{
	struct kvs_key k = key_of(11, 0);
	struct kvs_pin p;

	if (kvs_cache_pin_load(c, &k, KVS_ALLOC_LOAD, 8192, 0, &p) != KVS_PIN_OWNER)
		_exit(4);
}

/* Pin a packed load of bytes bytes of key (b, 0) as owner and fill it; the pin is returned. */
static struct kvs_pin pack_load(struct kvs_cache *c, uint64_t b, uint32_t bytes)
{
	struct kvs_key k = key_of(b, 0);
	struct kvs_pin p;

	ck_assert_int_eq(kvs_cache_pin_load(c, &k, KVS_ALLOC_LOAD, bytes, 0, &p), KVS_PIN_OWNER);
	ck_assert_uint_eq(kvs_cache_room(c, &p), (bytes + 4095) / 4096 * 4096);
	pack_fill(c, &p, &k, bytes);
	return p;
}

/* The pack's rules, one by one: the frame with more room stays open; a frame full of pages or
 * of records is sealed at once; a frame of the reserve is never opened; a corrupt open-frame
 * header never yields a slot outside its frame. */
START_TEST(test_pack_policy)
{
	struct kvs_config cfg;
	struct kvs_pin p[16], q, r;

	test_config(&cfg, 8, 1 << 20);
	cfg.cache_reserved = 25; /* frames 6 and 7 */
	struct kvs_cache *c = open_ok(&cfg);
	ck_assert_uint_eq(c->nmain, 6);
	/* 100 KiB opens a frame (924 KiB left); 960 KiB does not fit it and takes a frame of
	 * its own (64 KiB left), and the first stays open: 500 KiB is cut from it. */
	p[0] = pack_load(c, 1, 100 << 10);
	q = pack_load(c, 2, 960 << 10);
	r = pack_load(c, 3, 500 << 10);
	ck_assert_uint_ne(frame_of(c, q.slot), frame_of(c, p[0].slot));
	ck_assert_uint_eq(frame_of(c, r.slot), frame_of(c, p[0].slot));
	kvs_cache_release(c, &p[0]);
	kvs_cache_release(c, &q);
	kvs_cache_release(c, &r);
	/* Full of pages (424 KiB more, exactly): sealed at once, no record left claimed. */
	p[0] = pack_load(c, 4, 424 << 10);
	ck_assert_uint_eq(c->hdr->pack_frame, KVS_NIL);
	kvs_cache_release(c, &p[0]);
	/* Full of records (16 slots of 32 KiB, half the pages): sealed at once too. */
	for (uint32_t i = 0; i < 16; i++)
		p[i] = pack_load(c, 10 + i, 32 << 10);
	ck_assert_uint_eq(frame_of(c, p[15].slot), frame_of(c, p[0].slot));
	ck_assert_uint_eq(c->hdr->pack_frame, KVS_NIL);
	for (uint32_t i = 0; i < 16; i++)
		kvs_cache_release(c, &p[i]);
	pack_layout_ok(c);
	all_frames_takeable(c, 100);
	/* The main share all pinned: a load takes a reserve frame, which is not opened. */
	for (uint32_t i = 0; i < 6; i++) {
		struct kvs_key k = key_of(200, i);

		ck_assert_int_eq(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p[i]), KVS_PIN_OWNER);
	}
	q = pack_load(c, 300, 64 << 10);
	ck_assert_uint_ge(frame_of(c, q.slot), 6);
	ck_assert_uint_eq(c->hdr->pack_frame, KVS_NIL);
	kvs_cache_release(c, &q);
	for (uint32_t i = 0; i < 6; i++)
		kvs_cache_release(c, &p[i]);
	/* A corrupt open frame: fill past the frame's pages, or a frame past the region. */
	q = pack_load(c, 400, 64 << 10);
	kvs_cache_release(c, &q);
	ck_assert_uint_lt(c->hdr->pack_frame, c->nframes);
	c->hdr->pack_fill = c->frame_pages + 3;
	q = pack_load(c, 401, 64 << 10);
	kvs_cache_release(c, &q);
	pack_layout_ok(c);
	c->hdr->pack_frame = c->nframes + 7;
	q = pack_load(c, 402, 64 << 10);
	kvs_cache_release(c, &q);
	pack_layout_ok(c);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* pack_lock held by a stopped process: a packed load gives up on the lock (within the lock
 * timeout, then at once) and takes a frame of its own, freeing the frame's other records, so
 * nothing leaks. */
START_TEST(test_pack_lock_stuck)
{
	struct kvs_config cfg;

	test_config(&cfg, 8, 1 << 20);
	cfg.loader_wait_timeout_ms = 200;
	struct kvs_cache *c = open_ok(&cfg);
	_Atomic int *ready = shared_anon(4096);
	pid_t holder = spawn_holder(c, &cfg, hold_pack_lock, ready);
	kill(holder, SIGSTOP);
	for (uint64_t b = 0; b < 20; b++) {
		struct kvs_pin p = pack_load(c, 500 + b, 40960);
		uint32_t first = frame_first(c, frame_of(c, p.slot));

		ck_assert_uint_eq(p.slot, first);
		for (uint32_t j = 1; j < c->per_frame; j++)
			ck_assert_uint_eq(c->slots[first + j].state, KVS_SLOT_FREE);
		kvs_cache_release(c, &p);
	}
	ck_assert_uint_eq(c->hdr->pack_frame, KVS_NIL);
	all_frames_takeable(c, 600);
	kill(holder, SIGKILL);
	waitpid(holder, NULL, 0);
	kvs_cache_close(c);
	remove_region(&cfg);
	munmap((void *)ready, 4096);
}
END_TEST

/* A process killed inside the pack lock, in the middle of opening a frame, or owning the load
 * of a packed slot: the next allocator repairs the pack, the reclaim frees what the dead held,
 * and afterwards every frame can be taken again (nothing leaked). */
START_TEST(test_pack_holder_killed)
{
	void (*holds[3])(struct kvs_cache *) = {hold_pack_lock, hold_pack_switch, hold_pack_load};

	for (int h = 0; h < 3; h++) {
		struct kvs_config cfg;
		struct kvs_pin p;

		test_config(&cfg, 8, 1 << 20);
		struct kvs_cache *c = open_ok(&cfg);
		/* An open frame with slots in it already, so that the seal has work. */
		for (uint64_t b = 0; b < 3; b++) {
			struct kvs_key k = key_of(600 + b, 0);

			ck_assert_int_eq(kvs_cache_pin_load(c, &k, KVS_ALLOC_LOAD, 40960, 0, &p),
					 KVS_PIN_OWNER);
			pack_fill(c, &p, &k, 40960);
			kvs_cache_release(c, &p);
		}
		_Atomic int *ready = shared_anon(4096);
		pid_t victim = spawn_holder(c, &cfg, holds[h], ready);
		kill(victim, SIGKILL);
		waitpid(victim, NULL, 0);
		for (uint64_t b = 0; b < 40; b++) {
			struct kvs_key k = key_of(700 + b, 0);
			int r = kvs_cache_pin_load(c, &k, KVS_ALLOC_LOAD, 40960, 0, &p);

			ck_assert_msg(r == KVS_PIN_OWNER, "case %d, file %d: %d", h, (int)b, r);
			pack_fill(c, &p, &k, 40960);
			kvs_cache_release(c, &p);
		}
		for (uint64_t b = 0; b < 3; b++) {
			struct kvs_key k = key_of(600 + b, 0);

			ck_assert_int_eq(kvs_cache_pin_ready(c, &k, &p), KVS_PIN_HIT);
			ck_assert(pack_ok(c, &p, &k, 40960));
			kvs_cache_release(c, &p);
		}
		pack_layout_ok(c);
		kvs_cache_reap(c);
		all_frames_takeable(c, 800);
		kvs_cache_close(c);
		remove_region(&cfg);
		munmap((void *)ready, 4096);
	}
}
END_TEST

/* A region of keys only (shim.mode = observe): the control plane of its dimensions and no
 * data; every frame has its pages from the build, so no walk or prepare allocates any; keys
 * are pinned, owned, marked READY with a length (no byte) and hit as in any region, and
 * evicted by frame; nothing can be staged; an attacher that wants data refuses it. */
START_TEST(test_keys_only_region)
{
	struct kvs_config cfg;
	struct kvs_cache_params p, full;
	struct kvs_cache *c = NULL, *d = NULL;
	char name[KVS_CONFIG_STR_MAX + 16], msg[256], path[256];
	struct kvs_pin pin;
	struct stat st;
	uint32_t done = 0, slot;
	void *base;
	size_t len;

	test_config(&cfg, 8, 65536); /* 8 frames of 64 KiB: 512 KiB of data */
	cfg.shim_mode = KVS_MODE_OBSERVE;
	ck_assert_int_eq(kvs_cache_params_mode(&cfg, &p, name, sizeof(name)), 0);
	ck_assert(p.keys_only);
	ck_assert_str_eq(p.name + strlen(cfg.cache_name), ".observe");
	ck_assert_int_eq(kvs_cache_open(&p, KVS_OPEN_CREATE, &c, msg, sizeof(msg)), 0);
	ck_assert(c->keys_only && c->hdr->keys_only == 1);
	ck_assert_uint_eq(c->hdr->total_bytes, c->hdr->off_data);
	kvs_cache_path(&p, path, sizeof(path));
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq((uint64_t)st.st_size, c->hdr->total_bytes);
	ck_assert_uint_lt((uint64_t)st.st_size, 8 * 65536); /* less than its data would be */
	for (uint32_t f = 0; f < c->nframes; f++)
		ck_assert_uint_eq(c->fpages[f], KVS_PAGES_OK);
	ck_assert_uint_eq(c->hdr->populate_mode, KVS_POPULATE_LAZY);
	kvs_cache_data_region(c, &base, &len);
	ck_assert_uint_eq(len, 0);
	ck_assert_int_eq(kvs_cache_prepare(c, 1, &done), 0);
	ck_assert_uint_eq(done, 8);
	ck_assert_int_eq(kvs_cache_stage_claim(c, &slot), -EPERM);
	/* Owner, READY with a length and no byte, then a hit. */
	struct kvs_key k = key_of(1, 0);
	ck_assert_int_eq(kvs_cache_pin_load(c, &k, KVS_ALLOC_LOAD, 65536, 0, &pin), KVS_PIN_OWNER);
	kvs_cache_mark_ready(c, &pin, 65536);
	kvs_cache_release(c, &pin);
	ck_assert_int_eq(kvs_cache_pin_ready(c, &k, &pin), KVS_PIN_HIT);
	ck_assert_uint_eq(kvs_cache_length(c, &pin), 65536);
	kvs_cache_release(c, &pin);
	/* Twelve more keys through eight frames: evicted by frame, as with the data. */
	for (uint64_t b = 2; b < 14; b++) {
		struct kvs_key kb = key_of(b, 0);

		ck_assert_int_eq(kvs_cache_pin_load(c, &kb, KVS_ALLOC_LOAD, 65536, 0, &pin),
				 KVS_PIN_OWNER);
		kvs_cache_mark_ready(c, &pin, 65536);
		kvs_cache_release(c, &pin);
	}
	struct kvs_region_info info;
	struct kvs_counters t;
	ck_assert_int_ge(kvs_cache_stat(c, &info, &t, NULL, 0), 0);
	ck_assert(info.keys_only);
	ck_assert_uint_eq(info.slots_ready, 8);
	ck_assert_uint_ge(t.v[KVS_CTR_evictions], 5);
	ck_assert_uint_eq(info.slots_populated, 8);
	/* The same name wanted with data: refused, and the message says why. */
	full = p;
	full.keys_only = false;
	ck_assert_int_eq(kvs_cache_open(&full, 0, &d, msg, sizeof(msg)), -EPROTO);
	ck_assert_msg(strstr(msg, "keys only"), "%s", msg);
	kvs_cache_close(c);
	unlink(path);
}
END_TEST

/* Tallies: a process joins its pod's entry at attach; 15 named pods, then the one joined
 * longest ago whose processes are gone is recycled, its figures added to "other"; a root's
 * entry is found again by its path, and roots past the 15th count in "other"; adds reach
 * both entries of a reference, and the table says what each holds. */
START_TEST(test_tallies)
{
	struct kvs_config cfg;
	struct kvs_tally_info t[KVS_TALLY_PODS + KVS_TALLY_ROOTS];
	char root[64];

	test_config(&cfg, 8, 65536);
	struct kvs_cache *c = open_ok(&cfg);
	uint32_t mine = c->pod;
	ck_assert_uint_lt(mine, KVS_TALLY_PODS - 1);
	ck_assert_uint_eq(c->me->pod, mine);
	int r0 = kvs_cache_tally_root(c, "/kv/a");
	ck_assert_int_eq(r0, 0);
	ck_assert_int_eq(kvs_cache_tally_root(c, "/kv/a"), 0); /* the same path, the same entry */
	uint32_t ref = kvs_cache_tally_ref(c, r0);
	kvs_cache_tally_add(c, ref, KVS_TALLY_reads, 3);
	kvs_cache_tally_add(c, ref, KVS_TALLY_read_bytes, 300);
	kvs_cache_tally_add(c, KVS_TALLY_NONE, KVS_TALLY_reads, 1000); /* counts nowhere */
	/* Other namespaces: 14 more fill the named entries, each with 1 read. */
	uint32_t pods[30];
	ck_assert_int_eq(kvs_proc_lock(c), 0);
	for (uint64_t ns = 1; ns <= 14; ns++) {
		pods[ns] = kvs_tally_join_pod_locked(c, 1000 + ns);
		ck_assert_uint_lt(pods[ns], KVS_TALLY_PODS - 1);
		c->tally[pods[ns]].last_ns = ns; /* joined in this order */
		add_relaxed(&c->tally[pods[ns]].v[KVS_TALLY_reads], 1);
	}
	/* A 16th pod: namespace 1001's entry (joined first, no process) is recycled. */
	uint32_t p16 = kvs_tally_join_pod_locked(c, 2000);
	ck_assert_uint_eq(p16, pods[1]);
	ck_assert_uint_eq(c->tally[p16].key, 2000);
	ck_assert_uint_eq(c->tally[p16].v[KVS_TALLY_reads], 0);
	ck_assert_uint_eq(c->tally[KVS_TALLY_PODS - 1].v[KVS_TALLY_reads], 1);
	/* This process's own entry is in use: never recycled, found again by its namespace. */
	ck_assert_uint_eq(kvs_tally_join_pod_locked(c, c->me->pidns), mine);
	kvs_proc_unlock(c);
	/* Roots: 15 named, the 16th and later in "other". */
	for (int i = 1; i < 15; i++) {
		snprintf(root, sizeof(root), "/kv/r%d", i);
		ck_assert_int_eq(kvs_cache_tally_root(c, root), i);
	}
	ck_assert_int_eq(kvs_cache_tally_root(c, "/kv/r15"), KVS_TALLY_ROOTS - 1);
	ck_assert_int_eq(kvs_cache_tally_root(c, "/kv/r16"), KVS_TALLY_ROOTS - 1);
	kvs_cache_tally_add(c, kvs_cache_tally_ref(c, KVS_TALLY_ROOTS - 1), KVS_TALLY_reads, 5);
	int n = kvs_cache_tallies(c, t, (int)(sizeof(t) / sizeof(t[0])));
	uint64_t pod_reads = 0, root_reads = 0;
	int npods = 0, nroots = 0;
	for (int i = 0; i < n; i++) {
		if (t[i].root) {
			nroots++;
			root_reads += t[i].v[KVS_TALLY_reads];
		} else {
			npods++;
			pod_reads += t[i].v[KVS_TALLY_reads];
		}
		if (!t[i].root && t[i].kind == KVS_TALLY_POD && t[i].key == c->me->pidns) {
			ck_assert_uint_eq(t[i].processes, 1);
			ck_assert_uint_eq(t[i].v[KVS_TALLY_read_bytes], 300);
		}
	}
	ck_assert_int_eq(npods, 16);  /* 15 named and other */
	ck_assert_int_eq(nroots, 16); /* 15 named and other */
	ck_assert_uint_eq(pod_reads, 3 + 14 + 5);
	ck_assert_uint_eq(root_reads, 3 + 5);
	kvs_cache_close(c);
	remove_region(&cfg);
}
END_TEST

/* The close hooks' bitmap: every bit of [lo, hi] taken once, none outside, at word edges. */
static unsigned taken_bits[256], ntaken;
static void note_taken(unsigned int bit, void *arg)
{
	(void)arg;
	taken_bits[ntaken++] = bit;
}

START_TEST(test_bitmap_take_range)
{
	static const unsigned int ranges[][2] = {{0, 0},   {63, 63}, {64, 64},	  {60, 70},
						 {0, 127}, {5, 4},   {130, 1000}, {127, 127}};

	for (size_t r = 0; r < sizeof(ranges) / sizeof(ranges[0]); r++) {
		_Atomic uint64_t map[3];
		unsigned int lo = ranges[r][0], hi = ranges[r][1], nbits = 192;

		for (int w = 0; w < 3; w++)
			atomic_store(&map[w], ~0ull);
		ntaken = 0;
		kvs_bitmap_take_range(map, nbits, lo, hi, note_taken, NULL);
		unsigned int want =
		    lo > hi || lo >= nbits ? 0 : (hi >= nbits ? nbits - 1 : hi) - lo + 1;
		ck_assert_uint_eq(ntaken, want);
		for (unsigned int i = 0; i < ntaken; i++)
			ck_assert_uint_eq(taken_bits[i], lo + i);
		for (unsigned int b = 0; b < nbits; b++) {
			bool set = (atomic_load(&map[b / 64]) >> (b % 64)) & 1;
			bool in = want && b >= lo && b < lo + want;
			ck_assert_msg(set == !in, "range %u-%u: bit %u", lo, hi, b);
		}
		ntaken = 0; /* taken once: a second call finds nothing */
		kvs_bitmap_take_range(map, nbits, lo, hi, note_taken, NULL);
		ck_assert_uint_eq(ntaken, 0);
	}
}
END_TEST

/* A user that holds the old number delays the program's close until it puts it; users of the
 * new number, however many, do not. */
struct ownfd_user {
	struct kvs_ownfd *o;
	int seen;
	_Atomic int phase;
	double run_ms;
};

static void *ownfd_hold(void *arg)
{
	struct ownfd_user *u = arg;
	unsigned int ticket;

	u->seen = kvs_ownfd_get(u->o, &ticket);
	atomic_store(&u->phase, 1);
	usleep(300000);
	atomic_store(&u->phase, 2);
	kvs_ownfd_put(u->o, ticket);
	return NULL;
}

/* What the walk does: take it, use it a while, put it, take it again at once. */
static void *ownfd_busy(void *arg)
{
	struct ownfd_user *u = arg;
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	atomic_store(&u->phase, 1);
	do {
		unsigned int ticket;

		if (kvs_ownfd_get(u->o, &ticket) >= 0) {
			usleep(2000);
			kvs_ownfd_put(u->o, ticket);
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1e3 + (t.tv_nsec - t0.tv_nsec) / 1e6 < u->run_ms);
	return NULL;
}

static double ms_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

START_TEST(test_ownfd_moves_and_waits)
{
	char path[] = "/tmp/kvs-ownfd-XXXXXX";
	int fd = mkostemp(path, O_CLOEXEC);
	struct stat st;
	struct kvs_ownfd o = KVS_OWNFD_INIT;
	struct ownfd_user u = {.o = &o}, busy = {.o = &o, .run_ms = 1500};
	struct timespec t0;
	unsigned int ticket;
	pthread_t t;

	ck_assert_int_ge(fd, 0);
	unlink(path);
	ck_assert_int_eq(fstat(fd, &st), 0);
	o.dev = (uint64_t)st.st_dev;
	o.ino = (uint64_t)st.st_ino;
	kvs_ownfd_set(&o, fd);
	/* A number outside the range stays. */
	kvs_ownfd_closing(&o, (unsigned)fd + 1, (unsigned)fd + 10);
	ck_assert_int_eq(kvs_ownfd_peek(&o), fd);
	/* Inside: moved to 1024 or above, the same file; the holder of the old number is waited
	 * for. */
	ck_assert_int_eq(pthread_create(&t, NULL, ownfd_hold, &u), 0);
	while (!atomic_load(&u.phase))
		usleep(1000);
	ck_assert_int_eq(u.seen, fd);
	kvs_ownfd_closing(&o, (unsigned)fd, (unsigned)fd + 10);
	ck_assert_int_eq(atomic_load(&u.phase), 2); /* its put came before our return */
	pthread_join(t, NULL);
	int moved = kvs_ownfd_peek(&o);
	ck_assert_int_ge(moved, 1024);
	ck_assert(kvs_fd_is(moved, o.dev, o.ino));
	close(fd); /* the program's close */
	ck_assert_int_eq(kvs_ownfd_get(&o, &ticket), moved);
	kvs_ownfd_put(&o, ticket);
	/* A busy user (the walk) does not hold a close of its number for long: the close waits
	 * for the call on the old number only, not for the calls that follow on the new one. */
	ck_assert_int_eq(pthread_create(&t, NULL, ownfd_busy, &busy), 0);
	while (!atomic_load(&busy.phase))
		usleep(1000);
	usleep(100000);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kvs_ownfd_closing(&o, (unsigned)moved, (unsigned)moved);
	ck_assert_msg(ms_since(&t0) < 1000, "a close waited %.0f ms for a busy user",
		      ms_since(&t0));
	pthread_join(t, NULL);
	int again = kvs_ownfd_peek(&o);
	ck_assert_int_gt(again, moved);
	close(moved);
	/* Reused by a file of the program's: not ours, never handed out, never closed. */
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
	ck_assert_int_eq(dup2(null, again), again);
	close(null);
	ck_assert_int_eq(kvs_ownfd_get(&o, &ticket), -1);
	kvs_ownfd_close(&o);
	ck_assert_int_ge(fcntl(again, F_GETFD), 0);
	close(again);
	ck_assert_uint_eq(atomic_load(&o.users[0]) + atomic_load(&o.users[1]), 0);
	/* A close_range to the top: nowhere to go; the number is the program's from then on. */
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	ck_assert_int_eq(fstat(fd, &st), 0);
	o.dev = (uint64_t)st.st_dev;
	o.ino = (uint64_t)st.st_ino;
	kvs_ownfd_set(&o, fd);
	kvs_ownfd_closing(&o, 3, ~0u);
	ck_assert_int_eq(kvs_ownfd_peek(&o), -1);
	close(fd);
}
END_TEST

static Suite *cache_suite(void)
{
	Suite *s = suite_create("cache");
	TCase *core = tcase_create("core");
	TCase *limits = tcase_create("limits");
	TCase *conc = tcase_create("concurrency");
	TCase *crash = tcase_create("crash");

	tcase_add_test(core, test_layout_pinned);
	tcase_add_test(core, test_pin_loading);
	tcase_add_test(core, test_keys_only_region);
	tcase_add_test(core, test_tallies);
	tcase_add_test(core, test_expiry);
	tcase_add_test(core, test_first_seen);
	tcase_add_test(core, test_stage_publish_rekey);
	tcase_add_test(core, test_stage_edges);
	tcase_add_test(core, test_stage_bound);
	tcase_add_test(conc, test_write_sequences);
	tcase_add_test(conc, test_first_seen_concurrent);
	tcase_add_test(core, test_create_attach_mismatch);
	tcase_add_test(core, test_pin_owner_hit);
	tcase_add_test(core, test_failed_then_retry);
	tcase_add_test(core, test_clock_walkthrough);
	tcase_add_test(core, test_reserved_share);
	tcase_add_test(core, test_prealloc_invalidate_not_ready);
	tcase_add_test(limits, test_pin_table_full);
	tcase_add_test(limits, test_process_table_full);
	tcase_add_test(limits, test_corrupt_header_refused);
	tcase_add_test(limits, test_corrupt_chains_contained);
	tcase_add_test(limits, test_noroom_slots_unused);
	tcase_add_test(limits, test_sweep_at_the_headroom);
	tcase_add_test(limits, test_background_population);
	tcase_add_test(limits, test_populate_ahead);
	tcase_add_test(limits, test_victim_in_corrupt_chain_skipped);
	tcase_add_test(limits, test_populate_full_tmpfs);
	tcase_add_test(limits, test_region_too_big_for_shm);
	tcase_add_test(limits, test_shm_fills_up_later);
	tcase_add_test(limits, test_populate_without_fallocate);
	tcase_add_test(crash, test_fork_child_drops_walker);
	tcase_add_test(conc, test_one_owner_per_key);
	tcase_add_test(conc, test_failure_reaches_waiters);
	tcase_add_test(crash, test_owner_killed);
	tcase_add_test(crash, test_lock_holder_killed);
	tcase_add_test(crash, test_dead_process_reaped_on_attach);
	tcase_add_test(crash, test_dead_waiter_does_not_keep_failure);
	tcase_add_test(core, test_invalidate_longer_than_cache);
	tcase_add_test(core, test_deferred_release_retried);
	tcase_add_test(limits, test_lock_word_of_no_thread);
	tcase_add_test(crash, test_stopped_lock_holder);
	tcase_add_test(crash, test_lock_wait_sleeps_and_sees_a_holder_go);
	tcase_add_test(crash, test_live_holder_thread_waited_for);
	tcase_add_test(crash, test_proc_lock_holder_killed);
	tcase_add_test(crash, test_reap_fails_a_dead_owners_load);
	tcase_add_test(crash, test_other_namespace_holder);
	tcase_add_test(crash, test_ownerless_load_taken_over);
	tcase_add_test(core, test_publish_order);
	tcase_add_test(conc, test_pin_between_look_and_lock);
	tcase_add_test(conc, test_wake_latency);
	tcase_add_test(limits, test_uncounted_pins_forgotten);
	tcase_add_test(limits, test_corrupt_bucket_not_evicted);
	tcase_add_test(core, test_pinned_keep_second_chance);
	tcase_add_test(limits, test_wait_on_corrupt_state);
	tcase_add_test(conc, test_waiter_sleeps);
	tcase_add_test(crash, test_ranks_and_reap_count);
	tcase_add_test(core, test_pack_small_files);
	tcase_add_test(core, test_pack_stage_publish);
	tcase_add_test(core, test_pack_stage_small_files);
	tcase_add_test(conc, test_pack_mixed_sizes);
	tcase_add_test(crash, test_pack_holder_killed);
	tcase_add_test(core, test_pack_policy);
	tcase_add_test(crash, test_pack_lock_stuck);
	tcase_add_test(core, test_bitmap_take_range);
	tcase_add_test(conc, test_ownfd_moves_and_waits);
	tcase_add_checked_fixture(core, NULL, teardown);
	tcase_add_checked_fixture(limits, NULL, teardown);
	tcase_add_checked_fixture(conc, NULL, teardown);
	tcase_add_checked_fixture(crash, NULL, teardown);
	tcase_set_timeout(conc, 60);
	tcase_set_timeout(crash, 60);
	suite_add_tcase(s, core);
	suite_add_tcase(s, limits);
	suite_add_tcase(s, conc);
	suite_add_tcase(s, crash);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(cache_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
