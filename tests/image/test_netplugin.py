"""NCCL's EFA plugin must load in a trainer process: aws-ofi-nccl >= 1.18 dlopens the unversioned
`libcudart.so` (aws-ofi-nccl src/nccl_ofi_cuda.cpp; aws/aws-ofi-nccl#244), which neither the CUDA base
image nor torch's wheels provide. Here: the Dockerfile's link and its build-time check, and the check
itself against real shared libraries built by gcc (a fake plugin and a fake CUDA runtime) and real dlopen."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.image.helpers import DOCKERFILE, IMAGE_DIR, dockerfile_env, dockerfile_stages, load_entry_module

netplugin = load_entry_module("netplugin")

CUDART_LINK_DIR = "/opt/ringtrain/cudart"


# --------------------------------------------------------------------------------------------------
# The Dockerfile


def test_the_worker_image_links_libcudart_so_to_torchs_runtime():
    text = DOCKERFILE.read_text()
    _, instructions = dockerfile_stages(text)["train"]
    runs = [args for instr, args in instructions if instr == "RUN"]
    link = [r for r in runs if f"{CUDART_LINK_DIR}/libcudart.so" in r and "ln -s" in r]
    assert len(link) == 1, "one step makes the libcudart.so link"
    assert 'distribution("nvidia-cuda-runtime-cu12").locate_file("nvidia/cuda_runtime/lib")' in link[0], \
        "the link points at the runtime torch's wheel brought, not the base image's copy"
    assert 'ln -s "${cudart_dir}/libcudart.so.12" /opt/ringtrain/cudart/libcudart.so' in link[0]
    for stage in ("train", "launcher"):  # the launcher's LD_LIBRARY_PATH reaches every rank (horovodrun)
        assert CUDART_LINK_DIR in dockerfile_env(text, stage)["LD_LIBRARY_PATH"].split(":"), stage


def test_the_build_fails_unless_the_plugin_loads_with_torchs_runtime():
    _, instructions = dockerfile_stages(DOCKERFILE.read_text())["train"]
    steps = [(i, args) for i, (instr, args) in enumerate(instructions) if instr == "RUN"
             and "-m ringtrain_entry.netplugin" in args]
    assert len(steps) == 1
    index, run = steps[0]
    assert "PYTHONPATH=/opt/ringtrain /opt/venv/bin/python -m ringtrain_entry.netplugin --import torch" in run
    assert "--cudart-dir" in run
    copied_before = [args for instr, args in instructions[:index] if instr == "COPY"]
    assert "image/ringtrain_entry /opt/ringtrain/ringtrain_entry" in copied_before
    links_before = [args for instr, args in instructions[:index] if instr == "RUN" and "ln -s" in args]
    assert links_before, "the link exists before the check runs"


# --------------------------------------------------------------------------------------------------
# The check, pure parts


TORCH_RT = "/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
MAPS = f"""\
7f00-7f10 r--p 00000000 08:01 11 {TORCH_RT}
7f10-7f20 r-xp 00010000 08:01 11 {TORCH_RT}
7f20-7f30 r--p 00000000 08:01 12 /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so
7f30-7f40 rw-p 00000000 00:00 0
7f40-7f50 r--p 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libcudart_wrapper.so (deleted)
"""


def test_mapped_libraries_reads_proc_maps():
    assert netplugin.mapped_libraries(MAPS, "libcudart.so") == {TORCH_RT}
    assert netplugin.mapped_libraries(MAPS, "libnccl-net") == {
        "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so"}


def test_cudart_problems_want_exactly_torchs_copy(tmp_path):
    torch_dir, other_dir = tmp_path / "torch", tmp_path / "cuda"
    for d in (torch_dir, other_dir):
        d.mkdir()
        (d / "libcudart.so.12").write_text("")
    assert netplugin.cudart_problems({str(torch_dir / "libcudart.so.12")}, str(torch_dir)) == []
    assert "none" in netplugin.cudart_problems(set(), str(torch_dir))[0]
    two = netplugin.cudart_problems({str(torch_dir / "libcudart.so.12"), str(other_dir / "libcudart.so.12")},
                                    str(torch_dir))
    assert two and two[0].startswith("2 CUDA runtime libraries mapped")
    elsewhere = netplugin.cudart_problems({str(other_dir / "libcudart.so.12")}, str(torch_dir))
    assert "not torch's copy" in elsewhere[0]


# --------------------------------------------------------------------------------------------------
# The check, against real libraries and the real loader


def _shared_library(path: Path, soname: str, source: str) -> Path:
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("gcc is not installed: the real-loader tests build tiny shared libraries with it")
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text(source)
    subprocess.run([gcc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(src)], check=True,
                   capture_output=True, timeout=60)
    return path


@pytest.fixture
def libs(tmp_path):
    """torch's runtime (nvidia/cuda_runtime/lib/libcudart.so.12), a second runtime as in the CUDA base image,
    and the EFA plugin, each a real shared object."""
    runtime = "int cudaRuntimeGetVersion(int *v) { *v = 12060; return 0; }\n"
    torch_rt = _shared_library(tmp_path / "site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
                               "libcudart.so.12", runtime)
    base_rt = _shared_library(tmp_path / "usr-local-cuda/lib64/libcudart.so.12", "libcudart.so.12", runtime)
    plugin = _shared_library(tmp_path / "ofi-nccl/lib/libnccl-net-ofi.so", "libnccl-net-ofi.so",
                             "int ncclNetPlugin_v9 = 9;\n")
    return {"torch_rt": torch_rt, "base_rt": base_rt, "plugin_dir": plugin.parent, "tmp": tmp_path}


def _run_check(libs, ld_library_path: list[Path]) -> subprocess.CompletedProcess:
    """The check as the build runs it, in a fresh process (the loader reads LD_LIBRARY_PATH at start);
    --preload stands for `import torch`, which loads torch's libcudart.so.12 by path (RUNPATH)."""
    env = {**os.environ, "PYTHONPATH": str(IMAGE_DIR), "LD_LIBRARY_PATH": ":".join(map(str, ld_library_path))}
    return subprocess.run(
        [sys.executable, "-m", "ringtrain_entry.netplugin", "--cudart-dir", str(libs["torch_rt"].parent),
         "--preload", str(libs["torch_rt"])], capture_output=True, text=True, env=env, timeout=60)


def _link_dir(libs, target: Path) -> Path:
    link_dir = libs["tmp"] / f"link-to-{target.parent.parent.name}"
    link_dir.mkdir()
    (link_dir / "libcudart.so").symlink_to(target)
    return link_dir


def test_without_the_link_the_plugin_cannot_find_the_cuda_runtime(libs):
    """Today's image: only libcudart.so.12 exists, and the plugin's dlopen("libcudart.so") fails."""
    res = _run_check(libs, [libs["plugin_dir"]])
    assert res.returncode == 1
    if _host_resolves_libcudart_so():
        # This machine's loader cache has a CUDA toolkit's libcudart.so: the dlopen finds that one, a second
        # runtime beside torch's, which the check refuses just the same.
        assert "2 CUDA runtime libraries mapped" in res.stderr
    else:
        assert "cannot load libcudart.so" in res.stderr


def _host_resolves_libcudart_so() -> bool:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return False
    return any(line.strip().startswith("libcudart.so ") for line in out.splitlines())


def test_with_the_link_to_torchs_copy_the_check_passes(libs):
    res = _run_check(libs, [libs["plugin_dir"], _link_dir(libs, libs["torch_rt"])])
    assert res.returncode == 0, res.stderr
    assert "libnccl-net-ofi.so loads" in res.stdout


def test_a_link_to_another_copy_would_load_a_second_cuda_runtime(libs):
    res = _run_check(libs, [libs["plugin_dir"], _link_dir(libs, libs["base_rt"])])
    assert res.returncode == 1
    assert "2 CUDA runtime libraries mapped" in res.stderr


def test_without_the_plugin_on_the_path_the_check_fails(libs):
    res = _run_check(libs, [_link_dir(libs, libs["torch_rt"])])
    assert res.returncode == 1
    assert "cannot load libnccl-net-ofi.so" in res.stderr
