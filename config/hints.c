/*
 * hints: the names kvshim reads, and the nearest known name to a misspelt one, for `kvshim
 * check` and `kvshim run` (an environment variable or a key that is not ours, a suggested fix
 * for a configuration error).
 *
 * Tool-only: in the kvs_config_tools library, which libkvshim.so does not link.  No state:
 * safe from any thread.
 */
#include "hints.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "keytab.h"

/* Longest name kvs_config_near compares; longer ones are near nothing. */
#define NEAR_MAX 64

/* A near miss is at most this many edits away (or ends in a known key, which counts as
 * NEAR_SUFFIX edits). */
#define NEAR_EDITS  3
#define NEAR_SUFFIX 2

/* Variables kvshim reads that are not keys. */
static const char *const env_extra[] = {"KVSHIM_CONFIG", "KVSHIM_ENABLE", "KVSHIM_LIBRARY"};

bool kvs_config_env_known(const char *name, size_t len)
{
	char var[KVS_ENV_NAME_MAX];

	if (len >= 12 && !strncmp(name, "KVSHIM_TEST_", 12))
		return true;
	for (size_t i = 0; i < sizeof(env_extra) / sizeof(env_extra[0]); i++)
		if (strlen(env_extra[i]) == len && !memcmp(env_extra[i], name, len))
			return true;
	for (int id = 0; id < KVS_NKEYS; id++) {
		kvs_key_env_name(&kvs_keys[id], true, var);
		if (strlen(var) == len && !memcmp(var, name, len))
			return true;
	}
	return false;
}

/* Edit distance (optimal string alignment: insert, delete, replace, swap two neighbours)
 * between a and b, ASCII case ignored; both shorter than NEAR_MAX. */
static unsigned distance(const char *a, const char *b)
{
	unsigned rows[3][NEAR_MAX + 1];
	size_t la = strlen(a), lb = strlen(b);
	unsigned *pp = rows[0], *p = rows[1], *cur = rows[2];

	for (size_t j = 0; j <= lb; j++)
		p[j] = (unsigned)j;
	for (size_t i = 1; i <= la; i++) {
		cur[0] = (unsigned)i;
		for (size_t j = 1; j <= lb; j++) {
			unsigned cost = kvs_ascii_lower(a[i - 1]) != kvs_ascii_lower(b[j - 1]);
			unsigned v = p[j] + 1;

			if (cur[j - 1] + 1 < v)
				v = cur[j - 1] + 1;
			if (p[j - 1] + cost < v)
				v = p[j - 1] + cost;
			if (i > 1 && j > 1 &&
			    kvs_ascii_lower(a[i - 1]) == kvs_ascii_lower(b[j - 2]) &&
			    kvs_ascii_lower(a[i - 2]) == kvs_ascii_lower(b[j - 1]) &&
			    pp[j - 2] + 1 < v)
				v = pp[j - 2] + 1;
			cur[j] = v;
		}
		unsigned *t = pp;

		pp = p;
		p = cur;
		cur = t;
	}
	return p[lb];
}

/* Whether name ends in sep followed by key (ASCII case ignored), with something before. */
static bool ends_in_key(const char *name, char sep, const char *key)
{
	size_t n = strlen(name), k = strlen(key);

	return n > k + 1 && name[n - k - 1] == sep && kvs_str_ieq(name + n - k, key);
}

int kvs_config_near(const char *name, char *out, size_t outlen)
{
	bool dotted = strchr(name, '.') != NULL;
	/* One edit, and one more per 10 characters: "FOO" is not a misspelt "MODE". */
	unsigned best = 1 + (unsigned)strlen(name) / 10;
	char cand[KVS_ENV_NAME_MAX + KVS_CONFIG_MSG_MAX];
	int n = -1;

	if (strlen(name) >= NEAR_MAX)
		return -ENOENT;
	if (best > NEAR_EDITS)
		best = NEAR_EDITS;
	best++;
	/* Keys first, then the variables that are not keys: a tie goes to the key. */
	for (int id = 0; id < KVS_NKEYS + (dotted ? 0 : 3); id++) {
		const char *key = NULL;
		unsigned d;

		if (id >= KVS_NKEYS) {
			snprintf(cand, sizeof(cand), "%s", env_extra[id - KVS_NKEYS]);
		} else if (dotted) {
			snprintf(cand, sizeof(cand), "%s.%s", kvs_keys[id].section,
				 kvs_keys[id].key);
			key = kvs_keys[id].key;
		} else {
			kvs_key_env_name(&kvs_keys[id], true, cand);
			key = cand + strlen(cand) - strlen(kvs_keys[id].key);
		}
		d = distance(name, cand);
		/* A key in the wrong section: the key is right, the section is not. */
		if (key && d > NEAR_SUFFIX && ends_in_key(name, dotted ? '.' : '_', key))
			d = NEAR_SUFFIX;
		if (d < best) {
			best = d;
			snprintf(out, outlen, "%s", cand);
			n = (int)d;
		}
	}
	return n < 0 ? -ENOENT : n;
}

bool kvs_config_env_suspect(const char *name, size_t len)
{
	char buf[NEAR_MAX], near[KVS_ENV_NAME_MAX];
	int d;

	if (kvs_config_env_known(name, len))
		return false;
	if (len >= 6 && kvs_ascii_upper(name[0]) == 'K' && kvs_ascii_upper(name[1]) == 'V' &&
	    kvs_ascii_upper(name[2]) == 'S' && kvs_ascii_upper(name[3]) == 'H' &&
	    kvs_ascii_upper(name[4]) == 'I' && kvs_ascii_upper(name[5]) == 'M')
		return true;
	if (len >= sizeof(buf))
		return false;
	memcpy(buf, name, len);
	buf[len] = '\0';
	/* Only a near spelling of a whole name: "KVSIHM_CACHE_NAME", not any "..._NAME". */
	d = kvs_config_near(buf, near, sizeof(near));
	return d >= 0 && d <= 2 && distance(buf, near) <= 2;
}

void kvs_config_hint(const char *msg, char *hint, size_t len)
{
	static const char *const marks[] = {": unknown key", ": unknown section [",
					    ": key before any [section]"};
	char name[NEAR_MAX], near[KVS_ENV_NAME_MAX + KVS_CONFIG_MSG_MAX];
	const char *at = NULL, *start;
	size_t i, n;

	snprintf(hint, len, "`kvshim config --explain` lists every key, its default and meaning");
	for (i = 0; i < sizeof(marks) / sizeof(marks[0]) && !at; i++)
		at = strstr(msg, marks[i]);
	if (!at)
		return;
	i--;
	/* The name is the field before the mark: "...: NAME: unknown key". */
	for (start = at; start - 2 >= msg && !(start[-2] == ':' && start[-1] == ' '); start--)
		;
	n = (size_t)(at - start);
	if (!n || n >= sizeof(name))
		return;
	memcpy(name, start, n);
	name[n] = '\0';
	if (i == 2) {
		/* A key above every [section]: which section holds a key of that name? */
		for (int id = 0; id < KVS_NKEYS; id++) {
			if (kvs_str_ieq(kvs_keys[id].key, name)) {
				snprintf(hint, len, "put %s under [%s]", name,
					 kvs_keys[id].section);
				return;
			}
		}
		snprintf(hint, len, "keys go under a [section] (see `kvshim config --explain`)");
		return;
	}
	if (kvs_config_near(name, near, sizeof(near)) >= 0) {
		const char *dot = strchr(near, '.');

		if (dot && strchr(name, '.') &&
		    !strcmp(strchr(name, '.') + 1, dot + 1)) /* only the section is wrong */
			snprintf(hint, len, "did you mean %s? (put %s under [%.*s])", near, dot + 1,
				 (int)(dot - near), near);
		else
			snprintf(hint, len, "did you mean %s?", near);
	}
}
