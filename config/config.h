/*
 * config: the effective configuration of kvshim.
 *
 * Sources, lowest precedence first: built-in defaults (keys.def), the INI file named by
 * KVSHIM_CONFIG (else /etc/kvshim/kvshim.ini if it exists), then environment variables
 * KVSHIM_<SECTION>_<KEY> (capitals), then KVSHIM_ENABLE.  Loading is all or nothing: on any bad
 * input the result is the defaults with shim_enable = false, and one line of diagnostic.
 *
 * This module never prints, never exits and calls no hooked function on a path that could
 * recurse into the shim without the caller's guard (it reads the file through base/raw.h).
 *
 * The rest of config/, one header per concern: value.h (values as text: the size and boolean
 * parsers, the words of the enums), and for the tools only, in the kvs_config_tools library that
 * libkvshim.so does not link, print.h (the listing, --explain, the sample file) and hints.h
 * (known names, near misses, suggested fixes).  keytab.h is config/'s private key table.
 */
#ifndef KVS_CONFIG_H
#define KVS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVS_CONFIG_STR_MAX  4096
#define KVS_CONFIG_LINE_MAX 4096 /* longer INI lines are refused */
#define KVS_CONFIG_MSG_MAX  512
#define KVS_CACHE_DIR_MAX   200 /* bytes of cache.dir */

enum kvs_log_level { KVS_LOG_ERROR, KVS_LOG_WARN, KVS_LOG_INFO, KVS_LOG_DEBUG };
enum kvs_eviction { KVS_EVICT_CLOCK, KVS_EVICT_FIFO };
enum kvs_wait_mode { KVS_WAIT_FUTEX, KVS_WAIT_SPIN };
enum kvs_prefetch { KVS_PREFETCH_OFF, KVS_PREFETCH_ALLOC, KVS_PREFETCH_READ };
enum kvs_io_mode { KVS_IO_AUTO, KVS_IO_URING, KVS_IO_THREADS };
enum kvs_populate { KVS_POPULATE_LAZY, KVS_POPULATE_EAGER, KVS_POPULATE_AHEAD };
enum kvs_copy_mode { KVS_COPY_AUTO, KVS_COPY_MEMCPY, KVS_COPY_STREAM };
enum kvs_on_mismatch { KVS_MISMATCH_REFUSE, KVS_MISMATCH_REBUILD };
enum kvs_huge_pages { KVS_HUGE_AUTO, KVS_HUGE_ON, KVS_HUGE_OFF };
enum kvs_numa { KVS_NUMA_OFF, KVS_NUMA_INTERLEAVE, KVS_NUMA_LOCAL };
enum kvs_shim_mode { KVS_MODE_SERVE, KVS_MODE_OBSERVE };
enum kvs_remote_kind { KVS_REMOTE_NONE, KVS_REMOTE_MOONCAKE };

/* Where a key's effective value came from. */
enum kvs_source { KVS_SRC_DEFAULT, KVS_SRC_FILE, KVS_SRC_ENV };

/*
 * The C type of each key type of keys.def.  STR and NAME fields are arrays; the typedef lets
 * the struct below declare every field the same way.
 */
typedef char kvs_config_str[KVS_CONFIG_STR_MAX];

#define KVS_CTYPE_BOOL		bool
#define KVS_CTYPE_SIZE		uint64_t
#define KVS_CTYPE_SIZE_AUTO	uint64_t /* 0 = auto */
#define KVS_CTYPE_UINT		uint64_t
#define KVS_CTYPE_AUTO		int64_t
#define KVS_CTYPE_PCT		uint64_t
#define KVS_CTYPE_MODE		uint64_t
#define KVS_CTYPE_STR		kvs_config_str
#define KVS_CTYPE_NAME		kvs_config_str
#define KVS_CTYPE_ENUM_LOG	int
#define KVS_CTYPE_ENUM_EVICT	int
#define KVS_CTYPE_ENUM_WAIT	int
#define KVS_CTYPE_ENUM_PREFETCH int
#define KVS_CTYPE_ENUM_IO	int
#define KVS_CTYPE_ENUM_POPULATE int
#define KVS_CTYPE_ENUM_COPY	int
#define KVS_CTYPE_ENUM_MISMATCH int
#define KVS_CTYPE_ENUM_HUGE	int
#define KVS_CTYPE_ENUM_NUMA	int
#define KVS_CTYPE_ENUM_MODE	int
#define KVS_CTYPE_ENUM_REMOTE	int

enum kvs_key_id {
#define KVS_KEY(sec, key, type, field, def, min, max, help) KVS_KEY_##field,
#include "keys.def"
#undef KVS_KEY
	KVS_NKEYS
};

struct kvs_config {
#define KVS_KEY(sec, key, type, field, def, min, max, help) KVS_CTYPE_##type field;
#include "keys.def"
#undef KVS_KEY
	/* Provenance, for `kvshim config --explain`. */
	enum kvs_source source[KVS_NKEYS];
	unsigned line[KVS_NKEYS];      /* INI line, when source is KVS_SRC_FILE */
	char path[KVS_CONFIG_STR_MAX]; /* the INI file read, or "" */
	bool kvshim_enable_env_off;    /* KVSHIM_ENABLE=0 was seen */
};

/* Fill cfg with the built-in defaults; provenance KVS_SRC_DEFAULT. Never fails. */
void kvs_config_defaults(struct kvs_config *cfg);

/*
 * Load the effective configuration.  path: the INI file to read, or NULL to look it up
 * (KVSHIM_CONFIG, else /etc/kvshim/kvshim.ini if present, else none; an empty KVSHIM_CONFIG
 * means no file).  envp: the environment to read overrides from (NULL = environ).
 * Returns 0, or -EINVAL after bad input (unknown section or key, bad value, out of range,
 * overlong line, unreadable file).  On error cfg holds the defaults with shim_enable = false
 * and msg (if not NULL) holds one line without newline, of the form
 *   "config: FILE:LINE: KEY: reason"          for a key in the file,
 *   "config: FILE:LINE: reason"               for a line that is not a key (syntax, too long),
 *   "config: FILE: reason"                    for the file as a whole (cannot open it),
 *   "config: environment: VAR: reason"        for an environment variable,
 * which the caller prints once, prefixed "kvshim: ".  On success msg is "".
 * Safe to call from several threads at once; with envp NULL the caller must not change the
 * environment meanwhile.
 */
int kvs_config_load(struct kvs_config *cfg, const char *path, char *const *envp, char *msg,
		    size_t msglen);

#endif
