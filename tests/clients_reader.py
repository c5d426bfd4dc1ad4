#!/usr/bin/env python3
"""A third-party cuFile client reading KV files into (fake) device memory, for clients_test.sh.

    clients_reader.py --client kvikio|cufile --fake FAKEDIR --ref REFDIR [--block N] FILE...

Each FILE is read whole into one device allocation by the client named, copied back to the
host with cuMemcpyDtoH_v2 and compared byte for byte with REFDIR/<basename of FILE> (a copy
outside the shim's roots, so that the comparison itself reads nothing through the cache).
  kvikio  kvikio.CuFile(path, "r").pread(buf, task_size=N).get(), with KVIKIO_COMPAT_MODE=OFF
          expected in the environment; buf exposes __cuda_array_interface__.
  cufile  cufile-python's cufile.CuFile(path, "r").read(dptr, N, offset, dev_offset) per block.
Device memory comes from libcuda.so.1 (the fake of tests/fake_cuda.c, found on
LD_LIBRARY_PATH, FAKEDIR): cuInit, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuMemAlloc_v2.

On success prints one line: "clients: CLIENT: N files, BYTES bytes, ok" and exits 0.
Exit 1: wrong bytes or a short read (stderr names the file and the first wrong offset);
exit 2: the environment is not what the test set up (not the fake libcuda, another libcufile
loaded, compatibility mode on); exit 77: the client's package is not installed.
"""
import argparse
import ctypes
import os
import sys


def die(code, msg):
    print(f"clients_reader: {msg}", file=sys.stderr)
    sys.exit(code)


def mapped_libs(stem):
    """Paths of the mapped libraries whose file name starts with stem."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if os.path.basename(p).startswith(stem):
                paths.add(os.path.realpath(p))
    return paths


class Driver:
    """The few driver calls the reader makes itself, on libcuda.so.1."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        if not hasattr(self.lib, "fakecuda_host_view"):
            die(2, "libcuda.so.1 on LD_LIBRARY_PATH is not the fake (no fakecuda_host_view)")
        self.call("cuInit", ctypes.c_uint(0))
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), 0)
        self.ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), dev)
        self.call("cuCtxSetCurrent", self.ctx)

    def call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            die(2, f"{name}: CUresult {rc}")

    def alloc(self, size):
        p = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(size))
        return p.value

    def free(self, dptr):
        self.call("cuMemFree_v2", ctypes.c_uint64(dptr))

    def to_host(self, dptr, size):
        host = ctypes.create_string_buffer(size)
        self.call("cuMemcpyDtoH_v2", host, ctypes.c_uint64(dptr), ctypes.c_size_t(size))
        return host.raw


class DeviceBuffer:
    """size bytes of device memory, as a one-dimensional uint8 CUDA array (version 3)."""

    def __init__(self, dptr, size):
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (dptr, False),
            "strides": None,
            "version": 3,
        }


def read_kvikio(drv, path, size, dptr, block):
    # Without this, kvikio's loader (cuda.pathfinder) would find NVIDIA's real libcufile in
    # the nvidia-cufile wheel first; loaded by its SONAME from LD_LIBRARY_PATH, the fake is the
    # "already loaded" libcufile.so.0 that kvikio's own dlopen then gets.
    ctypes.CDLL("libcufile.so.0", mode=ctypes.RTLD_GLOBAL)
    try:
        import kvikio
        import kvikio.defaults
    except ImportError as e:
        die(77, f"kvikio is not installed ({e})")
    if kvikio.defaults.is_compat_mode_preferred():
        die(2, "kvikio prefers compatibility mode (KVIKIO_COMPAT_MODE=OFF not set?)")
    with kvikio.CuFile(path, "r") as f:
        n = f.pread(DeviceBuffer(dptr, size), size, 0, task_size=block).get()
    return n


def read_cufile(drv, path, size, dptr, block):
    try:
        import cufile
    except ImportError as e:
        die(77, f"cufile-python is not installed ({e})")
    n = 0
    with cufile.CuFile(path, "r") as f:
        for off in range(0, size, block):
            want = min(block, size - off)
            # cufile-python declares cuFileRead's result size_t: a negative error comes back
            # as a huge number, so read it back as signed.
            got = ctypes.c_ssize_t(f.read(ctypes.c_void_p(dptr), want, off, off)).value
            if got != want:
                die(1, f"{path}: cuFileRead at offset {off}: {got}, want {want}")
            n += got
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", choices=("kvikio", "cufile"), required=True)
    ap.add_argument("--fake", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--block", type=int, default=1 << 20)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()

    drv = Driver()
    read = read_kvikio if a.client == "kvikio" else read_cufile
    total = 0
    for path in a.files:
        with open(os.path.join(a.ref, os.path.basename(path)), "rb") as f:
            want = f.read()
        size = len(want)
        dptr = drv.alloc(size)
        n = read(drv, path, size, dptr, a.block)
        if n != size:
            die(1, f"{path}: read {n} bytes, want {size}")
        got = drv.to_host(dptr, size)
        drv.free(dptr)
        if got != want:
            off = next(i for i in range(size) if got[i] != want[i])
            die(1, f"mismatch: {path} offset {off}")
        total += size

    # The libcufile that did the reads must be the fake, and the only one.
    cufiles = mapped_libs("libcufile.so")
    fake = os.path.realpath(os.path.join(a.fake, "libcufile.so.0"))
    if cufiles != {fake}:
        die(2, f"libcufile mapped: {sorted(cufiles)} (want only the fake)")
    print(f"clients: {a.client}: {len(a.files)} files, {total} bytes, ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
