/*
 * Snapshots of regions and the list of this user's regions (snapshot.h).
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache_params.h"
#include "config.h"
#include "snapshot.h"

const char *const tool_ctr_name[KVS_NCOUNTERS] = {
#define KVS_COUNTER(name, help) #name,
#include "counters.def"
#undef KVS_COUNTER
};

const char *const tool_ctr_help[KVS_NCOUNTERS] = {
#define KVS_COUNTER(name, help) help,
#include "counters.def"
#undef KVS_COUNTER
};

const char *const tool_tally_name[KVS_NTALLY] = {
#define KVS_TALLY(name, help) #name,
#include "tallies.def"
#undef KVS_TALLY
};

const char *const tool_tally_help[KVS_NTALLY] = {
#define KVS_TALLY(name, help) help,
#include "tallies.def"
#undef KVS_TALLY
};

const struct tool_unserved tool_unserved[] = {
    {KVS_CTR_unserved_buffered, KVS_CTR_unserved_buffered_bytes,
     "buffered reads (no O_DIRECT, and files.buffered = false)"},
    {KVS_CTR_unserved_small, KVS_CTR_unserved_small_bytes, "reads shorter than files.min_read"},
    {KVS_CTR_unserved_misaligned, KVS_CTR_unserved_misaligned_bytes,
     "O_DIRECT reads not aligned as O_DIRECT needs"},
    {KVS_CTR_unserved_mmap, KVS_CTR_unserved_mmap_bytes,
     "mappings (mmap: a memory-mapped store reads by page faults; bytes mapped)"},
    {KVS_CTR_unserved_io_uring, KVS_CTR_unserved_io_uring_bytes,
     "io_uring reads passed to the kernel (SQPOLL, READ_FIXED into registered buffers, ...)"},
    {KVS_CTR_unserved_stdio, KVS_CTR_unserved_stdio_bytes,
     "fread calls on streams the shim cannot read around"},
    {KVS_CTR_unserved_buffers, KVS_CTR_unserved_buffers_bytes,
     "reads into memory the shim may not write"},
    {KVS_CTR_unserved_no_cache, KVS_CTR_unserved_no_cache_bytes,
     "reads while the loader could not start"},
    {KVS_CTR_unserved_anchor, KVS_CTR_unserved_anchor_bytes,
     "reads of files the shim could not hold open"},
    {KVS_CTR_unserved_fallback, KVS_CTR_unserved_fallback_bytes,
     "reads the cache handed back to storage"},
    {KVS_CTR_unserved_device, KVS_CTR_unserved_device_bytes,
     "cuFile reads into memory the shim cannot copy to"},
    {KVS_CTR_unserved_stream, KVS_CTR_unserved_stream_bytes,
     "cuFileReadAsync calls on streams without fixed parameters"},
};
const int tool_nunserved = (int)(sizeof(tool_unserved) / sizeof(tool_unserved[0]));

/* hit_ratio and per_unique of f's bytes. */
static void ratios(struct tool_figures *f)
{
	f->cached = f->observe ? f->unique + f->unserved : f->storage;
	f->hit_ratio = -1;
	if (f->read)
		f->hit_ratio = f->cached >= f->read ? 0 : 1 - (double)f->cached / (double)f->read;
	f->per_unique = f->unique ? (double)f->storage / (double)f->unique : -1;
}

void tool_figures_of(const struct tool_snapshot *s, struct tool_figures *f)
{
	const uint64_t *v = s->totals.v;

	memset(f, 0, sizeof(*f));
	f->observe = s->info.keys_only;
	for (int i = 0; i < tool_nunserved; i++)
		if (tool_unserved[i].calls != KVS_CTR_unserved_mmap)
			f->unserved += v[tool_unserved[i].bytes];
	f->read = v[KVS_CTR_read_bytes];
	if (f->observe) {
		f->storage = f->read;
		f->unique = v[KVS_CTR_would_read_bytes];
	} else {
		f->storage = v[KVS_CTR_backend_bytes] + f->unserved;
		for (int i = 0; i < s->ntallies; i++) /* every process counts in one pod entry */
			if (!s->tallies[i].root)
				f->unique += s->tallies[i].v[KVS_TALLY_unique_bytes];
	}
	ratios(f);
}

void tool_tally_figures(const struct kvs_tally_info *t, bool observe, struct tool_figures *f)
{
	memset(f, 0, sizeof(*f));
	f->observe = observe;
	f->read = t->v[KVS_TALLY_read_bytes];
	f->storage = t->v[KVS_TALLY_storage_bytes];
	f->unique = t->v[KVS_TALLY_unique_bytes];
	f->unserved = t->v[KVS_TALLY_unserved_bytes];
	ratios(f);
}

int tool_snapshot_take(const struct kvs_config *cfg, struct tool_snapshot *s)
{
	struct kvs_cache *c = NULL;
	struct kvs_cache_params params;
	int max = (int)cfg->cache_max_processes, n, r;

	memset(s, 0, sizeof(*s));
	/* shim.mode = observe: its region of keys, <cache.name>.observe. */
	if (kvs_cache_params_mode(cfg, &params, s->name, sizeof(s->name)) ||
	    kvs_cache_path(&params, s->path, sizeof(s->path))) {
		snprintf(s->msg, sizeof(s->msg), "the region path is too long");
		r = -ENAMETOOLONG;
		goto out;
	}
	if (params.name != s->name)
		snprintf(s->name, sizeof(s->name), "%s", cfg->cache_name);
	r = kvs_cache_open(&params, KVS_OPEN_WATCH, &c, s->msg, sizeof(s->msg));
	if (r)
		goto out;
	/* A watcher takes the region as built: its process table may be larger than the
	 * configuration's, so read again with room for every entry it reports. */
	for (int tries = 0; tries < 2; tries++) {
		struct kvs_proc_info *p = realloc(s->procs, (size_t)max * sizeof(*p));

		if (!p) {
			r = -ENOMEM;
			snprintf(s->msg, sizeof(s->msg), "out of memory");
			goto out_close;
		}
		s->procs = p;
		n = kvs_cache_stat(c, &s->info, &s->totals, s->procs, max);
		if (n < 0) {
			r = n;
			snprintf(s->msg, sizeof(s->msg), "cannot read %s: %s", s->path,
				 strerror(-r));
			goto out_close;
		}
		s->nprocs = n < max ? n : max;
		if (n <= max)
			break;
		max = n;
	}
	s->ntallies = kvs_cache_tallies(c, s->tallies, KVS_TALLY_PODS + KVS_TALLY_ROOTS);
out_close:
	kvs_cache_close(c);
out:
	if (r && r != -ENOENT && !s->msg[0])
		snprintf(s->msg, sizeof(s->msg), "%s: %s", s->path, strerror(-r));
	s->err = r;
	return r;
}

void tool_snapshot_free(struct tool_snapshot *s)
{
	free(s->procs);
	s->procs = NULL;
	s->nprocs = 0;
}

int tool_region_name_ok(const char *s)
{
	static const char name_chars[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-";
	size_t n = strlen(s);

	/* The rule of config.c's check_string for NAME keys; 255 bounds the file name. */
	return n > 0 && n < 256 - sizeof("kvshim.4294967295.") && !s[strspn(s, name_chars)];
}

/* True when s[0..n) is n > 0 characters all from set. */
static bool all_of(const char *s, size_t n, const char *set)
{
	return n > 0 && strspn(s, set) >= n;
}

/* True when name ends in ".tmp.<pid>.<n>" or ".build.<pid>.<32 hex>": what a creator that
 * died left behind (cache/region.c builds the region there and cache/shmfile.c renames it into
 * place). */
static bool leftover(const char *name)
{
	static const char dec[] = "0123456789", hex[] = "0123456789abcdef";
	const char *last = strrchr(name, '.'), *pid;

	if (!last || last == name)
		return false;
	for (pid = last - 1; pid > name && *pid != '.'; pid--)
		;
	if (pid == name || !all_of(pid + 1, (size_t)(last - pid - 1), dec))
		return false;
	if (pid - name >= 4 && !strncmp(pid - 4, ".tmp", 4))
		return all_of(last + 1, strlen(last + 1), dec);
	if (pid - name >= 6 && !strncmp(pid - 6, ".build", 6))
		return strlen(last + 1) == 32 && all_of(last + 1, 32, hex);
	return false;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void tool_names_free(char **names, int n)
{
	for (int i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

int tool_list_regions(const char *dir, char ***names)
{
	char prefix[32];
	char **v = NULL;
	struct dirent *e;
	size_t plen;
	int n = 0, cap = 0, r = 0;
	DIR *d;

	plen = (size_t)snprintf(prefix, sizeof(prefix), "kvshim.%u.", (unsigned)geteuid());
	d = opendir(dir);
	if (!d)
		return -errno;
	while ((errno = 0, e = readdir(d))) {
		const char *name = e->d_name + plen;

		if (strncmp(e->d_name, prefix, plen) || !tool_region_name_ok(name) ||
		    leftover(name))
			continue;
		if (n == cap) {
			char **nv = realloc(v, (size_t)(cap = cap ? 2 * cap : 8) * sizeof(*v));

			if (!nv) {
				r = -ENOMEM;
				goto err;
			}
			v = nv;
		}
		v[n] = strdup(name);
		if (!v[n]) {
			r = -ENOMEM;
			goto err;
		}
		n++;
	}
	if (errno) {
		r = -errno;
		goto err;
	}
	closedir(d);
	if (n)
		qsort(v, (size_t)n, sizeof(*v), cmp_names);
	*names = v;
	return n;

err:
	closedir(d);
	tool_names_free(v, n);
	return r;
}
