/*
 * kvshim: the operator's command (docs/operations.md, "The `kvshim` command").
 *
 *   kvshim check [--config FILE]                  check the configuration and the node
 *   kvshim run [--config FILE] [--strict] -- CMD [ARGS...]   run CMD with the shim preloaded
 *   kvshim stat [--json | --prom] [--watch SEC]   print the shared cache's figures
 *   kvshim config [--explain | --sample]          print the effective configuration
 *   kvshim reset [--force]                        remove the shared cache region
 *   kvshim ls [--all] [--json]                    list the regions in cache.dir
 *   kvshim evict PATH...                          drop the cached shards of files
 *   kvshim exporter --listen ADDR:PORT [--region NAME]...   serve /metrics to Prometheus
 *
 * This file picks the subcommand and holds the helpers the subcommands share for output; each
 * subcommand lives in its own cmd_<name>.c and parses its own options with tool_parse_cmdline
 * (cmdline.c, which also loads the configuration and names the region).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cmd_common.h"

const char *tool_human_bytes(uint64_t v, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double x = (double)v;
	int u = 0;

	while (x >= 1024.0 && u < 5) {
		x /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", v);
	else
		snprintf(buf, len, "%.1f %s", x, unit[u]);
	return buf;
}

static const char usage[] =
    "usage: kvshim COMMAND [OPTIONS]\n"
    "\n"
    "Commands:\n"
    "  check [--config FILE]\n"
    "                      check the configuration and the node before a launch\n"
    "  run [--config FILE] [--strict] -- CMD [ARGS...]\n"
    "                      run CMD with libkvshim.so prepended to LD_PRELOAD, after the checks\n"
    "  stat [--json | --prom] [--watch SEC]\n"
    "                      print the shared cache's figures (text, JSON or Prometheus)\n"
    "  config [--explain | --sample]\n"
    "                      print the effective configuration and where each value came from,\n"
    "                      or a sample kvshim.ini with every key and its default\n"
    "  prepare [--config FILE] [--threads N]\n"
    "                      create the region and give all its slots their memory now, before\n"
    "                      the engines start (stops at cache.shm_headroom)\n"
    "  prefetch [--config FILE] [--max BYTES] PATH...\n"
    "                      load files and directories under files.roots into the region\n"
    "                      before the engines ask, at background priority\n"
    "  reset [--force]     remove the shared cache region (refused while processes are attached)\n"
    "  ls [--all] [--json] list the regions in cache.dir: size, age, processes, state\n"
    "  evict PATH...       drop the cached shards of each file\n"
    "  exporter --listen ADDR:PORT [--region NAME]...\n"
    "                      serve the regions' figures to Prometheus over HTTP (GET /metrics)\n"
    "  remote [--config FILE]\n"
    "                      run the node's remote helper (remote.kind = mooncake): misses ask\n"
    "                      a Mooncake Store pool before storage, loads are published there\n"
    "\n"
    "  -h, --help          print this help; `kvshim COMMAND --help` describes one command\n"
    "  -V, --version       print the version of kvshim\n"
    "\n"
    "The configuration is the INI file named by KVSHIM_CONFIG (else /etc/kvshim/kvshim.ini if\n"
    "present, else the defaults), with any key overridden as KVSHIM_<SECTION>_<KEY>.\n"
    "KVSHIM_LIBRARY names the shim library that `kvshim run` preloads.\n";

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
} commands[] = {
    {"run", cmd_run},		{"stat", cmd_stat},	    {"config", cmd_config},
    {"reset", cmd_reset},	{"check", cmd_check},	    {"ls", cmd_ls},
    {"evict", cmd_evict},	{"exporter", cmd_exporter}, {"prepare", cmd_prepare},
    {"prefetch", cmd_prefetch}, {"remote", cmd_remote},
};

void tool_err(const char *fmt, ...)
{
	va_list ap;

	fputs("kvshim: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* Flush stdout and turn a write error (a full disk, a closed pipe) into a failure status. */
static int finish(int status)
{
	if (fflush(stdout) || ferror(stdout)) {
		tool_err("cannot write the output: %s", strerror(errno));
		return status ? status : KVS_EXIT_FAIL;
	}
	return status;
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : NULL;

	if (!cmd) {
		fputs(usage, stderr);
		return KVS_EXIT_USAGE;
	}
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
		fputs(usage, stdout);
		return finish(KVS_EXIT_OK);
	}
	if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
		puts("kvshim " KVS_VERSION);
		return finish(KVS_EXIT_OK);
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (!strcmp(cmd, commands[i].name))
			return finish(commands[i].fn(argc - 1, argv + 1));
	}
	if (cmd[0] == '-')
		tool_err("unknown option %s", cmd);
	else
		tool_err("unknown command %s", cmd);
	fputs(usage, stderr);
	return KVS_EXIT_USAGE;
}
