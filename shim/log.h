/*
 * log: the shim's only voice.  Messages go to stderr (fd 2, written with a raw system call so
 * no hook runs), prefixed "kvshim: ", filtered by shim.log, and at most once per cause.
 */
#ifndef KVS_SHIM_LOG_H
#define KVS_SHIM_LOG_H

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
	KVS_CAUSE_UNSERVED_IO_URING,
	KVS_CAUSE_UNSERVED_IO_URING_SETUP,
	KVS_CAUSE_NCAUSES
};

/* Set the level (enum kvs_log_level) above which messages are dropped. */
void kvs_log_set_level(int level);

/* Print "kvshim: <message>\n" once for cause, if level passes the filter. */
void kvs_log_once(enum kvs_cause cause, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
