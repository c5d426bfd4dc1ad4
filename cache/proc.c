/*
 * proc: the process table, liveness and reclaim (protocol: region.c, "Processes").
 *
 * Liveness is an OFD write lock on byte i of the region file for process-table slot i.  OFD
 * locks belong to the open file description, so the same process can always take a byte it
 * holds already: reclaim is therefore also serialised inside the process by reclaim_mu.
 *
 * Stuck locks.  Every lock taken here gives up after the lock timeout (lock.c).  A reclaim
 * or detach that could not return every pin or free every claim (a stripe stuck) leaves the
 * entry ACTIVE with its byte unlocked, so the next reap finds it dead again and finishes the
 * job; retiring it early would let the next attacher wipe pins that still count in refs.
 * Attach with a stuck proc_lock fails with -EUCLEAN (the process reads storage itself).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "raw.h"
#include "sys.h"

static int ofd(struct kvs_cache *c, int cmd, short type, uint32_t byte, short *seen)
{
	struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
	unsigned int ticket;
	int fd = kvs_ownfd_get(&c->own, &ticket), r = 0; /* never on a number the program took */

	if (fd < 0)
		return -EBADF;
	if (kvs_sys_fcntl(fd, cmd, &fl) < 0)
		r = -errno;
	kvs_ownfd_put(&c->own, ticket);
	if (r)
		return r;
	if (seen)
		*seen = fl.l_type;
	return 0;
}

bool kvs_proc_alive(struct kvs_cache *c, uint32_t p)
{
	short seen = F_UNLCK;

	/* On error assume alive: a wrong "dead" would fail someone's load. */
	if (ofd(c, F_OFD_GETLK, F_WRLCK, p, &seen))
		return true;
	return seen != F_UNLCK;
}

bool kvs_cache_whoami(const struct kvs_cache *c, uint32_t *slot, uint64_t *at)
{
	if (c->self < 0)
		return false;
	*slot = (uint32_t)c->self;
	*at = proc_at((struct kvs_cache *)c, (uint32_t)c->self)->attach_ns;
	return true;
}

bool kvs_cache_still(struct kvs_cache *c, uint32_t slot, uint64_t at)
{
	if (slot >= c->nprocs)
		return false;
	/* attach_ns is written under proc_lock by the attacher; a torn or stale read here can
	 * only make a live owner look gone if the slot was retaken, which is the answer then. */
	if (__atomic_load_n(&proc_at(c, slot)->attach_ns, __ATOMIC_RELAXED) != at)
		return false;
	return kvs_proc_alive(c, slot);
}

int kvs_proc_attach(struct kvs_cache *c)
{
	struct timespec ts;
	struct stat ns;
	int r;

	kvs_cache_reap(c);
	r = kvs_proc_lock(c);
	if (r)
		return r;
	r = -EUSERS;
	for (uint32_t i = 0; i < c->nprocs; i++) {
		struct kvs_proc *p = proc_at(c, i);

		if (load_relaxed(&p->state) != KVS_PROC_FREE)
			continue;
		if (ofd(c, F_OFD_SETLK, F_WRLCK, i, NULL))
			continue; /* a reclaimer holds it */
		memset((void *)p->pin, 0, sizeof(p->pin));
		for (int k = 0; k < KVS_NCOUNTERS; k++)
			store_relaxed(&p->ctr[k], 0);
		p->pid = (int32_t)getpid();
		p->pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
		p->pod = kvs_tally_join_pod_locked(c, p->pidns);
		c->pod = p->pod;
		store_relaxed(&p->rank, -1);
		store_relaxed(&p->staged, 0);
		clock_gettime(CLOCK_REALTIME, &ts);
		p->attach_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
		store_release(&p->state, KVS_PROC_ACTIVE);
		c->self = (int)i;
		c->me = p;
		r = 0;
		break;
	}
	kvs_proc_unlock(c);
	return r;
}

/* Fold p's counters into the totals and free its slot; caller holds proc_lock. */
static void retire_locked(struct kvs_cache *c, struct kvs_proc *p)
{
	for (int k = 0; k < KVS_NCOUNTERS; k++) {
		add_relaxed(&c->hdr->totals[k], load_relaxed(&p->ctr[k]));
		store_relaxed(&p->ctr[k], 0);
	}
	p->pid = 0;
	p->pidns = 0;
	p->pod = KVS_NIL;
	store_relaxed(&p->staged, 0); /* its claims are freed: nothing staged is left */
	store_release(&p->state, KVS_PROC_FREE);
}

void kvs_proc_detach(struct kvs_cache *c)
{
	/* Pins still held (a caller bug, or releases deferred behind a stuck stripe) are
	 * returned as if we had died; any left are returned by whoever reclaims us. */
	if (kvs_slot_unpin_all(c, (uint32_t)c->self) == 0 && kvs_proc_lock(c) == 0) {
		retire_locked(c, c->me);
		kvs_proc_unlock(c);
	}
	for (uint32_t w = 0; w < KVS_PINS_PER_PROC / 64; w++)
		store_relaxed(&c->deferred[w], 0);
	ofd(c, F_OFD_SETLK, F_UNLCK, (uint32_t)c->self, NULL);
	c->self = -1;
	c->me = NULL;
	c->pod = KVS_NIL;
}

int kvs_proc_reclaim(struct kvs_cache *c, uint32_t p)
{
	struct kvs_proc *pr = proc_at(c, p);
	int r = 0;

	if (p >= c->nprocs || (int)p == c->self || c->watch)
		return 0;
	pthread_mutex_lock(&c->reclaim_mu);
	if (load_acquire(&pr->state) != KVS_PROC_ACTIVE)
		goto out;
	/* Holding the dead process's byte keeps every other reclaimer out. */
	if (ofd(c, F_OFD_SETLK, F_WRLCK, p, NULL))
		goto out; /* alive, or being reclaimed */
	if (load_acquire(&pr->state) != KVS_PROC_ACTIVE)
		goto out_unlock;
	uint32_t left = kvs_slot_unpin_all(c, p);
	for (uint32_t i = 0; i < c->nslots; i++)
		if (load_relaxed(&c->slots[i].state) == KVS_ST_CLAIMED_BY(p))
			left += kvs_slot_free_claim(c, i, p) != 0;
	if (left)
		goto out_unlock; /* a stripe is stuck: the next reap finishes */
	kvs_wseq_repair(c, p);	 /* its writes in flight will never end */
	if (kvs_proc_lock(c) == 0) {
		retire_locked(c, pr);
		kvs_proc_unlock(c);
		r = 1;
	}
out_unlock:
	ofd(c, F_OFD_SETLK, F_UNLCK, p, NULL);
out:
	pthread_mutex_unlock(&c->reclaim_mu);
	return r;
}

int kvs_cache_reap(struct kvs_cache *c)
{
	int n = 0;

	if (c->watch)
		return 0;
	for (uint32_t i = 0; i < c->nprocs; i++) {
		if ((int)i == c->self || load_relaxed(&proc_at(c, i)->state) != KVS_PROC_ACTIVE)
			continue;
		if (!kvs_proc_alive(c, i))
			n += kvs_proc_reclaim(c, i);
	}
	return n;
}

int kvs_cache_reap_maybe(struct kvs_cache *c)
{
	uint64_t now = kvs_mono_ns(), last = load_relaxed(&c->last_reap_ns);

	if (now - last < KVS_REAP_PERIOD_NS || !cas_acq_rel(&c->last_reap_ns, &last, now))
		return 0;
	kvs_populate_start(c); /* if the populating process died, carry on */
	kvs_slot_retry_deferred(c);
	return kvs_cache_reap(c);
}

void kvs_cache_count(struct kvs_cache *c, enum kvs_counter_id id, uint64_t v)
{
	if (c->me)
		add_relaxed(&c->me->ctr[id], v);
}

uint64_t kvs_cache_counted(const struct kvs_cache *c, enum kvs_counter_id id)
{
	return c->me ? load_relaxed(&c->me->ctr[id]) : 0;
}

uint64_t kvs_cache_capacity(const struct kvs_cache *c)
{
	return (uint64_t)c->nframes * c->shard_size;
}

bool kvs_cache_outgrown(const struct kvs_cache *c)
{
	return c->me && load_relaxed(&c->me->ctr[KVS_CTR_evictions]) >= c->nframes / 2 &&
	       load_relaxed(&c->me->ctr[KVS_CTR_backend_bytes]) >
		   (uint64_t)c->nframes * c->shard_size;
}

void kvs_cache_ranks(struct kvs_cache *c, uint32_t *rank, uint32_t *nranks)
{
	uint32_t below = 0, all = 0;

	for (uint32_t i = 0; i < c->nprocs; i++) {
		if (load_relaxed(&proc_at(c, i)->state) != KVS_PROC_ACTIVE)
			continue;
		all++;
		below += (int)i < c->self;
	}
	*rank = below;
	*nranks = all ? all : 1;
}

void kvs_cache_set_rank(struct kvs_cache *c, int rank)
{
	if (c->me)
		store_relaxed(&c->me->rank, rank);
}

int kvs_cache_live_processes(const char *path)
{
	int fd =
	    kvs_sys_open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
	int n = 0;

	if (fd < 0)
		return -errno;
	/* Probe the first 4096 bytes' locks; the process table is never larger. */
	for (uint32_t i = 0; i < 4096; i++) {
		struct flock fl = {
		    .l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = i, .l_len = 1};

		if (kvs_sys_fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK)
			n++;
	}
	kvs_sys_close(fd);
	return n;
}

bool kvs_cache_take_euclean(struct kvs_cache *c)
{
	return c && atomic_exchange_explicit(&c->euclean_seen, 0, memory_order_relaxed);
}
