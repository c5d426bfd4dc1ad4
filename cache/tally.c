/*
 * tally: the figures of reads by pod and by root, in a bounded table of the region (cache.h,
 * "Tallies"; layout.h, struct kvs_tally).
 *
 * DESIGN.  The table has KVS_TALLY_PODS pod entries, then KVS_TALLY_ROOTS root entries; the
 * last of each is "other" (kind OTHER from the build), so the number of label values an
 * exporter makes of it is bounded whatever runs on the node.
 *
 *   field        written by                                   read without a lock by
 *   kind, key,   a joining process under proc_lock, while no  `kvshim stat` (a torn name
 *   name         live process names the entry                 is figures only)
 *   last_ns      a joining process under proc_lock            recycling (under proc_lock)
 *   v[]          any process whose read it is (relaxed add);  `kvshim stat`
 *                a recycler (under proc_lock: fold to other)
 *
 * Pods.  A process joins at attach, under proc_lock (kvs_proc_attach): the entry of its PID
 * namespace under its host name, or with a process in the table (the kernel reuses a
 * namespace's inode number once it is gone: the same number under another name, with no
 * process left, is another pod); else a FREE one; else the entry, among those whose processes have
 * all left the process table (no ACTIVE entry names it: a dead one not reaped yet still does),
 * joined longest ago, whose figures are first added to "other" and zeroed (no process adds to it
 * then: nothing that could is in the table); else "other".  The answer is kept in the
 * process entry (pod), read by `kvshim stat` for the processes of each pod, and in the handle.
 *
 * Roots.  A process asks for each of its roots' entries (kvs_cache_tally_root, under
 * proc_lock): the entry of that path (its hash and its first KVS_TALLY_NAME_MAX - 1 bytes),
 * else a FREE one, else "other".  Roots are not recycled: a node has few, and every process
 * of one configuration asks for the same ones.
 *
 * A process dies at any step: an entry half written under proc_lock is one whose name or key
 * is stale or torn (figures only; the next joiner of the same namespace rewrites it); the
 * adds of v[] are single atomic instructions.
 */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define ROOT0	   KVS_TALLY_PODS			  /* first root entry */
#define POD_OTHER  (KVS_TALLY_PODS - 1)			  /* the pods' "other" */
#define ROOT_OTHER (KVS_TALLY_PODS + KVS_TALLY_ROOTS - 1) /* the roots' "other" */
/* A reference: pod entry + 1 in bits 0-7, root entry + 1 in bits 8-15; 0 names none, so a
 * zeroed reference (KVS_TALLY_NONE) counts nowhere. */
#define REF_POD(r)   (((r)&0xffu) - 1u)
#define REF_ROOT(r)  ((((r) >> 8) & 0xffu) - 1u)
#define REF(pod, rt) (((uint32_t)(pod) + 1u) | ((uint32_t)(rt) + 1u) << 8)

static void set_name(struct kvs_tally *t, const char *name)
{
	size_t n = strnlen(name, KVS_TALLY_NAME_MAX - 1);

	memset(t->name, 0, sizeof(t->name));
	memcpy(t->name, name, n);
}

void kvs_tally_build(struct kvs_cache *c)
{
	set_name(&c->tally[POD_OTHER], "other");
	store_relaxed(&c->tally[POD_OTHER].kind, KVS_TALLY_OTHER);
	set_name(&c->tally[ROOT_OTHER], "other");
	store_relaxed(&c->tally[ROOT_OTHER].kind, KVS_TALLY_OTHER);
}

static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Does an ACTIVE process entry name pod entry i?  Caller holds proc_lock. */
static bool pod_in_use(struct kvs_cache *c, uint32_t i)
{
	for (uint32_t p = 0; p < c->nprocs; p++) {
		struct kvs_proc *pr = proc_at(c, p);

		if (load_relaxed(&pr->state) == KVS_PROC_ACTIVE && pr->pod == i)
			return true;
	}
	return false;
}

/* Give entry i to a new pod: its figures go to "other" first.  Caller holds proc_lock. */
static void recycle(struct kvs_cache *c, uint32_t i)
{
	for (uint32_t k = 0; k < KVS_TALLY_ROOM; k++) {
		uint64_t v = atomic_exchange_explicit(&c->tally[i].v[k], 0, memory_order_relaxed);

		add_relaxed(&c->tally[POD_OTHER].v[k], v);
	}
}

uint32_t kvs_tally_join_pod_locked(struct kvs_cache *c, uint64_t pidns)
{
	char host[KVS_TALLY_NAME_MAX];
	uint32_t free_i = KVS_NIL, old_i = KVS_NIL;
	uint64_t old_ns = UINT64_MAX;

	if (gethostname(host, sizeof(host)))
		host[0] = '\0';
	host[sizeof(host) - 1] = '\0';
	for (uint32_t i = 0; i < POD_OTHER; i++) {
		struct kvs_tally *t = &c->tally[i];
		uint32_t kind = load_relaxed(&t->kind);

		if (kind == KVS_TALLY_POD && t->key == pidns &&
		    (!strncmp(t->name, host, sizeof(t->name) - 1) || pod_in_use(c, i))) {
			t->last_ns = realtime_ns();
			return i;
		}
		/* The kernel reuses a namespace's inode number once it is gone: the same number
		 * under another host name, with no process left, is another pod, and that entry
		 * one to recycle like any other. */
		if (kind == KVS_TALLY_FREE && free_i == KVS_NIL)
			free_i = i;
		else if (kind == KVS_TALLY_POD && t->last_ns < old_ns && !pod_in_use(c, i))
			old_i = i, old_ns = t->last_ns;
	}
	uint32_t i = free_i != KVS_NIL ? free_i : old_i;
	if (i == KVS_NIL)
		return POD_OTHER;
	if (i == old_i)
		recycle(c, i);
	struct kvs_tally *t = &c->tally[i];
	t->key = pidns;
	t->last_ns = realtime_ns();
	set_name(t, host);
	store_relaxed(&t->kind, KVS_TALLY_POD);
	return i;
}

/* FNV-1a over path: a root's key. */
static uint64_t path_hash(const char *path)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; *path; path++)
		h = (h ^ (unsigned char)*path) * 0x100000001b3ull;
	return h;
}

int kvs_cache_tally_root(struct kvs_cache *c, const char *path)
{
	uint64_t key = path_hash(path);
	uint32_t free_i = KVS_NIL;
	int r;

	if (c->watch)
		return -EPERM;
	r = kvs_proc_lock(c);
	if (r)
		return r;
	r = (int)(ROOT_OTHER - ROOT0);
	for (uint32_t i = ROOT0; i < ROOT_OTHER; i++) {
		struct kvs_tally *t = &c->tally[i];
		uint32_t kind = load_relaxed(&t->kind);

		if (kind == KVS_TALLY_ROOT && t->key == key &&
		    !strncmp(t->name, path, KVS_TALLY_NAME_MAX - 1)) {
			r = (int)(i - ROOT0);
			goto out;
		}
		if (kind == KVS_TALLY_FREE && free_i == KVS_NIL)
			free_i = i;
	}
	if (free_i != KVS_NIL) {
		struct kvs_tally *t = &c->tally[free_i];

		t->key = key;
		set_name(t, path);
		store_relaxed(&t->kind, KVS_TALLY_ROOT);
		r = (int)(free_i - ROOT0);
	}
out:
	kvs_proc_unlock(c);
	return r;
}

uint32_t kvs_cache_tally_ref(const struct kvs_cache *c, int root)
{
	if (c->watch || c->pod >= KVS_TALLY_PODS)
		return KVS_TALLY_NONE;
	uint32_t ref = c->pod + 1u; /* REF with no root */

	if (root >= 0 && root < (int)KVS_TALLY_ROOTS)
		ref = REF(c->pod, (uint32_t)root);
	return ref;
}

void kvs_cache_tally_add(struct kvs_cache *c, uint32_t ref, enum kvs_tally_id id, uint64_t v)
{
	if ((unsigned)id >= KVS_NTALLY || !v)
		return;
	if (REF_POD(ref) < KVS_TALLY_PODS)
		add_relaxed(&c->tally[REF_POD(ref)].v[id], v);
	if (REF_ROOT(ref) < KVS_TALLY_ROOTS)
		add_relaxed(&c->tally[ROOT0 + REF_ROOT(ref)].v[id], v);
}

int kvs_cache_tallies(struct kvs_cache *c, struct kvs_tally_info *out, int n)
{
	int k = 0;

	for (uint32_t i = 0; i < KVS_TALLY_PODS + KVS_TALLY_ROOTS; i++) {
		const struct kvs_tally *t = &c->tally[i];
		uint32_t kind = load_relaxed(&t->kind);
		uint64_t v[KVS_NTALLY], any = 0;

		for (uint32_t j = 0; j < KVS_NTALLY; j++)
			any |= v[j] = load_relaxed(&t->v[j]);
		if (kind == KVS_TALLY_FREE || kind > KVS_TALLY_OTHER ||
		    (kind == KVS_TALLY_OTHER && !any))
			continue;
		if (k < n) {
			struct kvs_tally_info *o = &out[k];

			memset(o, 0, sizeof(*o));
			o->kind = (enum kvs_tally_kind)kind;
			o->root = i >= ROOT0;
			o->key = t->key;
			memcpy(o->name, t->name, sizeof(o->name) - 1);
			for (uint32_t j = 0; j < KVS_NTALLY; j++)
				o->v[j] = v[j];
			for (uint32_t p = 0; i < ROOT0 && p < c->nprocs; p++) {
				struct kvs_proc *pr = proc_at(c, p);

				o->processes += load_relaxed(&pr->state) == KVS_PROC_ACTIVE &&
						pr->pod == i &&
						((int)p == c->self || kvs_proc_alive(c, p));
			}
		}
		k++;
	}
	return k;
}
