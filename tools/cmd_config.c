/*
 * kvshim config [--explain | --sample]: print the effective configuration (docs/config.md), one
 * "section.key = value" line per key; --explain adds each key's default, where its value came
 * from (default, file PATH:LINE, env VAR) and its help text.  --sample prints a commented INI
 * file with every key and its default instead (the installed share/kvshim/kvshim.ini); it
 * reads no configuration.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "cmd_common.h"
#include "config.h"
#include "print.h"

static const char usage[] =
    "usage: kvshim config [--explain | --sample]\n"
    "  -e, --explain  also print each key's default, the source of its value and its meaning\n"
    "  -s, --sample   print a sample kvshim.ini: every key, commented out, with its default\n"
    "  -h, --help     print this help\n";

struct config_opts {
	bool explain, sample;
};

/* --explain, --sample. */
static int on_opt(void *arg, int opt, const char *optarg)
{
	struct config_opts *o = arg;

	if (opt == 'e')
		o->explain = true;
	else
		o->sample = true;
	return 0;
}

int cmd_config(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"explain", no_argument, NULL, 'e'},
	    {"sample", no_argument, NULL, 's'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct config_opts o = {0};
	const struct tool_cmdline cl = {.cmd = "config",
					.usage = usage,
					.optstring = "+:esh",
					.opts = opts,
					.on_opt = on_opt,
					.arg = &o};
	struct kvs_config *cfg;
	int status = tool_parse_cmdline(&cl, argc, argv);

	if (status != TOOL_GO_ON)
		return status;
	status = KVS_EXIT_OK;
	if (o.sample && o.explain) {
		tool_err("config: --explain and --sample exclude each other");
		fputs(usage, stderr);
		return KVS_EXIT_USAGE;
	}
	if (o.sample) {
		if (kvs_config_sample(stdout)) {
			tool_err("config: cannot write the sample");
			return KVS_EXIT_FAIL;
		}
		return KVS_EXIT_OK;
	}
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	if (kvs_config_print(cfg, stdout, o.explain)) {
		tool_err("config: cannot write the listing");
		status = KVS_EXIT_FAIL;
	}
	free(cfg);
	return status;
}
