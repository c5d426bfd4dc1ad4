/*
 * log: the shim's only voice.  Messages go to stderr (fd 2), or to the file shim.log_file names,
 * written with raw system calls so that no hook runs, filtered by shim.log, and at most once per
 * cause.  Each line reads "kvshim: 2026-11-30T15:04:05.123Z pid 1234 warn: <message>": the
 * prefix first (tests and operators grep for it), then the UTC time, the pid and the level.
 */
#ifndef KVS_SHIM_LOG_H
#define KVS_SHIM_LOG_H

#include <stdbool.h>

/* One bit per cause that may be reported; each is printed at most once per process. */
enum kvs_cause {
	KVS_CAUSE_CONFIG,
	KVS_CAUSE_ATTACH,
	KVS_CAUSE_LOADER,
	KVS_CAUSE_ATTACHED,
	KVS_CAUSE_READ_FALLBACK,
	KVS_CAUSE_EUCLEAN,
	KVS_CAUSE_IO_URING,
	KVS_CAUSE_DEVICE,
	KVS_CAUSE_CUFILE,
	KVS_CAUSE_UNSERVED_BUFFERED,
	KVS_CAUSE_UNSERVED_SMALL,
	KVS_CAUSE_UNSERVED_MISALIGNED,
	KVS_CAUSE_UNSERVED_MMAP,
	KVS_CAUSE_UNSERVED_STDIO,
	KVS_CAUSE_UNSERVED_BUFFERS,
	KVS_CAUSE_UNSERVED_NO_CACHE,
	KVS_CAUSE_UNSERVED_ANCHOR,
	KVS_CAUSE_UNSERVED_DEVICE,
	KVS_CAUSE_UNSERVED_STREAM,
	/* io_uring rings passed through, one cause each (api/uring.c) */
	KVS_CAUSE_URING_SQPOLL,
	KVS_CAUSE_URING_NOP,
	KVS_CAUSE_URING_REGRING,
	KVS_CAUSE_URING_FIXED,
	KVS_CAUSE_URING_UNSEEN,
	KVS_CAUSE_URING_READ_FIXED,
	KVS_CAUSE_CAPACITY, /* loads larger than the region (serve.c) */
	KVS_CAUSE_SHMAP,    /* a writable shared mapping not recorded (shmap.c) */
	KVS_CAUSE_NCAUSES
};

/* Set the level (enum kvs_log_level) above which messages are dropped. */
void kvs_log_set_level(int level);

/* Send the lines to path (opened O_APPEND|O_CREAT, mode 0600, at each message), or to stderr
 * for NULL or "".  A relative path is resolved against the working directory now.  Call it
 * before the first message; a path that cannot be opened sends every line to stderr, and says
 * so once. */
void kvs_log_set_file(const char *path);

/* Print "kvshim: <time> pid <pid> <level>: <message>\n" once for cause, if level passes the
 * filter. */
void kvs_log_once(enum kvs_cause cause, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Does level pass the filter?  One load: callers test it before preparing a message. */
bool kvs_log_wants(int level);

/* Print a line at level if it passes the filter, whatever was printed before: for callers that
 * keep their own "once" (why.c: once per descriptor and cause). */
void kvs_log_line(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The text of errno e, without strerror's locale lock (safe in a hook). */
const char *kvs_log_error_text(int e);

#endif
