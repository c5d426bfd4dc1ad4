/*
 * stream: what the fread and fwrite doors (hooks/posix.c) do with a stdio stream once they
 * have made a call a candidate: a large fread served around glibc's buffer, and an fwrite of a
 * KV file's stream staged for write-through at the stream's position.  Reaches glibc's own
 * fread and fwrite through kvs_real (real.h).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include "real.h"
#include "shim.h"
#include "stream.h"
#include "wthru.h"

/*
 * glibc's fread reads through its own buffer, not through read().  A large fread is served
 * around it, as glibc would read: the bytes buffered already ([_IO_read_ptr, _IO_read_end))
 * are copied out and consumed, the rest is served from the descriptor's position (glibc keeps
 * it at the end of what it buffered), and the stream is moved there with fseeko (which drops
 * the buffer and keeps glibc's offset right).  A short count (end of file) or a read the cache
 * refuses lets the real fread go on from there, so the EOF and error flags are set as usual.
 * Not served, and counted (unserved_stdio): a stream with bytes waiting to be written, one
 * reading back ungetc'd bytes (glibc's backup area), a wide-oriented one.  A read that the
 * buffer holds, or whose rest is below files.min_read, is glibc's own.
 */
#define KVS_IO_IN_BACKUP 0x100 /* glibc's _IO_IN_BACKUP (libio.h): reading ungetc'd bytes */

size_t kvs_stream_read(void *ptr, size_t size, size_t total, FILE *f)
{
	size_t done = 0, have;
	ssize_t n = -1;
	off_t pos;

	flockfile(f);
	have = f->_IO_read_end > f->_IO_read_ptr ? (size_t)(f->_IO_read_end - f->_IO_read_ptr) : 0;
	if (f->_IO_write_ptr > f->_IO_write_base || (f->_flags & KVS_IO_IN_BACKUP) ||
	    f->_mode > 0) {
		kvs_shim_note_stdio(fileno_unlocked(f), total);
	} else if (have < total && kvs_shim_wants(total - have)) {
		int fd = fileno_unlocked(f), saved = errno;

		pos = fd >= 0 ? lseek(fd, 0, SEEK_CUR) : -1;
		errno = saved; /* a pipe's ESPIPE is not the program's */
		if (pos >= 0) {
			struct iovec v = {(char *)ptr + have, total - have};

			if (have) { /* a stream that has read nothing yet has no buffer at all */
				memcpy(ptr, f->_IO_read_ptr, have);
				f->_IO_read_ptr =
				    f->_IO_read_end; /* consumed, as glibc's copy would */
			}
			done = have;
			n = kvs_shim_read(fd, &v, 1, pos, false);
			if (n >= 0 && fseeko(f, pos + n, SEEK_SET) != 0)
				n = -1; /* cannot happen; the real call rereads the rest */
		}
	}
	if (n < 0) {
		/* From where the copy above left the stream: its buffer is consumed, the
		 * descriptor's position is the next byte. */
		done += kvs_real.fread((char *)ptr + done, 1, total - done, f);
		funlockfile(f);
		return done / size;
	}
	done += (size_t)n;
	if (done < total)
		done += kvs_real.fread((char *)ptr + done, 1, total - done, f);
	funlockfile(f);
	return done / size;
}

/*
 * fwrite puts bytes in the stream's buffer; they reach the file at the stream's position when
 * it flushes.  For write-through they are staged at that position (ftello, under the stream's
 * lock) and kept once fclose has flushed them (hooks/posix.c, fclose).  A stream in append mode
 * (O_APPEND on its descriptor) keeps nothing: its position is not where the bytes go.  A stream
 * found elsewhere than the last fwrite left it, here or at fclose, keeps nothing either: stdio
 * calls the shim does not hook (fputc, fprintf, fwrite_unlocked, putc_unlocked) wrote or moved it.
 */
size_t kvs_stream_write(const void *ptr, size_t size, size_t nmemb, size_t total, FILE *f)
{
	size_t done;
	struct kvs_wthru_op op;
	bool staged = false;

	flockfile(f);
	int fd = fileno_unlocked(f), saved = errno;
	off_t pos = fd >= 0 ? ftello(f) : -1;
	errno = saved; /* a pipe's ESPIPE is not the program's */
	struct iovec v = {(void *)ptr, total};
	if (pos >= 0) {
		kvs_shim_invalidate(fd, pos, total, false, 0);
		staged = kvs_shim_write_before(&op, fd, &v, 1, total, pos, true);
	}
	done = kvs_real.fwrite(ptr, size, nmemb, f);
	if (pos >= 0 && done > 0) { /* taken by the stream: a rewrite counts now */
		saved = errno;
		kvs_shim_invalidate(fd, pos, done * size, false, -(off_t)(done * size));
		errno = saved;
	}
	if (staged) {
		saved = errno;
		/* Short: the stream has an error now, and fclose will say so. */
		kvs_shim_write_after(&op, fd, done == nmemb ? (ssize_t)total : -1);
		errno = saved;
	}
	funlockfile(f);
	return done;
}
