/*
 * deadline: when a wait with a POSIX timeout (a relative struct timespec) ends, on
 * CLOCK_MONOTONIC, for the waits that mix the shim's completions with the kernel's or glibc's
 * (io_getevents, aio_suspend, cuFileBatchIOGetStatus).  One place for the arithmetic: a
 * timeout too long to add to now (tv_sec up to LONG_MAX) means "wait", as it does to the
 * kernel, glibc and libcufile, never a deadline that wrapped into the past.
 */
#ifndef KVS_BASE_DEADLINE_H
#define KVS_BASE_DEADLINE_H

#include <stdint.h>
#include <time.h>

#include "sys.h" /* kvs_mono_ns */

#define KVS_FOREVER UINT64_MAX

/* The moment a wait of *ts from now ends (KVS_FOREVER for NULL, or one past the clock's
 * range).  ts must be valid: tv_sec >= 0, 0 <= tv_nsec < 1e9 (the caller refuses others as
 * the real call would). */
static inline uint64_t kvs_deadline_ns(const struct timespec *ts)
{
	uint64_t now, sec, d;

	if (!ts)
		return KVS_FOREVER;
	now = kvs_mono_ns();
	sec = (uint64_t)ts->tv_sec;
	if (sec > (KVS_FOREVER - now) / 1000000000ull)
		return KVS_FOREVER;
	d = now + sec * 1000000000ull;
	return d > KVS_FOREVER - (uint64_t)ts->tv_nsec ? KVS_FOREVER : d + (uint64_t)ts->tv_nsec;
}

/* A nanosecond count as a struct timespec. */
static inline struct timespec kvs_ns_ts(uint64_t ns)
{
	return (struct timespec){(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
}

#endif
