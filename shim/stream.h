/*
 * stream: the stdio work of the fread and fwrite doors (hooks/posix.c), on a stream they have
 * made a candidate.  Each answers as glibc's function of its name, errno included.
 */
#ifndef KVS_SHIM_STREAM_H
#define KVS_SHIM_STREAM_H

#include <stddef.h>
#include <stdio.h>

/* fread of total (size * nmemb, no overflow) bytes from f (not NULL), a read kvs_shim_wants:
 * served around glibc's buffer where it can be, glibc's fread for the rest; the count of whole
 * items read. */
size_t kvs_stream_read(void *ptr, size_t size, size_t total, FILE *f);

/* fwrite of total (size * nmemb, no overflow) bytes to f, a KV file's stream, with
 * write-through or a write-once root on: invalidated and staged at the stream's position
 * around glibc's fwrite; its answer. */
size_t kvs_stream_write(const void *ptr, size_t size, size_t nmemb, size_t total, FILE *f);

#endif
