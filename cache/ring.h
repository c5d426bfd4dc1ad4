/*
 * ring: a single-producer single-consumer ring of pointers, in the manner of liburing's.
 *
 * head and tail are free-running 32-bit counters on their own cache lines; the ring is full
 * when tail - head == size and an index is counter & mask.  The producer alone writes tail,
 * the consumer alone writes head.  A side that finds the ring empty (consumer) or full
 * (producer) sleeps on the other side's counter with a private futex after announcing itself
 * in a sleeper flag; the other side wakes it after moving its counter.  Both the announcement
 * and the counter moves are sequentially consistent, so one of the two always sees the other:
 * no lost wake-up, and no syscall while nobody sleeps.
 */
#ifndef KVS_RING_H
#define KVS_RING_H

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "sys.h"

struct kvs_spsc {
	_Alignas(64) _Atomic uint32_t head;
	_Atomic uint32_t prod_sleeps;
	_Alignas(64) _Atomic uint32_t tail;
	_Atomic uint32_t cons_sleeps;
	_Alignas(64) uint32_t mask;
	void **items;
};

static inline int kvs_spsc_init(struct kvs_spsc *r, uint32_t size_pow2)
{
	r->items = calloc(size_pow2, sizeof(void *));
	if (!r->items)
		return -1;
	r->mask = size_pow2 - 1;
	atomic_init(&r->head, 0);
	atomic_init(&r->tail, 0);
	atomic_init(&r->prod_sleeps, 0);
	atomic_init(&r->cons_sleeps, 0);
	return 0;
}

static inline void kvs_spsc_free(struct kvs_spsc *r)
{
	free(r->items);
	r->items = NULL;
}

/* Producer: append p, sleeping while the ring is full. */
static inline void kvs_spsc_push(struct kvs_spsc *r, void *p)
{
	uint32_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);

	for (;;) {
		uint32_t h = atomic_load(&r->head); /* pairs with the consumer's head store */

		if (t - h <= r->mask)
			break;
		atomic_store(&r->prod_sleeps, 1);
		if (atomic_load(&r->head) == h)
			kvs_futex_wait(&r->head, h, 0, false);
		atomic_store(&r->prod_sleeps, 0);
	}
	r->items[t & r->mask] = p;
	atomic_store(&r->tail, t + 1); /* publishes the item; pairs with pop's tail load */
	if (atomic_load(&r->cons_sleeps))
		kvs_futex_wake(&r->tail, INT_MAX, false);
}

/* Consumer: take the oldest item, sleeping while the ring is empty. */
static inline void *kvs_spsc_pop(struct kvs_spsc *r)
{
	uint32_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
	void *p;

	for (;;) {
		uint32_t t = atomic_load(&r->tail); /* pairs with the producer's tail store */

		if (t != h)
			break;
		atomic_store(&r->cons_sleeps, 1);
		if (atomic_load(&r->tail) == t)
			kvs_futex_wait(&r->tail, t, 0, false);
		atomic_store(&r->cons_sleeps, 0);
	}
	p = r->items[h & r->mask];
	atomic_store(&r->head, h + 1); /* frees the entry; pairs with push's head load */
	if (atomic_load(&r->prod_sleeps))
		kvs_futex_wake(&r->head, INT_MAX, false);
	return p;
}

#endif
