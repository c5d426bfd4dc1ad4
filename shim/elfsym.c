/*
 * elfsym: a symbol of a loaded object, found by reading its dynamic symbol table (see
 * elfsym.h).
 *
 * Why not dlsym: the shim interposes dlsym and dlvsym, so every call the shim makes to either
 * name binds to its own hook (symbols of an LD_PRELOAD object come first, for the object
 * itself too), and the hook needs glibc's functions to pass through to.  Here the shim asks no
 * one: ld.so's list of loaded objects (_r_debug.r_map, what debuggers read) gives each object's
 * dynamic section, which leads to its GNU hash table (or SysV hash table), symbol table,
 * strings and version definitions.
 *
 * Why not dl_iterate_phdr, and no libc at all: the first dlsym of a process may come from a
 * sanitizer runtime resolving its own interceptors before it is initialised, when any
 * intercepted libc function (and any instrumented code: this file is built without
 * sanitizers) would crash.  The walk reads the list without ld.so's lock; objects are appended
 * at its tail, and libc, which the walk looks for, is loaded before the program starts.
 *
 * The dynamic section's addresses are relocated in place by ld.so on the architectures we
 * build for; an address below the object's base is still an offset and is relocated here.
 */
#include <elf.h>
#include <link.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "elfsym.h"

struct want {
	const char *lib; /* prefix of the object's file name, after the last '/' */
	const char *name;
	const char *version; /* NULL: the default version */
	void *found;
};

struct tables {
	ElfW(Addr) base;
	const ElfW(Sym) * sym;
	const char *str;
	const uint32_t *gnu_hash;
	const uint32_t *sysv_hash;
	const ElfW(Half) * versym;
	const ElfW(Verdef) * verdef;
};

static bool same(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

static bool starts(const char *s, const char *prefix)
{
	while (*prefix && *s == *prefix)
		s++, prefix++;
	return !*prefix;
}

static uint32_t gnu_hash(const char *s)
{
	uint32_t h = 5381;

	for (; *s; s++)
		h = h * 33 + (unsigned char)*s;
	return h;
}

static const void *addr(const struct tables *t, ElfW(Addr) p)
{
	return (const void *)(p < t->base ? t->base + p : p);
}

/* Is symbol i defined with the wanted version (or, with none wanted, the default one)? */
static bool version_ok(const struct tables *t, uint32_t i, const char *version)
{
	if (!t->versym)
		return true; /* an object without versions: any version matches */
	ElfW(Half) ndx = t->versym[i];
	if (!version)
		return !(ndx & 0x8000); /* hidden: not the default */
	ndx &= 0x7fff;
	for (const ElfW(Verdef) *vd = t->verdef; vd;
	     vd = vd->vd_next ? (const void *)((const char *)vd + vd->vd_next) : NULL) {
		if (vd->vd_ndx != ndx)
			continue;
		const ElfW(Verdaux) *aux = (const void *)((const char *)vd + vd->vd_aux);
		return same(t->str + aux->vda_name, version);
	}
	return false;
}

static bool match(const struct tables *t, uint32_t i, const struct want *w)
{
	const ElfW(Sym) *s = &t->sym[i];

	/* Plain functions only: an IFUNC's table entry is its resolver, not the function. */
	return s->st_shndx != SHN_UNDEF && s->st_value && ELF64_ST_TYPE(s->st_info) == STT_FUNC &&
	       same(t->str + s->st_name, w->name) && version_ok(t, i, w->version);
}

static void *lookup(const struct tables *t, const struct want *w)
{
	if (t->gnu_hash) {
		const uint32_t *h = t->gnu_hash;
		uint32_t nbuckets = h[0], symoffset = h[1], bloom_size = h[2];
		const uint32_t *buckets =
		    (const uint32_t *)((const ElfW(Addr) *)(h + 4) + bloom_size);
		const uint32_t *chain = buckets + nbuckets;
		uint32_t hash = gnu_hash(w->name);

		if (!nbuckets)
			return NULL;
		for (uint32_t i = buckets[hash % nbuckets]; i >= symoffset; i++) {
			uint32_t ch = chain[i - symoffset];

			if ((ch | 1) == (hash | 1) && match(t, i, w))
				return (void *)(t->base + t->sym[i].st_value);
			if (ch & 1)
				break;
		}
		return NULL;
	}
	if (t->sysv_hash) {
		uint32_t nchain = t->sysv_hash[1];

		for (uint32_t i = 1; i < nchain; i++)
			if (match(t, i, w))
				return (void *)(t->base + t->sym[i].st_value);
	}
	return NULL;
}

/* Look w up in the object loaded at base whose dynamic section is dyn. */
static void *in_object(ElfW(Addr) base, const ElfW(Dyn) * d, const struct want *w)
{
	struct tables t = {.base = base};

	for (; d && d->d_tag != DT_NULL; d++) {
		switch (d->d_tag) {
		case DT_SYMTAB:
			t.sym = addr(&t, d->d_un.d_ptr);
			break;
		case DT_STRTAB:
			t.str = addr(&t, d->d_un.d_ptr);
			break;
		case DT_GNU_HASH:
			t.gnu_hash = addr(&t, d->d_un.d_ptr);
			break;
		case DT_HASH:
			t.sysv_hash = addr(&t, d->d_un.d_ptr);
			break;
		case DT_VERSYM:
			t.versym = addr(&t, d->d_un.d_ptr);
			break;
		case DT_VERDEF:
			t.verdef = addr(&t, d->d_un.d_ptr);
			break;
		}
	}
	return t.sym && t.str ? lookup(&t, w) : NULL;
}

void *kvs_elf_symbol(const char *lib, const char *name, const char *version)
{
	struct want w = {.lib = lib, .name = name, .version = version};

	for (const struct link_map *m = _r_debug.r_map; m; m = m->l_next) {
		const char *file = m->l_name, *p;

		if (!file)
			continue;
		for (p = file; *p; p++)
			if (*p == '/')
				file = p + 1;
		if (!starts(file, lib))
			continue;
		void *found = in_object(m->l_addr, m->l_ld, &w);
		if (found)
			return found;
	}
	return NULL;
}

void *kvs_elf_object_symbol(uintptr_t base, const void *dynamic, const char *name,
			    const char *version)
{
	struct want w = {.lib = "", .name = name, .version = version};

	return in_object((ElfW(Addr))base, dynamic, &w);
}
