/*
 * kvshim-bench-repair: what the walks over every slot record cost on a large region.
 *
 * Three paths walk all of the region's records (16 per frame with 1 MiB shards):
 *   - the repair of a stripe whose holder died (lock.c), paid by the next pin in that stripe
 *     while it holds the stripe;
 *   - the reclaim of a dead process (proc.c), paid by whoever reaps it;
 *   - kvs_cache_stat, paid by `kvshim stat`.
 * Each round kills a real process inside a stripe lock, times the next pin on a key of that
 * stripe, lets a second process die attached, times the reap, then times a stat.
 *
 * The region is built lazy, so only the control plane takes memory, but it must still fit
 * /dev/shm's size.  Prints figures; asserts nothing.
 * Usage: kvshim-bench-repair [GiB] [rounds]   (default 16 GiB, 3 rounds)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cache_params.h"
#include "config.h"
#include "internal.h"

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Fork a process that attaches, takes key's stripe if key is set, and exits at once (dead
 * inside the lock, or dead attached); return once it has gone. */
static int child_dies(struct kvs_cache *c, const struct kvs_config *cfg, const struct kvs_key *key)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		struct kvs_cache *cc = NULL;

		kvs_cache_forget(c);
		if (kvs_cache_open(KVS_CACHE_PARAMS(cfg), 0, &cc, NULL, 0))
			_exit(2);
		if (key && kvs_cache_test_lock_key(cc, key))
			_exit(3);
		_exit(0); /* with the stripe held, if key: the kernel marks it EOWNERDEAD */
	}
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		return -ECHILD;
	return 0;
}

int main(int argc, char **argv)
{
	uint64_t gib = argc > 1 ? strtoull(argv[1], NULL, 0) : 16;
	int rounds = argc > 2 ? atoi(argv[2]) : 3;
	struct kvs_key k = {0x9e3779b97f4a7c15ull, 1, 0};
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	char msg[512], path[256];
	int r;

	kvs_config_defaults(&cfg);
	snprintf(cfg.cache_name, sizeof(cfg.cache_name), "bench-repair.%d", (int)getpid());
	cfg.cache_shard_size = 1u << 20;
	cfg.cache_capacity = gib << 30;
	cfg.cache_reserved = 0;
	cfg.cache_populate = KVS_POPULATE_LAZY;
	cfg.cache_shm_headroom = 0;
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	if (r) {
		fprintf(stderr, "kvshim-bench-repair: %s\n", msg[0] ? msg : "cannot open");
		return 1;
	}
	kvs_cache_path(KVS_CACHE_PARAMS(&cfg), path, sizeof(path));
	printf("%llu GiB of 1 MiB shards: %u frames, %u slot records\n", (unsigned long long)gib,
	       c->nframes, c->nslots);
	/* Some chains to rebuild: 2000 ready shards. */
	for (uint64_t i = 0; i < 2000; i++) {
		struct kvs_key kk = {i * 0x9e3779b97f4a7c15ull + 7, i + 7, 0};
		struct kvs_pin p;

		if (kvs_cache_pin(c, &kk, KVS_ALLOC_LOAD, &p) == KVS_PIN_OWNER) {
			kvs_cache_mark_ready(c, &p, cfg.cache_shard_size);
			kvs_cache_release(c, &p);
		}
	}
	for (int n = 0; n < rounds; n++) {
		struct kvs_region_info info;
		struct kvs_counters totals;
		struct kvs_pin p;

		if (child_dies(c, &cfg, &k))
			break;
		double t0 = now_ms();
		r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p);
		double repair = now_ms() - t0;
		if (r == KVS_PIN_OWNER)
			kvs_cache_mark_failed(c, &p, EIO);
		if (r >= 0)
			kvs_cache_release(c, &p);
		if (child_dies(c, &cfg, NULL))
			break;
		t0 = now_ms();
		int reaped = kvs_cache_reap(c);
		double reap = now_ms() - t0;
		t0 = now_ms();
		kvs_cache_stat(c, &info, &totals, NULL, 0);
		double stat = now_ms() - t0;
		printf("round %d: pin with a stripe repair %.2f ms; reap of %d dead %.2f ms; "
		       "stat %.2f ms\n",
		       n + 1, repair, reaped, reap, stat);
	}
	kvs_cache_close(c);
	unlink(path);
	return 0;
}
