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

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "config.h" /* KVS_CONFIG_STR_MAX */
#include "params.h" /* struct kvs_cache_params */

struct option;

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
int cmd_prefetch(int argc, char **argv);
int cmd_remote(int argc, char **argv);

/*
 * The checks of `kvshim check` (cmd_check.c): the KVSHIM_* environment, the configuration,
 * files.roots, the region in /dev/shm and (with check_library) the shim library.  Prints
 * each problem with a fix on stderr; unless quiet, each passed check on stdout.  Sets
 * *config_ok when the configuration loads.  Returns the number of problems.
 */
int tool_check(bool quiet, bool check_library, bool *config_ok);

/* Is path (a real path) one of the colon-separated list's directories (files.roots,
 * files.write_once), or under one?  Each listed directory is taken by its real path
 * (cmd_check.c). */
bool tool_listed_under(const char *list, const char *path);

/* The shim's file name, as installed and as built. */
#define SHIM_NAME "libkvshim.so"

/* Find libkvshim.so ($KVSHIM_LIBRARY; beside this program; ../lib; ../shim), for `kvshim run`
 * and `kvshim check`, and canonicalise it into lib (PATH_MAX); 0, or -errno with one line in
 * why (library.c). */
int tool_find_library(char *lib, char *why, size_t whylen);

/* Put lib in LD_PRELOAD, first (an engine's: its hooks win) or last (a sanitizer's runtime, and
 * whatever else is there, stays ahead), dropping any earlier copy of it; 0 or -errno, said
 * (library.c). */
int tool_set_preload(const char *lib, bool first);
/* Canonicalise a readable file's path into out (PATH_MAX); 0 or -errno (library.c). */
int tool_usable_file(const char *path, char *out);

/* Format v bytes as a short human figure ("1.5 GiB", "512 B") into buf; returns buf. */
const char *tool_human_bytes(uint64_t v, char *buf, size_t len);

/* Print "kvshim: " and the formatted message and a newline on stderr. */
void tool_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * A subcommand's command line, for tool_parse_cmdline (cmdline.c).  optstring and opts are
 * getopt_long's (optstring starts with "+:": stop at the first operand, report a missing
 * argument as ':').  -h/--help prints usage on stdout and ends with KVS_EXIT_OK; with
 * use_config, -c/--config FILE names the configuration file (KVSHIM_CONFIG) for
 * tool_load_config.  Every other option goes to on_opt(arg, opt, optarg), which returns 0 to
 * go on or an exit status to end with (having said why).  need: NULL when the subcommand takes
 * no operand ("CMD: unexpected argument X"), else what to say when none is given ("no file
 * named").  Each usage error prints "kvshim: CMD: ..." and then usage on stderr.
 */
struct tool_cmdline {
	const char *cmd;
	const char *usage;
	const char *optstring;
	const struct option *opts;
	bool use_config;
	int (*on_opt)(void *arg, int opt, const char *optarg);
	void *arg;
	const char *need;
};

/* tool_parse_cmdline's answer when the subcommand goes on, its operands at argv[optind]. */
#define TOOL_GO_ON (-1)

/* Parse argv as cl says; TOOL_GO_ON, or the exit status to return now (0 after --help). */
int tool_parse_cmdline(const struct tool_cmdline *cl, int argc, char **argv);

/* Load the effective configuration (KVSHIM_CONFIG, /etc/kvshim/kvshim.ini, KVSHIM_* variables)
 * into a new heap object; on failure print the reason and return -EINVAL or -ENOMEM. */
int tool_load_config(struct kvs_config **out);

/* The region of a configuration's shim.mode (cache.name, or the observe mode's region of keys):
 * its parameters, the name they may point to, its path. */
struct tool_region {
	struct kvs_cache_params params;
	char name[KVS_CONFIG_STR_MAX + 16];
	char path[PATH_MAX];
};

/* Fill region from cfg; 0, or -ENAMETOOLONG after saying "the region path is too long". */
int tool_region_of(const struct kvs_config *cfg, struct tool_region *region);

/* Set to 1 by SIGINT or SIGTERM once tool_catch_stop has run (stop.c). */
extern volatile sig_atomic_t tool_stop;

/* Block SIGINT and SIGTERM and catch them into tool_stop; fills waitmask with the mask to
 * wait under (ppoll), which lets them in.  0 or -errno. */
int tool_catch_stop(sigset_t *waitmask);

/* The record of the warnings the launcher said on this node for the region at region_path
 * (cmd_check.c, said_before): a dotfile beside it, ".<region's name>.said", which `kvshim ls`
 * does not take for a region and `kvshim reset` removes.  0, or -1 when it does not fit. */
static inline int tool_said_path(const char *region_path, char *buf, size_t len)
{
	const char *slash = strrchr(region_path, '/');
	int n = slash ? snprintf(buf, len, "%.*s/.%s.said", (int)(slash - region_path), region_path,
				 slash + 1)
		      : -1;

	return n < 0 || (size_t)n >= len ? -1 : 0;
}

#endif
