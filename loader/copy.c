/*
 * copy: see copy.h.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "config.h"
#include "copy.h"

/* memcpy as a kvs_copy_fn (its result is not needed). */
static void plain(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

bool kvs_copy_test_no_avx2;

#if defined(__x86_64__)
#include <immintrin.h>

/* The one place that chooses between the two streaming loops. */
static bool use_avx2(void)
{
	return !kvs_copy_test_no_avx2 && __builtin_cpu_supports("avx2");
}

const char *kvs_copy_stream_kind(void)
{
	return use_avx2() ? "avx2" : "sse2";
}

__attribute__((target("avx2"))) static void stream_avx2(char *d, const char *s, size_t n)
{
	for (; n >= 128; n -= 128, d += 128, s += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)s);
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
		_mm256_stream_si256((__m256i *)d, a);
		_mm256_stream_si256((__m256i *)(d + 32), b);
		_mm256_stream_si256((__m256i *)(d + 64), c);
		_mm256_stream_si256((__m256i *)(d + 96), e);
	}
	_mm_sfence(); /* the streamed lines are visible before anything after the copy */
	memcpy(d, s, n);
}

static void stream_sse2(char *d, const char *s, size_t n)
{
	for (; n >= 64; n -= 64, d += 64, s += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
		_mm_stream_si128((__m128i *)d, a);
		_mm_stream_si128((__m128i *)(d + 16), b);
		_mm_stream_si128((__m128i *)(d + 32), c);
		_mm_stream_si128((__m128i *)(d + 48), e);
	}
	_mm_sfence();
	memcpy(d, s, n);
}

void kvs_copy_stream(void *dst, const void *src, size_t n)
{
	char *d = dst;
	const char *s = src;

	if (n < KVS_COPY_STREAM_MIN) {
		memcpy(d, s, n);
		return;
	}
	size_t head = (64 - ((uintptr_t)d & 63)) & 63; /* align the stores to a cache line */
	memcpy(d, s, head);
	if (use_avx2())
		stream_avx2(d + head, s + head, n - head);
	else
		stream_sse2(d + head, s + head, n - head);
}

kvs_copy_fn kvs_copy_pick(int mode)
{
	return mode == KVS_COPY_MEMCPY ? plain : kvs_copy_stream; /* auto: stream, measured */
}

#else /* no non-temporal stores written for this CPU: memcpy */

const char *kvs_copy_stream_kind(void)
{
	return "memcpy";
}

void kvs_copy_stream(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

kvs_copy_fn kvs_copy_pick(int mode)
{
	return plain;
}

#endif
