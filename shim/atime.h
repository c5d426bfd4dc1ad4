/*
 * atime: reads the cache serves keep the file's atime as the kernel would.
 *
 * A hit never reaches the file, so its atime stops moving, and a collector that deletes files
 * by atime (llm-d's PVC evictor, systemd-tmpfiles) would delete the hottest blocks.  So when
 * the shim serves a read of a file whose atime relatime would move (fdinfo.h, atime_due:
 * older than its mtime or ctime, or a day old), it asks a background thread of its own to
 * make one small real read of the file (the first block, through the shim's own descriptor),
 * which moves atime as the mount's own rules say and moves no ctime (utimensat would, and
 * ctime is part of a file's id by change); a file keyed by birth gets futimens instead, no
 * storage read.  At most once per file per day per process under relatime (per second under
 * strictatime); a file whose atime moved meanwhile (a load read it) is left alone.
 */
#ifndef KVS_SHIM_ATIME_H
#define KVS_SHIM_ATIME_H

#include "fdinfo.h"

struct kvs_cache;

/* Start the thread that makes the reads (at the attach: it sleeps until a note).  0, or the
 * thread's error, after which notes do nothing. */
int kvs_atime_start(void);

/* A read of fi's file, through the shim's descriptor anchor, is about to be served: if
 * fi->atime_due, queue the file's small read (c counts it in atime_updates once made).  No
 * malloc, no lock: a CAS on a queue entry, a dup of anchor, and a futex wake.  Nothing before
 * kvs_atime_start.  Leaves errno alone. */
void kvs_atime_note(struct kvs_cache *c, int anchor, const struct kvs_fdinfo *fi);

/* The fork child: the thread is gone; the queued descriptors are closed. */
void kvs_atime_atfork_child(void);

#endif
