/*
 * kvshim run [--config FILE] [--strict] -- CMD [ARGS...]: exec CMD with the shim preloaded.
 *
 * First the checks of `kvshim check` run once (tool_check, quiet: problems only).  On a problem
 * --strict refuses to start CMD (status 1); by default CMD starts with KVSHIM_ENABLE=0, and when
 * the configuration itself does not load, without the library in LD_PRELOAD at all: the shim
 * reads its configuration before KVSHIM_ENABLE, and every rank would print the same error.
 *
 * The library is the first of: $KVSHIM_LIBRARY; libkvshim.so beside this program; ../lib and
 * ../shim relative to it (an installed tree and the build tree).  It is put first in
 * LD_PRELOAD, ahead of what was there (minus any earlier copy of itself), so that its hooks
 * win.  --config FILE sets KVSHIM_CONFIG to FILE's absolute path, so that a CMD that changes
 * directory still finds it.  Exit status: CMD's own once exec succeeds; 1 when the library or
 * the file cannot be found; 127 when CMD cannot be executed.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd_common.h"
#include "config.h"

static const char usage[] =
    "usage: kvshim run [--config FILE] [--strict] -- CMD [ARGS...]\n"
    "  -c, --config FILE  use the INI file FILE (sets KVSHIM_CONFIG)\n"
    "  -s, --strict       refuse to start CMD when `kvshim check` finds a problem\n"
    "  -h, --help         print this help\n"
    "Before CMD starts, the checks of `kvshim check` run once; their problems are printed,\n"
    "and CMD starts with the shim off (KVSHIM_ENABLE=0; not preloaded at all when the\n"
    "configuration does not load, so that no process repeats its error).\n"
    "The shim library is $KVSHIM_LIBRARY, else " SHIM_NAME " in this program's folder,\n"
    "in ../lib or in ../shim relative to it.\n";

struct run_opts {
	const char *config;
	bool strict;
};

/* --config FILE, --strict. */
static int on_opt(void *arg, int opt, const char *optarg)
{
	struct run_opts *o = arg;

	if (opt == 'c')
		o->config = optarg;
	else
		o->strict = true;
	return 0;
}

int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"strict", no_argument, NULL, 's'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct run_opts o = {0};
	/* "+": stop at the first non-option, so that CMD's own options are left to CMD.  --config
	 * is run's own: the file is checked and made absolute before the engine gets it. */
	const struct tool_cmdline cl = {.cmd = "run",
					.usage = usage,
					.optstring = "+:c:sh",
					.opts = opts,
					.on_opt = on_opt,
					.arg = &o,
					.need = "no command given"};
	char lib[PATH_MAX], conf[PATH_MAX], why[KVS_CONFIG_MSG_MAX];
	const char *config;
	bool strict, config_ok = true;
	int r = tool_parse_cmdline(&cl, argc, argv), problems;

	if (r != TOOL_GO_ON)
		return r;
	config = o.config;
	strict = o.strict;
	if (config) {
		r = tool_usable_file(config, conf);
		if (r) {
			tool_err("%s: %s", config, strerror(-r));
			return KVS_EXIT_FAIL;
		}
		if (setenv("KVSHIM_CONFIG", conf, 1) < 0) {
			tool_err("cannot set KVSHIM_CONFIG: %s", strerror(errno));
			return KVS_EXIT_FAIL;
		}
	}
	if (tool_find_library(lib, why, sizeof(why))) {
		tool_err("%s", why);
		return KVS_EXIT_FAIL;
	}
	/* Once, here, rather than once per rank inside the engine. */
	problems = tool_check(true, false, &config_ok);
	if (problems && strict) {
		tool_err("run: %d problem%s; not starting %s (--strict)", problems,
			 problems == 1 ? "" : "s", argv[optind]);
		return KVS_EXIT_FAIL;
	}
	if (problems) {
		tool_err("run: %d problem%s; starting %s with the shim off%s", problems,
			 problems == 1 ? "" : "s", argv[optind],
			 config_ok ? " (KVSHIM_ENABLE=0)" : " (not preloaded)");
		if (setenv("KVSHIM_ENABLE", "0", 1) < 0) {
			tool_err("cannot set KVSHIM_ENABLE: %s", strerror(errno));
			return KVS_EXIT_FAIL;
		}
	}
	if (config_ok && tool_set_preload(lib, true))
		return KVS_EXIT_FAIL;
	fflush(stdout);
	execvp(argv[optind], argv + optind);
	tool_err("%s: %s", argv[optind], strerror(errno));
	return KVS_EXIT_EXEC;
}
