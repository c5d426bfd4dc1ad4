/*
 * kvshim exporter --listen ADDR:PORT [--region NAME]...: serve the figures of this user's
 * regions to Prometheus over HTTP (GET /metrics).
 *
 * DESIGN: one thread and one ppoll loop over the listening socket and at most MAX_CONNS
 * connections, all non-blocking.  A connection reads its request head (at most REQ_MAX bytes)
 * until the blank line; the response is then built whole in memory (the scrape happens there,
 * synchronously: each region is mapped as a watcher, read and unmapped, as `kvshim stat` does,
 * so the exporter never attaches and never holds the region) and written as the socket takes
 * it, with Connection: close.  After the response the write side is shut down and what the
 * client still sends is read and dropped, so that closing does not reset the connection
 * under the response.  Every connection has one deadline, CONN_TIMEOUT_MS after accept, for
 * all of that; a client that is too slow gets 408 (if nothing was written yet) and is closed.
 * A slow client therefore delays no one: the others are served by the same loop meanwhile.
 * Nor do idle ones: the listening socket is always polled, and a connection that finds every
 * slot taken takes the slot of the oldest connection that has its response already (draining)
 * or, failing that, of the oldest one still reading its request after GRACE_MS (it gets 503):
 * a scraper sends its request at once, an idle client may never; the grace keeps a burst of
 * new connections from taking each other's slots before their requests come.  A request line that
 * cannot be one (no method, path and version, or a NUL byte anywhere in the head) is answered 400
 * as soon as it is seen, not at the blank line that may never come. SIGINT and SIGTERM are let in
 * only inside ppoll (stop.c) and end the loop with status 0.
 */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cmd_common.h"
#include "config.h"
#include "snapshot.h"

#define MAX_CONNS	16
#define REQ_MAX		8192
#define CONN_TIMEOUT_MS 10000
#define DRAIN_MS	1000
#define GRACE_MS	200 /* a connection this young is never taken for an idle one */

static const char usage[] =
    "usage: kvshim exporter --listen ADDR:PORT [--region NAME]...\n"
    "  -l, --listen ADDR:PORT  serve GET /metrics on this address (HOST:PORT, [IPV6]:PORT,\n"
    "                          :PORT for every address; port 0 picks a free one)\n"
    "  -r, --region NAME       export this region only (repeatable); by default every\n"
    "                          region of this user in cache.dir (/dev/shm)\n"
    "  -h, --help              print this help\n";

static const char prom_type[] = "text/plain; version=0.0.4; charset=utf-8";

enum conn_state { C_FREE, C_READ, C_WRITE, C_DRAIN };

struct conn {
	enum conn_state state;
	int fd;
	uint64_t accepted; /* CLOCK_MONOTONIC ms */
	uint64_t deadline; /* CLOCK_MONOTONIC ms */
	size_t len;	   /* bytes of req read */
	char req[REQ_MAX + 1];
	char *out; /* the response (heap) */
	size_t outlen, off;
};

struct exporter {
	struct kvs_config *cfg; /* the configuration; cache_name is set for each region read */
	char **names;		/* --region names, or NULL: every region of this user */
	int nnames;
	char *last_errs; /* the regions' errors last reported, so each is printed once */
	struct conn conns[MAX_CONNS];
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/*
 * Parse ADDR:PORT (HOST:PORT, [V6]:PORT, :PORT or *:PORT for every address), bind and listen
 * on the first address it resolves to that works.  Returns the descriptor (non-blocking), or
 * -errno with one line in msg.
 */
static int listen_on(const char *spec, char *msg, size_t msglen)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	char host[256], *port;
	struct addrinfo *res, *ai;
	int fd = -1, r, one = 1;
	char *end;
	long p;

	if (snprintf(host, sizeof(host), "%s", spec) >= (int)sizeof(host) ||
	    !(port = strrchr(host, ':'))) {
		snprintf(msg, msglen, "--listen %s: expected ADDR:PORT", spec);
		return -EINVAL;
	}
	*port++ = '\0';
	errno = 0;
	p = strtol(port, &end, 10);
	if (!*port || *end || errno || p < 0 || p > 65535) {
		snprintf(msg, msglen, "--listen %s: bad port %s", spec, port);
		return -EINVAL;
	}
	if (host[0] == '[') {
		size_t n = strlen(host);

		if (n < 3 || host[n - 1] != ']') {
			snprintf(msg, msglen, "--listen %s: expected [IPV6]:PORT", spec);
			return -EINVAL;
		}
		host[n - 1] = '\0';
		memmove(host, host + 1, n - 1);
	}
	r = getaddrinfo(host[0] && strcmp(host, "*") ? host : NULL, port, &hints, &res);
	if (r) {
		snprintf(msg, msglen, "--listen %s: %s", spec, gai_strerror(r));
		return -EINVAL;
	}
	r = -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
			    ai->ai_protocol);
		if (fd < 0) {
			r = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0)
			break;
		r = -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0) {
		snprintf(msg, msglen, "cannot listen on %s: %s", spec, strerror(-r));
		return r;
	}
	return fd;
}

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

/* Set c's response: status line, headers and (unless head_only) body, which is taken. */
static void respond(struct conn *c, const char *status, const char *type, const char *extra,
		    char *body, size_t bodylen, bool head_only)
{
	FILE *f;

	c->out = NULL;
	c->outlen = 0;
	c->off = 0;
	c->state = C_WRITE;
	f = open_memstream(&c->out, &c->outlen);
	if (f) {
		fprintf(f,
			"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
			"Connection: close\r\n\r\n",
			status, type, bodylen, extra ? extra : "");
		if (!head_only && bodylen)
			fwrite(body, 1, bodylen, f);
		if (fclose(f)) {
			free(c->out);
			c->out = NULL;
		}
	}
	free(body);
	if (!c->out) {
		c->outlen = 0; /* out of memory: close without a response */
		c->state = C_DRAIN;
	}
}

/* Respond with status and a one-line text body. */
static void respond_text(struct conn *c, const char *status, const char *extra, bool head_only)
{
	char *body = NULL;
	int n = asprintf(&body, "%s\n", status);

	if (n < 0)
		body = NULL;
	respond(c, status, "text/plain; charset=utf-8", extra, body, n < 0 ? 0 : (size_t)n,
		head_only);
}

/* The request head in c->req is complete: parse its request line and set the response. */
static void handle(struct exporter *ex, struct conn *c)
{
	char *line = c->req, *sp1, *sp2, *eol, *q;
	bool head;

	eol = strpbrk(line, "\r\n");
	*eol = '\0';
	sp1 = strchr(line, ' ');
	sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
	if (!sp1 || !sp2 || sp1 == line || sp2 == sp1 + 1 || strchr(sp2 + 1, ' ')) {
		respond_text(c, "400 Bad Request", NULL, false);
		return;
	}
	*sp1 = *sp2 = '\0';
	if (strcmp(sp2 + 1, "HTTP/1.1") && strcmp(sp2 + 1, "HTTP/1.0")) {
		respond_text(c, "505 HTTP Version Not Supported", NULL, false);
		return;
	}
	head = !strcmp(line, "HEAD");
	q = strchr(sp1 + 1, '?');
	if (q)
		*q = '\0'; /* a query string selects nothing here */
	if (strcmp(sp1 + 1, "/metrics")) {
		respond_text(c, "404 Not Found", NULL, head);
		return;
	}
	if (strcmp(line, "GET") && !head) {
		respond_text(c, "405 Method Not Allowed", "Allow: GET, HEAD\r\n", false);
		return;
	}

	char *body = NULL;
	size_t len = 0;

	if (scrape(ex, &body, &len)) {
		respond_text(c, "500 Internal Server Error", NULL, head);
		return;
	}
	respond(c, "200 OK", prom_type, NULL, body, len, head);
}

static void conn_close(struct conn *c)
{
	close(c->fd);
	free(c->out);
	c->out = NULL;
	c->state = C_FREE;
}

/* Whether the head read so far, req, may still be a request: its first line, once whole,
 * is three words (METHOD PATH VERSION) of printable characters, the version "HTTP/". */
static bool line_may_be_request(const char *req)
{
	const char *eol = strpbrk(req, "\r\n"), *last = NULL;
	int spaces = 0;

	if (!eol)
		return true; /* not whole yet: the length limit bounds it */
	for (const char *p = req; p < eol; p++) {
		if (*p == ' ') {
			spaces++;
			last = p;
		} else if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e) {
			return false;
		}
	}
	return spaces == 2 && eol - last > 5 && !strncmp(last + 1, "HTTP/", 5);
}

/* Read what c's client sent; when the request head is complete (or can no longer be), set
 * the response. */
static void on_read(struct exporter *ex, struct conn *c)
{
	ssize_t n = recv(c->fd, c->req + c->len, REQ_MAX - c->len, 0);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) { /* an error, or closed before a whole request */
		conn_close(c);
		return;
	}
	if (memchr(c->req + c->len, '\0', (size_t)n)) {
		respond_text(c, "400 Bad Request", NULL, false); /* no HTTP head has one */
		return;
	}
	c->len += (size_t)n;
	c->req[c->len] = '\0';
	if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n"))
		handle(ex, c);
	else if (!line_may_be_request(c->req))
		respond_text(c, "400 Bad Request", NULL, false);
	else if (c->len == REQ_MAX)
		respond_text(c, "431 Request Header Fields Too Large", NULL, false);
}

/* Write what the socket takes of c's response; once all is sent, shut the write side and
 * drain. */
static void on_write(struct conn *c)
{
	while (c->off < c->outlen) {
		ssize_t n = send(c->fd, c->out + c->off, c->outlen - c->off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {
			conn_close(c);
			return;
		}
		c->off += (size_t)n;
	}
	shutdown(c->fd, SHUT_WR);
	c->state = C_DRAIN;
	if (c->deadline > now_ms() + DRAIN_MS)
		c->deadline = now_ms() + DRAIN_MS;
}

/* Drop what the client still sends; close at its end. */
static void on_drain(struct conn *c)
{
	char buf[4096];
	ssize_t n = recv(c->fd, buf, sizeof(buf), 0);

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
		conn_close(c);
}

/* c is past its deadline: tell a client that has not had its response yet, then close. */
static void on_timeout(struct conn *c)
{
	if (c->state == C_READ) {
		static const char r408[] = "HTTP/1.1 408 Request Timeout\r\nContent-Type: "
					   "text/plain; charset=utf-8\r\nContent-Length: 20\r\n"
					   "Connection: close\r\n\r\n408 Request Timeout\n";

		/* Best effort, non-blocking: the client may not be reading either. */
		(void)send(c->fd, r408, sizeof(r408) - 1, MSG_NOSIGNAL);
	}
	conn_close(c);
}

/* The slot a new connection would take (slot_for_new), without taking it; NULL if none can
 * be had before *when (CLOCK_MONOTONIC ms: a reading one's grace ends; UINT64_MAX: never). */
static struct conn *slot_to_take(struct exporter *ex, uint64_t now, uint64_t *when)
{
	struct conn *drain = NULL, *read = NULL;

	*when = UINT64_MAX;
	for (int i = 0; i < MAX_CONNS; i++) {
		struct conn *c = &ex->conns[i];

		if (c->state == C_FREE)
			return c;
		if (c->state == C_DRAIN && (!drain || c->accepted < drain->accepted))
			drain = c;
		if (c->state == C_READ && now - c->accepted >= GRACE_MS &&
		    (!read || c->accepted < read->accepted))
			read = c;
		if (c->state == C_READ && now - c->accepted < GRACE_MS &&
		    c->accepted + GRACE_MS < *when)
			*when = c->accepted + GRACE_MS;
	}
	return drain ? drain : read;
}

/* A slot for a new connection: a free one, else the oldest draining one, else the oldest
 * still reading its request past its grace (told 503); NULL if none can be had now. */
static struct conn *slot_for_new(struct exporter *ex)
{
	uint64_t when;
	struct conn *c = slot_to_take(ex, now_ms(), &when);
	struct conn *drain = c && c->state == C_DRAIN ? c : NULL;
	struct conn *read = c && c->state == C_READ ? c : NULL;

	if (c && c->state == C_FREE)
		return c;
	if (drain) {
		conn_close(drain);
		return drain;
	}
	if (read) {
		static const char r503[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
					   "text/plain; charset=utf-8\r\nContent-Length: 24\r\n"
					   "Connection: close\r\n\r\n503 Service Unavailable\n";

		/* Best effort, non-blocking: an idle client may not be reading. */
		(void)send(read->fd, r503, sizeof(r503) - 1, MSG_NOSIGNAL);
		conn_close(read);
		return read;
	}
	return NULL;
}

/* Accept what waits on lfd, making room as slot_for_new says. */
static void on_accept(struct exporter *ex, int lfd)
{
	for (int k = 0; k < MAX_CONNS; k++) {
		struct conn *c = slot_for_new(ex);
		int fd;

		if (!c)
			return; /* none can be had now: the next loop comes back */
		fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				tool_err("exporter: accept: %s", strerror(errno));
			return;
		}
		c->fd = fd;
		c->state = C_READ;
		c->len = 0;
		c->out = NULL;
		c->accepted = now_ms();
		c->deadline = c->accepted + CONN_TIMEOUT_MS;
	}
}

/* Serve on lfd until SIGINT or SIGTERM; returns an exit status. */
static int serve(struct exporter *ex, int lfd)
{
	struct pollfd pfd[MAX_CONNS + 1];
	int slot[MAX_CONNS + 1];
	sigset_t waitmask;
	int r;

	r = tool_catch_stop(&waitmask);
	if (r) {
		tool_err("cannot catch signals: %s", strerror(-r));
		return KVS_EXIT_FAIL;
	}
	say_where(lfd);
	while (!tool_stop) {
		uint64_t now = now_ms(), next = UINT64_MAX;
		struct timespec wait;
		int n = 0;

		for (int i = 0; i < MAX_CONNS; i++) {
			struct conn *c = &ex->conns[i];

			if (c->state == C_FREE)
				continue;
			if (c->deadline <= now) {
				on_timeout(c);
				continue;
			}
			next = c->deadline < next ? c->deadline : next;
			pfd[n] = (struct pollfd){.fd = c->fd,
						 .events = c->state == C_WRITE ? POLLOUT : POLLIN};
			slot[n++] = i;
		}
		uint64_t grace_end;
		if (slot_to_take(ex, now, &grace_end)) { /* a slot can be had (slot_for_new) */
			pfd[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
			slot[n++] = -1;
		} else if (grace_end < next) {
			next = grace_end; /* look again when a reading one's grace is over */
		}
		if (next != UINT64_MAX) {
			wait.tv_sec = (time_t)((next - now) / 1000u);
			wait.tv_nsec = (long)((next - now) % 1000u) * 1000000L;
		}
		/* SIGINT and SIGTERM come in only here: none is lost between the check of
		 * tool_stop and the wait. */
		r = ppoll(pfd, (nfds_t)n, next == UINT64_MAX ? NULL : &wait, &waitmask);
		if (r < 0 && errno != EINTR) {
			tool_err("exporter: cannot wait: %s", strerror(errno));
			return KVS_EXIT_FAIL;
		}
		for (int j = 0; r > 0 && j < n; j++) {
			struct conn *c;

			if (!pfd[j].revents)
				continue;
			if (slot[j] < 0) {
				on_accept(ex, lfd);
				continue;
			}
			c = &ex->conns[slot[j]];
			if (c->state == C_READ)
				on_read(ex, c);
			if (c->state == C_WRITE)
				on_write(c);
			else if (c->state == C_DRAIN && c->out && c->off == c->outlen)
				on_drain(c);
			else if (c->state == C_DRAIN)
				conn_close(c); /* no response could be built */
		}
	}
	return KVS_EXIT_OK;
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

int cmd_exporter(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"listen", required_argument, NULL, 'l'},
	    {"region", required_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	char msg[KVS_CONFIG_MSG_MAX];
	struct exporter ex = {0};
	const char *listen_spec = NULL;
	int opt, lfd = -1, status = KVS_EXIT_USAGE;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "+:l:r:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'l':
			listen_spec = optarg;
			break;
		case 'r':
			if (!tool_region_name_ok(optarg)) {
				tool_err("exporter: --region %s: not a region name (allowed: "
					 "A-Z a-z 0-9 . _ -)",
					 optarg);
				goto out;
			}
			if (add_name(&ex, optarg)) {
				tool_err("out of memory");
				status = KVS_EXIT_FAIL;
				goto out;
			}
			break;
		case 'h':
			fputs(usage, stdout);
			status = KVS_EXIT_OK;
			goto out;
		default:
			status = tool_bad_option("exporter", opt, argv, usage);
			goto out;
		}
	}
	if (optind < argc) {
		tool_err("exporter: unexpected argument %s", argv[optind]);
		fputs(usage, stderr);
		goto out;
	}
	if (!listen_spec) {
		tool_err("exporter: --listen ADDR:PORT is required");
		fputs(usage, stderr);
		goto out;
	}
	status = KVS_EXIT_FAIL;
	if (tool_load_config(&ex.cfg))
		goto out;
	lfd = listen_on(listen_spec, msg, sizeof(msg));
	if (lfd < 0) {
		tool_err("exporter: %s", msg);
		goto out;
	}
	status = serve(&ex, lfd);
	for (int i = 0; i < MAX_CONNS; i++)
		if (ex.conns[i].state != C_FREE)
			conn_close(&ex.conns[i]);
	close(lfd);
out:
	tool_names_free(ex.names, ex.nnames);
	free(ex.last_errs);
	free(ex.cfg);
	return status;
}
