/*
 * keytab: the key table of keys.def as data, and the value helpers built on it.  Private to
 * config/: value.c defines it; config.c (loading), print.c and hints.c (the tools' half) read
 * it.  No other folder includes this header.
 *
 * Everything here is pure: no I/O, no state outside the caller's buffers and the constant
 * table, so any thread may call any of it.
 */
#ifndef KVS_CONFIG_KEYTAB_H
#define KVS_CONFIG_KEYTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* Values quoted in a message are cut to this many bytes, so the reason always fits. */
#define KVS_QUOTE_MAX 48

/* Longest KVSHIM_<SECTION>_<KEY> name the table produces, with room to spare. */
#define KVS_ENV_NAME_MAX 64

/* The key types of keys.def (its TYPE column, prefixed KT_). */
enum kvs_key_type {
	KT_BOOL,
	KT_SIZE,
	KT_SIZE_AUTO,
	KT_UINT,
	KT_AUTO,
	KT_PCT,
	KT_MODE,
	KT_STR,
	KT_NAME,
	KT_ENUM_LOG,
	KT_ENUM_EVICT,
	KT_ENUM_WAIT,
	KT_ENUM_PREFETCH,
	KT_ENUM_IO,
	KT_ENUM_POPULATE,
	KT_ENUM_COPY,
	KT_ENUM_MISMATCH,
	KT_ENUM_HUGE,
	KT_ENUM_NUMA,
	KT_ENUM_MODE,
	KT_ENUM_REMOTE,
};

/* One row of keys.def: off is the field's offset in struct kvs_config, def its default as it
 * would be written in the file. */
struct kvs_key_desc {
	const char *section;
	const char *key;
	enum kvs_key_type type;
	size_t off;
	const char *def;
	uint64_t min, max;
	const char *help;
};

/* The table, indexed by enum kvs_key_id, in keys.def's order (which is the order printed). */
extern const struct kvs_key_desc kvs_keys[KVS_NKEYS];

/* One spelling of an enum value. */
struct kvs_word {
	const char *word;
	int val;
};

/* The spellings of an enum key type, NULL-terminated, the first spelling of a value being the
 * one printed; an empty list for the types that are not enums. */
const struct kvs_word *kvs_key_words(enum kvs_key_type t);

/*
 * Parse s as a value of key id, apply the key's bounds and the rules the table cannot express
 * (shard alignment, an absolute cache.dir, the running queue rounded up to a power of two), and
 * store it in cfg.  Returns 0, or -EINVAL with the reason (no location) in why; cfg is untouched
 * on error.  Provenance (source, line) is the caller's to set.
 */
int kvs_key_set(struct kvs_config *cfg, int id, const char *s, char *why, size_t whylen);

/* Write KVSHIM_<SECTION>_<KEY> of key k into buf (KVS_ENV_NAME_MAX bytes), or only its
 * KVSHIM_<SECTION>_ prefix. */
void kvs_key_env_name(const struct kvs_key_desc *k, bool with_key, char *buf);

/* Print a size with the largest suffix that divides it exactly, so it reads back the same. */
void kvs_format_size(uint64_t v, char *buf, size_t len);

/* Copy s into buf in double quotes, cut to KVS_QUOTE_MAX bytes, for a message; buf should hold
 * KVS_QUOTE_MAX + 8 bytes. */
void kvs_quote(const char *s, char *buf, size_t len);

/* Whether a and b are equal ignoring ASCII case. */
bool kvs_str_ieq(const char *a, const char *b);

/* ASCII only: the C library's tolower() follows the locale (Turkish 'I'). */
static inline char kvs_ascii_lower(char c)
{
	return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static inline char kvs_ascii_upper(char c)
{
	return c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
}

#endif
