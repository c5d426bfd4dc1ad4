/*
 * kvshim-bench-cache: figures for the shared cache's protocol (issue: foundation).
 *
 *   pin+release pairs per second on hits, 1 and 2 processes;
 *   CPU a waiter burns per second of waiting, futex mode against spin mode;
 *   wake latency from mark-ready to the waiter running, p50 and p99.
 *
 * Prints figures; asserts nothing (the machines are shared: compare ratios within one run).
 * Usage: kvshim-bench-cache [seconds-per-figure]   (default 1)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cache_params.h"
#include "config.h"

static double now_s(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void make_config(struct kvs_config *cfg, int wait_mode)
{
	kvs_config_defaults(cfg);
	snprintf(cfg->cache_name, sizeof(cfg->cache_name), "bench.%d", (int)getpid());
	cfg->cache_shard_size = 4096;
	cfg->cache_capacity = 1024 * 4096;
	cfg->loader_wait = wait_mode;
}

static struct kvs_cache *open_or_die(const struct kvs_config *cfg)
{
	struct kvs_cache *c = NULL;
	char msg[256];

	if (kvs_cache_open(KVS_CACHE_PARAMS(cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg))) {
		fprintf(stderr, "kvshim-bench-cache: %s\n", msg);
		exit(1);
	}
	return c;
}

static void *shared(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	memset(p, 0, len);
	return p;
}

/* Pin and release READY keys (64 of them, round robin) for secs; returns pairs per second. */
static double hit_loop(struct kvs_cache *c, double secs)
{
	struct kvs_pin p;
	uint64_t n = 0;
	double t0 = now_s(CLOCK_MONOTONIC), t;

	do {
		for (int i = 0; i < 4096; i++) {
			struct kvs_key k = {42, 42, (uint64_t)(i & 63)};

			if (kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p) == KVS_PIN_OWNER)
				kvs_cache_mark_ready(c, &p, 4096);
			kvs_cache_release(c, &p);
		}
		n += 4096;
		t = now_s(CLOCK_MONOTONIC);
	} while (t - t0 < secs);
	return (double)n / (t - t0);
}

static void bench_hits(const struct kvs_config *cfg, double secs)
{
	struct kvs_cache *c = open_or_die(cfg);
	double *rate = shared(4096);

	hit_loop(c, 0.05); /* load the keys */
	printf("pin+release on hits, 1 process:   %8.2f M pairs/s\n", hit_loop(c, secs) / 1e6);
	for (int n = 0; n < 2; n++) {
		if (fork() == 0) {
			struct kvs_cache *cc = NULL;

			kvs_cache_forget(c);
			if (kvs_cache_open(KVS_CACHE_PARAMS(cfg), 0, &cc, NULL, 0))
				_exit(1);
			rate[n] = hit_loop(cc, secs);
			kvs_cache_close(cc);
			_exit(0);
		}
	}
	while (wait(NULL) > 0)
		;
	printf("pin+release on hits, 2 processes: %8.2f M pairs/s (%.2f + %.2f)\n",
	       (rate[0] + rate[1]) / 1e6, rate[0] / 1e6, rate[1] / 1e6);
	kvs_cache_close(c);
}

/* One waiter waits secs for a load that the parent publishes late; returns its CPU share. */
static double waiter_cpu(const struct kvs_config *cfg, double secs)
{
	struct kvs_cache *c = open_or_die(cfg);
	struct kvs_key k = {7, 7, (uint64_t)mono_ns()};
	struct kvs_pin own;
	double *cpu = shared(4096);

	if (kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &own) != KVS_PIN_OWNER)
		exit(1);
	if (fork() == 0) {
		struct kvs_cache *cc = NULL;
		struct kvs_pin p;

		kvs_cache_forget(c);
		if (kvs_cache_open(KVS_CACHE_PARAMS(cfg), 0, &cc, NULL, 0) ||
		    kvs_cache_pin(cc, &k, KVS_ALLOC_LOAD, &p) != KVS_PIN_WAIT)
			_exit(1);
		double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
		kvs_cache_wait(cc, &p, 60000000000ull);
		cpu[0] = (now_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / (now_s(CLOCK_MONOTONIC) - w0);
		kvs_cache_release(cc, &p);
		kvs_cache_close(cc);
		_exit(0);
	}
	usleep((useconds_t)(secs * 1e6));
	kvs_cache_mark_ready(c, &own, 4096);
	kvs_cache_release(c, &own);
	wait(NULL);
	kvs_cache_close(c);
	return cpu[0];
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Wake latency: the waiter sleeps on the futex; the parent stamps and publishes. */
static void wake_latency(const struct kvs_config *cfg, int rounds)
{
	struct kvs_cache *c = open_or_die(cfg);
	struct board {
		_Atomic uint64_t stamp, round, pinned;
		uint64_t lat[];
	} *bd = shared(sizeof(*bd) + sizeof(uint64_t) * (size_t)rounds);

	if (fork() == 0) {
		struct kvs_cache *cc = NULL;

		kvs_cache_forget(c);
		if (kvs_cache_open(KVS_CACHE_PARAMS(cfg), 0, &cc, NULL, 0))
			_exit(1);
		for (int r = 0; r < rounds; r++) {
			struct kvs_key k = {9, 9, 1000000 + (uint64_t)r};
			struct kvs_pin p;

			while (bd->round != (uint64_t)r + 1)
				;
			if (kvs_cache_pin(cc, &k, KVS_ALLOC_LOAD, &p) != KVS_PIN_WAIT)
				_exit(2);
			bd->pinned = (uint64_t)r + 1;
			kvs_cache_wait(cc, &p, 10000000000ull);
			bd->lat[r] = mono_ns() - bd->stamp;
			kvs_cache_release(cc, &p);
		}
		kvs_cache_close(cc);
		_exit(0);
	}
	for (int r = 0; r < rounds; r++) {
		struct kvs_key k = {9, 9, 1000000 + (uint64_t)r};
		struct kvs_pin own;

		if (kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &own) != KVS_PIN_OWNER)
			exit(1);
		bd->round = (uint64_t)r + 1;
		while (bd->pinned != (uint64_t)r + 1)
			usleep(10);
		usleep(500); /* past the spin: the waiter is asleep in the kernel */
		bd->stamp = mono_ns();
		kvs_cache_mark_ready(c, &own, 4096);
		kvs_cache_release(c, &own);
	}
	wait(NULL);
	qsort(bd->lat, (size_t)rounds, sizeof(uint64_t), cmp_u64);
	printf("wake latency (futex, waiter asleep): p50 %.1f us, p99 %.1f us (%d rounds)\n",
	       (double)bd->lat[rounds / 2] / 1e3, (double)bd->lat[rounds * 99 / 100] / 1e3, rounds);
	kvs_cache_close(c);
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 1.0;
	struct kvs_config cfg;
	char path[256];

	if (secs <= 0)
		secs = 1.0;
	make_config(&cfg, KVS_WAIT_FUTEX);
	bench_hits(&cfg, secs);
	double f = waiter_cpu(&cfg, secs);
	make_config(&cfg, KVS_WAIT_SPIN);
	double s = waiter_cpu(&cfg, secs);
	printf("waiter CPU per second of waiting:  futex %.3f%% of a core, spin %.1f%%\n", f * 100,
	       s * 100);
	make_config(&cfg, KVS_WAIT_FUTEX);
	wake_latency(&cfg, 2000);
	kvs_cache_path(KVS_CACHE_PARAMS(&cfg), path, sizeof(path));
	unlink(path);
	return 0;
}
