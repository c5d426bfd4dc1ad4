/*
 * The kvshim command's subcommands (docs/operations.md, "The `kvshim` command") and the
 * helpers they share.
 *
 * Each cmd_<name>() is the main() of one subcommand: argv[0] is the subcommand's name, the
 * options follow, and the return value is the process exit status (0 success, 1 failure,
 * 2 bad usage; `run` returns only when it cannot exec).  Helpers return 0 or -errno.
 * Diagnostics go to stderr prefixed "kvshim: "; stdout carries only what was asked for.
 */
#ifndef KVS_TOOLS_CMD_COMMON_H
#define KVS_TOOLS_CMD_COMMON_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct kvs_config;

#define KVS_EXIT_OK    0
#define KVS_EXIT_FAIL  1
#define KVS_EXIT_USAGE 2
#define KVS_EXIT_EXEC  127

int cmd_config(int argc, char **argv);
int cmd_stat(int argc, char **argv);
int cmd_reset(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_evict(int argc, char **argv);
int cmd_exporter(int argc, char **argv);
int cmd_prepare(int argc, char **argv);

/*
 * The checks of `kvshim check` (cmd_check.c): the KVSHIM_* environment, the configuration,
 * files.roots, the region in /dev/shm and (with check_library) the shim library.  Prints
 * each problem with a fix on stderr; unless quiet, each passed check on stdout.  Sets
 * *config_ok when the configuration loads.  Returns the number of problems.
 */
int tool_check(bool quiet, bool check_library, bool *config_ok);

/* Find libkvshim.so as `kvshim run` does ($KVSHIM_LIBRARY; beside this program; ../lib;
 * ../shim) and canonicalise it into lib (PATH_MAX); 0, or -errno with one line in why. */
int tool_find_library(char *lib, char *why, size_t whylen);

/* Format v bytes as a short human figure ("1.5 GiB", "512 B") into buf; returns buf. */
const char *tool_human_bytes(uint64_t v, char *buf, size_t len);

/* Print "kvshim: " and the formatted message and a newline on stderr. */
void tool_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Report a getopt_long failure of subcommand cmd (the option at argv[optind - 1]), then
 * print usage on stderr; returns KVS_EXIT_USAGE. */
int tool_bad_option(const char *cmd, int opt, char **argv, const char *usage);

/* Load the effective configuration (KVSHIM_CONFIG, /etc/kvshim/kvshim.ini, KVSHIM_* variables)
 * into a new heap object; on failure print the reason and return -EINVAL or -ENOMEM. */
int tool_load_config(struct kvs_config **out);

/* --config FILE of a subcommand: make FILE the configuration that tool_load_config reads
 * (KVSHIM_CONFIG); 0, or -errno after saying why. */
int tool_use_config(const char *file);

/* Set to 1 by SIGINT or SIGTERM once tool_catch_stop has run (stop.c). */
extern volatile sig_atomic_t tool_stop;

/* Block SIGINT and SIGTERM and catch them into tool_stop; fills waitmask with the mask to
 * wait under (ppoll), which lets them in.  0 or -errno. */
int tool_catch_stop(sigset_t *waitmask);

#endif
