"""Can a trainer process load NCCL's EFA net plugin? The image build runs this and fails unless it can.

NCCL_NET_PLUGIN=ofi makes NCCL dlopen `libnccl-net-ofi.so` by name (NVIDIA/nccl src/plugin/plugin_open.cc:
prefix `libnccl-net` + `-ofi.so`), found through LD_LIBRARY_PATH. When the plugin initialises, aws-ofi-nccl
>= 1.18 as the EFA installer packages it (configure --enable-cudart-dynamic, contrib/debian-template/rules)
dlopens the *unversioned* `libcudart.so` (src/nccl_ofi_cuda.cpp, commit 791a48d0 of 2025-10-16; the same
failure in 1.7.1: aws/aws-ofi-nccl#244). The CUDA base image and torch's nvidia-cuda-runtime-cu12 wheel
ship only `libcudart.so.12`, so the dlopen fails, the plugin does not initialise and NCCL silently falls
back to TCP sockets. The image therefore carries a `libcudart.so` link to torch's own copy, and this check
asserts, in a process that has imported torch as a rank has:
  - the plugin loads by the name NCCL uses (all its libraries resolve);
  - `libcudart.so` resolves, to the very file torch loaded: exactly one libcudart is mapped afterwards,
    under torch's nvidia/cuda_runtime/lib (a second copy would be a second CUDA runtime in the process).
What needs a GPU and an EFA device (the plugin's init, the provider it picks) is the self-test's job.

    python -m ringtrain_entry.netplugin --cudart-dir DIR [--import torch]   exit 0, or 1 with the problems
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import sys
from collections.abc import Sequence

PLUGIN_LIB = "libnccl-net-ofi.so"   # NCCL_NET_PLUGIN=ofi
CUDART_LIB = "libcudart.so"         # what aws-ofi-nccl dlopens
MAPS = "/proc/self/maps"


def mapped_libraries(maps_text: str, prefix: str) -> set[str]:
    """Files mapped in a /proc/<pid>/maps text whose name starts with `prefix` (e.g. libcudart.so)."""
    found = set()
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/") and os.path.basename(fields[5]).startswith(prefix):
            found.add(fields[5])
    return found


def cudart_problems(mapped: set[str], cudart_dir: str) -> list[str]:
    """Exactly one libcudart file mapped, and it is the one in `cudart_dir` (torch's)."""
    files = {os.path.realpath(p) for p in mapped}
    want = os.path.realpath(cudart_dir)
    if len(files) != 1:
        return [f"{len(files)} CUDA runtime libraries mapped ({', '.join(sorted(files)) or 'none'}); "
                f"want exactly one, torch's in {cudart_dir}"]
    (only,) = files
    if os.path.dirname(only) != want:
        return [f"{CUDART_LIB} resolved to {only}, not torch's copy in {cudart_dir}"]
    return []


def load_problems(cudart_dir: str, imports: Sequence[str] = (), preload: Sequence[str] = (),
                  maps_path: str = MAPS) -> list[str]:
    """Load what a rank has loaded (`imports`, `preload` paths), then the plugin and `libcudart.so` the way
    NCCL and the plugin do; return what went wrong (empty: the plugin can load and find the CUDA runtime)."""
    problems = []
    for module in imports:
        importlib.import_module(module)
    for path in preload:
        ctypes.CDLL(path)
    for name, why in ((PLUGIN_LIB, "NCCL_NET_PLUGIN=ofi cannot load the EFA plugin"),
                      (CUDART_LIB, "aws-ofi-nccl dlopens it at init; without it NCCL falls back to sockets")):
        try:
            ctypes.CDLL(name, mode=os.RTLD_NOW)
        except OSError as e:
            problems.append(f"cannot load {name} ({why}): {e}")
    with open(maps_path) as f:
        mapped = mapped_libraries(f.read(), CUDART_LIB)
    return problems + cudart_problems(mapped, cudart_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringtrain_entry.netplugin",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--cudart-dir", required=True, help="the directory of torch's libcudart.so.12")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import this first, as a rank does (torch)")
    parser.add_argument("--preload", action="append", default=[], metavar="PATH",
                        help="load this library first")
    args = parser.parse_args(argv)
    problems = load_problems(args.cudart_dir, args.imports, args.preload)
    for problem in problems:
        print(f"netplugin: FAIL {problem}", file=sys.stderr)
    if not problems:
        print(f"netplugin: ok: {PLUGIN_LIB} loads and {CUDART_LIB} is torch's copy in {args.cudart_dir}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
