/*
 * wthru_op: the record of one write that write-through follows, on the writer's stack from
 * kvs_wthru_before to kvs_wthru_after (wthru.h).  Its own header, below the rest of
 * write-through, because the hooks' contract (shim.h) holds one by value in the records it
 * hands the doors (kvs_shim_change, kvs_shim_cfwrite) and needs nothing else of wthru.h.
 */
#ifndef KVS_SHIM_WTHRU_OP_H
#define KVS_SHIM_WTHRU_OP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "cache.h"

struct wt_file;

/* One write in progress (on the writer's stack), from kvs_wthru_before to kvs_wthru_after. */
struct kvs_wthru_op {
	struct wt_file *f; /* NULL: not staged */
	const struct iovec *iov;
	int iovcnt;
	uint64_t off, len;
	bool at_pos;	/* at the file position (write, writev) */
	bool late;	/* the offset is known only after the write (O_APPEND): copy after it */
	bool async;	/* copied by the copier thread during the real call */
	bool deferred;	/* seen complete only later (aio): copied at submission */
	bool late_copy; /* copied after the real call, of what it wrote (no safe copy here) */
	bool trusted;	/* the bytes to copy were just read by the kernel: a plain copy */
	bool tok_only;	/* not staged: only the write sequence moves (writes.c) */
	bool whole;  /* lands where nothing says (O_APPEND and an offset): the file keeps nothing */
	bool change; /* no bytes copied (kvs_wthru_change): its range keeps nothing */
	bool stream; /* an fwrite at the stream's position off (KVS_WT_STREAM) */
	struct kvs_wtok tok;
	uint64_t t0; /* the node's clock (kvs_node_ns) when the write began */
	struct kvs_wthru_op *next;
	_Atomic uint32_t copied; /* the copier is done with the op (release) */
	/* Where the bytes come from when not iov (device memory, cuFileWrite): copies n bytes at
	 * byte pos of the write to dst, returns 0 or -errno. */
	int (*src_copy)(void *ctx, uint64_t pos, void *dst, size_t n);
	void *src_ctx;
	bool copy_failed; /* a src_copy failed: the file keeps nothing */
};

#endif
