/*
 * unseen: O_DIRECT opens of KV files whose reads the shim never saw.  A loader that reads with
 * inline system calls (a bundled liburing: runai-model-streamer's io_uring_direct, its
 * default) opens its files through libc, where the open hooks see them, and reads where no
 * hook does: served nothing, and said nowhere.  Each such open, closed with no read the shim
 * looked at, is counted (unserved_unseen), which `kvshim stat` and `kvshim check` name.
 *
 * A readable O_DIRECT open of a KV file marks its number (kvs_unseen_opened, from the open
 * hooks; the marks are unseen_marks.h's); any look of the shim at the number for a read or a write
 * clears the mark (kvs_unseen_looked, from fdinfo.c, and from unserved.c for a read too short to
 * serve); a close of a marked number counts it as pending (kvs_unseen_closed, from
 * kvs_shim_fds_closing, before the kernel closes: after, another thread's open may have the number;
 * atomics only, async-signal-safe).  At exit a process that read no KV file the shim saw
 * (read_bytes 0) moves its pending count into the region, mapping it; one that did read through the
 * shim opened those files for something else (runai's libaio_direct opens a spare descriptor per
 * worker).  Not counted: a process killed, or ended by _exit.  A number reborn through an open
 * whose earlier close no hook saw, or duplicated (dup2, dup3, F_DUPFD: dd reads its input as
 * descriptor 0), is cleared without counting (kvs_unseen_forget); a dup() is not seen, and a
 * close of the original after it counts.
 */
#ifndef KVS_SHIM_UNSEEN_H
#define KVS_SHIM_UNSEEN_H

#include <stdbool.h>

/* The program opened fd with flags (any open door, after the real call; errno kept). */
void kvs_unseen_opened(int fd, int flags);

#endif
