/*
 * textout: the region's strings written as JSON and Prometheus text.  Paths, host names and
 * region names are bytes, not text: a root cut inside a UTF-8 character, or a host name in
 * another encoding, must not make `stat --json` invalid JSON or a scrape that Prometheus
 * rejects whole.  Each byte that is not part of a valid UTF-8 sequence (RFC 3629: no overlong
 * form, no surrogate, nothing past U+10FFFF) is written as U+FFFD.
 */
#ifndef KVS_TOOLS_TEXTOUT_H
#define KVS_TOOLS_TEXTOUT_H

#include <stdio.h>

/* s as a JSON string literal, quotes included: '"' and '\\' escaped, control characters as
 * \u00XX, every invalid byte as \ufffd. */
void tool_json_string(FILE *f, const char *s);

/* s as a Prometheus label value, quotes included: '"', '\\' and newline escaped as the text
 * format asks, every invalid byte as U+FFFD in UTF-8. */
void tool_prom_label(FILE *f, const char *s);

#endif
