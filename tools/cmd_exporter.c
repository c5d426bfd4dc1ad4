/*
 * kvshim exporter --listen ADDR:PORT [--region NAME]...: serve the figures of this user's
 * regions to Prometheus over HTTP (GET /metrics).
 *
 * DESIGN: the HTTP server is http.c's (one thread, one ppoll loop, slow and idle clients
 * bounded there); this file answers its requests.  GET or HEAD /metrics scrapes synchronously,
 * on the server's thread: each region is mapped as a watcher, read and unmapped, as `kvshim
 * stat` does, so the exporter never attaches and never holds the region; the Prometheus text
 * is built whole in memory.  Any other path is 404, any other method 405.  A region that
 * cannot be read is kvshim_up 0, and its reason is printed on stderr once while it lasts.
 * SIGINT and SIGTERM end the server's loop, and the command exits 0.
 */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cmd_common.h"
#include "config.h"
#include "http.h"
#include "snapshot.h"

static const char usage[] =
    "usage: kvshim exporter --listen ADDR:PORT [--region NAME]...\n"
    "  -l, --listen ADDR:PORT  serve GET /metrics on this address (HOST:PORT, [IPV6]:PORT,\n"
    "                          :PORT for every address; port 0 picks a free one)\n"
    "  -r, --region NAME       export this region only (repeatable); by default every\n"
    "                          region of this user in cache.dir (/dev/shm)\n"
    "  -h, --help              print this help\n";

static const char prom_type[] = "text/plain; version=0.0.4; charset=utf-8";

struct exporter {
	struct kvs_config *cfg; /* the configuration; cache_name is set for each region read */
	char **names;		/* --region names, or NULL: every region of this user */
	int nnames;
	char *last_errs;	 /* the regions' errors last reported, so each is printed once */
	const char *listen_spec; /* --listen */
};

/* Print the one line that says where fd listens: "listening on http://ADDR:PORT/metrics". */
static void say_where(int fd)
{
	struct sockaddr_storage sa;
	socklen_t len = sizeof(sa);
	char host[NI_MAXHOST], port[NI_MAXSERV];

	if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0 ||
	    getnameinfo((struct sockaddr *)&sa, len, host, sizeof(host), port, sizeof(port),
			NI_NUMERICHOST | NI_NUMERICSERV)) {
		tool_err("exporter listening (address unknown: %s)", strerror(errno));
		return;
	}
	if (sa.ss_family == AF_INET6)
		tool_err("exporter listening on http://[%s]:%s/metrics", host, port);
	else
		tool_err("exporter listening on http://%s:%s/metrics", host, port);
}

/* Report on stderr the regions' errors in errs (one per line) unless they are those reported
 * last time; takes errs. */
static void report_errors(struct exporter *ex, char *errs)
{
	if (ex->last_errs && !strcmp(ex->last_errs, errs)) {
		free(errs);
		return;
	}
	for (const char *line = errs, *nl; *line; line = nl + 1) {
		nl = strchr(line, '\n');
		if (!nl)
			break;
		tool_err("exporter: %.*s", (int)(nl - line), line);
	}
	free(ex->last_errs);
	ex->last_errs = errs;
}

/*
 * Read the regions and print them as Prometheus text into a new heap buffer (*body, *len).
 * A region that cannot be read is kvshim_up 0 and its reason goes to stderr (once while it
 * lasts).  Returns 0 or -errno (-ENOMEM).
 */
static int scrape(struct exporter *ex, char **body, size_t *len)
{
	struct tool_snapshot *s = NULL;
	char **names = ex->names, *errs = NULL;
	size_t errlen = 0;
	FILE *f = NULL, *ef = NULL;
	int n = ex->nnames, r;

	if (!names) {
		n = tool_list_regions(ex->cfg->cache_dir, &names);
		if (n < 0) {
			tool_err("exporter: cannot list %s: %s", ex->cfg->cache_dir, strerror(-n));
			names = NULL;
			n = 0;
		}
	}
	s = n ? calloc((size_t)n, sizeof(*s)) : NULL;
	f = open_memstream(body, len);
	ef = open_memstream(&errs, &errlen);
	if ((n && !s) || !f || !ef) {
		r = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		snprintf(ex->cfg->cache_name, sizeof(ex->cfg->cache_name), "%s", names[i]);
		ex->cfg->shim_mode = KVS_MODE_SERVE; /* the name is the region's own */
		r = tool_snapshot_take(ex->cfg, &s[i]);
		/* A listed region removed since is simply gone; a named one is worth saying. */
		if (r == -ENOENT && ex->names)
			fprintf(ef, "no region at %s\n", s[i].path);
		else if (r && r != -ENOENT)
			fprintf(ef, "%s\n", s[i].msg);
	}
	r = tool_prom_write(f, s, n);
out:
	if (f && fclose(f) && !r)
		r = -ENOMEM;
	if (ef && fclose(ef) == 0) {
		report_errors(ex, errs);
		errs = NULL;
	}
	free(errs);
	for (int i = 0; s && i < n; i++)
		tool_snapshot_free(&s[i]);
	free(s);
	if (names != ex->names)
		tool_names_free(names, n);
	if (r && f) {
		free(*body);
		*body = NULL;
	}
	return r;
}

/* The server's handler (http.h): /metrics by GET or HEAD, scraped now. */
static void on_request(void *arg, const char *method, const char *path,
		       struct tool_http_reply *reply)
{
	struct exporter *ex = arg;

	if (strcmp(path, "/metrics")) {
		reply->status = "404 Not Found";
		return;
	}
	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		reply->status = "405 Method Not Allowed";
		reply->extra = "Allow: GET, HEAD\r\n";
		return;
	}
	if (scrape(ex, &reply->body, &reply->bodylen)) {
		reply->status = "500 Internal Server Error";
		return;
	}
	reply->status = "200 OK";
	reply->type = prom_type;
}

/* Serve on lfd until SIGINT or SIGTERM; returns an exit status. */
static int serve(struct exporter *ex, int lfd)
{
	sigset_t waitmask;
	int r;

	r = tool_catch_stop(&waitmask);
	if (r) {
		tool_err("cannot catch signals: %s", strerror(-r));
		return KVS_EXIT_FAIL;
	}
	say_where(lfd);
	return tool_http_serve(lfd, &waitmask, "exporter", on_request, ex);
}

/* Add name to ex->names unless it is there already; 0 or -ENOMEM. */
static int add_name(struct exporter *ex, const char *name)
{
	char **v;

	for (int i = 0; i < ex->nnames; i++)
		if (!strcmp(ex->names[i], name))
			return 0;
	v = realloc(ex->names, (size_t)(ex->nnames + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	ex->names = v;
	v[ex->nnames] = strdup(name);
	if (!v[ex->nnames])
		return -ENOMEM;
	ex->nnames++;
	return 0;
}

/* --listen ADDR:PORT, --region NAME (repeatable). */
static int on_opt(void *arg, int opt, const char *optarg)
{
	struct exporter *ex = arg;

	if (opt == 'l') {
		ex->listen_spec = optarg;
		return 0;
	}
	if (!tool_region_name_ok(optarg)) {
		tool_err("exporter: --region %s: not a region name (allowed: A-Z a-z 0-9 . _ -)",
			 optarg);
		return KVS_EXIT_USAGE;
	}
	if (add_name(ex, optarg)) {
		tool_err("out of memory");
		return KVS_EXIT_FAIL;
	}
	return 0;
}

int cmd_exporter(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"listen", required_argument, NULL, 'l'},
	    {"region", required_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct exporter ex = {0};
	const struct tool_cmdline cl = {.cmd = "exporter",
					.usage = usage,
					.optstring = "+:l:r:h",
					.opts = opts,
					.on_opt = on_opt,
					.arg = &ex};
	char msg[KVS_CONFIG_MSG_MAX];
	int lfd = -1, status = tool_parse_cmdline(&cl, argc, argv);

	if (status != TOOL_GO_ON)
		goto out;
	status = KVS_EXIT_USAGE;
	if (!ex.listen_spec) {
		tool_err("exporter: --listen ADDR:PORT is required");
		fputs(usage, stderr);
		goto out;
	}
	status = KVS_EXIT_FAIL;
	if (tool_load_config(&ex.cfg))
		goto out;
	lfd = tool_http_listen(ex.listen_spec, msg, sizeof(msg));
	if (lfd < 0) {
		tool_err("exporter: %s", msg);
		goto out;
	}
	status = serve(&ex, lfd);
	close(lfd);
out:
	tool_names_free(ex.names, ex.nnames);
	free(ex.last_errs);
	free(ex.cfg);
	return status;
}
