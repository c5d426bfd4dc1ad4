/*
 * http: a small HTTP/1.x server for the kvshim command (the exporter's), one request per
 * connection, one thread.
 *
 * The server reads each request head, answers the malformed ones itself (400 for a request line
 * that cannot be one or a NUL byte, 505 for a version other than HTTP/1.0 and 1.1, 431 for a
 * head over 8 KiB, 408 past the connection's 10 s deadline, 503 to an idle client whose slot a
 * new one takes) and passes every other request to the caller's handler, with its method and
 * its path stripped of the query string.  Responses carry Content-Length and Connection: close;
 * a HEAD request gets the handler's headers without its body.
 */
#ifndef KVS_TOOLS_HTTP_H
#define KVS_TOOLS_HTTP_H

#include <signal.h>
#include <stddef.h>

/* A handler's response.  type NULL: a text/plain body that is the status and a newline
 * ("404 Not Found\n"), body ignored; else body (bodylen bytes, heap, which the server takes
 * and frees, NULL for none) of that Content-Type.  extra: more header lines, each ending in
 * "\r\n", or NULL. */
struct tool_http_reply {
	const char *status; /* "200 OK" */
	const char *type;
	const char *extra;
	char *body;
	size_t bodylen;
};

/* Answer one request into *reply (zeroed by the server beforehand); arg is the caller's.
 * Runs on the serving thread, which waits meanwhile: the other connections wait too. */
typedef void (*tool_http_handler)(void *arg, const char *method, const char *path,
				  struct tool_http_reply *reply);

/*
 * Parse ADDR:PORT (HOST:PORT, [V6]:PORT, :PORT or *:PORT for every address), bind and listen
 * on the first address it resolves to that works.  Returns the descriptor (non-blocking), or
 * -errno with one line in msg ("--listen SPEC: ..." or "cannot listen on SPEC: ...").
 */
int tool_http_listen(const char *spec, char *msg, size_t msglen);

/*
 * Serve requests on the listening descriptor lfd with handler(arg, ...) until tool_stop is set
 * (stop.c): the caller has run tool_catch_stop, and waitmask is the mask it filled, the only
 * one under which SIGINT and SIGTERM come in.  Failures of accept and of the wait are printed
 * prefixed with who ("kvshim: WHO: accept: ...").  Closes every connection before it returns
 * KVS_EXIT_OK, or KVS_EXIT_FAIL when it cannot wait; lfd stays the caller's.
 */
int tool_http_serve(int lfd, const sigset_t *waitmask, const char *who, tool_http_handler handler,
		    void *arg);

#endif
