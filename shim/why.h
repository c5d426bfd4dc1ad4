/*
 * why: at shim.log = debug, say why a read was passed through to the real call, once per
 * descriptor and cause.  "Once per descriptor" means once per (descriptor number, file): a
 * number closed and reopened on another file speaks again.  Off the debug level it costs one
 * load.
 */
#ifndef KVS_SHIM_WHY_H
#define KVS_SHIM_WHY_H

#include <stdint.h>

/* The reasons a read of a regular file passes through.  At most 16. */
enum kvs_why {
	KVS_WHY_NOT_KV,	    /* not under files.roots */
	KVS_WHY_UNREADABLE, /* opened write-only or O_PATH: the real call answers EBADF */
	KVS_WHY_BUFFERED,   /* no O_DIRECT and files.buffered = false */
	KVS_WHY_SMALL,	    /* shorter than files.min_read */
	KVS_WHY_MISALIGNED, /* O_DIRECT, but not aligned as O_DIRECT needs */
	KVS_WHY_BUFFERS,    /* the destination is not memory the shim may write */
	KVS_WHY_DEVICE,	    /* a cuFile destination the shim cannot copy to */
	KVS_WHY_NO_CACHE,   /* the region could not be attached (said once, at warn) */
	KVS_WHY_ANCHOR,	    /* no anchor: the file changed under the look, or the fd is too large */
	KVS_WHY_FALLBACK,   /* the cache failed this read; storage answered */
	KVS_WHY_MMAP,	    /* mapped with mmap: its reads are page faults */
	KVS_WHY_STDIO,	    /* fread on a stream with bytes to write, ungetc'd bytes, or wide */
	KVS_WHY_NCAUSES
};

/* Say once for (fd, the file dev:ino, why) that a read passed through, with the file's path.
 * err, when nonzero, is the errno that made it so (KVS_WHY_ANCHOR, KVS_WHY_FALLBACK).  Never
 * changes errno; async-signal-safe apart from the line's formatting (as every log line). */
void kvs_why(int fd, uint64_t dev, uint64_t ino, enum kvs_why why, int err);

#endif
