/*
 * stdio_reader: reads a KV file through stdio the way llama.cpp restores a saved slot
 * (llama_file: small header freads, then one large fread per K and V tensor of each layer),
 * mixed with fseek, ftell, fgetc, ungetc and a read across the end, printing for every call
 * its answer, the stream's position, EOF and error flags and a checksum of the bytes.  The
 * e2e test compares its output with and without the shim, line for line.
 *   stdio_reader FILE
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned char buf[4 << 20];

static uint32_t sum(const unsigned char *p, size_t n)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

static void show(FILE *f, const char *what, long r, size_t bytes)
{
	printf("%-24s -> %ld, ftell %ld, eof %d, error %d, sum %08x\n", what, r, ftell(f), feof(f),
	       ferror(f), sum(buf, bytes));
}

static void rd(FILE *f, const char *what, size_t size, size_t n)
{
	size_t k = fread(buf, size, n, f);

	show(f, what, (long)k, k * size);
}

int main(int argc, char **argv)
{
	FILE *f = argc == 2 ? fopen(argv[1], "rb") : NULL;

	if (!f) {
		fprintf(stderr, "usage: stdio_reader FILE\n");
		return 2;
	}
	/* The session header: magic, version, token count, the tokens. */
	rd(f, "magic", 4, 1);
	rd(f, "version", 4, 1);
	rd(f, "n_tokens", 4, 1);
	rd(f, "tokens", 4, 1561);
	/* Per layer: a small record, then the tensor's bytes (about 600 KB each). */
	for (int layer = 0; layer < 4; layer++) {
		rd(f, "k type and size", 4, 2);
		rd(f, "k tensor", 1, 600000);
		rd(f, "v type and size", 4, 2);
		rd(f, "v tensor", 1, 600000);
	}
	show(f, "fseek 1000", fseek(f, 1000, SEEK_SET), 0);
	rd(f, "8 bytes", 1, 8);
	show(f, "fgetc", fgetc(f), 0);
	show(f, "ungetc", ungetc('x', f), 0);
	rd(f, "after ungetc", 1, 700000);
	show(f, "fseek -100 from end", fseek(f, -100, SEEK_END), 0);
	rd(f, "across the end", 1, 600000);
	clearerr(f);
	show(f, "fseek 0", fseek(f, 0, SEEK_SET), 0);
	rd(f, "1 MiB in 64 KiB items", 65536, 16);
	rd(f, "3 MiB", 1, 3 << 20);
	fclose(f);
	return 0;
}
