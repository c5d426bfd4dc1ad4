/*
 * unseen_marks: the marks of unseen.h, kept with atomics alone (no lock, no allocation,
 * async-signal-safe), so that the lowest floors of the shim (fdinfo.c's look at a number)
 * can clear them.  unseen.c decides what is marked and counts what is pending at exit.
 *
 * marks: one bit per descriptor number below KVS_UNSEEN_SLOTS, set by the opening thread,
 * cleared by whoever clears it first (a look, a close, a forget: atomic and-not, the clearer
 * that found it set counts).  pending: the closes of marked numbers.  owner: the pid the marks
 * belong to (a vfork child closes in its parent's memory: not counted).
 */
#ifndef KVS_SHIM_UNSEEN_MARKS_H
#define KVS_SHIM_UNSEEN_MARKS_H

#include <stdint.h>

#define KVS_UNSEEN_SLOTS 65536

/* Mark fd (below KVS_UNSEEN_SLOTS) as opened unseen by process pid. */
void kvs_unseen_mark(int fd, long pid);

/* The shim looked at fd for a read or a write: not unseen.  One load when nothing is marked. */
void kvs_unseen_looked(int fd);

/* fd is a new number whose earlier close was not seen, or fd is duplicated (its file lives on
 * under another number, whose reads are not fd's): its mark goes uncounted. */
void kvs_unseen_forget(int fd);

/* The program closed every number of [lo, hi]: marked ones become pending. */
void kvs_unseen_closed(unsigned int lo, unsigned int hi);

/* What is pending (unchanged), and the pid that marked last. */
uint64_t kvs_unseen_pending(void);
long kvs_unseen_owner(void);

/* Take what is pending: the count, now 0. */
uint64_t kvs_unseen_pending_take(void);

/* The fork child: the parent's opens are the parent's. */
void kvs_unseen_atfork_child(void);

#endif
