/*
 * hooks_uring: liburing's doors (hooks/uring.c).  What the dlclose door needs of them.
 */
#ifndef KVS_SHIM_HOOKS_URING_H
#define KVS_SHIM_HOOKS_URING_H

/* A library was unloaded (the dlclose hook): the liburing functions found for call sites are
 * forgotten. */
void kvs_uring_unloaded(void);

/* Its fork rule (hooks/fanout.c): the call-site cache's lock made anew. */
void kvs_uring_doors_atfork_child(void);

#endif
