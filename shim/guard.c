/*
 * guard: see guard.h.
 */
#include "guard.h"

__thread int kvs_shim_guard __attribute__((tls_model("initial-exec")));
