/*
 * deadline: when a wait with a POSIX timeout (a relative struct timespec) ends, on
 * CLOCK_MONOTONIC, for the waits that mix the shim's completions with the kernel's or glibc's
 * (io_getevents, aio_suspend, cuFileBatchIOGetStatus).  One place for the arithmetic: a
 * timeout too long to add to now (tv_sec up to LONG_MAX) means "wait", as it does to the
 * kernel, glibc and libcufile, never a deadline that wrapped into the past.
 */
#ifndef KVS_BASE_DEADLINE_H
#define KVS_BASE_DEADLINE_H

#include <pthread.h>
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

/* A condition variable whose timed waits are on CLOCK_MONOTONIC (kvs_cond_wait_until): a
 * step of the wall clock neither ends a wait early nor makes it hang.  0 or an errno. */
static inline int kvs_cond_init_mono(pthread_cond_t *cond)
{
	pthread_condattr_t ca;
	int r = pthread_condattr_init(&ca);

	if (!r)
		r = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (!r)
		r = pthread_cond_init(cond, &ca);
	pthread_condattr_destroy(&ca);
	return r;
}

/* Wait on cond (made by kvs_cond_init_mono), mutex held, until it is signalled or the
 * monotonic moment until (kvs_mono_ns's clock; KVS_FOREVER: no bound) passes.  A wake-up may
 * be spurious: the caller looks again.  pthread_cond_timedwait's answer. */
static inline int kvs_cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mu, uint64_t until)
{
	if (until == KVS_FOREVER)
		return pthread_cond_wait(cond, mu);
	struct timespec ts = kvs_ns_ts(until);

	return pthread_cond_timedwait(cond, mu, &ts);
}

#endif
