/*
 * stat: what a mapped region says of itself, for `kvshim stat` and the exporter
 * (kvs_cache_stat), and the handle's accessors.
 */
#include <errno.h>
#include <string.h>

#include "config.h"
#include "internal.h"

uint64_t kvs_cache_shard_size(const struct kvs_cache *c)
{
	return c->shard_size;
}

uint64_t kvs_cache_page_size(const struct kvs_cache *c)
{
	return c->page_size;
}

uint32_t kvs_cache_slots(const struct kvs_cache *c)
{
	return c->nframes;
}

int kvs_cache_self(const struct kvs_cache *c)
{
	return c->self;
}

int kvs_cache_stat(struct kvs_cache *c, struct kvs_region_info *info, struct kvs_counters *totals,
		   struct kvs_proc_info *procs, int nprocs)
{
	int n = 0;
	bool locked;

	memset(info, 0, sizeof(*info));
	memset(totals, 0, sizeof(*totals));
	info->capacity_bytes = c->hdr->capacity;
	info->shard_size = c->shard_size;
	info->total_bytes = c->hdr->total_bytes;
	info->slots = c->nframes;
	info->reserved_slots = c->nframes - c->nmain;
	info->max_processes = c->nprocs;
	/* Pairs with the walker's release store: the reason is stored before the errno. */
	info->populate_err = load_acquire(&c->hdr->populate_err);
	info->populate_reason =
	    kvs_populate_reason(load_relaxed(&c->hdr->populate_why), info->populate_err);
	info->populate_mode = load_relaxed(&c->hdr->populate_mode);
	if (info->populate_mode > KVS_POPULATE_AHEAD)
		info->populate_mode = KVS_POPULATE_LAZY;
	info->refused_attaches = load_relaxed(&c->hdr->refused_attaches);
	info->created_ns = c->hdr->created_ns;
	memcpy(info->built_by, c->hdr->built_by, sizeof(c->hdr->built_by));
	info->page_kind = c->page_kind;
	info->page_size = c->page_size;
	info->numa = c->numa;
	info->keys_only = c->keys_only;
	info->shm_free_bytes = kvs_memory_free(kvs_ownfd_peek(&c->own), c->page_kind);
	for (uint32_t i = 0; i < c->nslots; i++) {
		uint32_t w = load_relaxed(&c->slots[i].state), st = st_of(w);

		if (w == KVS_ST_CLAIMED_BY(KVS_PACK_OWNER))
			continue; /* room of the open frame (pack.c), not a claim of anyone's */

		info->slots_ready += st == KVS_SLOT_READY;
		info->slots_loading += st == KVS_SLOT_LOADING;
		info->slots_failed += st == KVS_SLOT_FAILED;
		info->slots_claimed += st == KVS_SLOT_CLAIMED;
		info->slots_pinned += load_relaxed(&c->slots[i].refs) != 0;
		if (st == KVS_SLOT_READY)
			info->bytes_ready += load_relaxed(&c->slots[i].length);
	}
	for (uint32_t f = 0; f < c->nframes; f++)
		info->slots_populated += load_relaxed(&c->fpages[f]) == KVS_PAGES_OK;
	/* A stuck proc_lock must not hang `kvshim stat`: read the table without it, and say so. */
	locked = kvs_proc_lock(c) == 0;
	info->procs_unlocked = !locked;
	for (int k = 0; k < KVS_NCOUNTERS; k++)
		totals->v[k] = load_relaxed(&c->hdr->totals[k]);
	for (uint32_t i = 0; i < c->nprocs; i++) {
		struct kvs_proc *p = proc_at(c, i);

		if (load_relaxed(&p->state) != KVS_PROC_ACTIVE)
			continue;
		bool alive = (int)i == c->self || kvs_proc_alive(c, i);

		info->processes_attached += alive;
		for (int k = 0; k < KVS_NCOUNTERS; k++)
			totals->v[k] += load_relaxed(&p->ctr[k]);
		if (procs && n < nprocs) {
			procs[n].pid = p->pid;
			procs[n].pidns = p->pidns;
			procs[n].rank = load_relaxed(&p->rank);
			procs[n].alive = alive;
			for (int k = 0; k < KVS_NCOUNTERS; k++)
				procs[n].ctr.v[k] = load_relaxed(&p->ctr[k]);
		}
		n++;
	}
	if (locked)
		kvs_proc_unlock(c);
	return n;
}
