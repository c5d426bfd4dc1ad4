/*
 * value: configuration values as text, for whoever reads or shows one outside config/ (the
 * tools, the cache's messages, the tests).
 *
 * Pure functions: no I/O, no state, safe from any thread.  Parsers return 0 or -EINVAL and
 * leave *out alone on error; the word lookups never fail.
 */
#ifndef KVS_CONFIG_VALUE_H
#define KVS_CONFIG_VALUE_H

#include <stdbool.h>
#include <stdint.h>

/* A byte count with an optional K, M, G or T suffix (1024-based), optionally followed by B or
 * iB, or a bare B ("2MiB", "4096", "1g"); -EINVAL for anything else or past 2^64 - 1. */
int kvs_parse_size(const char *s, uint64_t *out);

/* true, 1, yes, on / false, 0, no, off, ASCII case ignored; -EINVAL for anything else. */
int kvs_parse_bool(const char *s, bool *out);

/* The cache.populate word of mode (enum kvs_populate); "lazy" for a value it does not know. */
const char *kvs_config_populate_word(uint32_t mode);

/* The cache.numa word of a policy (enum kvs_numa); "off" for a value it does not know. */
const char *kvs_config_numa_word(uint32_t numa);

#endif
