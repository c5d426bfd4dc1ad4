/*
 * unserved: a KV file's read (or mapping) that the shim passes through, counted with its
 * bytes in an unserved_* counter (observe.h's figures too) and said once at info, so that an
 * operator sees the shim loaded but out of the path, and why; the reason per read at debug
 * (why.h).  The note functions of shim.h for the hooks are here too.
 */
#ifndef KVS_SHIM_UNSERVED_H
#define KVS_SHIM_UNSERVED_H

#include <stdint.h>

#include "cache.h"
#include "fdinfo.h"
#include "log.h"
#include "why.h"

/* fi's file (NULL when it was not described) read at off for len bytes, or mapped, and passed
 * through: count id with its bytes, say what once (cause).  Caller holds the guard. */
void kvs_unserved(enum kvs_counter_id id, enum kvs_cause cause, const char *what,
		  const struct kvs_fdinfo *fi, uint64_t off, uint64_t len);

/* Say at debug why a read of fd (described as fi) passes through (err: an errno, or 0). */
void kvs_unserved_pass(int fd, const struct kvs_fdinfo *fi, enum kvs_why why, int err);

#endif
