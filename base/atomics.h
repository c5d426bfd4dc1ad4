/*
 * Named atomic helpers.  Every acquire names the release it pairs with at its call site.
 * Shared-memory words are declared _Atomic so that the compiler never tears or caches them.
 */
#ifndef KVS_ATOMICS_H
#define KVS_ATOMICS_H

#include <stdatomic.h>

#define load_relaxed(p)	    atomic_load_explicit((p), memory_order_relaxed)
#define load_acquire(p)	    atomic_load_explicit((p), memory_order_acquire)
#define store_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define store_release(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define xchg_acq_rel(p, v)  atomic_exchange_explicit((p), (v), memory_order_acq_rel)
#define add_relaxed(p, v)   atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define sub_relaxed(p, v)   atomic_fetch_sub_explicit((p), (v), memory_order_relaxed)
#define cas_acq_rel(p, expp, v)                                                                    \
	atomic_compare_exchange_strong_explicit((p), (expp), (v), memory_order_acq_rel,            \
						memory_order_acquire)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

#endif
