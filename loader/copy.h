/*
 * copy: how served bytes reach host buffers (loader.copy).  memcpy, or a copy with
 * non-temporal stores for large copies: the destination of a served read is usually handed
 * to a GPU or a checksum next, not read back by this core soon, so writing it around the cache
 * saves the reads of the destination lines that an ordinary store costs, and leaves the cache
 * to the source.
 */
#ifndef KVS_COPY_H
#define KVS_COPY_H

#include <stdbool.h>
#include <stddef.h>

typedef void (*kvs_copy_fn)(void *dst, const void *src, size_t n);

/* The copy for mode (enum kvs_copy_mode): memcpy, or the streaming copy where the CPU has
 * non-temporal stores (x86_64: SSE2 always, AVX2 when present); memcpy elsewhere.  auto is
 * the streaming copy: on the hit path it won in every paired run (docs/benchmarks.md). */
kvs_copy_fn kvs_copy_pick(int mode);

/* The streaming copy itself: memcpy below KVS_COPY_STREAM_MIN bytes; else the destination
 * is aligned with memcpy, the body written with non-temporal stores, then fenced (sfence), so
 * the bytes are visible to any reader once it returns. */
#define KVS_COPY_STREAM_MIN (64u << 10)
void kvs_copy_stream(void *dst, const void *src, size_t n);

/* The loop kvs_copy_stream runs on this CPU: "avx2", "sse2" (x86_64 without AVX2), or
 * "memcpy" (no streaming copy written for this architecture). */
const char *kvs_copy_stream_kind(void);

/* Tests only: run the SSE2 loop even where AVX2 is present (a hidden symbol, like the
 * backend's test hooks), so that both loops are checked on any x86_64. */
extern bool kvs_copy_test_no_avx2;

#endif
