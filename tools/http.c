/*
 * http: the kvshim command's HTTP server (http.h), the exporter's.
 *
 * DESIGN: one thread and one ppoll loop over the listening socket and at most MAX_CONNS
 * connections, all non-blocking.  A connection reads its request head (at most REQ_MAX bytes)
 * until the blank line; the response is then built whole in memory (the handler runs there,
 * synchronously) and written as the socket takes it, with Connection: close.  After the
 * response the write side is shut down and what the client still sends is read and dropped,
 * so that closing does not reset the connection under the response.  Every connection has one
 * deadline, CONN_TIMEOUT_MS after accept, for all of that; a client that is too slow gets 408
 * (if nothing was written yet) and is closed.  A slow client therefore delays no one: the
 * others are served by the same loop meanwhile.  Nor do idle ones: the listening socket is
 * always polled, and a connection that finds every slot taken takes the slot of the oldest
 * connection that has its response already (draining) or, failing that, of the oldest one
 * still reading its request after GRACE_MS (it gets 503): a scraper sends its request at once,
 * an idle client may never; the grace keeps a burst of new connections from taking each
 * other's slots before their requests come.  A request line that cannot be one (no method,
 * path and version, or a NUL byte anywhere in the head) is answered 400 as soon as it is seen,
 * not at the blank line that may never come.  SIGINT and SIGTERM are let in only inside ppoll
 * (stop.c) and end the loop.
 *
 * Connection states: C_READ (reading the head) -> C_WRITE (response built) -> C_DRAIN (write
 * side shut, reading until the client closes) -> C_FREE; a connection without a response
 * (out of memory) goes to C_DRAIN with none and is closed at its next event.
 */
#include "http.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cmd_common.h"

#define MAX_CONNS	16
#define REQ_MAX		8192
#define CONN_TIMEOUT_MS 10000
#define DRAIN_MS	1000
#define GRACE_MS	200 /* a connection this young is never taken for an idle one */

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

/* One tool_http_serve() call; lives on its stack (as the exporter's state did). */
struct server {
	tool_http_handler handler;
	void *arg;
	const char *who; /* the prefix of its messages */
	struct conn conns[MAX_CONNS];
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int tool_http_listen(const char *spec, char *msg, size_t msglen)
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

/* The request head in c->req is complete: parse its request line, ask the handler, and set
 * the response. */
static void handle(struct server *sv, struct conn *c)
{
	char *line = c->req, *sp1, *sp2, *eol, *q;
	struct tool_http_reply reply = {0};
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
	sv->handler(sv->arg, line, sp1 + 1, &reply);
	if (!reply.type) {
		free(reply.body);
		respond_text(c, reply.status, reply.extra, head);
		return;
	}
	respond(c, reply.status, reply.type, reply.extra, reply.body, reply.bodylen, head);
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
static void on_read(struct server *sv, struct conn *c)
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
		handle(sv, c);
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
static struct conn *slot_to_take(struct server *sv, uint64_t now, uint64_t *when)
{
	struct conn *drain = NULL, *read = NULL;

	*when = UINT64_MAX;
	for (int i = 0; i < MAX_CONNS; i++) {
		struct conn *c = &sv->conns[i];

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
static struct conn *slot_for_new(struct server *sv)
{
	uint64_t when;
	struct conn *c = slot_to_take(sv, now_ms(), &when);
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
static void on_accept(struct server *sv, int lfd)
{
	for (int k = 0; k < MAX_CONNS; k++) {
		struct conn *c = slot_for_new(sv);
		int fd;

		if (!c)
			return; /* none can be had now: the next loop comes back */
		fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				tool_err("%s: accept: %s", sv->who, strerror(errno));
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

int tool_http_serve(int lfd, const sigset_t *waitmask, const char *who, tool_http_handler handler,
		    void *arg)
{
	struct pollfd pfd[MAX_CONNS + 1];
	int slot[MAX_CONNS + 1];
	struct server server = {.handler = handler, .arg = arg, .who = who}, *sv = &server;
	int r, status = KVS_EXIT_OK;

	while (!tool_stop) {
		uint64_t now = now_ms(), next = UINT64_MAX;
		struct timespec wait;
		int n = 0;

		for (int i = 0; i < MAX_CONNS; i++) {
			struct conn *c = &sv->conns[i];

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
		if (slot_to_take(sv, now, &grace_end)) { /* a slot can be had (slot_for_new) */
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
		r = ppoll(pfd, (nfds_t)n, next == UINT64_MAX ? NULL : &wait, waitmask);
		if (r < 0 && errno != EINTR) {
			tool_err("%s: cannot wait: %s", who, strerror(errno));
			status = KVS_EXIT_FAIL;
			break;
		}
		for (int j = 0; r > 0 && j < n; j++) {
			struct conn *c;

			if (!pfd[j].revents)
				continue;
			if (slot[j] < 0) {
				on_accept(sv, lfd);
				continue;
			}
			c = &sv->conns[slot[j]];
			if (c->state == C_READ)
				on_read(sv, c);
			if (c->state == C_WRITE)
				on_write(c);
			else if (c->state == C_DRAIN && c->out && c->off == c->outlen)
				on_drain(c);
			else if (c->state == C_DRAIN)
				conn_close(c); /* no response could be built */
		}
	}
	for (int i = 0; i < MAX_CONNS; i++)
		if (sv->conns[i].state != C_FREE)
			conn_close(&sv->conns[i]);
	return status;
}
