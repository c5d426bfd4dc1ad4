/*
 * cmdline: what every kvshim subcommand does before its own work: parse its command line
 * (--help, --config FILE, the usage errors, the operands), load the configuration, name the
 * region of its shim.mode.  The messages are the subcommands' own, prefixed with their names.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_params.h"
#include "cmd_common.h"
#include "config.h"

/* Report a getopt_long failure of subcommand cmd (the option at argv[optind - 1]), then
 * print usage on stderr; returns KVS_EXIT_USAGE. */
static int bad_option(const char *cmd, int opt, char **argv, const char *cmd_usage)
{
	const char *arg = optind > 0 ? argv[optind - 1] : "?";

	if (opt == ':')
		tool_err("%s: option %s needs an argument", cmd, arg);
	else if (optopt && strncmp(arg, "--", 2))
		tool_err("%s: unknown option -%c", cmd, optopt);
	else
		tool_err("%s: unknown option %s", cmd, arg);
	fputs(cmd_usage, stderr);
	return KVS_EXIT_USAGE;
}

/* --config FILE of a subcommand: make FILE the configuration that tool_load_config reads
 * (KVSHIM_CONFIG); 0, or -errno after saying why. */
static int use_config(const char *file)
{
	int err;

	if (setenv("KVSHIM_CONFIG", file, 1) == 0)
		return 0;
	err = errno;
	tool_err("cannot set KVSHIM_CONFIG: %s", strerror(err));
	return -err;
}

int tool_load_config(struct kvs_config **out)
{
	char msg[KVS_CONFIG_MSG_MAX];
	struct kvs_config *cfg;
	int r;

	/* About 100 KiB of string fields: too big for the stack. */
	cfg = calloc(1, sizeof(*cfg));
	if (!cfg) {
		tool_err("out of memory");
		return -ENOMEM;
	}
	r = kvs_config_load(cfg, NULL, NULL, msg, sizeof(msg));
	if (r) {
		tool_err("%s", msg);
		free(cfg);
		return r;
	}
	*out = cfg;
	return 0;
}

int tool_parse_cmdline(const struct tool_cmdline *cl, int argc, char **argv)
{
	int opt, r;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, cl->optstring, cl->opts, NULL)) != -1) {
		if (opt == 'h') {
			fputs(cl->usage, stdout);
			return KVS_EXIT_OK;
		}
		if (opt == 'c' && cl->use_config) {
			if (use_config(optarg))
				return KVS_EXIT_FAIL;
			continue;
		}
		/* '?': an unknown option; ':' one without its argument. */
		if (opt == '?' || opt == ':' || !cl->on_opt)
			return bad_option(cl->cmd, opt, argv, cl->usage);
		r = cl->on_opt(cl->arg, opt, optarg);
		if (r)
			return r;
	}
	if (!cl->need && optind < argc) {
		tool_err("%s: unexpected argument %s", cl->cmd, argv[optind]);
		fputs(cl->usage, stderr);
		return KVS_EXIT_USAGE;
	}
	if (cl->need && optind >= argc) {
		tool_err("%s: %s", cl->cmd, cl->need);
		fputs(cl->usage, stderr);
		return KVS_EXIT_USAGE;
	}
	return TOOL_GO_ON;
}

int tool_region_of(const struct kvs_config *cfg, struct tool_region *region)
{
	if (kvs_cache_params_mode(cfg, &region->params, region->name, sizeof(region->name)) ||
	    kvs_cache_path(&region->params, region->path, sizeof(region->path))) {
		tool_err("the region path is too long");
		return -ENAMETOOLONG;
	}
	return 0;
}
