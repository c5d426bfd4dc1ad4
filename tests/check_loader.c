/*
 * check_loader: the loader and the backend, on real files, across real processes.
 *
 * Every read is compared with pread of the same range.  Multi-process cases fork children that
 * open the file, attach and start their own loader; they report through a shared mapping and
 * the region's own counters.  They fork before the parent opens anything, while it has one
 * thread: a child of a process whose threads are running may find a lock held for ever that
 * nobody in it will release (ASan's allocator's, taken by a loader thread as it starts: seen
 * hanging a rank in 1 of about 50 runs of the ranks case next to a busy test).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cache_params.h"
#include "config.h"
#include "backend.h"
#include "copy.h"
#include "loader.h"

#define SHARD 65536u

static char dir[256];
static int seq;

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/var/tmp/check_loader.XXXXXX");
	ck_assert(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[400];

	/* Also the regions of a case that failed before removing its own. */
	snprintf(cmd, sizeof(cmd), "rm -rf %s /dev/shm/kvshim.%u.loader.%d.*", dir,
		 (unsigned)getuid(), (int)getpid());
	ck_assert_int_eq(system(cmd), 0);
}

static void config(struct kvs_config *cfg, int io)
{
	kvs_config_defaults(cfg);
	snprintf(cfg->cache_name, sizeof(cfg->cache_name), "loader.%d.%llx.%d", (int)getpid(),
		 (unsigned long long)time(NULL), seq++); /* see check_cache.c */
	cfg->cache_shard_size = SHARD;
	cfg->cache_capacity = 256 * SHARD;
	cfg->cache_reserved = 0;
	cfg->loader_io = io;
	cfg->loader_io_depth = 8;
	cfg->loader_prefetch = KVS_PREFETCH_OFF;
}

static void remove_region(const struct kvs_config *cfg)
{
	char path[256];

	kvs_cache_path(KVS_CACHE_PARAMS(cfg), path, sizeof(path));
	unlink(path);
}

/* A file of size bytes of a pattern that differs at every byte position. */
static void make_file(const char *name, size_t size, char *path, size_t len)
{
	unsigned char *b = malloc(size);
	int fd;

	ck_assert(b);
	snprintf(path, len, "%s/%s", dir, name);
	for (size_t i = 0; i < size; i++)
		b[i] = (unsigned char)((i * 131) ^ (i >> 11) ^ (size_t)name[0]);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert(fd >= 0);
	ck_assert(write(fd, b, size) == (ssize_t)size);
	close(fd);
	free(b);
}

struct env {
	struct kvs_config cfg;
	struct kvs_cache *c;
	struct kvs_loader *ld;
};

static void env_open(struct env *e)
{
	char msg[256];

	ck_assert_msg(kvs_cache_open(KVS_CACHE_PARAMS(&e->cfg), KVS_OPEN_CREATE, &e->c, msg,
				     sizeof(msg)) == 0,
		      "%s", msg);
	ck_assert_int_eq(kvs_loader_create(e->c, &e->cfg, &e->ld), 0);
}

static void env_close(struct env *e)
{
	kvs_loader_destroy(e->ld);
	kvs_cache_close(e->c);
}

/* Close and remove the region: the end of every case that made one. */
static void env_done(struct env *e)
{
	env_close(e);
	remove_region(&e->cfg);
}

/* Read [off, off+len) of fd through the loader; return the loader's result. */
/* Fill in what the shim's hook knows of the file: its identity, and that it may be kept. */
static void describe_file(struct kvs_read *rd, const struct stat *st)
{
	kvs_block_id(st, &rd->block);
	rd->dev = (uint64_t)st->st_dev;
	rd->ino = (uint64_t)st->st_ino;
	rd->fresh = (struct kvs_fresh){0}; /* settle 0: kept for good */
}

static int64_t loader_read(struct env *e, int fd, void *buf, uint64_t off, uint64_t len)
{
	struct stat st;
	struct iovec v = {buf, len};
	struct kvs_read rd = {.fd = fd, .off = off, .iov = &v, .iovcnt = 1, .len = len};

	ck_assert_int_eq(fstat(fd, &st), 0);
	describe_file(&rd, &st);
	rd.file_size = (uint64_t)st.st_size;
	rd.direct = fcntl(fd, F_GETFL) & O_DIRECT;
	return kvs_loader_read(e->ld, &rd);
}

/* Compare a loader read with pread of the same range. */
static void check_range(struct env *e, int fd, uint64_t off, uint64_t len)
{
	void *a, *b;

	ck_assert_int_eq(posix_memalign(&a, 4096, len + 4096), 0);
	ck_assert_int_eq(posix_memalign(&b, 4096, len + 4096), 0);
	memset(a, 0xaa, len);
	memset(b, 0xaa, len);
	ssize_t want = pread(fd, b, len, (off_t)off);
	int64_t got = loader_read(e, fd, a, off, len);
	ck_assert_int_eq(got, want);
	/* Only the returned count is the contract: past it O_DIRECT may leave the block's tail. */
	ck_assert_msg(want <= 0 || memcmp(a, b, (size_t)want) == 0,
		      "bytes differ at off %lu len %lu", (unsigned long)off, (unsigned long)len);
	free(a);
	free(b);
}

static struct kvs_counters totals(struct env *e)
{
	struct kvs_region_info info;
	struct kvs_counters t;

	ck_assert_int_ge(kvs_cache_stat(e->c, &info, &t, NULL, 0), 0);
	return t;
}

static uint32_t pinned(struct env *e)
{
	struct kvs_region_info info;
	struct kvs_counters t;

	ck_assert_int_ge(kvs_cache_stat(e->c, &info, &t, NULL, 0), 0);
	return info.slots_pinned;
}

static void *shared_anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	ck_assert(p != MAP_FAILED);
	return p;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------------ core */

START_TEST(test_order)
{
	uint32_t o[12], want1[12] = {1, 5, 9, 2, 6, 10, 3, 7, 11, 0, 4, 8};

	kvs_loader_order(1, 4, 12, o);
	ck_assert_mem_eq(o, want1, sizeof(want1));
	kvs_loader_order(0, 1, 5, o);
	for (uint32_t i = 0; i < 5; i++)
		ck_assert_uint_eq(o[i], i);
	/* More ranks than shards: every shard still visited once. */
	kvs_loader_order(6, 8, 3, o);
	ck_assert_uint_eq(o[0] + o[1] + o[2], 3);
	ck_assert(o[0] != o[1] && o[1] != o[2] && o[0] != o[2]);
}
END_TEST

/* Odd sizes and ranges: unaligned buffered reads, aligned O_DIRECT reads, EOF. */
static void ranges(int io, bool direct)
{
	struct env e;
	char path[300];
	size_t size = 5 * SHARD + 12345;

	config(&e.cfg, io);
	env_open(&e);
	make_file("ranges", size, path, sizeof(path));
	int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
	ck_assert(fd >= 0);
	if (direct) {
		check_range(&e, fd, 0, 6 * SHARD);
		check_range(&e, fd, SHARD, 2 * SHARD);
		check_range(&e, fd, 4096, SHARD);
		check_range(&e, fd, 5 * SHARD, SHARD);
		check_range(&e, fd, 6 * SHARD, SHARD); /* past the end: 0 */
	} else {
		check_range(&e, fd, 0, size);
		check_range(&e, fd, 1, 3 * SHARD + 7);
		check_range(&e, fd, SHARD - 1, 2);
		check_range(&e, fd, size - 100, 4096); /* short at EOF */
		check_range(&e, fd, size, 4096);
		check_range(&e, fd, 0, size + SHARD);
	}
	struct kvs_counters t = totals(&e);
	ck_assert_uint_ge(t.v[KVS_CTR_shards_hit], 1);
	ck_assert_uint_eq(t.v[KVS_CTR_shards_loaded], 6);
	ck_assert_uint_eq(t.v[KVS_CTR_backend_bytes], size);
	ck_assert_uint_eq(t.v[KVS_CTR_fallbacks], 0);
	ck_assert_uint_eq(pinned(&e), 0);
	close(fd);
	env_done(&e);
}

START_TEST(test_ranges_threads_buffered)
{
	ranges(KVS_IO_THREADS, false);
}
END_TEST

START_TEST(test_ranges_threads_direct)
{
	ranges(KVS_IO_THREADS, true);
}
END_TEST

START_TEST(test_ranges_uring_direct)
{
	struct kvs_config cfg;
	struct kvs_cache *c;
	struct kvs_loader *ld;

	config(&cfg, KVS_IO_URING);
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, NULL, 0), 0);
	int r = kvs_loader_create(c, &cfg, &ld);
	if (r) {
		fprintf(stderr, "check_loader: io_uring unavailable (%s): covered by threads\n",
			strerror(-r));
		kvs_cache_close(c);
		remove_region(&cfg);
		return;
	}
	ck_assert_str_eq(kvs_loader_backend(ld), "io_uring");
	kvs_loader_destroy(ld);
	kvs_cache_close(c);
	remove_region(&cfg);
	ranges(KVS_IO_URING, true);
	ranges(KVS_IO_URING, false);
}
END_TEST

START_TEST(test_scatter_iovecs)
{
	struct env e;
	char path[300];
	size_t size = 3 * SHARD;
	struct stat st;

	config(&e.cfg, KVS_IO_AUTO);
	env_open(&e);
	make_file("iov", size, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	char *want = malloc(size), *a = calloc(1, 1000), *b = calloc(1, SHARD),
	     *c = calloc(1, size);
	ck_assert(pread(fd, want, size, 0) == (ssize_t)size);
	struct iovec v[3] = {{a, 1000}, {b, SHARD}, {c, size}};
	struct kvs_read rd = {
	    .fd = fd, .off = 0, .iov = v, .iovcnt = 3, .len = 1000 + SHARD + size};
	ck_assert_int_eq(fstat(fd, &st), 0);
	describe_file(&rd, &st);
	rd.file_size = size;
	ck_assert_int_eq(kvs_loader_read(e.ld, &rd), (int64_t)size);
	ck_assert_mem_eq(a, want, 1000);
	ck_assert_mem_eq(b, want + 1000, SHARD);
	ck_assert_mem_eq(c, want + 1000 + SHARD, size - 1000 - SHARD);
	free(want);
	free(a);
	free(b);
	free(c);
	close(fd);
	env_done(&e);
}
END_TEST

/* Poll until key reaches a state, for up to a second. */
static int wait_state(struct env *e, const struct kvs_key *k, int want)
{
	int s = -1;

	for (int i = 0; i < 1000; i++) {
		s = kvs_cache_lookup(e->c, k);
		if (s == want)
			break;
		usleep(1000);
	}
	return s;
}

START_TEST(test_prefetch)
{
	for (int mode = KVS_PREFETCH_ALLOC; mode <= KVS_PREFETCH_READ; mode++) {
		struct env e;
		char path[300];
		struct stat st;
		struct kvs_key k;

		config(&e.cfg, KVS_IO_AUTO);
		e.cfg.loader_prefetch = mode;
		env_open(&e);
		make_file(mode == KVS_PREFETCH_READ ? "pr" : "pa", 2 * SHARD + 10, path,
			  sizeof(path));
		int fd = open(path, O_RDONLY);
		check_range(&e, fd, 0, SHARD);
		ck_assert_int_eq(fstat(fd, &st), 0);
		kvs_block_id(&st, &k);
		k.shard = 1;
		ck_assert_int_eq(
		    wait_state(&e, &k,
			       mode == KVS_PREFETCH_READ ? KVS_SLOT_READY : KVS_SLOT_ALLOCATED),
		    mode == KVS_PREFETCH_READ ? KVS_SLOT_READY : KVS_SLOT_ALLOCATED);
		ck_assert_uint_eq(totals(&e).v[KVS_CTR_prefetches], 1);
		/* Shard 2 comes next; never past the end of the file. */
		check_range(&e, fd, SHARD, 2 * SHARD);
		k.shard = 3;
		usleep(50000);
		ck_assert_int_eq(kvs_cache_lookup(e.c, &k), -ENOENT);
		ck_assert_uint_eq(pinned(&e), 0);
		close(fd);
		/* A miss whose next shard is READY already: the read-ahead's pin is a hit, which it
		 * must let go of. */
		make_file(mode == KVS_PREFETCH_READ ? "prh" : "pah", 2 * SHARD, path, sizeof(path));
		fd = open(path, O_RDONLY);
		check_range(&e, fd, SHARD, SHARD);
		check_range(&e, fd, 0, SHARD);
		usleep(50000);
		ck_assert_uint_eq(pinned(&e), 0);
		close(fd);
		env_done(&e);
	}
}
END_TEST

/* A shard that starts exactly at the end of the file is never read ahead.  The dispatch
 * thread acts on remembered reads in order when idle, so once the read-ahead that a second
 * read asked for is READY, the first read's has been decided: deterministic, no sleep. */
START_TEST(test_prefetch_stops_at_eof)
{
	struct env e;
	char path_a[300], path_b[300];
	struct stat st;
	struct kvs_key k;

	config(&e.cfg, KVS_IO_AUTO);
	e.cfg.loader_prefetch = KVS_PREFETCH_READ;
	env_open(&e);
	make_file("ea", 2 * SHARD, path_a, sizeof(path_a));
	make_file("eb", 3 * SHARD, path_b, sizeof(path_b));
	int fa = open(path_a, O_RDONLY), fb = open(path_b, O_RDONLY);
	ck_assert(fa >= 0 && fb >= 0);
	check_range(&e, fa, SHARD, SHARD); /* the last shard of a: nothing after it */
	check_range(&e, fb, 0, SHARD);	   /* reads b's shard 1 ahead */
	ck_assert_int_eq(fstat(fb, &st), 0);
	kvs_block_id(&st, &k);
	k.shard = 1;
	ck_assert_int_eq(wait_state(&e, &k, KVS_SLOT_READY), KVS_SLOT_READY);
	ck_assert_uint_eq(totals(&e).v[KVS_CTR_prefetches], 1);
	ck_assert_int_eq(fstat(fa, &st), 0);
	kvs_block_id(&st, &k);
	k.shard = 2;
	ck_assert_int_eq(kvs_cache_lookup(e.c, &k), -ENOENT);
	ck_assert_uint_eq(pinned(&e), 0);
	close(fa);
	close(fb);
	env_done(&e);
}
END_TEST

START_TEST(test_backend_only)
{
	struct env e;
	char path[300];

	config(&e.cfg, KVS_IO_AUTO);
	e.cfg.loader_backend_only = true;
	env_open(&e);
	make_file("bo", 2 * SHARD, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	check_range(&e, fd, 0, 2 * SHARD);
	check_range(&e, fd, 0, 2 * SHARD);
	struct kvs_counters t = totals(&e);
	/* Every read goes to storage; the cache only coordinates. */
	ck_assert_uint_ge(t.v[KVS_CTR_backend_bytes], 4 * SHARD);
	ck_assert_uint_eq(t.v[KVS_CTR_shards_hit], 0);
	close(fd);
	env_done(&e);
}
END_TEST

/* ------------------------------------------------------------------ limits */

/* Every slot pinned: the cache can take none of a read, holds nothing, reads nothing, and
 * hands it back (-ENOBUFS) for the caller's real call, which reads what was asked with the
 * program's own depth. */
START_TEST(test_all_pinned_reads_itself)
{
	struct env e;
	char path[300];
	struct kvs_pin p[2];
	void *buf;

	config(&e.cfg, KVS_IO_AUTO);
	e.cfg.cache_capacity = 2 * SHARD;
	env_open(&e);
	for (int i = 0; i < 2; i++) {
		struct kvs_key k = {77, 77, (uint64_t)i};
		ck_assert_int_eq(kvs_cache_pin(e.c, &k, KVS_ALLOC_LOAD, &p[i]), KVS_PIN_OWNER);
		kvs_cache_mark_ready(e.c, &p[i], 1);
	}
	make_file("full", 4 * SHARD, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	ck_assert_int_eq(posix_memalign(&buf, 4096, 4 * SHARD), 0);
	ck_assert_int_eq(loader_read(&e, fd, buf, 0, 4 * SHARD), -ENOBUFS);
	ck_assert_uint_eq(totals(&e).v[KVS_CTR_backend_bytes], 0);
	ck_assert_uint_eq(totals(&e).v[KVS_CTR_fallbacks], 1);
	ck_assert_uint_eq(pinned(&e), 2);
	kvs_cache_release(e.c, &p[0]);
	kvs_cache_release(e.c, &p[1]);
	ck_assert_uint_eq(pinned(&e), 0);
	check_range(&e, fd, 0, 4 * SHARD); /* with room again, served */
	free(buf);
	close(fd);
	env_done(&e);
}
END_TEST

/* A shard the cache cannot take within a read it takes in part is read by the loader, and
 * only its wanted bytes: shard 1 of the file is READY and held, every other slot pinned; a
 * read from the middle of shard 0 into shard 1 hits shard 1 and reads [from, end of shard 0)
 * itself, not shard 0 from its start (buffered, and O_DIRECT straight into the aligned
 * buffer). */
START_TEST(test_fallback_reads_what_was_asked)
{
	struct env e;
	char path[300];
	struct kvs_pin p[2], held;
	struct stat st;
	struct kvs_read rd = {0};

	config(&e.cfg, KVS_IO_AUTO);
	e.cfg.cache_capacity = 3 * SHARD;
	env_open(&e);
	make_file("asked", 4 * SHARD, path, sizeof(path));
	for (int direct = 0; direct < 2; direct++) {
		int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
		ck_assert_int_ge(fd, 0);
		check_range(&e, fd, SHARD, SHARD); /* shard 1 READY */
		ck_assert_int_eq(fstat(fd, &st), 0);
		describe_file(&rd, &st);
		struct kvs_key k1 = {rd.block.block_lo, rd.block.block_hi, 1};
		ck_assert_int_eq(kvs_cache_pin(e.c, &k1, KVS_ALLOC_LOAD, &held), KVS_PIN_HIT);
		for (int i = 0; i < 2; i++) {
			struct kvs_key k = {78, 78, (uint64_t)(2 * direct + i)};
			ck_assert_int_eq(kvs_cache_pin(e.c, &k, KVS_ALLOC_LOAD, &p[i]),
					 KVS_PIN_OWNER);
			kvs_cache_mark_ready(e.c, &p[i], 1);
		}
		uint64_t off = SHARD / 2 + (direct ? 0 : 100), len = SHARD;
		uint64_t before = totals(&e).v[KVS_CTR_backend_bytes];
		check_range(&e, fd, off, len);
		uint64_t got = totals(&e).v[KVS_CTR_backend_bytes] - before;
		ck_assert_msg(got == SHARD - off, "%s: %lu storage bytes, want %lu",
			      direct ? "O_DIRECT" : "buffered", (unsigned long)got,
			      (unsigned long)(SHARD - off));
		kvs_cache_release(e.c, &held);
		kvs_cache_release(e.c, &p[0]);
		kvs_cache_release(e.c, &p[1]);
		kvs_cache_invalidate(e.c, &rd.block, 0, 3); /* the next pass starts cold */
		close(fd);
	}
	env_done(&e);
}
END_TEST

START_TEST(test_file_shrank_falls_back)
{
	struct env e;
	char path[300];
	struct stat st;
	char *buf = malloc(3 * SHARD);

	config(&e.cfg, KVS_IO_AUTO);
	env_open(&e);
	make_file("shrink", 3 * SHARD, path, sizeof(path));
	int fd = open(path, O_RDWR);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(ftruncate(fd, SHARD), 0);
	/* The identity the hook took says 3 shards; storage has 1: never promise the bytes. */
	struct iovec v = {buf, 3 * SHARD};
	struct kvs_read rd = {.fd = fd, .off = 0, .iov = &v, .iovcnt = 1, .len = 3 * SHARD};
	describe_file(&rd, &st);
	rd.file_size = 3 * SHARD;
	ck_assert_int_lt(kvs_loader_read(e.ld, &rd), 0);
	ck_assert_uint_eq(pinned(&e), 0);
	ck_assert_uint_ge(totals(&e).v[KVS_CTR_failures], 1);
	free(buf);
	close(fd);
	env_done(&e);
}
END_TEST

/* kvs_loader_pin/settle/unpin (cuFileReadAsync's path): reads and settle count hits, and a shard
 * whose load failed and whose own storage read comes up short fails the task, never reports bytes
 * it does not have. */
START_TEST(test_settle_hits_and_failures)
{
	struct env e;
	char path[300];
	struct stat st;
	struct kvs_task t;
	char *buf = malloc(3 * SHARD);

	config(&e.cfg, KVS_IO_AUTO);
	env_open(&e);
	make_file("settle", 3 * SHARD, path, sizeof(path));
	int fd = open(path, O_RDWR);
	ck_assert_int_eq(fstat(fd, &st), 0);
	struct kvs_read rd = {.fd = fd, .off = 0, .len = 3 * SHARD, .file_size = 3 * SHARD};
	describe_file(&rd, &st);

	/* Warm: three hits, counted by a read and by settle. */
	ck_assert_int_eq(loader_read(&e, fd, buf, 0, 3 * SHARD), 3 * SHARD);
	uint64_t hits = totals(&e).v[KVS_CTR_shards_hit];
	ck_assert_int_eq(loader_read(&e, fd, buf, 0, 3 * SHARD), 3 * SHARD);
	ck_assert_uint_eq(totals(&e).v[KVS_CTR_shards_hit] - hits, 3);
	hits += 3;
	ck_assert_int_eq(kvs_loader_pin(e.ld, &t, &rd), 0);
	ck_assert_int_eq(kvs_loader_settle(e.ld, &t), 0);
	kvs_loader_unpin(e.ld, &t);
	ck_assert_uint_eq(totals(&e).v[KVS_CTR_shards_hit] - hits, 3);

	/* Another block whose identity says 3 shards while storage has 1. */
	ck_assert_int_eq(ftruncate(fd, SHARD), 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	describe_file(&rd, &st);
	ck_assert_int_eq(kvs_loader_pin(e.ld, &t, &rd), 0);
	ck_assert_int_lt(kvs_loader_settle(e.ld, &t), 0);
	kvs_loader_unpin(e.ld, &t);
	ck_assert_uint_eq(pinned(&e), 0);
	free(buf);
	close(fd);
	env_done(&e);
}
END_TEST

START_TEST(test_idle_burns_no_cpu)
{
	struct env e;
	char path[300];
	struct timespec a, b;

	config(&e.cfg, KVS_IO_AUTO);
	e.cfg.loader_prefetch = KVS_PREFETCH_ALLOC;
	env_open(&e);
	make_file("idle", 2 * SHARD, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	check_range(&e, fd, 0, SHARD);
	usleep(100000);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
	usleep(1000000);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
	long us = (b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000;
	ck_assert_msg(us < 5000, "idle loader used %ld us of CPU in a second", us);
	close(fd);
	env_done(&e);
}
END_TEST

/* ------------------------------------------------------------------ concurrency */

#define NPROC 8

START_TEST(test_ranks_read_storage_once)
{
	struct env e;
	char path[4][300];
	pid_t pids[NPROC];
	size_t size = 8 * SHARD + 4096;

	config(&e.cfg, KVS_IO_AUTO);
	for (int f = 0; f < 4; f++) {
		char n[8] = {(char)('a' + f), 0};
		make_file(n, size, path[f], sizeof(path[f]));
	}
	_Atomic int *bd = shared_anon(4096);
	pid_t parent = getpid();
	for (int n = 0; n < NPROC; n++) {
		pids[n] = fork(); /* before env_open: see the top of this file */
		if (pids[n])
			continue;
		struct env me = {.cfg = e.cfg};
		env_open(&me); /* the ranks and the parent race to make the region */
		while (!bd[0])
			if (getppid() != parent) /* the parent failed before the start */
				_exit(3);
		for (int f = 0; f < 4; f++) {
			int fd = open(path[(f + n) % 4], O_RDONLY | O_DIRECT);
			void *a, *b;
			if (fd < 0 || posix_memalign(&a, 4096, size + 4096) ||
			    posix_memalign(&b, 4096, size + 4096))
				_exit(2);
			if (loader_read(&me, fd, a, 0, size + 4096) != (int64_t)size ||
			    pread(fd, b, size + 4096, 0) != (ssize_t)size || memcmp(a, b, size))
				bd[1 + n] = 1;
			close(fd);
		}
		env_close(&me);
		_exit(0);
	}
	env_open(&e);
	bd[0] = 1;
	for (int n = 0; n < NPROC; n++) {
		int st;
		ck_assert(waitpid(pids[n], &st, 0) == pids[n]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: %#x", n, st);
		ck_assert_int_eq(bd[1 + n], 0);
	}
	struct kvs_counters t = totals(&e);
	ck_assert_uint_eq(t.v[KVS_CTR_backend_bytes], 4 * size);
	ck_assert_uint_eq(t.v[KVS_CTR_shards_loaded], 4 * 9);
	ck_assert_uint_eq(t.v[KVS_CTR_requests], NPROC * 4);
	ck_assert_uint_eq(pinned(&e), 0);
	env_done(&e);
}
END_TEST

/* Many engine threads of one process submit at once. */
struct thread_arg {
	struct env *e;
	int fd, n;
	size_t size;
	int bad;
};

static void *reader_thread(void *p)
{
	struct thread_arg *a = p;
	char *got = malloc(a->size), *want = malloc(a->size);

	for (int round = 0; round < 20 && got && want; round++) {
		uint64_t off = ((uint64_t)(a->n * 7 + round * 13) % 16) * 4096;
		uint64_t len = a->size - off;
		struct stat st;
		struct iovec v = {got, len};
		struct kvs_read rd = {.fd = a->fd, .off = off, .iov = &v, .iovcnt = 1, .len = len};

		if (fstat(a->fd, &st))
			a->bad++;
		describe_file(&rd, &st);
		rd.file_size = (uint64_t)st.st_size;
		if (kvs_loader_read(a->e->ld, &rd) != (int64_t)len ||
		    pread(a->fd, want, len, (off_t)off) != (ssize_t)len || memcmp(got, want, len))
			a->bad++;
	}
	free(got);
	free(want);
	return NULL;
}

START_TEST(test_threads_submit_at_once)
{
	struct env e;
	char path[300];
	pthread_t th[8];
	struct thread_arg a[8];
	size_t size = 6 * SHARD + 333;

	config(&e.cfg, KVS_IO_AUTO);
	e.cfg.loader_waiting_queue_depth = 2; /* submitters also wait for room */
	env_open(&e);
	make_file("threads", size, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	for (int i = 0; i < 8; i++) {
		a[i] = (struct thread_arg){.e = &e, .fd = fd, .n = i, .size = size};
		ck_assert_int_eq(pthread_create(&th[i], NULL, reader_thread, &a[i]), 0);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(a[i].bad, 0);
	}
	struct kvs_counters t = totals(&e);
	ck_assert_uint_eq(t.v[KVS_CTR_shards_loaded], 7);
	ck_assert_uint_eq(t.v[KVS_CTR_requests], 8 * 20);
	ck_assert_uint_eq(pinned(&e), 0);
	close(fd);
	env_done(&e);
}
END_TEST

/* ------------------------------------------------------------------ crash */

/* A process owns shard 0 and then fails, stalls, or dies; readers still get the bytes. */
enum owner_fate { FATE_FAIL, FATE_STALL, FATE_DIE };

static void owner_then(enum owner_fate fate)
{
	struct env e;
	char path[300];
	struct stat st;

	config(&e.cfg, KVS_IO_AUTO);
	e.cfg.loader_wait_timeout_ms = 300;
	make_file("own", 2 * SHARD, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	ck_assert_int_eq(fstat(fd, &st), 0);
	_Atomic int *bd = shared_anon(4096);
	pid_t parent = getpid();
	pid_t owner = fork(); /* before env_open: see the top of this file */
	if (owner == 0) {
		struct kvs_cache *c;
		struct kvs_pin p;
		struct kvs_key k;

		for (; !bd[2]; usleep(1000)) /* the parent has made the region */
			if (getppid() != parent)
				_exit(4); /* it failed first */
		if (kvs_cache_open(KVS_CACHE_PARAMS(&e.cfg), 0, &c, NULL, 0))
			_exit(2);
		kvs_block_id(&st, &k);
		if (kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p) != KVS_PIN_OWNER)
			_exit(3);
		bd[0] = 1;
		while (!bd[1])
			usleep(1000);
		if (fate == FATE_FAIL)
			kvs_cache_mark_failed(c, &p, EIO);
		for (;;)
			pause();
	}
	env_open(&e);
	bd[2] = 1;
	while (!bd[0])
		usleep(1000);
	if (fate == FATE_DIE) {
		kill(owner, SIGKILL);
		waitpid(owner, NULL, 0);
	}
	bd[1] = 1;
	uint64_t t0 = mono_ms();
	check_range(&e, fd, 0, 2 * SHARD);
	uint64_t ms = mono_ms() - t0;
	struct kvs_counters t = totals(&e);
	ck_assert_uint_ge(t.v[KVS_CTR_fallbacks], 1);
	if (fate == FATE_STALL)
		ck_assert_uint_ge(ms, 250); /* waited for the timeout, then read itself */
	else
		ck_assert_uint_lt(ms, 1000);
	if (fate != FATE_DIE) {
		kill(owner, SIGKILL);
		waitpid(owner, NULL, 0);
	}
	kvs_cache_reap(e.c);
	ck_assert_uint_eq(pinned(&e), 0);
	close(fd);
	env_done(&e);
}

START_TEST(test_owner_fails)
{
	owner_then(FATE_FAIL);
}
END_TEST

START_TEST(test_owner_stalls)
{
	owner_then(FATE_STALL);
}
END_TEST

START_TEST(test_owner_dies)
{
	owner_then(FATE_DIE);
}
END_TEST

/* An owner's own read outlasts loader.wait_timeout_ms: the loader must not let go of a read in
 * flight (its request lives in the caller's task), and still return the right bytes. */
START_TEST(test_owner_read_outlasts_timeout)
{
	struct env e;
	char path[300];

	kvs_backend_test_delay_us = 30000;
	config(&e.cfg, KVS_IO_AUTO);
	e.cfg.loader_wait_timeout_ms = 1;
	e.cfg.loader_io_depth = 1;
	env_open(&e);
	kvs_backend_test_delay_us = 0;
	make_file("slow", 20 * SHARD + 4096, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	check_range(&e, fd, 0, 2 * SHARD);		   /* ops on the stack */
	check_range(&e, fd, 2 * SHARD, 17 * SHARD + 4096); /* ops on the heap */
	usleep(100000);
	ck_assert_uint_eq(pinned(&e), 0);
	close(fd);
	env_done(&e);
}
END_TEST

/* ------------------------------------------------------------------ backend */

struct done_board {
	struct kvs_bio bio;
	int calls; /* __atomic: set on a backend thread */
};

static void count_done(struct kvs_bio *bio)
{
	__atomic_fetch_add(&((struct done_board *)bio->arg)->calls, 1, __ATOMIC_SEQ_CST);
}

static void board_init(struct done_board *d, int fd, void *buf, uint64_t off)
{
	memset(d, 0, sizeof(*d));
	d->bio = (struct kvs_bio){
	    .fd = fd, .buf = buf, .off = off, .len = SHARD, .done = count_done, .arg = d};
}

/* Wait up to 5 s for d's read to finish; then its bytes must be the file's. */
static void board_check(struct done_board *d, int fd)
{
	static unsigned char want[SHARD];
	uint64_t t0 = mono_ms();

	while (!__atomic_load_n(&d->calls, __ATOMIC_SEQ_CST) && mono_ms() - t0 < 5000)
		usleep(1000);
	ck_assert_int_eq(__atomic_load_n(&d->calls, __ATOMIC_SEQ_CST), 1);
	ck_assert_int_eq(d->bio.result, SHARD);
	ck_assert_int_eq(pread(fd, want, SHARD, (off_t)d->bio.off), SHARD);
	ck_assert(memcmp(d->bio.buf, want, SHARD) == 0);
}

/* A submission that fails after its SQE was filled: the read is done synchronously, and the
 * SQE must never reach the kernel, whose next submit would read into a buffer reused since. */
/* A thread that cannot start fails the backend's creation, whichever thread it is: an
 * io_uring backend without its reaper would never complete a read. */
START_TEST(test_backend_thread_start_fails)
{
	struct kvs_backend *be = NULL;

	if (kvs_backend_create(KVS_IO_URING, 4, &be) == 0) {
		kvs_backend_destroy(be);
		kvs_backend_test_fail_thread = 1; /* the reaper */
		ck_assert_int_eq(kvs_backend_create(KVS_IO_URING, 4, &be), -EAGAIN);
	} else {
		fprintf(stderr,
			"check_loader: io_uring unavailable: its reaper's start not tested\n");
	}
	kvs_backend_test_fail_thread = 3; /* the third worker */
	ck_assert_int_eq(kvs_backend_create(KVS_IO_THREADS, 4, &be), -EAGAIN);
	ck_assert_uint_eq(kvs_backend_test_fail_thread, 0);
	ck_assert_int_eq(kvs_backend_create(KVS_IO_THREADS, 4, &be), 0);
	kvs_backend_destroy(be);
}
END_TEST

START_TEST(test_backend_submit_failure)
{
	char path[512];
	struct kvs_backend *be;
	struct done_board a, b;
	void *buf1, *buf2;

	make_file("s", 4 * SHARD, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	if (kvs_backend_create(KVS_IO_URING, 4, &be)) {
		fprintf(stderr, "check_loader: io_uring unavailable: submit failure not tested\n");
		close(fd);
		return;
	}
	ck_assert_int_eq(posix_memalign(&buf1, 4096, SHARD), 0);
	ck_assert_int_eq(posix_memalign(&buf2, 4096, SHARD), 0);
	board_init(&a, fd, buf1, 0);
	kvs_backend_test_fail_submits = 1;
	kvs_backend_submit(be, &a.bio);
	ck_assert_uint_eq(kvs_backend_test_fail_submits, 0);
	/* Done on this thread, before the submit returned. */
	ck_assert_int_eq(__atomic_load_n(&a.calls, __ATOMIC_SEQ_CST), 1);
	board_check(&a, fd);
	/* The buffer is ours again: a later submit through the same ring must not touch it. */
	memset(buf1, 0xee, SHARD);
	board_init(&b, fd, buf2, SHARD);
	kvs_backend_submit(be, &b.bio);
	board_check(&b, fd);
	usleep(100000); /* room for a stale read to land */
	ck_assert_int_eq(__atomic_load_n(&a.calls, __ATOMIC_SEQ_CST), 1);
	for (size_t i = 0; i < SHARD; i++)
		ck_assert_uint_eq(((unsigned char *)buf1)[i], 0xee);
	kvs_backend_destroy(be);
	free(buf1);
	free(buf2);
	close(fd);
}
END_TEST

/* The reaper's wait fails: it polls instead of leaving, so every read still completes, and so
 * does a loader read that waits for its own backend reads. */
START_TEST(test_backend_wait_error)
{
	char path[512];
	struct kvs_backend *be;
	struct done_board d[4];
	void *buf[4];
	struct env e;

	make_file("w", 4 * SHARD, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	kvs_backend_test_fail_wait = true;
	int r = kvs_backend_create(KVS_IO_URING, 8, &be);
	kvs_backend_test_fail_wait = false;
	if (r) {
		fprintf(stderr, "check_loader: io_uring unavailable: wait error not tested\n");
		close(fd);
		return;
	}
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(posix_memalign(&buf[i], 4096, SHARD), 0);
		board_init(&d[i], fd, buf[i], (uint64_t)i * SHARD);
		kvs_backend_submit(be, &d[i].bio);
	}
	for (int i = 0; i < 4; i++)
		board_check(&d[i], fd);
	kvs_backend_destroy(be); /* the stop NOP still stops it */
	for (int i = 0; i < 4; i++)
		free(buf[i]);

	config(&e.cfg, KVS_IO_URING);
	kvs_backend_test_fail_wait = true;
	env_open(&e);
	kvs_backend_test_fail_wait = false;
	check_range(&e, fd, 0, 4 * SHARD);
	check_range(&e, fd, SHARD / 2, 2 * SHARD);
	env_done(&e);
	close(fd);
}
END_TEST

/* Storage returns a short read mid-file (not at its end): the reaper reads the rest, so the
 * owner publishes the whole shard and nobody falls back to reading it again. */
START_TEST(test_backend_short_read)
{
	char path[512];
	struct kvs_backend *be;
	struct done_board a;
	void *buf;

	make_file("h", 4 * SHARD, path, sizeof(path));
	int fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	if (kvs_backend_create(KVS_IO_URING, 4, &be)) {
		fprintf(stderr, "check_loader: io_uring unavailable: short reads not tested\n");
		close(fd);
		return;
	}
	ck_assert_int_eq(posix_memalign(&buf, 4096, SHARD), 0);
	board_init(&a, fd, buf, SHARD);
	kvs_backend_test_short_reads = 1;
	kvs_backend_submit(be, &a.bio);
	board_check(&a, fd);
	ck_assert_uint_eq(kvs_backend_test_short_reads, 0);
	kvs_backend_destroy(be);
	free(buf);

	/* Through the loader: one storage read per shard, no fallback. */
	struct env e;
	config(&e.cfg, KVS_IO_URING);
	env_open(&e);
	kvs_backend_test_short_reads = 2;
	check_range(&e, fd, 0, 2 * SHARD);
	kvs_backend_test_short_reads = 0;
	struct kvs_counters t = totals(&e);
	ck_assert_uint_eq(t.v[KVS_CTR_shards_loaded], 2);
	ck_assert_uint_eq(t.v[KVS_CTR_fallbacks], 0);
	ck_assert_uint_eq(t.v[KVS_CTR_failures], 0);
	env_done(&e);
	close(fd);
}
END_TEST

/* The streaming copy (loader.copy = stream) against memcpy: every alignment of source and
 * destination around the 64-byte line, sizes around its threshold and its loop steps. */
START_TEST(test_copy_stream)
{
	size_t max = KVS_COPY_STREAM_MIN * 2 + 200;
	char *src = malloc(max + 64), *a = malloc(max + 64), *b = malloc(max + 64);
	size_t sizes[] = {0,
			  1,
			  63,
			  KVS_COPY_STREAM_MIN - 1,
			  KVS_COPY_STREAM_MIN,
			  KVS_COPY_STREAM_MIN + 1,
			  KVS_COPY_STREAM_MIN + 127,
			  max};

	ck_assert(src && a && b);
	for (size_t i = 0; i < max + 64; i++)
		src[i] = (char)(i * 131 + 7);
	/* Each loop this CPU has: AVX2's where present, and SSE2's everywhere on x86_64. */
	for (int no_avx2 = 0; no_avx2 < 2; no_avx2++) {
		kvs_copy_test_no_avx2 = no_avx2;
		for (unsigned so = 0; so < 64; so += 7) {
			for (unsigned dof = 0; dof < 64; dof += 5) {
				for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
					size_t n = sizes[k];

					memset(a, 0x55, max + 64);
					memset(b, 0x55, max + 64);
					kvs_copy_stream(a + dof, src + so, n);
					memcpy(b + dof, src + so, n);
					ck_assert_msg(memcmp(a, b, max + 64) == 0,
						      "%s: src+%u dst+%u n %zu differs",
						      kvs_copy_stream_kind(), so, dof, n);
				}
			}
		}
	}
	kvs_copy_test_no_avx2 = false;
	kvs_copy_fn f = kvs_copy_pick(KVS_COPY_MEMCPY);
	f(a, src, 100);
	ck_assert_int_eq(memcmp(a, src, 100), 0);
#if defined(__x86_64__)
	/* Every x86_64 has SSE2's streaming stores: stream and auto pick the streaming copy (a
	 * build that lost it would copy right, only slower, and no byte check would see it). */
	ck_assert(kvs_copy_pick(KVS_COPY_STREAM) == kvs_copy_stream);
	ck_assert(kvs_copy_pick(KVS_COPY_AUTO) == kvs_copy_stream);
	ck_assert(kvs_copy_pick(KVS_COPY_MEMCPY) != kvs_copy_stream);
	/* The loop follows the CPU (an AVX2 loop on a CPU without AVX2 is SIGILL). */
	ck_assert_str_eq(kvs_copy_stream_kind(), __builtin_cpu_supports("avx2") ? "avx2" : "sse2");
#endif
	free(src);
	free(a);
	free(b);
}
END_TEST

static Suite *loader_suite(void)
{
	Suite *s = suite_create("loader");
	TCase *core = tcase_create("core");
	TCase *limits = tcase_create("limits");
	TCase *conc = tcase_create("concurrency");
	TCase *crash = tcase_create("crash");
	TCase *all[] = {core, limits, conc, crash};

	tcase_add_test(core, test_order);
	tcase_add_test(core, test_ranges_threads_buffered);
	tcase_add_test(core, test_ranges_threads_direct);
	tcase_add_test(core, test_ranges_uring_direct);
	tcase_add_test(core, test_scatter_iovecs);
	tcase_add_test(core, test_prefetch);
	tcase_add_test(core, test_backend_only);
	tcase_add_test(core, test_copy_stream);
	tcase_add_test(limits, test_all_pinned_reads_itself);
	tcase_add_test(limits, test_fallback_reads_what_was_asked);
	tcase_add_test(limits, test_file_shrank_falls_back);
	tcase_add_test(limits, test_settle_hits_and_failures);
	tcase_add_test(limits, test_idle_burns_no_cpu);
	tcase_add_test(conc, test_ranks_read_storage_once);
	tcase_add_test(conc, test_threads_submit_at_once);
	tcase_add_test(crash, test_owner_fails);
	tcase_add_test(crash, test_owner_stalls);
	tcase_add_test(crash, test_owner_dies);
	tcase_add_test(crash, test_owner_read_outlasts_timeout);
	tcase_add_test(limits, test_backend_submit_failure);
	tcase_add_test(limits, test_backend_thread_start_fails);
	tcase_add_test(crash, test_backend_wait_error);
	tcase_add_test(core, test_prefetch_stops_at_eof);
	tcase_add_test(limits, test_backend_short_read);
	for (int i = 0; i < 4; i++) {
		tcase_add_checked_fixture(all[i], setup, teardown);
		tcase_set_timeout(all[i], 60);
		suite_add_tcase(s, all[i]);
	}
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(loader_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
