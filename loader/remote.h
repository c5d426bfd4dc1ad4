/*
 * remote: the engine's side of the remote tier (remote.kind, docs/design.md "Beyond one
 * node"): which loads may ask the node's helper, under what key, and the ring to ask it
 * through (remote/ring.h).  The loader calls it only for shards it owns, after a miss: the hit
 * path never comes here.
 *
 * Which files.  Only files that lie under a files.write_once root, and only while no write of
 * the file under the shim is in flight on this node (struct kvs_keep: marked).  Such a file is
 * complete at its final name before any reader opens it and never rewritten in place (the
 * root's contract), so its name, size and the stamps the file system gives every node name one
 * content, whether or not this node keeps the file by birth: on file systems without an inode
 * generation (FUSE, NFS: where a pool pays) the node keeps such files by change, with
 * files.settle, because a file created anew on a reused inode could look old by (st_dev,
 * st_ino, size); the remote key has no inode, and a file created anew has a new mtime.  A
 * load is offered only if the file was still what it was keyed as after the read
 * (kvs_check_file: KVS_V_KEEP).  Files of other roots are rewritten in place by contract,
 * keyed by change on each node (st_dev, ctime, a node-local settle); a node cannot tell from
 * them that another node read the same bytes.  They never ask the pool and are never offered
 * to it.  The one case the key cannot tell: a file deleted and created again under its name,
 * with the same size, within one tick of the file system's mtime and with no birth time; a
 * content-addressed store never does that.
 *
 * The remote key: "kvshim/1/<remote.namespace>/<id>/<shard size>/<shard>", id the hex of
 * XXH3-128 over
 *   - the last component of the write-once root the file lies under (its name on every node,
 *     wherever each node mounts it),
 *   - the path below that root,
 *   - st_size,
 *   - the modification time (s, ns) and the birth time (s, ns; 0 where statx gives none), as
 *     the file system reports them: on a shared file system every node sees the server's.
 * Not st_dev (each node's mount has its own), not st_ino (cluster-wide only on some file
 * systems, and FUSE numbers its own), not ctime (a touch moves it, and UCM touches every
 * lookup).  A file written again under the same name gets a new mtime (and a new birth time
 * when it is replaced by a rename): another key.  Two files with one name below two roots of
 * one last component are told apart by size and stamps only; remote.namespace separates
 * stores.
 *
 * Every call is lock-free and allocation-free except kvs_remote_create.
 */
#ifndef KVS_LOADER_REMOTE_H
#define KVS_LOADER_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "loader.h"

struct kvs_config;
struct kvs_remote;
struct kvs_ring;

/* The remote tier of a loader over region c at region_path, or NULL (remote.kind = none, or
 * nothing usable: said once).  */
struct kvs_remote *kvs_remote_create(const struct kvs_config *cfg, struct kvs_cache *c);
void kvs_remote_destroy(struct kvs_remote *rm);

/* The ring of the node's helper, when one beats there (NULL otherwise: nothing to ask, nothing
 * to offer), and in *ask whether this piece's misses ask the pool: the helper routes misses to
 * it now (or this piece is the probe of a pool routed around), and this process has not
 * stopped asking after failures in a row (kvs_remote_answered).  Maps the ring the first time,
 * and again when a helper of other dimensions replaced it. */
struct kvs_ring *kvs_remote_ring(struct kvs_remote *rm, bool *ask);

/* The remote identity of rd's file, if it may be shared: a file under a write-once root whose
 * statx now matches rd (size).  false: ask nothing, offer nothing. */
bool kvs_remote_ident(struct kvs_remote *rm, const struct kvs_read *rd, struct kvs_rid *out);

/* The remote key of shard `shard` of the file id names, NUL-terminated in out. */
void kvs_remote_key(const struct kvs_remote *rm, const struct kvs_rid *id, uint64_t shard,
		    char *out, size_t len);

/* How a piece's asks ended: some answered (a hit or a miss), or none (errors, the deadline).
 * KVS_REMOTE_QUIET_AFTER pieces in a row with none answered, whatever the helper says of
 * itself, and this process asks nothing for KVS_REMOTE_QUIET_NS: a helper that beats but
 * cannot answer costs a few deadlines, not one per piece. */
#define KVS_REMOTE_QUIET_AFTER 3u
#define KVS_REMOTE_QUIET_NS    2000000000ull
void kvs_remote_answered(struct kvs_remote *rm, bool answered);

/* remote.timeout_ms in ns: how long a load waits for the pool. */
uint64_t kvs_remote_timeout_ns(const struct kvs_remote *rm);

/* Offer shard key, just loaded from storage and kept, to the pool (remote.publish).  Kept may
 * mean until an expiry (the settle window of a file system without inode generations): a put
 * the helper takes after it finds the shard gone, and is dropped (remote_dropped). */
void kvs_remote_offer(struct kvs_remote *rm, const struct kvs_rid *id, const struct kvs_key *key,
		      uint32_t len);

#endif
