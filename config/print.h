/*
 * print: the configuration as the operator reads it (`kvshim config [--explain|--sample]`).
 * Tool-only: link kvs_config_tools (libkvshim.so does not).
 */
#ifndef KVS_CONFIG_PRINT_H
#define KVS_CONFIG_PRINT_H

#include <stdbool.h>
#include <stdio.h>

#include "config.h"

/* Print "section.key = value" for every key, one per line; with explain, add the default,
 * the source ("default", "file PATH:LINE", "env VAR") and the help text. Returns 0 or -errno. */
int kvs_config_print(const struct kvs_config *cfg, FILE *out, bool explain);

/* Print a sample INI file: every key of keys.def under its section, commented out with its
 * default and help text, so that uncommenting a line sets that key.  Returns 0 or -EIO. */
int kvs_config_sample(FILE *out);

#endif
