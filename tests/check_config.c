/*
 * check_config: the configuration module (config/config.c).
 *
 * core: defaults, the file, the environment and their precedence, KVSHIM_ENABLE, the listing,
 *       the exact form of every error message, all-or-nothing loading, concurrent loads.
 * limits: good and bad inputs of every key type, through both the environment and a file,
 *         line and value lengths at and past their limits, the parse helpers.
 *
 * Files are written under a fresh mkdtemp() directory per test; the environment is passed as
 * envp, with KVSHIM_CONFIG= (empty: no file) so that /etc/kvshim/kvshim.ini cannot leak in.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* open_memstream() */
#endif

#include "config.h"
#include "print.h"
#include "value.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILES 32

static char tmpdir[64]; /* "/tmp/check_config.XXXXXX" */
static char files[MAX_FILES][PATH_MAX];
static int nfiles;
static char msg[KVS_CONFIG_MSG_MAX];

/* Big (about 25 KiB each): kept off the stack of the tests. */
static struct kvs_config cfg, want;

static void setup(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/check_config.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
	nfiles = 0;
}

static void teardown(void)
{
	for (int i = 0; i < nfiles; i++)
		unlink(files[i]);
	rmdir(tmpdir);
}

/* Write len bytes of text to tmpdir/name and return its path. */
static const char *write_bytes(const char *name, const char *text, size_t len)
{
	char *path;
	int fd;

	ck_assert_int_lt(nfiles, MAX_FILES);
	path = files[nfiles++];
	snprintf(path, PATH_MAX, "%s/%s", tmpdir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
	close(fd);
	return path;
}

static const char *write_file(const char *name, const char *text)
{
	return write_bytes(name, text, strlen(text));
}

/* Load with only the given variables in the environment (NULL-terminated). */
static int load(const char *path, char *const *envp)
{
	static char *const empty[] = {"KVSHIM_CONFIG=", NULL};

	memset(msg, 'x', sizeof(msg));
	return kvs_config_load(&cfg, path, envp ? envp : empty, msg, sizeof(msg));
}

/* cfg must be the defaults with the shim turned off, as after any error. */
static void assert_failed_state(void)
{
	kvs_config_defaults(&want);
	want.shim_enable = false;
	ck_assert_int_eq(memcmp(&cfg, &want, sizeof(cfg)), 0);
}

/* Expect load() to fail with exactly the message fmt, formatted with the path. */
static void expect_file_error(const char *path, const char *fmt)
{
	char expect[KVS_CONFIG_MSG_MAX];

	snprintf(expect, sizeof(expect), fmt, path);
	ck_assert_msg(load(path, NULL) == -EINVAL, "loaded, expected \"%s\"", expect);
	ck_assert_str_eq(msg, expect);
	assert_failed_state();
}

/* The plain or explained listing of cfg, malloc()ed. */
static char *listing(bool explain)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(kvs_config_print(&cfg, f, explain), 0);
	fclose(f);
	return buf;
}

START_TEST(test_defaults)
{
	kvs_config_defaults(&cfg);
	ck_assert(cfg.shim_enable);
	ck_assert_int_eq(cfg.shim_log, KVS_LOG_WARN);
	ck_assert_str_eq(cfg.files_roots, "");
	ck_assert_uint_eq(cfg.files_min_read, 64 << 10);
	ck_assert(!cfg.files_buffered);
	ck_assert_str_eq(cfg.cache_name, "default");
	ck_assert_uint_eq(cfg.cache_capacity, 1 << 30);
	ck_assert_uint_eq(cfg.cache_shard_size, 1 << 20);
	ck_assert_uint_eq(cfg.cache_reserved, 5);
	ck_assert_int_eq(cfg.cache_eviction, KVS_EVICT_CLOCK);
	ck_assert_uint_eq(cfg.cache_mode, 0600);
	ck_assert_uint_eq(cfg.cache_max_processes, 64);
	ck_assert_int_eq(cfg.loader_local_rank_size, -1);
	ck_assert_int_eq(cfg.loader_local_rank, -1);
	ck_assert(cfg.loader_rotate);
	ck_assert_int_eq(cfg.loader_wait, KVS_WAIT_FUTEX);
	ck_assert_uint_eq(cfg.loader_wait_timeout_ms, 30000);
	ck_assert_int_eq(cfg.loader_prefetch, KVS_PREFETCH_ALLOC);
	ck_assert_int_eq(cfg.loader_io, KVS_IO_AUTO);
	ck_assert_uint_eq(cfg.loader_io_depth, 32);
	ck_assert_uint_eq(cfg.loader_waiting_queue_depth, 256);
	ck_assert_uint_eq(cfg.loader_running_queue_depth, 256);
	ck_assert(!cfg.loader_backend_only);
	ck_assert_str_eq(cfg.cuda_library, "libcuda.so.1");
	ck_assert_str_eq(cfg.cuda_cufile_library, "libcufile.so.0");
	ck_assert(cfg.cuda_register_host);
	ck_assert_str_eq(cfg.path, "");
	ck_assert(!cfg.kvshim_enable_env_off);
	for (int i = 0; i < KVS_NKEYS; i++)
		ck_assert_int_eq(cfg.source[i], KVS_SRC_DEFAULT);

	/* Loading with no file and no overrides succeeds, which proves every default string of
	 * keys.def passes its own validation, and gives exactly the defaults. */
	want = cfg;
	ck_assert_int_eq(load(NULL, NULL), 0);
	ck_assert_str_eq(msg, "");
	ck_assert_int_eq(memcmp(&cfg, &want, sizeof(cfg)), 0);
}
END_TEST

START_TEST(test_file_values)
{
	const char *path = write_file("a.ini", "; kvshim test\n"
					       "[shim]\n"
					       "log = debug\r\n"
					       "\n"
					       "[cache]\n"
					       "# a comment\n"
					       "capacity = 2G ; inline comment\n"
					       "  name=run-1.a_b\n"
					       "mode: 640\n"
					       "[files]\n"
					       "roots = /data/kv:/scratch/kv\n"
					       "[loader]\n"
					       "local_rank_size = 8\n"
					       "prefetch = read\n"
					       "[cuda]\n"
					       "register_host = off");

	ck_assert_int_eq(load(path, NULL), 0);
	ck_assert_str_eq(msg, "");
	ck_assert_str_eq(cfg.path, path);
	ck_assert_int_eq(cfg.shim_log, KVS_LOG_DEBUG);
	ck_assert_uint_eq(cfg.cache_capacity, 2ULL << 30);
	ck_assert_str_eq(cfg.cache_name, "run-1.a_b");
	ck_assert_uint_eq(cfg.cache_mode, 0640);
	ck_assert_str_eq(cfg.files_roots, "/data/kv:/scratch/kv");
	ck_assert_int_eq(cfg.loader_local_rank_size, 8);
	ck_assert_int_eq(cfg.loader_prefetch, KVS_PREFETCH_READ);
	ck_assert(!cfg.cuda_register_host);
	ck_assert(cfg.shim_enable);

	ck_assert_int_eq(cfg.source[KVS_KEY_shim_log], KVS_SRC_FILE);
	ck_assert_uint_eq(cfg.line[KVS_KEY_shim_log], 3);
	ck_assert_uint_eq(cfg.line[KVS_KEY_cache_capacity], 7);
	ck_assert_uint_eq(cfg.line[KVS_KEY_cache_name], 8);
	ck_assert_uint_eq(cfg.line[KVS_KEY_cache_mode], 9);
	ck_assert_uint_eq(cfg.line[KVS_KEY_cuda_register_host], 16);
	ck_assert_int_eq(cfg.source[KVS_KEY_cache_shard_size], KVS_SRC_DEFAULT);
	ck_assert_uint_eq(cfg.cache_shard_size, 1 << 20);
}
END_TEST

START_TEST(test_env_overrides_file)
{
	const char *path = write_file("a.ini", "[cache]\ncapacity = 2G\nreserved = 10\n"
					       "[loader]\nlocal_rank_size = 4\n");
	char cfgvar[PATH_MAX + 16];
	char *envp[] = {"KVSHIM_CACHE_CAPACITY=4G", "KVSHIM_LOADER_LOCAL_RANK_SIZE=8", cfgvar,
			NULL};

	/* Also finds the file through KVSHIM_CONFIG, since path is NULL. */
	snprintf(cfgvar, sizeof(cfgvar), "KVSHIM_CONFIG=%s", path);
	ck_assert_int_eq(load(NULL, envp), 0);
	ck_assert_str_eq(cfg.path, path);
	ck_assert_uint_eq(cfg.cache_capacity, 4ULL << 30);
	ck_assert_int_eq(cfg.source[KVS_KEY_cache_capacity], KVS_SRC_ENV);
	ck_assert_uint_eq(cfg.line[KVS_KEY_cache_capacity], 0);
	ck_assert_int_eq(cfg.loader_local_rank_size, 8);
	ck_assert_int_eq(cfg.source[KVS_KEY_loader_local_rank_size], KVS_SRC_ENV);
	ck_assert_uint_eq(cfg.cache_reserved, 10);
	ck_assert_int_eq(cfg.source[KVS_KEY_cache_reserved], KVS_SRC_FILE);
	ck_assert_uint_eq(cfg.line[KVS_KEY_cache_reserved], 3);

	/* An explicit path wins over KVSHIM_CONFIG. */
	const char *other = write_file("b.ini", "[cache]\ncapacity = 3G\n");
	char *envp2[] = {cfgvar, NULL};

	ck_assert_int_eq(load(other, envp2), 0);
	ck_assert_str_eq(cfg.path, other);
	ck_assert_uint_eq(cfg.cache_capacity, 3ULL << 30);
}
END_TEST

START_TEST(test_enable_env)
{
	static const char *const off[] = {"0", "false", "no", "off", "OFF", "No"};
	char var[64];
	char *envp[] = {"KVSHIM_CONFIG=", var, NULL};

	for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); i++) {
		snprintf(var, sizeof(var), "KVSHIM_ENABLE=%s", off[i]);
		ck_assert_int_eq(load(NULL, envp), 0);
		ck_assert_msg(!cfg.shim_enable, "KVSHIM_ENABLE=%s", off[i]);
		ck_assert(cfg.kvshim_enable_env_off);
		ck_assert_int_eq(cfg.source[KVS_KEY_shim_enable], KVS_SRC_ENV);
	}

	/* A true KVSHIM_ENABLE changes nothing: it is a kill switch, not a way round the file. */
	snprintf(var, sizeof(var), "KVSHIM_ENABLE=1");
	ck_assert_int_eq(load(NULL, envp), 0);
	ck_assert(cfg.shim_enable);
	ck_assert(!cfg.kvshim_enable_env_off);
	ck_assert_int_eq(cfg.source[KVS_KEY_shim_enable], KVS_SRC_DEFAULT);

	const char *path = write_file("off.ini", "[shim]\nenable = false\n");

	ck_assert_int_eq(load(path, envp), 0);
	ck_assert(!cfg.shim_enable);
	ck_assert_int_eq(cfg.source[KVS_KEY_shim_enable], KVS_SRC_FILE);

	/* KVSHIM_ENABLE=0 beats KVSHIM_SHIM_ENABLE=1 whatever their order. */
	char *envp2[] = {"KVSHIM_CONFIG=", "KVSHIM_ENABLE=off", "KVSHIM_SHIM_ENABLE=1", NULL};

	ck_assert_int_eq(load(NULL, envp2), 0);
	ck_assert(!cfg.shim_enable);

	snprintf(var, sizeof(var), "KVSHIM_ENABLE=maybe");
	ck_assert_int_eq(load(NULL, envp), -EINVAL);
	ck_assert_str_eq(msg, "config: environment: KVSHIM_ENABLE: bad value \"maybe\" (expected "
			      "true, false, 1, 0, yes, no, on or off)");
	assert_failed_state();
}
END_TEST

START_TEST(test_env_ignored_and_unknown)
{
	char *envp[] = {"KVSHIM_CONFIG=",
			"KVSHIM_TEST_CACHE_BOGUS=1", /* tests' own */
			"KVSHIM_FOO=1",		     /* no such section: someone else's */
			"KVSHIM_FOO_BAR=1",
			"KVSHIM_CONFIGURE=1",
			"KVSHIM_LOADER=1",	    /* a section, but no key part */
			"kvshim_cache_capacity=2G", /* not in capitals: not ours */
			"KVSHIM_cache_capacity=2G",
			"PATH=/usr/bin",
			"NOEQUALS",
			NULL};

	ck_assert_int_eq(load(NULL, envp), 0);
	ck_assert_str_eq(msg, "");
	kvs_config_defaults(&want);
	ck_assert_int_eq(memcmp(&cfg, &want, sizeof(cfg)), 0);

	char *bad[] = {"KVSHIM_CONFIG=", "KVSHIM_CACHE_BOGUS=1", NULL};

	ck_assert_int_eq(load(NULL, bad), -EINVAL);
	ck_assert_str_eq(msg, "config: environment: KVSHIM_CACHE_BOGUS: unknown key");
	assert_failed_state();

	/* First error wins among variables too. */
	char *two[] = {"KVSHIM_CONFIG=", "KVSHIM_LOADER_IO=aio", "KVSHIM_CACHE_MODE=999", NULL};

	ck_assert_int_eq(load(NULL, two), -EINVAL);
	ck_assert_str_eq(msg, "config: environment: KVSHIM_LOADER_IO: bad value \"aio\" (expected "
			      "one of auto, io_uring, threads, uring)");
}
END_TEST

START_TEST(test_environ_default)
{
	/* envp == NULL reads environ; this runs in its own process under CK_FORK. */
	ck_assert_int_eq(setenv("KVSHIM_CONFIG", "", 1), 0);
	ck_assert_int_eq(setenv("KVSHIM_CACHE_NAME", "from-environ", 1), 0);
	memset(msg, 'x', sizeof(msg));
	ck_assert_int_eq(kvs_config_load(&cfg, NULL, NULL, msg, sizeof(msg)), 0);
	ck_assert_str_eq(cfg.cache_name, "from-environ");
	ck_assert_int_eq(cfg.source[KVS_KEY_cache_name], KVS_SRC_ENV);
	unsetenv("KVSHIM_CACHE_NAME");
	unsetenv("KVSHIM_CONFIG");
}
END_TEST

START_TEST(test_print)
{
	const char *path = write_file("p.ini", "[cache]\n"
					       "\n"
					       "capacity = 2G\n"
					       "mode = 640\n"
					       "reserved = 7\n"
					       "[loader]\n"
					       "io = uring\n"
					       "[files]\n"
					       "min_read = 12345\n");
	char *envp[] = {"KVSHIM_CONFIG=", "KVSHIM_LOADER_IO_DEPTH=64", "KVSHIM_ENABLE=0", NULL};
	char expect[PATH_MAX + 128];
	char *out, *exp;

	ck_assert_int_eq(load(path, envp), 0);
	out = listing(false);
	ck_assert_ptr_nonnull(strstr(out, "shim.enable = false\n"));
	ck_assert_ptr_nonnull(strstr(out, "shim.log = warn\n"));
	ck_assert_ptr_nonnull(strstr(out, "files.roots = \n"));
	ck_assert_ptr_nonnull(strstr(out, "files.min_read = 12345\n"));
	ck_assert_ptr_nonnull(strstr(out, "cache.capacity = 2G\n"));
	ck_assert_ptr_nonnull(strstr(out, "cache.mode = 0640\n"));
	ck_assert_ptr_nonnull(strstr(out, "cache.reserved = 7%\n"));
	ck_assert_ptr_nonnull(strstr(out, "loader.local_rank_size = auto\n"));
	ck_assert_ptr_nonnull(strstr(out, "loader.io = io_uring\n"));
	ck_assert_ptr_nonnull(strstr(out, "loader.io_depth = 64\n"));
	ck_assert_ptr_null(strstr(out, "source"));
	/* One line per key. */
	int lines = 0;

	for (char *p = out; *p; p++)
		lines += *p == '\n';
	ck_assert_int_eq(lines, KVS_NKEYS);

	exp = listing(true);
	snprintf(expect, sizeof(expect),
		 "cache.capacity = 2G\n\tdefault 1G, source file %s:3\n\tbytes of data, in frames "
		 "of cache.shard_size\n",
		 path);
	ck_assert_ptr_nonnull(strstr(exp, expect));
	ck_assert_ptr_nonnull(strstr(exp, "loader.io_depth = 64\n\tdefault 32, source env "
					  "KVSHIM_LOADER_IO_DEPTH\n"));
	ck_assert_ptr_nonnull(strstr(exp, "shim.enable = false\n\tdefault true, source env "
					  "KVSHIM_ENABLE\n"));
	ck_assert_ptr_nonnull(
	    strstr(exp, "cache.shard_size = 1M\n\tdefault 1M, source default\n"
			"\tbytes per frame, the most one shard holds, multiple of 4 KiB; "
			"smaller files and tails are packed several to a frame\n"));
	ck_assert_ptr_nonnull(strstr(exp, "files.roots = \n\tdefault (empty), source default\n"));
	free(exp);
	free(out);
}
END_TEST

START_TEST(test_print_reads_back)
{
	/* The plain listing, turned into INI, loads back to the same listing: every value is
	 * printed in a form its parser takes. */
	const char *path = write_file("r.ini", "[cache]\ncapacity = 3221225472\nshard_size = 12K\n"
					       "mode = 0\n[loader]\nlocal_rank = 3\n"
					       "running_queue_depth = 100\n[files]\nmin_read = 0\n"
					       "roots = /a:/b c\n[shim]\nlog = error\n");
	char *first, *second, *ini, *line, *save = NULL;
	size_t len = 0;
	FILE *f;

	ck_assert_int_eq(load(path, NULL), 0);
	first = listing(false);
	f = open_memstream(&ini, &len);
	ck_assert_ptr_nonnull(f);
	char *copy = strdup(first);

	for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *dot = strchr(line, '.');

		ck_assert_ptr_nonnull(dot);
		fprintf(f, "[%.*s]\n%s\n", (int)(dot - line), line, dot + 1);
	}
	fclose(f);
	free(copy);
	path = write_file("back.ini", ini);
	free(ini);
	ck_assert_int_eq(load(path, NULL), 0);
	second = listing(false);
	ck_assert_str_eq(first, second);
	ck_assert_ptr_nonnull(strstr(first, "cache.capacity = 3G\n"));
	ck_assert_ptr_nonnull(strstr(first, "loader.running_queue_depth = 128\n"));
	free(first);
	free(second);
}
END_TEST

START_TEST(test_all_or_nothing)
{
	const char *path = write_file("half.ini", "[cache]\ncapacity = 2G\nname = good\n"
						  "reserved = 99\n[loader]\nio_depth = 8\n");
	char *envp[] = {"KVSHIM_CONFIG=", "KVSHIM_CACHE_NAME=fine", "KVSHIM_LOADER_ROTATE=perhaps",
			NULL};

	ck_assert_int_eq(load(path, NULL), -EINVAL);
	ck_assert_uint_eq(cfg.cache_capacity, 1 << 30);
	ck_assert_str_eq(cfg.cache_name, "default");
	ck_assert_str_eq(cfg.path, "");
	assert_failed_state();

	/* The same after good variables, and after a good file. */
	path = write_file("good.ini", "[cache]\ncapacity = 2G\n");
	ck_assert_int_eq(load(path, envp), -EINVAL);
	ck_assert_str_eq(msg, "config: environment: KVSHIM_LOADER_ROTATE: bad value \"perhaps\" "
			      "(expected true, false, 1, 0, yes, no, on or off)");
	assert_failed_state();

	/* A dirty struct comes back clean. */
	memset(&cfg, 0x5a, sizeof(cfg));
	ck_assert_int_eq(load("/nonexistent/kvshim.ini", NULL), -EINVAL);
	assert_failed_state();
}
END_TEST

START_TEST(test_error_messages)
{
	const char *p;

	p = write_file("e1.ini", "[cache]\ncapacity = 1G\nshard_size = 6000\n");
	expect_file_error(p, "config: %s:3: cache.shard_size: value \"6000\" is not a multiple of "
			     "4K");

	p = write_file("e2.ini", "[shim]\nenable = true\n[bogus]\nx = 1\n");
	expect_file_error(p, "config: %s:4: bogus.x: unknown section [bogus]");

	p = write_file("e3.ini", "[cache]\n\n# comment\nbogus = 1\n");
	expect_file_error(p, "config: %s:4: cache.bogus: unknown key");

	p = write_file("e4.ini", "enable = 1\n");
	expect_file_error(p, "config: %s:1: enable: key before any [section]");

	p = write_file("e5.ini", "[cache]\ncapacity 1G\n");
	expect_file_error(p, "config: %s:2: syntax error (expected [section], key = value or a "
			     "comment)");

	p = write_file("e6.ini", "[cache\ncapacity = 1G\n");
	expect_file_error(p, "config: %s:1: syntax error (expected [section], key = value or a "
			     "comment)");

	p = write_file("e7.ini", "[cache]\nreserved = 51%\n");
	expect_file_error(p, "config: %s:2: cache.reserved: value \"51%%\" out of range (0 to 50)");

	p = write_file("e8.ini", "[cache]\neviction = lru\n");
	expect_file_error(p, "config: %s:2: cache.eviction: bad value \"lru\" (expected one of "
			     "clock, fifo)");

	p = write_file("e9.ini", "[cache]\ncapacity = 32T\n");
	expect_file_error(p,
			  "config: %s:2: cache.capacity: value \"32T\" out of range (4K to 16T)");

	p = write_file("e10.ini", "[cache]\nmode = 0800\n");
	expect_file_error(p, "config: %s:2: cache.mode: bad value \"0800\" (expected octal "
			     "permission bits such as 0600)");

	p = write_file("e11.ini", "[cache]\nname = a/b\n");
	expect_file_error(p, "config: %s:2: cache.name: bad character in name \"a/b\" (allowed: "
			     "A-Z a-z 0-9 . _ -)");

	p = write_file("e12.ini", "[cache]\ncapacity = 512K\n");
	expect_file_error(p, "config: %s:2: cache.capacity: 512K is smaller than one shard "
			     "(cache.shard_size 1M)");

	/* Keys are matched exactly: the file uses the documented lower case. */
	p = write_file("e13.ini", "[Cache]\ncapacity = 1G\n");
	expect_file_error(p, "config: %s:2: Cache.capacity: unknown section [Cache]");

	/* First error wins: a bad value before a syntax error, and the other way round. */
	p = write_file("e14.ini", "[cache]\nreserved = 60\nmode = 9\n");
	expect_file_error(p, "config: %s:2: cache.reserved: value \"60\" out of range (0 to 50)");
	p = write_file("e15.ini", "[cache]\nnonsense\nmode = 9\n");
	expect_file_error(p, "config: %s:2: syntax error (expected [section], key = value or a "
			     "comment)");

	p = write_bytes("e16.ini", "[cache]\nname = a\0b\n", sizeof("[cache]\nname = a\0b\n") - 1);
	expect_file_error(p, "config: %s:2: NUL byte in line");

	/* The file named by KVSHIM_CONFIG must exist; the one in /etc need not. */
	char missing[PATH_MAX], expect[PATH_MAX + 64], var[PATH_MAX + 16];
	char *envp[] = {var, NULL};

	snprintf(missing, sizeof(missing), "%s/missing.ini", tmpdir);
	snprintf(var, sizeof(var), "KVSHIM_CONFIG=%s", missing);
	snprintf(expect, sizeof(expect), "config: %s: cannot open: No such file or directory",
		 missing);
	ck_assert_int_eq(load(NULL, envp), -EINVAL);
	ck_assert_str_eq(msg, expect);
	assert_failed_state();
	ck_assert_int_eq(load(missing, NULL), -EINVAL);
	ck_assert_str_eq(msg, expect);

	snprintf(expect, sizeof(expect), "config: %s: not a regular file", tmpdir);
	ck_assert_int_eq(load(tmpdir, NULL), -EINVAL);
	ck_assert_str_eq(msg, expect);

	/* A capacity/shard clash is blamed on whichever came last. */
	p = write_file("e17.ini", "[cache]\ncapacity = 2M\n");
	char *shard[] = {"KVSHIM_CACHE_SHARD_SIZE=4M", NULL};

	ck_assert_int_eq(load(p, shard), -EINVAL);
	ck_assert_str_eq(msg, "config: environment: KVSHIM_CACHE_SHARD_SIZE: 4M is larger than "
			      "cache.capacity (2M)");
}
END_TEST

START_TEST(test_msg_buffer)
{
	const char *p = write_file("m.ini", "[cache]\nbogus = 1\n");
	char small[8];
	char *envp[] = {"KVSHIM_CONFIG=", "KVSHIM_CACHE_NAME=a\nb\tc", NULL};

	ck_assert_int_eq(kvs_config_load(&cfg, p, NULL, NULL, 0), -EINVAL);
	ck_assert(!cfg.shim_enable);
	memset(small, 'x', sizeof(small));
	ck_assert_int_eq(kvs_config_load(&cfg, p, NULL, small, sizeof(small)), -EINVAL);
	ck_assert_str_eq(small, "config:");

	/* A value with control characters still gives one printable line. */
	ck_assert_int_eq(load(NULL, envp), -EINVAL);
	ck_assert_str_eq(msg, "config: environment: KVSHIM_CACHE_NAME: bad character in name "
			      "\"a?b?c\" (allowed: A-Z a-z 0-9 . _ -)");
}
END_TEST

struct loader_arg {
	const char *path;
	uint64_t capacity;
	int bad;
};

/* Load one file many times, as another thread loads another one. */
static void *load_loop(void *p)
{
	struct loader_arg *a = p;
	struct kvs_config *c = malloc(sizeof(*c));
	char m[KVS_CONFIG_MSG_MAX];
	char *envp[] = {NULL};

	for (int i = 0; c && i < 200; i++)
		if (kvs_config_load(c, a->path, envp, m, sizeof(m)) ||
		    c->cache_capacity != a->capacity)
			a->bad++;
	free(c);
	return c ? NULL : p;
}

START_TEST(test_concurrent_loads)
{
	struct loader_arg a[4];
	pthread_t t[4];
	char name[16], text[64];

	for (int i = 0; i < 4; i++) {
		snprintf(name, sizeof(name), "t%d.ini", i);
		snprintf(text, sizeof(text), "[cache]\ncapacity = %dG\n", i + 1);
		a[i] = (struct loader_arg){write_file(name, text), (uint64_t)(i + 1) << 30, 0};
	}
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, load_loop, &a[i]), 0);
	for (int i = 0; i < 4; i++) {
		void *r;

		ck_assert_int_eq(pthread_join(t[i], &r), 0);
		ck_assert_ptr_null(r);
		ck_assert_int_eq(a[i].bad, 0);
	}
}
END_TEST

/* One input of one key: through KVSHIM_<SECTION>_<KEY> and through a file. */
struct input {
	const char *section, *key;
	const char *value;
	bool ok;
	size_t off;
	char kind; /* u: uint64_t, i: int64_t, b: bool, e: int, s: string */
	int64_t want;
	const char *want_s;
};

#define F(field) offsetof(struct kvs_config, field)
#define GOOD(sec, key_, val, field, kind_, want_)                                                  \
	{                                                                                          \
		.section = #sec, .key = #key_, .value = val, .ok = true, .off = F(field),          \
		.kind = kind_, .want = (int64_t)(want_)                                            \
	}
#define GOODS(sec, key_, val, field, want_)                                                        \
	{                                                                                          \
		.section = #sec, .key = #key_, .value = val, .ok = true, .off = F(field),          \
		.kind = 's', .want_s = want_                                                       \
	}
#define BAD(sec, key_, val)                                                                        \
	{                                                                                          \
		.section = #sec, .key = #key_, .value = val, .ok = false                           \
	}

static const struct input inputs[] = {
    /* SIZE, files.min_read in [0, 1T] */
    GOOD(files, min_read, "0", files_min_read, 'u', 0),
    GOOD(files, min_read, "4096", files_min_read, 'u', 4096),
    GOOD(files, min_read, "64K", files_min_read, 'u', 64 << 10),
    GOOD(files, min_read, "64k", files_min_read, 'u', 64 << 10),
    GOOD(files, min_read, "64KB", files_min_read, 'u', 64 << 10),
    GOOD(files, min_read, "64KiB", files_min_read, 'u', 64 << 10),
    GOOD(files, min_read, "64kib", files_min_read, 'u', 64 << 10),
    GOOD(files, min_read, "1m", files_min_read, 'u', 1 << 20),
    GOOD(files, min_read, "3G", files_min_read, 'u', 3ULL << 30),
    GOOD(files, min_read, "1T", files_min_read, 'u', 1ULL << 40),
    GOOD(files, min_read, "1tib", files_min_read, 'u', 1ULL << 40),
    GOOD(files, min_read, "4096B", files_min_read, 'u', 4096),
    GOOD(files, min_read, "4096b", files_min_read, 'u', 4096),
    GOOD(files, min_read, "007K", files_min_read, 'u', 7 << 10),
    BAD(files, min_read, ""),
    BAD(files, min_read, "K"),
    BAD(files, min_read, "-1"),
    BAD(files, min_read, "+1"),
    BAD(files, min_read, "1.5G"),
    BAD(files, min_read, "1 G"),
    BAD(files, min_read, "1X"),
    BAD(files, min_read, "1KBB"),
    BAD(files, min_read, "1iB"),
    BAD(files, min_read, "1Ki"),
    BAD(files, min_read, "0x10"),
    BAD(files, min_read, "2T"),
    BAD(files, min_read, "1099511627777"),
    BAD(files, min_read, "99999999999999999999"),
    BAD(files, min_read, "16777216T"),
    /* shard_size: SIZE in [4K, 1G], multiple of 4K */
    GOOD(cache, shard_size, "4K", cache_shard_size, 'u', 4096),
    GOOD(cache, shard_size, "1G", cache_shard_size, 'u', 1 << 30),
    GOOD(cache, shard_size, "12288", cache_shard_size, 'u', 12288),
    BAD(cache, shard_size, "6000"),
    BAD(cache, shard_size, "4097"),
    BAD(cache, shard_size, "0"),
    BAD(cache, shard_size, "2G"),
    /* capacity: at least one shard (1M by default) */
    GOOD(cache, capacity, "1M", cache_capacity, 'u', 1 << 20),
    BAD(cache, capacity, "4K"),
    /* UINT */
    GOOD(loader, io_depth, "1", loader_io_depth, 'u', 1),
    GOOD(loader, io_depth, "1024", loader_io_depth, 'u', 1024),
    GOOD(loader, io_depth, "0032", loader_io_depth, 'u', 32),
    BAD(loader, io_depth, "0"),
    BAD(loader, io_depth, "1025"),
    BAD(loader, io_depth, "1K"),
    BAD(loader, io_depth, ""),
    BAD(loader, io_depth, "-5"),
    BAD(loader, io_depth, "3.0"),
    BAD(loader, io_depth, "18446744073709551616"),
    BAD(loader, wait_timeout_ms, "0"),
    GOOD(loader, wait_timeout_ms, "3600000", loader_wait_timeout_ms, 'u', 3600000),
    BAD(loader, wait_timeout_ms, "3600001"),
    /* running_queue_depth rounds up to a power of two */
    GOOD(loader, running_queue_depth, "2", loader_running_queue_depth, 'u', 2),
    GOOD(loader, running_queue_depth, "3", loader_running_queue_depth, 'u', 4),
    GOOD(loader, running_queue_depth, "256", loader_running_queue_depth, 'u', 256),
    GOOD(loader, running_queue_depth, "257", loader_running_queue_depth, 'u', 512),
    GOOD(loader, running_queue_depth, "65535", loader_running_queue_depth, 'u', 65536),
    GOOD(loader, running_queue_depth, "65536", loader_running_queue_depth, 'u', 65536),
    BAD(loader, running_queue_depth, "1"),
    BAD(loader, running_queue_depth, "65537"),
    /* AUTO */
    GOOD(loader, local_rank_size, "auto", loader_local_rank_size, 'i', -1),
    GOOD(loader, local_rank_size, "AUTO", loader_local_rank_size, 'i', -1),
    GOOD(loader, local_rank_size, "Auto", loader_local_rank_size, 'i', -1),
    GOOD(loader, local_rank_size, "8", loader_local_rank_size, 'i', 8),
    GOOD(loader, local_rank_size, "4096", loader_local_rank_size, 'i', 4096),
    BAD(loader, local_rank_size, "0"),
    BAD(loader, local_rank_size, "4097"),
    BAD(loader, local_rank_size, "-1"),
    BAD(loader, local_rank_size, "autox"),
    BAD(loader, local_rank_size, ""),
    BAD(loader, local_rank_size, "8K"),
    GOOD(loader, local_rank, "0", loader_local_rank, 'i', 0),
    GOOD(loader, local_rank, "4095", loader_local_rank, 'i', 4095),
    BAD(loader, local_rank, "4096"),
    /* PCT */
    GOOD(cache, reserved, "5%", cache_reserved, 'u', 5),
    GOOD(cache, reserved, "5", cache_reserved, 'u', 5),
    GOOD(cache, reserved, "0", cache_reserved, 'u', 0),
    GOOD(cache, reserved, "50%", cache_reserved, 'u', 50),
    BAD(cache, reserved, "51"),
    BAD(cache, reserved, "100%"),
    BAD(cache, reserved, "5%%"),
    BAD(cache, reserved, "%"),
    BAD(cache, reserved, "-1"),
    BAD(cache, reserved, "5 %"),
    BAD(cache, reserved, "0.5"),
    BAD(cache, reserved, ""),
    /* MODE */
    GOOD(cache, mode, "0600", cache_mode, 'u', 0600),
    GOOD(cache, mode, "640", cache_mode, 'u', 0640),
    GOOD(cache, mode, "0", cache_mode, 'u', 0),
    GOOD(cache, mode, "0777", cache_mode, 'u', 0777),
    GOOD(cache, mode, "00644", cache_mode, 'u', 0644),
    BAD(cache, mode, "0800"),
    BAD(cache, mode, "1000"),
    BAD(cache, mode, "rw"),
    BAD(cache, mode, ""),
    BAD(cache, mode, "9"),
    BAD(cache, mode, "-600"),
    BAD(cache, mode, "0x1ff"),
    BAD(cache, mode, "777777777777777777777777"),
    /* BOOL */
    GOOD(files, buffered, "true", files_buffered, 'b', 1),
    GOOD(files, buffered, "TRUE", files_buffered, 'b', 1),
    GOOD(files, buffered, "Yes", files_buffered, 'b', 1),
    GOOD(files, buffered, "on", files_buffered, 'b', 1),
    GOOD(files, buffered, "1", files_buffered, 'b', 1),
    GOOD(loader, rotate, "false", loader_rotate, 'b', 0),
    GOOD(loader, rotate, "No", loader_rotate, 'b', 0),
    GOOD(loader, rotate, "OFF", loader_rotate, 'b', 0),
    GOOD(loader, rotate, "0", loader_rotate, 'b', 0),
    BAD(files, buffered, "2"),
    BAD(files, buffered, ""),
    BAD(files, buffered, "tru"),
    BAD(files, buffered, "yes please"),
    BAD(files, buffered, "y"),
    BAD(files, buffered, "01"),
    /* ENUM_* */
    GOOD(shim, log, "debug", shim_log, 'e', KVS_LOG_DEBUG),
    GOOD(shim, log, "WARN", shim_log, 'e', KVS_LOG_WARN),
    GOOD(shim, log, "Error", shim_log, 'e', KVS_LOG_ERROR),
    GOOD(shim, log, "info", shim_log, 'e', KVS_LOG_INFO),
    BAD(shim, log, "verbose"),
    BAD(shim, log, ""),
    BAD(shim, log, "2"),
    GOOD(cache, eviction, "fifo", cache_eviction, 'e', KVS_EVICT_FIFO),
    GOOD(cache, eviction, "CLOCK", cache_eviction, 'e', KVS_EVICT_CLOCK),
    BAD(cache, eviction, "lru"),
    GOOD(loader, wait, "spin", loader_wait, 'e', KVS_WAIT_SPIN),
    GOOD(loader, wait, "futex", loader_wait, 'e', KVS_WAIT_FUTEX),
    BAD(loader, wait, "sleep"),
    GOOD(loader, prefetch, "off", loader_prefetch, 'e', KVS_PREFETCH_OFF),
    GOOD(loader, prefetch, "read", loader_prefetch, 'e', KVS_PREFETCH_READ),
    GOOD(loader, prefetch, "alloc", loader_prefetch, 'e', KVS_PREFETCH_ALLOC),
    BAD(loader, prefetch, "none"),
    GOOD(loader, io, "uring", loader_io, 'e', KVS_IO_URING),
    GOOD(loader, io, "io_uring", loader_io, 'e', KVS_IO_URING),
    GOOD(loader, io, "threads", loader_io, 'e', KVS_IO_THREADS),
    GOOD(loader, io, "auto", loader_io, 'e', KVS_IO_AUTO),
    BAD(loader, io, "aio"),
    /* NAME */
    GOODS(cache, name, "a-b_c.1", cache_name, "a-b_c.1"),
    GOODS(cache, name, "X", cache_name, "X"),
    BAD(cache, name, "a/b"),
    BAD(cache, name, "a b"),
    BAD(cache, name, ""),
    BAD(cache, name, "\xc3\xbc"),
    BAD(cache, name, "a:b"),
    /* STR */
    GOODS(files, roots, "", files_roots, ""),
    GOODS(files, roots, "/a:/b c", files_roots, "/a:/b c"),
    GOODS(cuda, library, "/opt/cuda/lib64/libcuda.so", cuda_library, "/opt/cuda/lib64/libcuda.so"),
};

/* Check cfg after loading input in: its value and source, or the failure. */
static void check_input(const struct input *in, int ret, const char *prefix, int source)
{
	const char *field = (const char *)&cfg + in->off;
	int id;

	if (!in->ok) {
		ck_assert_msg(ret == -EINVAL, "%s.%s = \"%s\" accepted", in->section, in->key,
			      in->value);
		ck_assert_msg(!strncmp(msg, prefix, strlen(prefix)), "message \"%s\" lacks \"%s\"",
			      msg, prefix);
		assert_failed_state();
		return;
	}
	ck_assert_msg(ret == 0, "%s.%s = \"%s\" refused: %s", in->section, in->key, in->value, msg);
	switch (in->kind) {
	case 'u':
		ck_assert_uint_eq(*(const uint64_t *)field, (uint64_t)in->want);
		break;
	case 'i':
		ck_assert_int_eq(*(const int64_t *)field, in->want);
		break;
	case 'b':
		ck_assert_int_eq(*(const bool *)field, in->want);
		break;
	case 'e':
		ck_assert_int_eq(*(const int *)field, in->want);
		break;
	default:
		ck_assert_str_eq(field, in->want_s);
		break;
	}
	/* The key's source says where the value came from. */
	for (id = 0; id < KVS_NKEYS; id++)
		if (cfg.source[id] != KVS_SRC_DEFAULT)
			break;
	ck_assert_int_lt(id, KVS_NKEYS);
	ck_assert_int_eq(cfg.source[id], source);
}

START_TEST(test_input_env)
{
	const struct input *in = &inputs[_i];
	char var[4200], prefix[4300];
	char *envp[] = {"KVSHIM_CONFIG=", var, NULL};
	int n;

	n = snprintf(var, sizeof(var), "KVSHIM_%s_%s", in->section, in->key);
	for (int i = 0; i < n; i++)
		if (var[i] >= 'a' && var[i] <= 'z')
			var[i] = (char)(var[i] - 'a' + 'A');
	snprintf(prefix, sizeof(prefix), "config: environment: %s: ", var);
	snprintf(var + n, sizeof(var) - (size_t)n, "=%s", in->value);
	check_input(in, load(NULL, envp), prefix, KVS_SRC_ENV);
}
END_TEST

START_TEST(test_input_file)
{
	const struct input *in = &inputs[_i];
	char text[4200], prefix[PATH_MAX + 128];
	const char *path;

	snprintf(text, sizeof(text), "# %s\n[%s]\n%s = %s\n", in->value, in->section, in->key,
		 in->value);
	path = write_file("in.ini", text);
	snprintf(prefix, sizeof(prefix), "config: %s:3: %s.%s: ", path, in->section, in->key);
	check_input(in, load(path, NULL), prefix, KVS_SRC_FILE);
}
END_TEST

START_TEST(test_line_length)
{
	size_t max = KVS_CONFIG_LINE_MAX - 1;
	char *text = malloc(3 * KVS_CONFIG_LINE_MAX);
	char expect[PATH_MAX + 64];
	const char *p;
	size_t n;

	ck_assert_ptr_nonnull(text);
	/* A line of exactly the longest length loads whole, past inih's default 200 bytes. */
	n = (size_t)sprintf(text, "[files]\nroots = ");
	memset(text + n, 'r', max - strlen("roots = "));
	n += max - strlen("roots = ");
	n += (size_t)sprintf(text + n, "\n[cache]\nname = after\n");
	p = write_bytes("max.ini", text, n);
	ck_assert_int_eq(load(p, NULL), 0);
	ck_assert_uint_eq(strlen(cfg.files_roots), max - strlen("roots = "));
	ck_assert_str_eq(cfg.cache_name, "after");
	ck_assert_uint_eq(cfg.line[KVS_KEY_cache_name], 4);

	/* One byte more is refused, with its line number, in the middle or at the end. */
	n = (size_t)sprintf(text, "[files]\n; comment\nroots = ");
	memset(text + n, 'r', max + 1 - strlen("roots = "));
	n += max + 1 - strlen("roots = ");
	p = write_bytes("long.ini", text, n);
	snprintf(expect, sizeof(expect), "config: %s:3: line too long (at most %zu bytes)", p, max);
	ck_assert_int_eq(load(p, NULL), -EINVAL);
	ck_assert_str_eq(msg, expect);
	assert_failed_state();

	n += (size_t)sprintf(text + n, "\n[cache]\nname = x\n");
	p = write_bytes("long2.ini", text, n);
	snprintf(expect, sizeof(expect), "config: %s:3: line too long (at most %zu bytes)", p, max);
	ck_assert_int_eq(load(p, NULL), -EINVAL);
	ck_assert_str_eq(msg, expect);

	/* Comments count too: the limit is on lines, not values. */
	memset(text, '#', 2 * KVS_CONFIG_LINE_MAX);
	p = write_bytes("comment.ini", text, 2 * KVS_CONFIG_LINE_MAX);
	snprintf(expect, sizeof(expect), "config: %s:1: line too long (at most %zu bytes)", p, max);
	ck_assert_int_eq(load(p, NULL), -EINVAL);
	ck_assert_str_eq(msg, expect);

	/* Many lines, longer than the reader's buffer in all, are fine. */
	n = (size_t)sprintf(text, "[cache]\n");
	while (n < 3 * KVS_CONFIG_LINE_MAX - 64)
		n += (size_t)sprintf(text + n, "; filler filler filler filler filler\n");
	n += (size_t)sprintf(text + n, "name = last");
	p = write_bytes("many.ini", text, n);
	ck_assert_int_eq(load(p, NULL), 0);
	ck_assert_str_eq(cfg.cache_name, "last");
	free(text);
}
END_TEST

START_TEST(test_value_length)
{
	char *var = malloc(KVS_CONFIG_STR_MAX + 64);

	ck_assert_ptr_nonnull(var);
	char *envp[] = {"KVSHIM_CONFIG=", var, NULL};
	size_t n = (size_t)sprintf(var, "KVSHIM_FILES_ROOTS=");

	/* Through the environment a value is not bounded by the line limit. */
	memset(var + n, 'v', KVS_CONFIG_STR_MAX - 1);
	var[n + KVS_CONFIG_STR_MAX - 1] = '\0';
	ck_assert_int_eq(load(NULL, envp), 0);
	ck_assert_uint_eq(strlen(cfg.files_roots), KVS_CONFIG_STR_MAX - 1);

	strcat(var, "v");
	ck_assert_int_eq(load(NULL, envp), -EINVAL);
	ck_assert_str_eq(msg, "config: environment: KVSHIM_FILES_ROOTS: value too long (4096 "
			      "bytes, at most 4095)");
	assert_failed_state();

	/* Names are bounded by the file name they become: /dev/shm/kvshim.<uid>.<name>. */
	n = (size_t)sprintf(var, "KVSHIM_CACHE_NAME=");
	memset(var + n, 'n', 237);
	var[n + 237] = '\0';
	ck_assert_int_eq(load(NULL, envp), 0);
	ck_assert_uint_eq(strlen(cfg.cache_name), 237);
	strcat(var, "n");
	ck_assert_int_eq(load(NULL, envp), -EINVAL);
	ck_assert_str_eq(msg, "config: environment: KVSHIM_CACHE_NAME: name too long (238 bytes, "
			      "at most 237)");

	/* A long bad value is cut short in the message. */
	n = (size_t)sprintf(var, "KVSHIM_CACHE_MODE=");
	memset(var + n, '9', 100);
	var[n + 100] = '\0';
	ck_assert_int_eq(load(NULL, envp), -EINVAL);
	ck_assert_str_eq(msg, "config: environment: KVSHIM_CACHE_MODE: bad value "
			      "\"999999999999999999999999999999999999999999999999...\" (expected "
			      "octal permission bits such as 0600)");
	free(var);
}
END_TEST

START_TEST(test_parse_helpers)
{
	uint64_t v;
	bool b;

	ck_assert_int_eq(kvs_parse_size("18446744073709551615", &v), 0);
	ck_assert_uint_eq(v, UINT64_MAX);
	ck_assert_int_eq(kvs_parse_size("18446744073709551616", &v), -EINVAL);
	ck_assert_int_eq(kvs_parse_size("16777215T", &v), 0);
	ck_assert_uint_eq(v, 16777215ULL << 40);
	ck_assert_int_eq(kvs_parse_size("16777216T", &v), -EINVAL);
	ck_assert_int_eq(kvs_parse_size("17179869184G", &v), -EINVAL);
	ck_assert_int_eq(kvs_parse_size(" 1", &v), -EINVAL);
	ck_assert_int_eq(kvs_parse_size("1 ", &v), -EINVAL);
	ck_assert_int_eq(kvs_parse_size("2MiB", &v), 0);
	ck_assert_uint_eq(v, 2 << 20);
	v = 42;
	ck_assert_int_eq(kvs_parse_size("bad", &v), -EINVAL);
	ck_assert_uint_eq(v, 42);

	ck_assert_int_eq(kvs_parse_bool("oN", &b), 0);
	ck_assert(b);
	ck_assert_int_eq(kvs_parse_bool("fAlSe", &b), 0);
	ck_assert(!b);
	ck_assert_int_eq(kvs_parse_bool(" yes", &b), -EINVAL);
	ck_assert_int_eq(kvs_parse_bool("", &b), -EINVAL);
}
END_TEST

static Suite *config_suite(void)
{
	Suite *s = suite_create("config");
	TCase *core = tcase_create("core");
	TCase *limits = tcase_create("limits");
	int ninputs = (int)(sizeof(inputs) / sizeof(inputs[0]));

	tcase_add_checked_fixture(core, setup, teardown);
	tcase_add_test(core, test_defaults);
	tcase_add_test(core, test_file_values);
	tcase_add_test(core, test_env_overrides_file);
	tcase_add_test(core, test_enable_env);
	tcase_add_test(core, test_env_ignored_and_unknown);
	tcase_add_test(core, test_environ_default);
	tcase_add_test(core, test_print);
	tcase_add_test(core, test_print_reads_back);
	tcase_add_test(core, test_all_or_nothing);
	tcase_add_test(core, test_error_messages);
	tcase_add_test(core, test_msg_buffer);
	tcase_add_test(core, test_concurrent_loads);
	suite_add_tcase(s, core);

	tcase_add_checked_fixture(limits, setup, teardown);
	tcase_add_loop_test(limits, test_input_env, 0, ninputs);
	tcase_add_loop_test(limits, test_input_file, 0, ninputs);
	tcase_add_test(limits, test_line_length);
	tcase_add_test(limits, test_value_length);
	tcase_add_test(limits, test_parse_helpers);
	suite_add_tcase(s, limits);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(config_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
