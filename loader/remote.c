/*
 * remote: the engine's side of the remote tier (see remote.h).
 *
 * The ring is mapped lazily, by the first owner of a miss that asks, and looked at again at
 * most once a second while its helper does not beat: a helper started later, or restarted with
 * other dimensions (a new file at the path), is found without a restart of the engine.  The
 * pointer is published with a release store; a ring once mapped stays mapped for the process's
 * life (a thread may still wait on it: ring.c, "Crashes").
 */
#include "remote.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "atomics.h"
#include "cache_params.h"
#include "config.h"
#include "raw.h"
#include "ring.h"
#include "sys.h"

#define MAX_WONCE 16
#define LOOK_NS	  1000000000ull /* how often a missing or silent ring is looked for again */

struct kvs_remote {
	struct kvs_cache *c;
	char ring_path[PATH_MAX];
	uint64_t shard_size;
	uint32_t mode;
	uint64_t timeout_ns;
	bool publish;
	char ns[65];
	int nroots;
	char *roots[MAX_WONCE]; /* canonical write-once roots */
	size_t root_len[MAX_WONCE];
	const char *label[MAX_WONCE]; /* last component of each */
	struct kvs_ring *_Atomic ring;
	_Atomic uint64_t looked; /* kvs_mono_ns of the last look for the ring */
	_Atomic uint32_t looking;
	_Atomic uint32_t probes;
	_Atomic uint32_t failures;    /* asks in a row not answered */
	_Atomic uint64_t quiet_until; /* kvs_mono_ns: ask nothing before then */
};

struct kvs_remote *kvs_remote_create(const struct kvs_config *cfg, struct kvs_cache *c)
{
	if (cfg->remote_kind == KVS_REMOTE_NONE || !cfg->files_write_once[0])
		return NULL;
	struct kvs_remote *rm = calloc(1, sizeof(*rm));
	struct kvs_cache_params params = kvs_cache_params_of(cfg);

	if (!rm)
		return NULL;
	rm->c = c;
	rm->shard_size = kvs_cache_shard_size(c);
	rm->mode = (uint32_t)cfg->cache_mode;
	rm->timeout_ns = cfg->remote_timeout_ms * 1000000ull;
	rm->publish = cfg->remote_publish;
	if (strlen(cfg->remote_namespace) >= sizeof(rm->ns) ||
	    kvs_cache_path(&params, rm->ring_path, sizeof(rm->ring_path) - 8) != 0)
		goto fail;
	strcat(rm->ring_path, ".remote");
	memcpy(rm->ns, cfg->remote_namespace, strlen(cfg->remote_namespace) + 1);

	char dirs[KVS_CONFIG_STR_MAX];
	snprintf(dirs, sizeof(dirs), "%s", cfg->files_write_once);
	for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d && rm->nroots < MAX_WONCE;
	     d = strtok_r(NULL, ":", &save)) {
		char *canon = realpath(d, NULL);

		if (!canon)
			continue;
		size_t n = strlen(canon);
		while (n > 1 && canon[n - 1] == '/')
			canon[--n] = 0;
		const char *slash = strrchr(canon, '/');
		rm->roots[rm->nroots] = canon;
		rm->root_len[rm->nroots] = n;
		rm->label[rm->nroots] = slash && slash[1] ? slash + 1 : canon;
		rm->nroots++;
	}
	if (rm->nroots)
		return rm;
fail:
	kvs_remote_destroy(rm);
	return NULL;
}

void kvs_remote_destroy(struct kvs_remote *rm)
{
	if (!rm)
		return;
	for (int i = 0; i < rm->nroots; i++)
		free(rm->roots[i]);
	free(rm);
}

uint64_t kvs_remote_timeout_ns(const struct kvs_remote *rm)
{
	return rm->timeout_ns;
}

/* Look for the ring (again): at most once per LOOK_NS, one thread at a time. */
static struct kvs_ring *look(struct kvs_remote *rm, struct kvs_ring *old)
{
	uint64_t now = kvs_mono_ns();
	uint32_t no = 0;

	if (now - atomic_load_explicit(&rm->looked, memory_order_relaxed) < LOOK_NS ||
	    !atomic_compare_exchange_strong(&rm->looking, &no, 1))
		return old;
	atomic_store_explicit(&rm->looked, now, memory_order_relaxed);
	if (!old || kvs_ring_replaced(old, rm->ring_path)) {
		struct kvs_ring *r = NULL;

		if (kvs_ring_map(rm->ring_path, rm->shard_size, rm->mode, &r) == 0) {
			atomic_store_explicit(&rm->ring, r, memory_order_release);
			old = r;
		}
	}
	atomic_store_explicit(&rm->looking, 0, memory_order_release);
	return old;
}

void kvs_remote_answered(struct kvs_remote *rm, bool answered)
{
	if (answered) {
		atomic_store_explicit(&rm->failures, 0, memory_order_relaxed);
		return;
	}
	if (atomic_fetch_add_explicit(&rm->failures, 1, memory_order_relaxed) + 1 >=
	    KVS_REMOTE_QUIET_AFTER) {
		atomic_store_explicit(&rm->failures, 0, memory_order_relaxed);
		atomic_store_explicit(&rm->quiet_until, kvs_mono_ns() + KVS_REMOTE_QUIET_NS,
				      memory_order_relaxed);
	}
}

struct kvs_ring *kvs_remote_ring(struct kvs_remote *rm, bool *ask)
{
	struct kvs_ring *r = atomic_load_explicit(&rm->ring, memory_order_acquire);

	*ask = false;
	if (!r || !kvs_ring_alive(r))
		r = look(rm, r);
	if (!r || !kvs_ring_alive(r))
		return NULL;
	if (kvs_mono_ns() < atomic_load_explicit(&rm->quiet_until, memory_order_relaxed))
		return r;
	switch (kvs_ring_route(r)) {
	case KVS_ROUTE_ASK:
		*ask = true;
		break;
	case KVS_ROUTE_STORAGE: /* keep measuring the pool: one piece in KVS_RING_PROBE asks */
		*ask = atomic_fetch_add_explicit(&rm->probes, 1, memory_order_relaxed) %
			   KVS_RING_PROBE ==
		       0;
		break;
	default:
		break;
	}
	return r;
}

/* Append the decimal (or, with width, zero-padded hex) form of v at p; returns the end. */
static char *put_num(char *p, uint64_t v, int hex_width)
{
	char tmp[20];
	int n = 0;

	if (hex_width) {
		for (int i = hex_width - 1; i >= 0; i--)
			*p++ = "0123456789abcdef"[(v >> (4 * i)) & 15];
		return p;
	}
	do
		tmp[n++] = (char)('0' + v % 10);
	while ((v /= 10) && n < 20);
	while (n)
		*p++ = tmp[--n];
	return p;
}

bool kvs_remote_ident(struct kvs_remote *rm, const struct kvs_read *rd, struct kvs_rid *out)
{
	char link[40], path[PATH_MAX];

	memcpy(link, "/proc/self/fd/", 14);
	*put_num(link + 14, (uint64_t)rd->fd, 0) = 0;
	long n = kvs_syscall(SYS_readlinkat, AT_FDCWD, link, path, sizeof(path) - 1);
	if (n <= 0 || n >= (long)sizeof(path) - 1)
		return false;
	path[n] = 0;
	int root = -1;
	for (int i = 0; i < rm->nroots; i++) {
		size_t k = rm->root_len[i];

		if ((root < 0 || k > rm->root_len[root]) && strncmp(path, rm->roots[i], k) == 0 &&
		    path[k] == '/')
			root = i;
	}
	if (root < 0)
		return false;

	struct statx sx;
	if (kvs_syscall(SYS_statx, rd->fd, "", AT_EMPTY_PATH,
			STATX_SIZE | STATX_MTIME | STATX_BTIME, &sx) != 0 ||
	    sx.stx_size != rd->file_size)
		return false;
	bool birth = sx.stx_mask & STATX_BTIME;
	uint64_t stamps[5] = {
	    sx.stx_size,
	    (uint64_t)sx.stx_mtime.tv_sec,
	    sx.stx_mtime.tv_nsec,
	    birth ? (uint64_t)sx.stx_btime.tv_sec : 0,
	    birth ? sx.stx_btime.tv_nsec : 0,
	};
	/* label NUL path-below-root NUL stamps: the NULs keep "a/b"+"c" apart from "a"+"b/c" */
	char buf[PATH_MAX + 64 + sizeof(stamps)];
	size_t ll = strlen(rm->label[root]), rl = (size_t)n - rm->root_len[root] - 1;
	if (ll + 1 + rl + 1 + sizeof(stamps) > sizeof(buf))
		return false;
	memcpy(buf, rm->label[root], ll + 1);
	memcpy(buf + ll + 1, path + rm->root_len[root] + 1, rl);
	buf[ll + 1 + rl] = 0;
	memcpy(buf + ll + 2 + rl, stamps, sizeof(stamps));
	XXH128_hash_t h = XXH3_128bits(buf, ll + 2 + rl + sizeof(stamps));
	out->lo = h.low64;
	out->hi = h.high64;
	return true;
}

void kvs_remote_key(const struct kvs_remote *rm, const struct kvs_rid *id, uint64_t shard,
		    char *out, size_t len)
{
	char buf[KVS_RING_KEY_MAX], *p = buf;
	size_t nl = strlen(rm->ns);

	/* No snprintf: this runs on a read's thread, which may be a signal handler's. */
	memcpy(p, "kvshim/1/", 9);
	p += 9;
	memcpy(p, rm->ns, nl); /* at most 64 bytes: kvs_remote_create */
	p += nl;
	*p++ = '/';
	p = put_num(p, id->hi, 16);
	p = put_num(p, id->lo, 16);
	*p++ = '/';
	p = put_num(p, rm->shard_size, 0); /* exact: 3M and 4M shards cut a file differently */
	*p++ = '/';
	p = put_num(p, shard, 0);
	*p = 0;
	if ((size_t)(p - buf) < len)
		memcpy(out, buf, (size_t)(p - buf) + 1);
	else if (len)
		out[0] = 0;
}

void kvs_remote_offer(struct kvs_remote *rm, const struct kvs_rid *id, const struct kvs_key *key,
		      uint32_t len)
{
	char rkey[KVS_RING_KEY_MAX];
	struct kvs_ring *r;

	if (!rm->publish)
		return;
	r = atomic_load_explicit(&rm->ring, memory_order_acquire);
	if (!r || !kvs_ring_alive(r))
		return; /* no helper: nothing to offer to, nothing dropped */
	if (kvs_ring_route(r) == KVS_ROUTE_BROKEN) {
		kvs_cache_count(rm->c, KVS_CTR_remote_dropped, 1); /* the helper would drop it */
		return;
	}
	struct kvs_ring_owner o;
	if (!kvs_cache_whoami(rm->c, &o.slot, &o.at))
		return;
	kvs_remote_key(rm, id, key->shard, rkey, sizeof(rkey));
	if (kvs_ring_put(r, &o, rkey, key, len) != 0)
		kvs_cache_count(rm->c, KVS_CTR_remote_dropped, 1);
}
