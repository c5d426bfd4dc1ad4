/*
 * helper: the C side of a node's remote helper (`kvshim remote`), built as
 * libkvshim_remote.so for the Python program that holds the node's Mooncake client
 * (kvshim_remote.py, through ctypes).  Everything that touches the region or the ring is here;
 * the Python side moves bytes between staging and the pool and decides routes.
 *
 * kvr_open loads the configuration (KVSHIM_CONFIG, as every kvshim process), attaches to the
 * region as an ordinary process (created if it is not there yet, as an engine would; its pins
 * are reclaimed if the helper dies), takes the helper's lock, builds or takes over the ring, and
 * starts the heartbeat thread (kvs_ring_beat every KVS_RING_BEAT_NS).  The helper never forks.
 *
 * A put is prepared here before Python sees it: the shard is pinned if it is still READY under
 * its key (kvs_cache_pin_ready: an evicted, reloaded or unkept shard is not), copied into the
 * entry's staging buffer, and unpinned.  The region itself is never registered with the pool,
 * so no peer can read or write it: only staging is.
 *
 * Functions return 0 or -errno unless said; none prints (the Python side says what failed, with
 * the message kvr_open fills).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "cache_params.h"
#include "config.h"
#include "ring.h"
#include "sys.h"

#define KVR_API __attribute__((visibility("default")))

struct kvr {
	struct kvs_config *cfg;
	struct kvs_cache *c;
	struct kvs_ring *ring;
	char path[4096];
	int lock_fd;
	pthread_t beat;
	_Atomic bool stop;
	bool beating;
	uint64_t bound_ns;		  /* Mooncake's bound on a transfer or an RPC */
	_Atomic uint64_t gets_busy_since; /* kvs_mono_ns when the gets thread left kvr_take */
	uint64_t hold_ns;		  /* a failed get's target stays out of use that long */
	/* remote.zero_copy: the pin on each get's slot (entry-indexed), held until its transfer
	 * is over, or until hold_ns after it failed (zc_until; the beat thread lets go). */
	bool zero_copy;
	pthread_mutex_t zc_mu;
	struct kvs_pin *zc_pin;
	uint64_t *zc_until; /* 0: none held; UINT64_MAX: held, transfer running */
};

/* Let go of entry i's slot pin if it is due (now >= its time); zc_mu held. */
static void zc_drop_locked(struct kvr *h, uint32_t i, uint64_t now)
{
	if (h->zc_until[i] && now >= h->zc_until[i]) {
		kvs_cache_release(h->c, &h->zc_pin[i]);
		h->zc_until[i] = 0;
	}
}

/* One job as Python sees it (ctypes.Structure of the same fields). */
struct kvr_job {
	uint32_t entry;
	uint32_t len;
	uint64_t staging; /* the address of the entry's buffer */
	char key[KVS_RING_KEY_MAX];
};

static bool still(void *arg, const struct kvs_ring_owner *o)
{
	return kvs_cache_still(arg, o->slot, o->at);
}

static void *beat_main(void *arg)
{
	struct kvr *h = arg;

	while (!atomic_load(&h->stop)) {
		uint64_t busy = atomic_load(&h->gets_busy_since);

		/* Gets stuck in the pool's client for longer than its own bounds (a connect to a
		 * peer that drops packets): stop beating, so that engines stop asking. */
		if (h->zero_copy) { /* before the reclaim, which may free the entries */
			uint64_t now = kvs_mono_ns();

			pthread_mutex_lock(&h->zc_mu);
			for (uint32_t i = 0; i < kvs_ring_entries(h->ring); i++)
				zc_drop_locked(h, i, now);
			pthread_mutex_unlock(&h->zc_mu);
		}
		if (busy && kvs_mono_ns() - busy > 2 * h->bound_ns + KVS_RING_DEAD_NS)
			kvs_ring_reclaim(h->ring, still, h->c);
		else
			kvs_ring_beat(h->ring, still, h->c);
		kvs_cache_reap_maybe(h->c);
		struct timespec ts = {0, (long)KVS_RING_BEAT_NS};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

KVR_API void kvr_close(struct kvr *h)
{
	if (!h)
		return;
	if (h->beating) {
		atomic_store(&h->stop, true);
		pthread_join(h->beat, NULL);
	}
	if (h->ring)
		kvs_ring_leave(h->ring);
	if (h->c)
		kvs_cache_close(h->c);
	if (h->lock_fd >= 0)
		close(h->lock_fd);
	free(h->cfg);
	free(h);
}

KVR_API struct kvr *kvr_open(char *msg, size_t msglen)
{
	struct kvr *h = calloc(1, sizeof(*h));
	int r;

	msg[0] = 0;
	if (!h || !(h->cfg = calloc(1, sizeof(*h->cfg)))) {
		snprintf(msg, msglen, "out of memory");
		free(h);
		return NULL;
	}
	h->lock_fd = -1;
	if (kvs_config_load(h->cfg, NULL, NULL, msg, msglen) != 0)
		goto fail;
	if (h->cfg->remote_kind == KVS_REMOTE_NONE) {
		snprintf(msg, msglen, "remote.kind is none: there is nothing for a helper to do");
		goto fail;
	}
	struct kvs_cache_params params = kvs_cache_params_of(h->cfg);
	if (kvs_cache_path(&params, h->path, sizeof(h->path) - 16) != 0) {
		snprintf(msg, msglen, "cache.dir and cache.name make too long a path");
		goto fail;
	}
	strcat(h->path, ".remote");
	r = kvs_ring_lock(h->path, (uint32_t)h->cfg->cache_mode);
	if (r < 0) {
		snprintf(msg, msglen, "%s.lock: %s", h->path,
			 r == -EWOULDBLOCK ? "another helper serves this region" : strerror(-r));
		goto fail;
	}
	h->lock_fd = r;
	r = kvs_cache_open(&params, KVS_OPEN_CREATE, &h->c, msg, msglen);
	if (r) {
		if (!msg[0])
			snprintf(msg, msglen, "cannot attach to the region: %s", strerror(-r));
		goto fail;
	}
	r = kvs_ring_create(h->path, (uint32_t)h->cfg->remote_entries, kvs_cache_shard_size(h->c),
			    (uint32_t)h->cfg->cache_mode, &h->ring, msg, msglen);
	if (r)
		goto fail;
	/* Mooncake's transfer and RPC bounds, as kvshim_remote.py sets them: whole seconds. */
	h->bound_ns = ((h->cfg->remote_timeout_ms + 999) / 1000) * 1000000000ull;
	h->hold_ns = 2 * h->bound_ns + 1000000000ull;
	kvs_ring_set_hold(h->ring, h->hold_ns);
	h->zero_copy = h->cfg->remote_zero_copy;
	if (h->zero_copy) {
		uint32_t n = kvs_ring_entries(h->ring);

		h->zc_pin = calloc(n, sizeof(*h->zc_pin));
		h->zc_until = calloc(n, sizeof(*h->zc_until));
		pthread_mutex_init(&h->zc_mu, NULL);
		if (!h->zc_pin || !h->zc_until) {
			snprintf(msg, msglen, "out of memory");
			goto fail;
		}
	}
	kvs_ring_set_zero_copy(h->ring, h->zero_copy);
	kvs_ring_beat(h->ring, still, h->c); /* engines may ask from now on */
	if (pthread_create(&h->beat, NULL, beat_main, h) != 0) {
		snprintf(msg, msglen, "cannot start the heartbeat thread");
		goto fail;
	}
	h->beating = true;
	return h;
fail:
	kvr_close(h);
	return NULL;
}

/* The value of configuration key "section.key" as text (what `kvshim config` prints), for
 * the few the Python side needs. */
KVR_API int kvr_setting(struct kvr *h, const char *name, char *out, size_t len)
{
	const struct kvs_config *c = h->cfg;

	if (!strcmp(name, "remote.master"))
		snprintf(out, len, "%s", c->remote_master);
	else if (!strcmp(name, "remote.metadata"))
		snprintf(out, len, "%s", c->remote_metadata);
	else if (!strcmp(name, "remote.host"))
		snprintf(out, len, "%s", c->remote_host);
	else if (!strcmp(name, "remote.segment"))
		snprintf(out, len, "%llu", (unsigned long long)c->remote_segment);
	else if (!strcmp(name, "remote.timeout_ms"))
		snprintf(out, len, "%llu", (unsigned long long)c->remote_timeout_ms);
	else if (!strcmp(name, "cache.name"))
		snprintf(out, len, "%s", c->cache_name);
	else if (!strcmp(name, "ring"))
		snprintf(out, len, "%s", h->path);
	else
		return -ENOENT;
	return 0;
}

/* The region's data frames, to register with the pool under remote.zero_copy (0 otherwise). */
KVR_API void kvr_region(struct kvr *h, uint64_t *base, uint64_t *len)
{
	void *b = NULL;
	size_t n = 0;

	if (h->zero_copy)
		kvs_cache_data_region(h->c, &b, &n);
	*base = (uint64_t)(uintptr_t)b;
	*len = n;
}

KVR_API void kvr_staging(struct kvr *h, uint64_t *base, uint64_t *len)
{
	void *b;
	size_t n;

	kvs_ring_staging(h->ring, &b, &n);
	*base = (uint64_t)(uintptr_t)b;
	*len = n;
}

/* Copy a put's shard into its staging, if it is still READY under its key with all its bytes.
 * Returns true when it is there. */
static bool stage_put(struct kvr *h, const struct kvs_ring_job *j)
{
	struct kvs_pin pin;
	bool ok = false;

	if (kvs_cache_pin_ready(h->c, &j->key, &pin) != KVS_PIN_HIT)
		return false;
	if (kvs_cache_length(h->c, &pin) == j->len) {
		memcpy(j->staging, kvs_cache_data(h->c, &pin), j->len);
		ok = true;
	}
	kvs_cache_release(h->c, &pin);
	return ok;
}

/*
 * remote.zero_copy: pin the get's slot while its owner still loads it, and aim the transfer
 * there.  The pin keeps the slot from being reused under a transfer that lands late, whatever
 * the owner does meanwhile (it may give up at its deadline and read storage into the same
 * slot: the same key, the same bytes).  False: the owner is not loading it any more.
 */
static bool zc_target(struct kvr *h, struct kvs_ring_job *j)
{
	uint32_t e = j->entry;
	struct kvs_pin pin;

	if (kvs_cache_pin_loading(h->c, &j->key, j->owner.slot, j->slot, &pin) != KVS_PIN_WAIT)
		return false;
	if (kvs_cache_room(h->c, &pin) < j->len) {
		kvs_cache_release(h->c, &pin);
		return false;
	}
	pthread_mutex_lock(&h->zc_mu);
	/* The entry was freed after its last hold: a pin still held from then is due. */
	if (h->zc_until[e])
		zc_drop_locked(h, e, UINT64_MAX - 1);
	h->zc_pin[e] = pin;
	h->zc_until[e] = UINT64_MAX;
	pthread_mutex_unlock(&h->zc_mu);
	j->staging = kvs_cache_data(h->c, &pin);
	return true;
}

/*
 * Take up to n posted requests of op (1 get, 2 put), waiting up to timeout_ms for one.  Puts
 * come back staged; one that could not be staged is dropped and counted here.  Returns the
 * count of jobs filled.  Call with the GIL released (ctypes does).
 */
KVR_API int kvr_take(struct kvr *h, int op, struct kvr_job *jobs, int n, uint32_t timeout_ms)
{
	struct kvs_ring_job j[64];
	int got, out = 0;

	if (n > 64)
		n = 64;
	if (op == KVS_RING_GET)
		atomic_store(&h->gets_busy_since, 0);
	got = kvs_ring_take(h->ring, (unsigned)op, j, n, timeout_ms * 1000000ull);
	if (op == KVS_RING_GET && got)
		atomic_store(&h->gets_busy_since, kvs_mono_ns());
	for (int i = 0; i < got; i++) {
		if (op == KVS_RING_PUT && !stage_put(h, &j[i])) {
			kvs_cache_count(h->c, KVS_CTR_remote_dropped, 1);
			kvs_ring_done(h->ring, j[i].entry, 0);
			continue;
		}
		if (op == KVS_RING_GET && h->zero_copy && !zc_target(h, &j[i])) {
			kvs_ring_done(h->ring, j[i].entry, -ENOENT); /* not loading: as a miss */
			continue;
		}
		jobs[out].entry = j[i].entry;
		jobs[out].len = j[i].len;
		jobs[out].staging = (uint64_t)(uintptr_t)j[i].staging;
		memcpy(jobs[out].key, j[i].rkey, KVS_RING_KEY_MAX);
		out++;
	}
	return out;
}

/* Answer entry: a get's bytes (or -errno; -ENOENT: the pool does not hold it); a put's
 * outcome, counted: the bytes put, 0 (the pool had the key already) or < 0 (dropped). */
KVR_API void kvr_done(struct kvr *h, int op, uint32_t entry, int64_t result)
{
	if (op == KVS_RING_PUT && result > 0)
		kvs_cache_count(h->c, KVS_CTR_remote_published_bytes, (uint64_t)result);
	else if (op == KVS_RING_PUT && result < 0)
		kvs_cache_count(h->c, KVS_CTR_remote_dropped, 1);
	if (op == KVS_RING_GET && h->zero_copy) {
		uint32_t len = 0;
		bool over =
		    result == -ENOENT || result == -ECANCELED ||
		    (result > 0 && kvs_ring_len(h->ring, entry, &len) && result == (int64_t)len);

		pthread_mutex_lock(&h->zc_mu);
		if (h->zc_until[entry] == UINT64_MAX) /* over: let go now; failed: after the hold */
			h->zc_until[entry] = over ? 1 : kvs_mono_ns() + h->hold_ns;
		zc_drop_locked(h, entry, kvs_mono_ns());
		pthread_mutex_unlock(&h->zc_mu);
	}
	kvs_ring_done(h->ring, entry, result);
}

KVR_API void kvr_route(struct kvr *h, int route)
{
	kvs_ring_set_route(h->ring, route);
}

/* The helper is leaving without closing anything (its threads may still be inside the pool's
 * client): engines stop asking now; the lock goes with the process. */
KVR_API void kvr_leave(struct kvr *h)
{
	kvs_ring_set_route(h->ring, KVS_ROUTE_BROKEN);
	atomic_store(&h->stop, true);
	kvs_ring_leave(h->ring);
}

/* What the node's loads saw so far (every process's, the region's totals): bytes of the pieces
 * that read storage and their wall time (storage_wall_bytes, _ns), bytes from the pool and
 * the time owners waited for it (remote_ns): the two speeds the route compares. */
KVR_API int kvr_speeds(struct kvr *h, uint64_t *bytes, uint64_t *ns, uint64_t *pool_bytes,
		       uint64_t *pool_ns)
{
	struct kvs_region_info info;
	struct kvs_counters tot;
	int r = kvs_cache_stat(h->c, &info, &tot, NULL, 0);

	if (r < 0)
		return r;
	*bytes = tot.v[KVS_CTR_storage_wall_bytes];
	*ns = tot.v[KVS_CTR_storage_wall_ns];
	*pool_bytes = tot.v[KVS_CTR_remote_bytes];
	*pool_ns = tot.v[KVS_CTR_remote_ns];
	return 0;
}
