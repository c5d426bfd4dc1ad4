/*
 * print: the configuration as text for the operator: `kvshim config` (every key and its
 * value), `--explain` (its default, source and help) and `--sample` (the sample kvshim.ini,
 * generated from keys.def at build time so it cannot drift).
 *
 * Tool-only: in the kvs_config_tools library, which libkvshim.so does not link (the shim never
 * prints on stdout).  No state: safe from any thread, each call writing only to its FILE.
 */
#include "print.h"

#include <errno.h>
#include <string.h>

#include "keytab.h"

/* Write the value of key id in cfg to out, as it would be written in the file. */
static int print_value(const struct kvs_config *cfg, int id, FILE *out)
{
	const struct kvs_key_desc *k = &kvs_keys[id];
	const char *field = (const char *)cfg + k->off;
	const struct kvs_word *w;
	char buf[32];
	uint64_t u;
	int64_t i;

	switch (k->type) {
	case KT_BOOL:
		return fputs(*(const bool *)field ? "true" : "false", out);
	case KT_SIZE:
		kvs_format_size(*(const uint64_t *)field, buf, sizeof(buf));
		return fputs(buf, out);
	case KT_SIZE_AUTO:
		u = *(const uint64_t *)field;
		if (!u)
			return fputs("auto", out);
		kvs_format_size(u, buf, sizeof(buf));
		return fputs(buf, out);
	case KT_UINT:
		return fprintf(out, "%llu", (unsigned long long)*(const uint64_t *)field);
	case KT_AUTO:
		i = *(const int64_t *)field;
		return i < 0 ? fputs("auto", out) : fprintf(out, "%lld", (long long)i);
	case KT_PCT:
		return fprintf(out, "%llu%%", (unsigned long long)*(const uint64_t *)field);
	case KT_MODE:
		u = *(const uint64_t *)field;
		return fprintf(out, "%04llo", (unsigned long long)u);
	case KT_STR:
	case KT_NAME:
		/* fputs("") returns 0 on success, like any non-negative result. */
		return fputs(field, out);
	default:
		for (w = kvs_key_words(k->type); w->word; w++)
			if (w->val == *(const int *)field)
				return fputs(w->word, out);
		return fprintf(out, "(invalid %d)", *(const int *)field);
	}
}

int kvs_config_print(const struct kvs_config *cfg, FILE *out, bool explain)
{
	char var[KVS_ENV_NAME_MAX];
	int err = 0;

	for (int id = 0; id < KVS_NKEYS && err >= 0; id++) {
		const struct kvs_key_desc *k = &kvs_keys[id];

		err = fprintf(out, "%s.%s = ", k->section, k->key);
		if (err >= 0)
			err = print_value(cfg, id, out);
		if (err >= 0)
			err = fputc('\n', out);
		if (err < 0 || !explain)
			continue;

		err = fprintf(out, "\tdefault %s, source ", *k->def ? k->def : "(empty)");
		if (err < 0)
			break;
		switch (cfg->source[id]) {
		case KVS_SRC_FILE:
			err = fprintf(out, "file %s:%u\n", cfg->path, cfg->line[id]);
			break;
		case KVS_SRC_ENV:
			if (id == KVS_KEY_shim_enable && cfg->kvshim_enable_env_off)
				snprintf(var, sizeof(var), "KVSHIM_ENABLE");
			else
				kvs_key_env_name(k, true, var);
			err = fprintf(out, "env %s\n", var);
			break;
		default:
			err = fputs("default\n", out);
			break;
		}
		if (err >= 0)
			err = fprintf(out, "\t%s\n", k->help);
	}
	/* stdio's errno is not reliable enough to pass on: say it was an I/O error. */
	if (err < 0 || fflush(out))
		return -EIO;
	return 0;
}

int kvs_config_sample(FILE *out)
{
	const char *section = "";
	char var[KVS_ENV_NAME_MAX];
	int err;

	err = fputs("; kvshim.ini: the configuration of kvshim (docs/config.md).\n"
		    ";\n"
		    "; Every key is listed under its section with its default, commented out:\n"
		    "; uncomment a line to set that key.  Any key can also be set in the\n"
		    "; environment as KVSHIM_<SECTION>_<KEY>; KVSHIM_CONFIG names this file and\n"
		    "; KVSHIM_ENABLE=0 turns the shim off.  Sizes take K, M, G and T suffixes.\n"
		    "; `kvshim check` validates a file and the node before a launch.\n",
		    out);
	for (int id = 0; id < KVS_NKEYS && err >= 0; id++) {
		const struct kvs_key_desc *k = &kvs_keys[id];

		if (strcmp(section, k->section)) {
			section = k->section;
			err = fprintf(out, "\n[%s]\n", section);
			if (err < 0)
				break;
		}
		kvs_key_env_name(k, true, var);
		err = fprintf(out, "\n; %s (%s)\n;%s = %s\n", k->help, var, k->key, k->def);
	}
	if (err < 0 || fflush(out))
		return -EIO;
	return 0;
}
