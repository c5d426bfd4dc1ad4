/*
 * check_region: which regions a process may use, how one is published, and what it may take
 * of /dev/shm (cache/region.c, cache/populate.c, tools/cmd_reset.c).
 *
 * core: an object at the region's path is used only if it is a regular file of our effective
 * uid with one link and no permission beyond cache.mode; every other object is refused with
 * -EPERM at once (a FIFO does not block), and `kvshim reset` removes it without hanging.  The
 * foreign-region case runs a second local user (useradd; skipped when not root).  Publication
 * uses no guessable name.
 * limits: in a private /dev/shm of a few MiB (a mount namespace; skipped where that cannot be
 * made), a region that does not fit under cache.shm_headroom is refused with one line,
 * capacity = auto shrinks to fit, lazy population allocates pages only for the slots used and
 * never below the headroom, and the eager walk stops at the headroom.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cache_params.h"
#include "config.h"
#include "internal.h"

#ifndef KVSHIM_CLI
#error "KVSHIM_CLI must name the kvshim program"
#endif

static int case_seq;
static unsigned prepare_threads; /* kvs_cache_prepare's threads in the prepare cases (0: CPUs) */

static void test_config(struct kvs_config *cfg, uint64_t slots, uint64_t shard)
{
	kvs_config_defaults(cfg);
	snprintf(cfg->cache_name, sizeof(cfg->cache_name), "check_region.%d.%llx.%d", (int)getpid(),
		 (unsigned long long)time(NULL), case_seq++); /* see check_cache.c */
	cfg->cache_shard_size = shard;
	cfg->cache_capacity = slots * shard;
	cfg->cache_reserved = 0;
	cfg->cache_max_processes = 16;
	cfg->cache_shm_headroom = 0; /* the limits cases set their own */
	/* The page cases count the pages of the slots they use: no walk ahead unless they ask. */
	cfg->cache_populate = KVS_POPULATE_LAZY;
}

static void path_of(const struct kvs_config *cfg, char *path, size_t len)
{
	ck_assert_int_eq(kvs_cache_path(KVS_CACHE_PARAMS(cfg), path, len), 0);
}

static struct kvs_key key_of(uint64_t block, uint64_t shard)
{
	struct kvs_key k = {block * 0x9e3779b97f4a7c15ull + 1, block, shard};

	return k;
}

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Open cfg's region (creating it); expect r, and msg containing want (if not NULL). */
static void expect_open(const struct kvs_config *cfg, int flags, int r, const char *want)
{
	struct kvs_cache *c = NULL;
	char msg[512];
	double t0 = mono_s();
	int got = kvs_cache_open(KVS_CACHE_PARAMS(cfg), flags, &c, msg, sizeof(msg));

	ck_assert_msg(mono_s() - t0 < 1.0, "open took %.1f s", mono_s() - t0);
	ck_assert_msg(got == r, "open: %d, expected %d (%s)", got, r, msg);
	if (!r) {
		kvs_cache_close(c);
		return;
	}
	ck_assert_ptr_null(c);
	ck_assert_msg(!strchr(msg, '\n'), "msg is not one line: %s", msg);
	if (want)
		ck_assert_msg(strstr(msg, want), "msg lacks \"%s\": %s", want, msg);
}

/* Run `kvshim reset` for region name as uid (or as ourselves if uid < 0) with a 10 s alarm;
 * its stdout and stderr go to out.  Returns the wait status. */
static int run_reset(const char *name, int uid, int gid, const char *out)
{
	pid_t pid = fork();
	int st;

	ck_assert(pid >= 0);
	if (pid == 0) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(125);
		if (uid >= 0 && (setgroups(0, NULL) || setgid((gid_t)gid) || setuid((uid_t)uid)))
			_exit(125);
		setenv("KVSHIM_CONFIG", "", 1);
		setenv("KVSHIM_CACHE_NAME", name, 1);
		alarm(10); /* a reset that hangs dies of SIGALRM */
		execl(KVSHIM_CLI, "kvshim", "reset", (char *)NULL);
		_exit(126);
	}
	ck_assert(waitpid(pid, &st, 0) == pid);
	return st;
}

static void expect_reset(const char *name, int uid, int gid, int status, const char *want)
{
	char out[] = "/tmp/check_region.reset.XXXXXX", text[1024] = "";
	int fd = mkstemp(out);

	ck_assert(fd >= 0);
	fchmod(fd, 0666);
	close(fd);
	int st = run_reset(name, uid, gid, out);
	fd = open(out, O_RDONLY);
	ssize_t n = fd >= 0 ? read(fd, text, sizeof(text) - 1) : -1;
	text[n > 0 ? n : 0] = '\0';
	if (fd >= 0)
		close(fd);
	unlink(out);
	ck_assert_msg(!WIFSIGNALED(st), "kvshim reset died of signal %d (hung?): %s", WTERMSIG(st),
		      text);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == status,
		      "kvshim reset: status %#x, expected exit %d: %s", st, status, text);
	if (want)
		ck_assert_msg(strstr(text, want), "kvshim reset lacks \"%s\": %s", want, text);
}

/* ------------------------------------------------------------------ core: trust */

static char user[32];

static void userdel(void)
{
	char cmd[96];

	if (!user[0])
		return;
	snprintf(cmd, sizeof(cmd), "userdel %s 2>/dev/null", user);
	if (system(cmd) != 0)
		fprintf(stderr, "check_region: %s failed\n", cmd);
	user[0] = '\0';
}

/* Another local user builds a valid region with mode 0666 and hard-links it at our path:
 * refused, nothing mapped, and reset (as root) removes it; a FIFO there does not hang reset;
 * and a user's reset says why it cannot remove root's FIFO at its path. */
START_TEST(test_foreign_region_refused)
{
	struct kvs_config cfg;
	char mine[256], theirs[512], cmd[160], maps[640];
	struct passwd *pw;
	pid_t pid;
	int st;

	if (geteuid() != 0) {
		fprintf(stderr, "check_region: not root, cannot add a user; "
				"test_foreign_region_refused skipped\n");
		return;
	}
	/* Named after the runner (our parent under CK_FORK), which removes it if we fail. */
	snprintf(user, sizeof(user), "kvst%d", (int)getppid() % 100000);
	snprintf(cmd, sizeof(cmd), "useradd -M -r -s /bin/false %s 2>/dev/null", user);
	if (system(cmd) != 0 || !(pw = getpwnam(user))) {
		user[0] = '\0';
		fprintf(stderr, "check_region: useradd failed; test_foreign_region_refused "
				"skipped\n");
		return;
	}
	uid_t uid = pw->pw_uid;
	gid_t gid = pw->pw_gid;

	test_config(&cfg, 16, 4096);
	path_of(&cfg, mine, sizeof(mine));
	snprintf(theirs, sizeof(theirs), "/dev/shm/kvshim.%u.%.200s", (unsigned)uid,
		 cfg.cache_name);

	/* The attacker: a region of our dimensions, writable by all, linked at our path. */
	pid = fork();
	ck_assert(pid >= 0);
	if (pid == 0) {
		struct kvs_config evil = cfg;
		struct kvs_cache *c = NULL;

		evil.cache_mode = 0666;
		if (setgroups(0, NULL) || setgid(gid) || setuid(uid))
			_exit(2);
		if (kvs_cache_open(KVS_CACHE_PARAMS(&evil), KVS_OPEN_CREATE, &c, NULL, 0))
			_exit(3);
		kvs_cache_close(c);
		_exit(link(theirs, mine) ? 4 : 0);
	}
	ck_assert(waitpid(pid, &st, 0) == pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "attacker status %#x", st);

	snprintf(cmd, sizeof(cmd), "owned by uid %u, not 0", (unsigned)uid);
	expect_open(&cfg, KVS_OPEN_CREATE, -EPERM, cmd);
	expect_open(&cfg, KVS_OPEN_WATCH, -EPERM, cmd); /* kvshim stat */
	snprintf(maps, sizeof(maps), "grep -q '%s' /proc/%d/maps", mine, (int)getpid());
	ck_assert_msg(system(maps) != 0, "%s is mapped", mine);

	expect_reset(cfg.cache_name, -1, -1, 0, "owned by uid");
	ck_assert_int_eq(access(mine, F_OK), -1);

	/* A FIFO at our path: reset neither blocks nor fails. */
	ck_assert_int_eq(mkfifo(mine, 0600), 0);
	expect_reset(cfg.cache_name, -1, -1, 0, "FIFO");
	ck_assert_int_eq(access(mine, F_OK), -1);

	/* Root's FIFO at the user's path: the user's reset explains, and does not hang. */
	unlink(theirs);
	ck_assert_int_eq(mkfifo(theirs, 0666), 0);
	expect_reset(cfg.cache_name, (int)uid, (int)gid, 1, "only uid 0 or root");
	ck_assert_int_eq(access(theirs, F_OK), 0);
	unlink(theirs);
	userdel();
}
END_TEST

/* A FIFO at the path: open returns at once (no blocking open) and refuses it. */
START_TEST(test_fifo_refused)
{
	struct kvs_config cfg;
	char path[256];

	test_config(&cfg, 16, 4096);
	path_of(&cfg, path, sizeof(path));
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	alarm(5);
	expect_open(&cfg, KVS_OPEN_CREATE, -EPERM, "is a FIFO, not a regular file");
	expect_open(&cfg, KVS_OPEN_WATCH, -EPERM, "FIFO");
	alarm(0);
	unlink(path);
}
END_TEST

/* Our own region with a second name (someone linked it): refused. */
START_TEST(test_two_links_refused)
{
	struct kvs_config cfg;
	char path[256], other[300];

	test_config(&cfg, 16, 4096);
	path_of(&cfg, path, sizeof(path));
	expect_open(&cfg, KVS_OPEN_CREATE, 0, NULL);
	snprintf(other, sizeof(other), "%s.second", path);
	ck_assert_int_eq(link(path, other), 0);
	expect_open(&cfg, KVS_OPEN_CREATE, -EPERM, "has 2 links");
	unlink(other);
	expect_open(&cfg, 0, 0, NULL);
	unlink(path);
}
END_TEST

/* A permission bit beyond cache.mode: refused; a narrower mode is fine. */
START_TEST(test_mode_wider_refused)
{
	struct kvs_config cfg;
	char path[256];

	test_config(&cfg, 16, 4096);
	path_of(&cfg, path, sizeof(path));
	expect_open(&cfg, KVS_OPEN_CREATE, 0, NULL);
	ck_assert_int_eq(chmod(path, 0666), 0);
	expect_open(&cfg, 0, -EPERM, "mode 0666 is wider than cache.mode 0600");
	ck_assert_int_eq(chmod(path, 0600), 0);
	cfg.cache_mode = 0660;
	expect_open(&cfg, 0, 0, NULL);
	unlink(path);
}
END_TEST

/* A symbolic link is not followed; a truncated file of ours is refused as before. */
START_TEST(test_link_and_truncated_refused)
{
	struct kvs_config cfg;
	char path[256];

	test_config(&cfg, 16, 4096);
	path_of(&cfg, path, sizeof(path));
	ck_assert_int_eq(symlink("/etc/passwd", path), 0);
	expect_open(&cfg, KVS_OPEN_CREATE, -EPERM, "symbolic link");
	unlink(path);

	int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	ck_assert(fd >= 0);
	ck_assert_int_eq(ftruncate(fd, 100), 0);
	close(fd);
	expect_open(&cfg, KVS_OPEN_CREATE, -EPROTO, "is 100 bytes");
	unlink(path);
}
END_TEST

/* Names another user could guess (the old "<path>.tmp.<pid>.<n>") do not stop creation, with
 * O_TMPFILE and without it (a random name, removed); the region has one link and cache.mode. */
START_TEST(test_guessable_names_taken)
{
	struct kvs_config cfg;
	char path[256], tmp[320], cmd[800];
	struct stat st;

	for (int pass = 0; pass < 2; pass++) {
		kvs_region_test_no_tmpfile = pass == 1;
		test_config(&cfg, 16, 4096);
		cfg.cache_mode = 0640;
		path_of(&cfg, path, sizeof(path));
		for (int n = 0; n < 64; n++) {
			snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%d", path, (int)getpid(), n);
			int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL, 0600);
			ck_assert(fd >= 0);
			close(fd);
		}
		expect_open(&cfg, KVS_OPEN_CREATE, 0, NULL);
		ck_assert_int_eq(lstat(path, &st), 0);
		ck_assert_uint_eq(st.st_nlink, 1);
		ck_assert_uint_eq(st.st_mode & 07777, 0640);
		snprintf(cmd, sizeof(cmd), "ls /dev/shm | grep -q '%.200s.build'", cfg.cache_name);
		ck_assert_msg(system(cmd) != 0, "a build name was left behind");
		snprintf(cmd, sizeof(cmd), "rm -f %s %s.tmp.*", path, path);
		ck_assert_int_eq(system(cmd), 0);
	}
	kvs_region_test_no_tmpfile = false;
}
END_TEST

/* ------------------------------------------------------------------ limits: node memory */

/* Run fn in a child process that sees a tmpfs of `size` as /dev/shm (a private mount
 * namespace).  fn returns 0 or a code for the failure it printed. */
/* Run fn in a child with a file system of type fs, mounted with opts, at /dev/shm in a mount
 * namespace of its own.  Returns the child's wait status; 77 (said on stderr) where that
 * cannot be made. */
static int in_fs(const char *fs, const char *opts, int (*fn)(void))
{
	pid_t pid = fork();
	int st = -1;

	if (pid == 0) {
		if (unshare(CLONE_NEWNS) || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
		    mount(fs, "/dev/shm", fs, 0, opts))
			_exit(77);
		_exit(fn());
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
		fprintf(stderr,
			"check_region: no private /dev/shm here (unshare, mount); skipped\n");
		return 0;
	}
	return st;
}

/* in_fs, and the child must succeed (or be skipped). */
static void with_fs(const char *fs, const char *opts, int (*fn)(void))
{
	int st = in_fs(fs, opts, fn);

	ck_assert_msg(st == 0, "child status %#x", st);
}

/* fn in a private /dev/shm: a tmpfs of the options size ("size=8M", with huge= ...). */
static void with_small_shm(const char *size, int (*fn)(void))
{
	with_fs("tmpfs", size, fn);
}

#define FAIL_IF(cond, code, ...)                                                                   \
	do {                                                                                       \
		if (cond) {                                                                        \
			fprintf(stderr, "check_region: " __VA_ARGS__);                             \
			fputc('\n', stderr);                                                       \
			return code;                                                               \
		}                                                                                  \
	} while (0)

static uint64_t shm_free(void)
{
	struct statvfs sv;

	return statvfs("/dev/shm", &sv) ? 0 : (uint64_t)sv.f_bavail * sv.f_frsize;
}

/* Take /dev/shm down to `left` free bytes with a file of its own; the descriptor or -1. */
static int fill_to(uint64_t left)
{
	int fd = open("/dev/shm/filler", O_RDWR | O_CREAT | O_TRUNC, 0600);
	uint64_t now = shm_free();

	if (fd < 0 || now < left || fallocate(fd, 0, 0, (off_t)(now - left)))
		return -1;
	return fd;
}

static uint64_t blocks_of(const char *path)
{
	struct stat st;

	return stat(path, &st) ? 0 : (uint64_t)st.st_blocks * 512;
}

/* 8 MiB of /dev/shm, headroom 4 MiB: a 6 MiB region is refused with one line naming the
 * fixes, nothing is left behind; without the headroom it fits. */
static int too_big(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	char msg[512];

	test_config(&cfg, 96, 64 << 10);
	cfg.cache_shm_headroom = 4 << 20;
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != -ENOSPC, 2, "open: %d, expected -ENOSPC (%s)", r, msg);
	FAIL_IF(strchr(msg, '\n') || !strstr(msg, "No space left") ||
		    !strstr(msg, "cache.shm_headroom") || !strstr(msg, "cache.capacity = auto") ||
		    !strstr(msg, "--shm-size") || !strstr(msg, "6.0 MiB"),
		3, "message: %s", msg);
	FAIL_IF(system("ls /dev/shm | grep -q kvshim") == 0, 4, "something was left behind");
	cfg.cache_shm_headroom = 0;
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 5, "open without headroom: %d (%s)", r, msg);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_too_big_refused)
{
	with_small_shm("size=8M", too_big);
}
END_TEST

/* capacity = auto takes what fits above the headroom, in whole shards; a later attacher with
 * auto takes the region as built though free space has shrunk; too little room is refused. */
static int auto_fits(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL, *d = NULL;
	struct kvs_region_info info, again;
	struct kvs_counters t;
	char msg[512];

	test_config(&cfg, 1, 64 << 10);
	cfg.cache_capacity = 0;
	cfg.cache_shm_headroom = 2 << 20;
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open auto: %d (%s)", r, msg);
	kvs_cache_stat(c, &info, &t, NULL, 0);
	FAIL_IF(info.capacity_bytes % (64 << 10) || info.capacity_bytes < (5 << 20) ||
		    info.total_bytes + (2 << 20) > (8 << 20),
		3, "auto: capacity %llu, total %llu in 8 MiB with 2 MiB headroom",
		(unsigned long long)info.capacity_bytes, (unsigned long long)info.total_bytes);
	int fd = fill_to(1 << 20);
	FAIL_IF(fd < 0, 4, "cannot fill /dev/shm");
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &d, msg, sizeof(msg));
	FAIL_IF(r != 0, 5, "second open auto: %d (%s)", r, msg);
	kvs_cache_stat(d, &again, &t, NULL, 0);
	FAIL_IF(again.capacity_bytes != info.capacity_bytes, 6, "the attacher took %llu",
		(unsigned long long)again.capacity_bytes);
	kvs_cache_close(d);
	kvs_cache_close(c);

	char path[256];
	kvs_cache_path(KVS_CACHE_PARAMS(&cfg), path, sizeof(path));
	unlink(path);
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != -ENOSPC || strchr(msg, '\n') || !strstr(msg, "auto"), 7,
		"auto without room: %d (%s)", r, msg);
	close(fd);
	return 0;
}

START_TEST(test_auto_capacity_fits)
{
	with_small_shm("size=8M", auto_fits);
}
END_TEST

/* lazy: pages exist only for the slots used. */
static int lazy_pages(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	struct kvs_region_info info;
	struct kvs_counters t;
	struct kvs_pin p;
	char path[256], msg[512];

	test_config(&cfg, 32, 1 << 20);
	cfg.cache_shm_headroom = 4 << 20;
	kvs_cache_path(KVS_CACHE_PARAMS(&cfg), path, sizeof(path));
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	usleep(200000); /* time for a walk, if one ran, to allocate most of 32 MiB */
	FAIL_IF(blocks_of(path) > (1 << 20), 3, "%llu bytes allocated before any use",
		(unsigned long long)blocks_of(path));
	for (uint64_t b = 0; b < 3; b++) {
		struct kvs_key k = key_of(b, 0);
		FAIL_IF(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p) != KVS_PIN_OWNER, 4, "pin %d",
			(int)b);
		memset(kvs_cache_data(c, &p), 7, 1 << 20);
		kvs_cache_mark_ready(c, &p, 1 << 20);
		kvs_cache_release(c, &p);
	}
	uint64_t used = blocks_of(path);
	FAIL_IF(used < (3 << 20) || used > (4 << 20), 5, "%llu bytes allocated for 3 slots",
		(unsigned long long)used);
	kvs_cache_stat(c, &info, &t, NULL, 0);
	FAIL_IF(info.slots_populated != 3 || info.populate_mode != KVS_POPULATE_LAZY ||
		    info.populate_err,
		6, "populated %u, mode %u, err %d", info.slots_populated, info.populate_mode,
		info.populate_err);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_lazy_allocates_used_slots)
{
	with_small_shm("size=64M", lazy_pages);
}
END_TEST

/* lazy at the headroom: a slot without pages is left free, not given up for good. */
static int lazy_headroom(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	struct kvs_pin p;
	char msg[512];

	test_config(&cfg, 8, 1 << 20);
	cfg.cache_shm_headroom = 8 << 20;
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	int fd = fill_to((8 << 20) + (512 << 10)); /* room, but not a slot's worth above it */
	FAIL_IF(fd < 0, 3, "cannot fill /dev/shm");
	struct kvs_key k = key_of(1, 0);
	r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p);
	FAIL_IF(r != -ENOSPC, 4, "pin at the headroom: %d", r);
	FAIL_IF(shm_free() < (8u << 20), 5, "free space went below the headroom");
	/* Nothing given up: no pages, and no claim kept by the allocator that found no room. */
	for (uint32_t f = 0; f < c->nframes; f++)
		FAIL_IF(c->fpages[f] != KVS_PAGES_UNKNOWN, 6, "frame %u pages %u", f, c->fpages[f]);
	for (uint32_t i = 0; i < c->nslots; i++) {
		FAIL_IF(c->slots[i].state != KVS_SLOT_FREE, 8, "slot %u state %#x", i,
			c->slots[i].state);
	}
	close(fd);
	unlink("/dev/shm/filler");
	usleep(150000); /* past the retry pause */
	r = kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &p);
	FAIL_IF(r != KVS_PIN_OWNER, 7, "pin once there is room: %d", r);
	kvs_cache_mark_ready(c, &p, 4096);
	kvs_cache_release(c, &p);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_lazy_stops_at_headroom)
{
	with_small_shm("size=32M", lazy_headroom);
}
END_TEST

/* Wait (at most 3 s) until the region's walk has stopped or every slot has its pages; *info
 * holds the region's figures then. */
static void walk_settles(struct kvs_cache *c, struct kvs_region_info *info)
{
	struct kvs_counters t;

	for (int i = 0; i < 3000; i++) {
		kvs_cache_stat(c, info, &t, NULL, 0);
		if (info->populate_err || info->slots_populated == info->slots)
			return;
		usleep(1000);
	}
}

/* eager: the walk stops at the headroom, and says so. */
static int eager_headroom(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL, *e = NULL;
	struct kvs_region_info info;
	char msg[512];

	test_config(&cfg, 64, 256 << 10); /* 16 MiB */
	cfg.cache_shm_headroom = 8 << 20;
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg,
			       sizeof(msg)); /* lazy: no walk */
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	int fd = fill_to((10 << 20)); /* 2 MiB above the headroom: 8 slots */
	FAIL_IF(fd < 0, 3, "cannot fill /dev/shm");
	cfg.cache_populate = KVS_POPULATE_EAGER;
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &e, msg, sizeof(msg));
	FAIL_IF(r != 0, 4, "open eager: %d (%s)", r, msg);
	walk_settles(c, &info);
	FAIL_IF(info.populate_err != ENOSPC || strcmp(info.populate_reason, "headroom"), 5,
		"walk: err %d, reason \"%s\", %u of %u populated", info.populate_err,
		info.populate_reason, info.slots_populated, info.slots);
	FAIL_IF(info.slots_populated == 0 || info.slots_populated >= info.slots, 6,
		"%u of %u populated", info.slots_populated, info.slots);
	FAIL_IF(shm_free() < (8u << 20), 7, "free %llu below the headroom",
		(unsigned long long)shm_free());
	FAIL_IF(info.populate_mode != KVS_POPULATE_EAGER, 8, "mode %u", info.populate_mode);
	kvs_cache_close(e);
	kvs_cache_close(c);
	close(fd);
	return 0;
}

START_TEST(test_eager_stops_at_headroom)
{
	with_small_shm("size=32M", eager_headroom);
}
END_TEST

/* ahead at the headroom waits instead of ending: once a neighbour frees its memory the walk
 * goes on, and stat no longer says it stopped. */
static int ahead_headroom(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL, *a = NULL;
	struct kvs_region_info info;
	struct kvs_counters t;
	char msg[512];

	test_config(&cfg, 64, 256 << 10); /* 16 MiB, all of it in the window */
	cfg.cache_shm_headroom = 8 << 20;
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	int fd = fill_to((10 << 20)); /* 2 MiB above the headroom: 8 slots */
	FAIL_IF(fd < 0, 3, "cannot fill /dev/shm");
	cfg.cache_populate = KVS_POPULATE_AHEAD;
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &a, msg, sizeof(msg));
	FAIL_IF(r != 0, 4, "open ahead: %d (%s)", r, msg);
	walk_settles(c, &info);
	FAIL_IF(info.populate_err != ENOSPC || strcmp(info.populate_reason, "headroom"), 5,
		"walk: err %d, reason \"%s\"", info.populate_err, info.populate_reason);
	FAIL_IF(shm_free() < (8u << 20), 6, "free %llu below the headroom",
		(unsigned long long)shm_free());
	close(fd);
	unlink("/dev/shm/filler");	/* the neighbour lets go */
	for (int i = 0; i < 500; i++) { /* the walk looks again every second */
		kvs_cache_stat(c, &info, &t, NULL, 0);
		if (!info.populate_err && info.slots_populated == info.slots)
			break;
		usleep(10000);
	}
	FAIL_IF(info.populate_err || info.slots_populated != info.slots, 7,
		"after room came back: err %d, %u of %u populated", info.populate_err,
		info.slots_populated, info.slots);
	kvs_cache_close(a);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_ahead_waits_at_headroom)
{
	with_small_shm("size=32M", ahead_headroom);
}
END_TEST

/* This process's resident shared memory (RssShmem), in bytes; 0 if unknown. */
static uint64_t rss_shmem(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "RssShmem: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb << 10;
}

/* Slots of the first n whose every page tmpfs holds up to date (cleared or written): mincore
 * reports a page fallocate allocated but nobody touched yet as not resident. */
static uint32_t cleared_slots(struct kvs_cache *c, uint32_t n, uint64_t shard)
{
	unsigned char vec[64]; /* shard / 4096, at most 256 KiB here */
	uint32_t k = 0;
	size_t len;
	void *base;

	kvs_cache_data_region(c, &base, &len);
	for (uint32_t i = 0; i < n; i++) {
		bool all = true;

		if (mincore((char *)base + i * shard, shard, vec))
			return UINT32_MAX;
		for (uint64_t j = 0; j < shard / 4096; j++)
			all = all && (vec[j] & 1);
		k += all;
	}
	return k;
}

/* prepare clears every slot, also those an earlier walk allocated without clearing on a region
 * too full for one more chunk above the headroom; it keeps a cached shard's bytes, does not
 * leave the region resident in its own process, and a second run changes nothing. */
static int prepare_all(void)
{
	const uint64_t shard = 256 << 10;
	struct kvs_key k = {0x1234, 7, 0};
	struct kvs_config cfg;
	struct kvs_cache *c = NULL, *e = NULL;
	struct kvs_region_info info;
	struct kvs_counters t;
	struct kvs_pin pin;
	char msg[512], path[256];
	uint32_t done;

	test_config(&cfg, 64, shard);	   /* 16 MiB */
	cfg.cache_shm_headroom = 12 << 20; /* full, the region leaves 15.9 MiB: < 12 + 4 */
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	FAIL_IF(kvs_cache_pin(c, &k, KVS_ALLOC_LOAD, &pin) != KVS_PIN_OWNER, 3, "pin");
	memset(kvs_cache_data(c, &pin), 0xa5, shard);
	kvs_cache_mark_ready(c, &pin, (uint32_t)shard);
	kvs_cache_release(c, &pin);
	cfg.cache_populate = KVS_POPULATE_EAGER; /* allocates the rest, clears nothing */
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &e, msg, sizeof(msg));
	FAIL_IF(r != 0, 11, "open eager: %d (%s)", r, msg);
	walk_settles(c, &info);
	kvs_cache_close(e);
	FAIL_IF(info.slots_populated != info.slots, 12, "the eager walk: %u of %u (err %d)",
		info.slots_populated, info.slots, info.populate_err);
	uint32_t before = cleared_slots(c, 64, shard);
	if (before == 64)
		fprintf(stderr, "check_region: mincore shows no uncleared page here; the clearing "
				"itself is not checked\n");
	uint64_t rss0 = rss_shmem();
	r = kvs_cache_prepare(c, 0, &done);
	FAIL_IF(r != 0 || done != 64, 4, "prepare: %d, %u slots", r, done);
	FAIL_IF(rss_shmem() > rss0 + (1 << 20), 5, "RssShmem %llu after prepare, %llu before",
		(unsigned long long)rss_shmem(), (unsigned long long)rss0);
	FAIL_IF(before < 64 && cleared_slots(c, 64, shard) != 64, 13,
		"%u of 64 slots cleared after prepare (%u before)", cleared_slots(c, 64, shard),
		before);
	kvs_cache_stat(c, &info, &t, NULL, 0);
	FAIL_IF(info.slots_populated != info.slots, 6, "%u of %u populated", info.slots_populated,
		info.slots);
	path_of(&cfg, path, sizeof(path));
	FAIL_IF(blocks_of(path) < 64 * shard, 7, "%llu bytes allocated",
		(unsigned long long)blocks_of(path));
	FAIL_IF(kvs_cache_pin_ready(c, &k, &pin) != KVS_PIN_HIT, 8, "the cached shard is gone");
	const unsigned char *d = kvs_cache_data(c, &pin);
	for (uint64_t i = 0; i < shard; i++)
		FAIL_IF(d[i] != 0xa5, 9, "byte %llu of the cached shard is %#x after prepare",
			(unsigned long long)i, d[i]);
	kvs_cache_release(c, &pin);
	r = kvs_cache_prepare(c, 0, &done);
	FAIL_IF(r != 0 || done != 64, 10, "prepare again: %d, %u slots", r, done);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_prepare_all)
{
	with_small_shm("size=32M", prepare_all);
}
END_TEST

/* prepare stops where /dev/shm would go below the headroom, says so, and says how far it got;
 * once there is room again it finishes, and the stopped walk's reason is gone from stat. */
static int prepare_headroom(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL, *e = NULL;
	struct kvs_region_info info;
	struct kvs_counters t;
	char msg[512];
	uint32_t done;

	test_config(&cfg, 64, 256 << 10); /* 16 MiB */
	cfg.cache_shm_headroom = 8 << 20;
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	int fd = fill_to((10 << 20)); /* 2 MiB above the headroom: 8 slots */
	FAIL_IF(fd < 0, 3, "cannot fill /dev/shm");
	cfg.cache_populate = KVS_POPULATE_EAGER; /* a walk that stops at the headroom */
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &e, msg, sizeof(msg));
	FAIL_IF(r != 0, 8, "open eager: %d (%s)", r, msg);
	walk_settles(c, &info);
	kvs_cache_close(e);
	FAIL_IF(info.populate_err != ENOSPC, 9, "the eager walk did not stop: %u populated",
		info.slots_populated);
	r = kvs_cache_prepare(c, prepare_threads, &done);
	FAIL_IF(r != -ENOSPC || done == 0 || done >= 64, 4, "prepare: %d, %u slots", r, done);
	FAIL_IF(cleared_slots(c, done, 256 << 10) != done, 7, "%u of the %u slots prepared cleared",
		cleared_slots(c, done, 256 << 10), done);
	FAIL_IF(shm_free() < (8u << 20), 5, "free %llu below the headroom",
		(unsigned long long)shm_free());
	kvs_cache_stat(c, &info, &t, NULL, 0);
	FAIL_IF(info.slots_populated != done, 6, "%u populated, prepare said %u",
		info.slots_populated, done);
	close(fd);
	unlink("/dev/shm/filler"); /* the neighbour lets go */
	r = kvs_cache_prepare(c, 0, &done);
	kvs_cache_stat(c, &info, &t, NULL, 0);
	FAIL_IF(r != 0 || done != 64 || info.slots_populated != 64 || info.populate_err, 10,
		"prepare with room: %d, %u slots; %u populated, populate_errno %d", r, done,
		info.slots_populated, info.populate_err);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_prepare_stops_at_headroom)
{
	for (prepare_threads = 1; prepare_threads <= 4; prepare_threads += 3)
		with_small_shm("size=32M", prepare_headroom);
	prepare_threads = 0;
}
END_TEST

/* A slot whose allocation failed for good (NOROOM) is never used: prepare passes over it, in
 * a whole chunk and one slot at a time (room for slots but not for a chunk), and does not count
 * it as prepared. */
static int prepare_noroom(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	char msg[512];
	uint32_t done;

	test_config(&cfg, 64, 256 << 10); /* 16 MiB */
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	atomic_store(&c->fpages[5], KVS_PAGES_NOROOM);
	c->headroom = shm_free() - (3u << 20); /* 12 slots (0-4, 6-12), not 16 at once */
	r = kvs_cache_prepare(c, prepare_threads, &done);
	FAIL_IF(r != -ENOSPC || done != 12, 3, "prepare one slot at a time: %d, %u slots", r, done);
	FAIL_IF(atomic_load(&c->fpages[6]) != KVS_PAGES_OK, 4, "slot 6 left without pages");
	c->headroom = 0;
	r = kvs_cache_prepare(c, prepare_threads, &done);
	FAIL_IF(r != 0 || done != 63, 5, "prepare by chunks: %d, %u slots", r, done);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_prepare_passes_noroom)
{
	/* One thread, and four: the walk decides which slots get pages in order, under its lock,
	 * so the answer is the same. */
	for (prepare_threads = 1; prepare_threads <= 4; prepare_threads += 3)
		with_small_shm("size=32M", prepare_noroom);
	prepare_threads = 0;
}
END_TEST

/* The PMD size THP gives, 0 without THP. */
static uint64_t thp_size(void)
{
	unsigned long long v = 0;
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r");

	if (f) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

/* The kB of field (Rss, ShmemPmdMapped, ...) that /proc/self/smaps gives the mapping holding
 * address at. */
static uint64_t smaps_kb(const void *addr, const char *field)
{
	unsigned long lo, hi, at = (unsigned long)addr;
	unsigned long long kb, got = 0;
	size_t flen = strlen(field);
	char line[512];
	bool in = false;
	FILE *f;

	f = fopen("/proc/self/smaps", "r");
	while (f && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
		    strchr(line, '-') < strchr(line, ' '))
			in = lo <= at && at < hi;
		else if (in && !strncmp(line, field, flen) && line[flen] == ':' &&
			 sscanf(line + flen + 1, "%llu", &kb) == 1)
			got += kb;
	}
	if (f)
		fclose(f);
	return got;
}

/* Read a byte of every 4 KiB of c's data, then smaps_kb of it. */
static uint64_t touched_smaps(struct kvs_cache *c, const char *field)
{
	size_t len = (size_t)c->nframes * c->shard_size;
	volatile const char *d = c->data;

	for (size_t off = 0; off < len; off += 4096)
		(void)d[off];
	return smaps_kb(c->data, field);
}

/* On a tmpfs mounted huge=always the region is built on 2 MiB pages: its data starts on one,
 * its file is whole pages, stat says so, a mapping of it is mapped by PMDs once touched, and an
 * attacher takes the page size from the header. */
static int huge_always(void)
{
	uint64_t thp = thp_size();
	struct kvs_config cfg;
	struct kvs_cache *c = NULL, *a = NULL;
	struct kvs_region_info info;
	struct kvs_counters t;
	char msg[512], path[512];
	struct stat st;
	uint32_t done;

	test_config(&cfg, 16, 1 << 20);
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	FAIL_IF(msg[0], 3, "a message where huge pages are had: %s", msg);
	kvs_cache_stat(c, &info, &t, NULL, 0);
	FAIL_IF(info.page_size != thp || info.page_kind != KVS_PAGE_TMPFS, 4,
		"page size %llu kind %u, want %llu tmpfs", (unsigned long long)info.page_size,
		info.page_kind, (unsigned long long)thp);
	path_of(&cfg, path, sizeof(path));
	FAIL_IF(stat(path, &st) || c->hdr->off_data % thp || (uint64_t)st.st_size % thp ||
		    (uint64_t)st.st_size != c->hdr->total_bytes,
		5, "off_data %llu, file %lld: not whole pages of %llu",
		(unsigned long long)c->hdr->off_data, (long long)st.st_size,
		(unsigned long long)thp);
	r = kvs_cache_prepare(c, 2, &done);
	FAIL_IF(r != 0 || done != 16, 6, "prepare: %d, %u", r, done);
	uint64_t pmd = touched_smaps(c, "ShmemPmdMapped");
	FAIL_IF(pmd < 16 * 1024, 7, "%llu kB of the 16 MiB data mapped by PMDs",
		(unsigned long long)pmd);
	cfg.cache_huge_pages = KVS_HUGE_OFF; /* an attacher follows the region, not its keys */
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &a, msg, sizeof(msg));
	FAIL_IF(r != 0, 8, "attach: %d (%s)", r, msg);
	kvs_cache_stat(a, &info, &t, NULL, 0);
	FAIL_IF(info.page_size != thp, 9, "the attacher sees pages of %llu",
		(unsigned long long)info.page_size);
	kvs_cache_close(a);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_huge_always)
{
	if (!thp_size()) {
		fprintf(stderr, "check_region: no transparent huge pages here; skipped\n");
		return;
	}
	with_small_shm("size=64M,huge=always", huge_always);
}
END_TEST

/* huge=advise gives huge pages to a region that asks (cache.huge_pages = auto), by
 * MADV_HUGEPAGE and faults, prepare on several threads included; with off it has 4 KiB pages
 * and none is mapped by a PMD. */
static int huge_advise(void)
{
	uint64_t thp = thp_size();
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	struct kvs_region_info info;
	struct kvs_counters t;
	char msg[512];
	uint32_t done;

	for (int off = 0; off < 2; off++) {
		test_config(&cfg, 16, 1 << 20);
		cfg.cache_huge_pages = off ? KVS_HUGE_OFF : KVS_HUGE_AUTO;
		int r =
		    kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
		FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
		kvs_cache_stat(c, &info, &t, NULL, 0);
		FAIL_IF(info.page_size != (off ? 4096 : thp) ||
			    info.page_kind != (off ? KVS_PAGE_BASE : KVS_PAGE_ADVISE),
			3, "off %d: page size %llu kind %u", off,
			(unsigned long long)info.page_size, info.page_kind);
		r = kvs_cache_prepare(c, 4, &done);
		FAIL_IF(r != 0 || done != 16, 4, "off %d: prepare: %d, %u", off, r, done);
		uint64_t pmd = touched_smaps(c, "ShmemPmdMapped");
		FAIL_IF(off ? pmd != 0 : pmd < 16 * 1024, 5, "off %d: %llu kB mapped by PMDs", off,
			(unsigned long long)pmd);
		kvs_cache_close(c);
	}
	return 0;
}

START_TEST(test_huge_advise)
{
	if (!thp_size()) {
		fprintf(stderr, "check_region: no transparent huge pages here; skipped\n");
		return;
	}
	with_small_shm("size=64M,huge=advise", huge_advise);
}
END_TEST

/* On huge=advise pages come from faults: prepare on four threads stops at the headroom, in
 * order, without ever taking the file system below it, counting whole 2 MiB pages. */
static int huge_advise_headroom(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	char msg[512];
	uint32_t done;

	test_config(&cfg, 64, 256 << 10); /* 16 MiB, 8 slots a page */
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	c->headroom = shm_free() - (5u << 20); /* room for two pages, not three */
	kvs_prepare_test_fault_ms = 100;       /* the other threads decide while the first faults */
	r = kvs_cache_prepare(c, 4, &done);
	kvs_prepare_test_fault_ms = 0;
	FAIL_IF(r != -ENOSPC || done != 16, 3, "prepare at the headroom: %d, %u slots", r, done);
	FAIL_IF(shm_free() < c->headroom, 4, "free %llu below the headroom %llu",
		(unsigned long long)shm_free(), (unsigned long long)c->headroom);
	for (uint32_t i = 0; i < 64; i++)
		FAIL_IF((atomic_load(&c->fpages[i]) == KVS_PAGES_OK) != (i < 16), 5,
			"slot %u: pages %u", i, atomic_load(&c->fpages[i]));
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_huge_advise_headroom)
{
	if (thp_size() != (2u << 20)) {
		fprintf(stderr, "check_region: no 2 MiB transparent huge pages here; skipped\n");
		return;
	}
	with_small_shm("size=32M,huge=advise", huge_advise_headroom);
}
END_TEST

/* cache.huge_pages = on where the file system gives no huge pages: the region is built on 4 KiB
 * pages, and the creator is told once, with the step that would give them; an attacher
 * configured on is told once that the region has 4 KiB pages; auto says nothing. */
static int huge_on_fallback(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL, *a = NULL;
	struct kvs_region_info info;
	struct kvs_counters t;
	char msg[512];

	test_config(&cfg, 16, 1 << 20);
	cfg.cache_huge_pages = KVS_HUGE_ON;
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(r != 0, 2, "open: %d (%s)", r, msg);
	const char *say = "cache.huge_pages = on, but /dev/shm (tmpfs, huge=never) gives no huge "
			  "pages: ";
	FAIL_IF(!strstr(msg, say) || strstr(strstr(msg, say) + 1, "cache.huge_pages") ||
		    !strstr(msg, "`mount -o remount,huge=advise /dev/shm`"),
		3, "the creator's line: %s", msg);
	kvs_cache_stat(c, &info, &t, NULL, 0);
	FAIL_IF(info.page_size != 4096 || info.page_kind != KVS_PAGE_BASE, 4,
		"page size %llu kind %u", (unsigned long long)info.page_size, info.page_kind);
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &a, msg, sizeof(msg));
	FAIL_IF(r != 0 || !strstr(msg, "has 4 KiB pages (it was built") ||
		    strstr(strstr(msg, "cache.huge_pages") + 1, "cache.huge_pages"),
		5, "the attacher's line: %d (%s)", r, msg);
	kvs_cache_close(a);
	cfg.cache_huge_pages = KVS_HUGE_AUTO;
	r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &a, msg, sizeof(msg));
	FAIL_IF(r != 0 || msg[0], 6, "auto: %d (%s)", r, msg);
	kvs_cache_close(a);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_huge_on_fallback)
{
	with_small_shm("size=64M,huge=never", huge_on_fallback);
}
END_TEST

/* A region built before the page size was recorded (0 in the header) is one of 4 KiB pages; a
 * page size no kernel gives is refused as a mismatch. */
START_TEST(test_page_size_of_old_region)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	struct kvs_region_info info;
	struct kvs_counters t;
	char msg[512];

	test_config(&cfg, 8, 1 << 20);
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, 512), 0);
	ck_assert_uint_eq(c->hdr->page_size, 4096);
	c->hdr->page_size = 0;
	kvs_cache_close(c);
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &c, msg, sizeof(msg)), 0);
	kvs_cache_stat(c, &info, &t, NULL, 0);
	ck_assert_uint_eq(info.page_size, 4096);
	c->hdr->page_size = 12345;
	kvs_cache_close(c);
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &c, msg, sizeof(msg)), -EPROTO);
	ck_assert_msg(strstr(msg, "page size"), "%s", msg);
}
END_TEST

/* cache.numa: the creator binds the region before any page exists, and the policy is the
 * file's: another mapping of it has it too (get_mempolicy at an address of its data). */
START_TEST(test_numa_policy)
{
	static const struct {
		int numa;
		int mode;
	} want[] = {{KVS_NUMA_INTERLEAVE, 3 /* MPOL_INTERLEAVE */},
		    {KVS_NUMA_LOCAL, 4 /* MPOL_LOCAL */},
		    {KVS_NUMA_OFF, 0 /* MPOL_DEFAULT */}};

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct kvs_config cfg;
		struct kvs_cache *c = NULL, *a = NULL;
		struct kvs_region_info info;
		struct kvs_counters t;
		char msg[512];
		int mode = -1;

		test_config(&cfg, 8, 1 << 20);
		cfg.cache_numa = want[i].numa;
		ck_assert_int_eq(
		    kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, 512), 0);
		kvs_cache_stat(c, &info, &t, NULL, 0);
		ck_assert_uint_eq(info.numa, (uint32_t)want[i].numa);
		cfg.cache_numa = KVS_NUMA_OFF; /* the attacher's own key does not matter */
		ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &a, msg, sizeof(msg)),
				 0);
		ck_assert_int_eq(syscall(SYS_get_mempolicy, &mode, NULL, 0,
					 (char *)a->data + (3 << 20), 2 /* MPOL_F_ADDR */),
				 0);
		ck_assert_int_eq(mode, want[i].mode);
		kvs_cache_close(a);
		kvs_cache_close(c);
	}
}
END_TEST

/* The node's pool of 2 MiB pages, raised by add for a test and given back (under the lock the
 * huge test takes too).  pool_raise: whether it could; pool_lower: give it back. */
static int pool_lock_fd = -1;

static unsigned long long pool_pages(void)
{
	unsigned long long v = 0;
	FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r");

	if (f) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

static void pool_set(unsigned long long n)
{
	FILE *f = fopen("/proc/sys/vm/nr_hugepages", "w");

	if (f) {
		fprintf(f, "%llu\n", n);
		fclose(f);
	}
}

static bool pool_raise(unsigned add)
{
	unsigned long long was;

	if (geteuid() != 0 || access("/sys/kernel/mm/hugepages/hugepages-2048kB", F_OK))
		return false;
	pool_lock_fd = open("/tmp/kvshim-huge-test.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (pool_lock_fd < 0 || flock(pool_lock_fd, LOCK_EX))
		return false;
	was = pool_pages();
	pool_set(was + add);
	if (pool_pages() >= was + add)
		return true;
	pool_set(was);
	close(pool_lock_fd);
	pool_lock_fd = -1;
	return false;
}

static void pool_lower(unsigned add)
{
	unsigned long long now = pool_pages();

	pool_set(now > add ? now - add : 0);
	close(pool_lock_fd);
	pool_lock_fd = -1;
}

/* Ranks that start together on a hugetlbfs whose pages fit one region: the first creator's
 * mapping reserves them before it publishes, and a second creator that measured the pool then
 * would find no room and read storage for good; it waits for the first (lock_creators in
 * region.c) and attaches to its region. */
static int hugetlbfs_racing(void)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL;
	struct kvs_region_info info;
	struct kvs_counters t;
	char msg[512];
	pid_t pid;
	int st;

	test_config(&cfg, 4, 1 << 20); /* a page of control plane and two of data */
	pid = fork();
	if (pid == 0) {
		kvs_region_test_publish_ms = 400;
		int r =
		    kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
		if (r) {
			fprintf(stderr, "check_region: the first creator: %d (%s)\n", r, msg);
			_exit(1);
		}
		usleep(500000);
		_exit(0);
	}
	FAIL_IF(pid < 0, 2, "fork");
	usleep(150000); /* the first has reserved its pages and sleeps before it publishes */
	int r = kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, sizeof(msg));
	FAIL_IF(waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st), 3,
		"the first creator failed");
	FAIL_IF(r != 0, 4, "the second creator: %d (%s)", r, msg);
	kvs_cache_stat(c, &info, &t, NULL, 0);
	FAIL_IF(info.page_kind != KVS_PAGE_HUGETLBFS || info.page_size != (2u << 20), 5,
		"page kind %u size %llu", info.page_kind, (unsigned long long)info.page_size);
	kvs_cache_close(c);
	return 0;
}

START_TEST(test_hugetlbfs_racing_creators)
{
	if (!pool_raise(8)) {
		fprintf(stderr, "check_region: cannot reserve 2 MiB pages here; skipped\n");
		return;
	}
	/* The mount's size= is the region: 3 pages, and no room for a second. */
	int st = in_fs("hugetlbfs", "pagesize=2M,size=6M", hugetlbfs_racing);
	pool_lower(8); /* first: a failure must not keep the node's pages */
	ck_assert_msg(st == 0, "child status %#x", st);
}
END_TEST

/* cache.prefault: an attacher maps the frames that hold a loaded shard, and only those (not
 * every frame with pages), on a thread of its own, before it reads anything; closing the
 * handle stops that thread. */
START_TEST(test_prefault_maps_loaded_frames)
{
	struct kvs_config cfg;
	struct kvs_cache *c = NULL, *a = NULL;
	struct kvs_pin pin;
	char msg[512];
	uint64_t rss = 0;

	uint32_t done;

	test_config(&cfg, 16, 1 << 20);
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), KVS_OPEN_CREATE, &c, msg, 512), 0);
	ck_assert_int_eq(kvs_cache_prepare(c, 1, &done), 0); /* every frame has its pages */
	for (uint64_t k = 0; k < 4; k++) {
		struct kvs_key key = key_of(7, k);

		ck_assert_int_eq(kvs_cache_pin(c, &key, KVS_ALLOC_LOAD, &pin), KVS_PIN_OWNER);
		memset(kvs_cache_data(c, &pin), 0x5a, 1 << 20);
		kvs_cache_mark_ready(c, &pin, 1 << 20);
		kvs_cache_release(c, &pin);
	}
	cfg.cache_prefault = true;
	ck_assert_int_eq(kvs_cache_open(KVS_CACHE_PARAMS(&cfg), 0, &a, msg, sizeof(msg)), 0);
	for (int i = 0; i < 200 && (rss = smaps_kb(a->data, "Rss")) < 4096; i++)
		usleep(10000);
	ck_assert_msg(rss >= 4096 && rss < 6 * 1024, "Rss %llu kB: not the 4 loaded frames",
		      (unsigned long long)rss);
	kvs_cache_close(a);
	kvs_cache_close(c);
}
END_TEST

/* Remove what a case that failed left behind. */
static void teardown(void)
{
	char cmd[128];

	userdel();
	snprintf(cmd, sizeof(cmd), "rm -f /dev/shm/kvshim.*.check_region.%d.*", (int)getpid());
	if (system(cmd) != 0)
		fprintf(stderr, "check_region: %s failed\n", cmd);
}

static Suite *region_suite(void)
{
	Suite *s = suite_create("region");
	TCase *core = tcase_create("core");
	TCase *limits = tcase_create("limits");

	tcase_add_test(core, test_foreign_region_refused);
	tcase_add_test(core, test_fifo_refused);
	tcase_add_test(core, test_two_links_refused);
	tcase_add_test(core, test_mode_wider_refused);
	tcase_add_test(core, test_link_and_truncated_refused);
	tcase_add_test(core, test_guessable_names_taken);
	tcase_add_test(limits, test_too_big_refused);
	tcase_add_test(limits, test_auto_capacity_fits);
	tcase_add_test(limits, test_lazy_allocates_used_slots);
	tcase_add_test(limits, test_lazy_stops_at_headroom);
	tcase_add_test(limits, test_eager_stops_at_headroom);
	tcase_add_test(limits, test_ahead_waits_at_headroom);
	tcase_add_test(limits, test_prepare_all);
	tcase_add_test(limits, test_prepare_stops_at_headroom);
	tcase_add_test(limits, test_prepare_passes_noroom);
	tcase_add_test(limits, test_huge_always);
	tcase_add_test(limits, test_huge_advise);
	tcase_add_test(limits, test_huge_advise_headroom);
	tcase_add_test(limits, test_huge_on_fallback);
	tcase_add_test(core, test_page_size_of_old_region);
	tcase_add_test(core, test_numa_policy);
	tcase_add_test(core, test_prefault_maps_loaded_frames);
	tcase_add_test(limits, test_hugetlbfs_racing_creators);
	tcase_add_checked_fixture(core, NULL, teardown);
	tcase_add_checked_fixture(limits, NULL, teardown);
	tcase_set_timeout(core, 60);
	tcase_set_timeout(limits, 60);
	suite_add_tcase(s, core);
	suite_add_tcase(s, limits);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(region_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	/* A failed case exits before its teardown: remove its user and regions here. */
	snprintf(user, sizeof(user), "kvst%d", (int)getpid() % 100000);
	if (getpwnam(user))
		userdel();
	if (system("rm -f /dev/shm/kvshim.*.check_region.*") != 0)
		fprintf(stderr, "check_region: cannot remove the regions left behind\n");
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
