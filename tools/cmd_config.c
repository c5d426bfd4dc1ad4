/*
 * kvshim config [--explain | --sample]: print the effective configuration (design.md §6), one
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

int cmd_config(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"explain", no_argument, NULL, 'e'},
	    {"sample", no_argument, NULL, 's'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct kvs_config *cfg;
	bool explain = false, sample = false;
	int opt, status = KVS_EXIT_OK;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "+:esh", opts, NULL)) != -1) {
		switch (opt) {
		case 'e':
			explain = true;
			break;
		case 's':
			sample = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return KVS_EXIT_OK;
		default:
			return tool_bad_option("config", opt, argv, usage);
		}
	}
	if (optind < argc) {
		tool_err("config: unexpected argument %s", argv[optind]);
		fputs(usage, stderr);
		return KVS_EXIT_USAGE;
	}
	if (sample && explain) {
		tool_err("config: --explain and --sample exclude each other");
		fputs(usage, stderr);
		return KVS_EXIT_USAGE;
	}
	if (sample) {
		if (kvs_config_sample(stdout)) {
			tool_err("config: cannot write the sample");
			return KVS_EXIT_FAIL;
		}
		return KVS_EXIT_OK;
	}
	if (tool_load_config(&cfg))
		return KVS_EXIT_FAIL;
	if (kvs_config_print(cfg, stdout, explain)) {
		tool_err("config: cannot write the listing");
		status = KVS_EXIT_FAIL;
	}
	free(cfg);
	return status;
}
