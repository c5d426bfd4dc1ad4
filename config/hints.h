/*
 * hints: the names kvshim reads and the nearest known name to a misspelt one, for `kvshim
 * check` and the launcher.  Tool-only: link kvs_config_tools (libkvshim.so does not).
 *
 * kvs_config_env_known: whether the environment variable name (len bytes, no '=') is one that
 * kvshim reads: a KVSHIM_<SECTION>_<KEY> of keys.def, KVSHIM_CONFIG, KVSHIM_ENABLE,
 * KVSHIM_LIBRARY, or the tests' KVSHIM_TEST_*.
 *
 * kvs_config_near: the known name nearest to name, a misspelt one, into out (outlen bytes).
 * An environment name ("KVSHIM_FILE_ROOTS", any case) is answered with an environment name
 * ("KVSHIM_FILES_ROOTS"); a dotted one ("file.roots", or a key in the wrong section such as
 * "files.shard_size") with section.key ("cache.shard_size").  A name that ends in a known key
 * after its separator counts as near, whatever its section.  Returns the distance (0 means
 * the name is known exactly, ASCII case aside), or -ENOENT when nothing is near enough.
 *
 * kvs_config_env_suspect: whether the variable name (len bytes) looks meant for kvshim but
 * is not known: it starts with KVSHIM (any case) or is near a known name.
 *
 * kvs_config_hint: a suggested fix for msg, an error of kvs_config_load, into hint: for an
 * unknown key or section the nearest known name ("did you mean cache.shard_size?", "put it
 * under [cache]"), else a pointer to `kvshim config --explain`.  Never fails.
 */
#ifndef KVS_CONFIG_HINTS_H
#define KVS_CONFIG_HINTS_H

#include <stdbool.h>
#include <stddef.h>

bool kvs_config_env_known(const char *name, size_t len);
int kvs_config_near(const char *name, char *out, size_t outlen);
bool kvs_config_env_suspect(const char *name, size_t len);
void kvs_config_hint(const char *msg, char *hint, size_t len);

#endif
