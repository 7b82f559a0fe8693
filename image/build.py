#!/usr/bin/env python3
"""Build the two ringtrain images (image/Dockerfile targets) and push them to the stack's ECR repository.

    scripts/image-build                      build, then push to `pulumi stack output ecrRepositoryUrl`
    scripts/image-build --repo URL           push to this ECR repository instead
    scripts/image-build --no-push            build and tag locally only
    scripts/image-build --dry-run            print the plan (tags, commands), run nothing

Targets, one version (image/VERSION, semver), one repository:
    train       the worker image (CUDA, EFA, torch, Horovod, the trainer, sshd); tags:
                    <version>                                  e.g. 0.1.0
                    <version>-cuda<X>-torch<Y>-hvd<Z>          e.g. 0.1.0-cuda12.6.3-torch2.13.0-hvd0.28.1
                    git-<revision>                             the commit the image was built from
    launcher    the slim MPIJob launcher image (horovodrun, ssh; no CUDA), for the small system nodes;
                tags: <version>-launcher, git-<revision>-launcher

A version is immutable: if any of these tags already exists in the repository with different contents
(its manifest/config digest differs from what was just built), nothing is pushed and the script exits 1
— bump image/VERSION. If they exist with the same contents, nothing needs pushing. Pushing needs a
clean working tree, so the revision tags name exactly the source that was built.

Needs Docker with buildx; pushing also needs the AWS CLI (credentials for the account) and, without
--repo, the Pulumi CLI logged in to the stack's backend. Exit codes: 0 done, 1 refused or a tool failed,
2 bad input. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Run as a script (scripts/image-build), not from the repository root: make `import train.*` work
# without relying on the editable install. train/contract.py is standard library only.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from train.contract import LAUNCHER_TAG_SUFFIX  # noqa: E402  (the MPIJob's launcher image names it)

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = "linux/amd64"
SOURCE_URL_DEFAULT = "https://github.com/ringtrain/ringtrain"

SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)
# <account>.dkr.ecr.<region>.amazonaws.com[.cn]/<repository name>
ECR_URL = re.compile(
    r"(?P<registry>(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)\.amazonaws\.com(?:\.cn)?)"
    r"/(?P<name>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
)
DOCKER_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class BuildError(Exception):
    """A problem the user must fix; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------------------------------
# Pure logic


def parse_version(text: str) -> str:
    version = text.strip()
    if not SEMVER.fullmatch(version):
        raise BuildError(f"image/VERSION holds {version!r}; use a semantic version like 1.2.3 or 1.2.3-rc.1")
    return version


def dockerfile_args(text: str) -> dict[str, str]:
    """Default values of the Dockerfile's `ARG NAME=value` lines (the first definition of each wins)."""
    args: dict[str, str] = {}
    for m in re.finditer(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|\S+)\s*$", text, re.MULTILINE):
        args.setdefault(m.group(1), m.group(2).strip('"'))
    return args


@dataclass(frozen=True)
class Pins:
    cuda: str
    torch: str
    horovod: str

    @classmethod
    def from_dockerfile(cls, text: str) -> Pins:
        args = dockerfile_args(text)
        missing = [a for a in ("CUDA_VERSION", "TORCH_VERSION", "HOROVOD_VERSION") if a not in args]
        if missing:
            raise BuildError(f"image/Dockerfile has no default for ARG {', '.join(missing)}")
        return cls(cuda=args["CUDA_VERSION"], torch=args["TORCH_VERSION"], horovod=args["HOROVOD_VERSION"])


@dataclass(frozen=True)
class Target:
    """One target of image/Dockerfile: its stage name, local image name and tag suffix in the repository."""

    stage: str
    local_name: str
    tag_suffix: str


TRAIN = Target("train", "ringtrain-train", "")
LAUNCHER = Target("launcher", "ringtrain-launcher", LAUNCHER_TAG_SUFFIX)
TARGETS = (TRAIN, LAUNCHER)


def compute_tags(version: str, pins: Pins, revision: str, target: Target = TRAIN) -> list[str]:
    if target.tag_suffix:
        tags = [f"{version}{target.tag_suffix}", f"git-{revision}{target.tag_suffix}"]
    else:
        tags = [version, f"{version}-cuda{pins.cuda}-torch{pins.torch}-hvd{pins.horovod}", f"git-{revision}"]
    for tag in tags:
        if not DOCKER_TAG.fullmatch(tag):
            raise BuildError(f"computed tag {tag!r} is not a valid image tag")
    return tags


@dataclass(frozen=True)
class EcrRepo:
    url: str
    registry: str
    region: str
    name: str


def parse_ecr_url(url: str) -> EcrRepo:
    m = ECR_URL.fullmatch(url.strip())
    if not m:
        raise BuildError(
            f"{url!r} is not an ECR repository URL; expected <account>.dkr.ecr.<region>.amazonaws.com/<name>"
        )
    return EcrRepo(url=m.group(0), registry=m["registry"], region=m["region"], name=m["name"])


def remote_digests(batch_get_image: Mapping) -> set[str] | None:
    """Digests identifying the image an `aws ecr batch-get-image` answer describes; None if the tag is absent.

    Both the manifest digest and the config digest are returned: `docker image inspect` reports the
    config digest (classic image store) or the manifest digest (containerd image store).
    """
    images = batch_get_image.get("images") or []
    if not images:
        return None
    image = images[0]
    digests = {image.get("imageId", {}).get("imageDigest")}
    manifest = image.get("imageManifest")
    if manifest:
        with contextlib.suppress(ValueError):
            digests.add(json.loads(manifest).get("config", {}).get("digest"))
    digests.discard(None)
    return digests


@dataclass
class PushPlan:
    action: str                                   # push | up-to-date | refuse
    to_push: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


def plan_push(local_digest: str, remote: Mapping[str, set[str] | None]) -> PushPlan:
    """remote: tag -> digests of what the repository holds under it (None: absent)."""
    conflicts = [tag for tag, held in remote.items() if held is not None and local_digest not in held]
    if conflicts:
        return PushPlan("refuse", conflicts=conflicts)
    missing = [tag for tag, digests in remote.items() if digests is None]
    return PushPlan("push", to_push=missing) if missing else PushPlan("up-to-date")


# --------------------------------------------------------------------------------------------------
# Tools


def _run(cmd: Sequence[str], *, cwd: Path, input_text: str | None = None, timeout: float | None = 300,
         capture: bool = True) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(cmd), cwd=cwd, input=input_text, text=True, timeout=timeout,
                              capture_output=capture, check=False)
    except FileNotFoundError:
        raise BuildError(f"{cmd[0]} is not installed (not on PATH)") from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"{' '.join(cmd[:3])} did not answer within {timeout:.0f} s", EXIT_REFUSED) from None


def _checked(cmd: Sequence[str], *, cwd: Path, what: str, **kw) -> str:
    res = _run(cmd, cwd=cwd, **kw)
    if res.returncode != 0:
        detail = (res.stderr or res.stdout or "").strip() if kw.get("capture", True) else ""
        raise BuildError(f"{what} failed (exit {res.returncode}){': ' + detail[-500:] if detail else ''}",
                         EXIT_REFUSED)
    return (res.stdout or "").strip()


def git_state(root: Path) -> tuple[str, str, str, bool]:
    """(full revision, short revision, commit time ISO-8601, working tree clean?)."""
    if not shutil.which("git"):
        raise BuildError("git is not installed; the revision tag needs it")
    rev = _checked(["git", "rev-parse", "HEAD"], cwd=root, what="git rev-parse HEAD (a git checkout?)")
    when = _checked(["git", "show", "-s", "--format=%cI", "HEAD"], cwd=root, what="git show")
    dirty = _checked(["git", "status", "--porcelain"], cwd=root, what="git status")
    return rev, rev[:12], when, not dirty


def stack_repo_url(root: Path, stack: str | None) -> str:
    if not shutil.which("pulumi"):
        raise BuildError("no --repo given and the Pulumi CLI is not installed; pass --repo "
                         "<account>.dkr.ecr.<region>.amazonaws.com/<name> (stack output ecrRepositoryUrl)")
    cmd = ["pulumi", "stack", "output", "ecrRepositoryUrl"] + (["--stack", stack] if stack else [])
    url = _checked(cmd, cwd=root, what="pulumi stack output ecrRepositoryUrl", timeout=120)
    if not url:
        raise BuildError("the stack has no ecrRepositoryUrl output; run scripts/up first or pass --repo")
    return url


def ecr_lookup(repo: EcrRepo, tag: str, root: Path) -> set[str] | None:
    res = _run(["aws", "ecr", "batch-get-image", "--region", repo.region, "--repository-name", repo.name,
                "--image-ids", f"imageTag={tag}", "--output", "json"], cwd=root, timeout=120)
    if res.returncode != 0:
        raise BuildError(f"aws ecr batch-get-image for {repo.name}:{tag} failed: {res.stderr.strip()[-500:]}",
                         EXIT_REFUSED)
    try:
        answer = json.loads(res.stdout or "{}")
    except ValueError:
        raise BuildError(f"aws ecr batch-get-image answered something that is not JSON: {res.stdout[:200]!r}",
                         EXIT_REFUSED) from None
    return remote_digests(answer)


# --------------------------------------------------------------------------------------------------
# The flow


def build_command(root: Path, target: Target, local_ref: str, version: str, revision: str, created: str,
                  source: str, platform: str) -> list[str]:
    return [
        "docker", "buildx", "build",
        "--file", str(root / "image" / "Dockerfile"),
        "--target", target.stage,
        "--platform", platform,
        "--load",
        "--tag", local_ref,
        "--build-arg", f"IMAGE_VERSION={version}",
        "--build-arg", f"VCS_REF={revision}",
        "--build-arg", f"BUILD_DATE={created}",
        "--build-arg", f"SOURCE_URL={source}",
        str(root),
    ]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="image-build", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", help="ECR repository URL (default: pulumi stack output ecrRepositoryUrl)")
    p.add_argument("--stack", help="Pulumi stack to read ecrRepositoryUrl from (default: the selected one)")
    p.add_argument("--no-push", action="store_true", help="build and tag locally, push nothing")
    p.add_argument("--dry-run", action="store_true", help="print tags and commands, run nothing")
    p.add_argument("--platform", default=PLATFORM, help=f"target platform (default {PLATFORM})")
    p.add_argument("--source-url", default=SOURCE_URL_DEFAULT, help="org.opencontainers.image.source label")
    p.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    root: Path = args.root.resolve()
    version = parse_version((root / "image" / "VERSION").read_text())
    pins = Pins.from_dockerfile((root / "image" / "Dockerfile").read_text())
    revision, short, created, clean = git_state(root)
    tags = {t: compute_tags(version, pins, short, t) for t in TARGETS}
    local_refs = {t: f"{t.local_name}:{version}" for t in TARGETS}
    push = not args.no_push
    if push and not clean:
        raise BuildError("the working tree has uncommitted changes; commit them before pushing, so that "
                         f"the tag git-{short} names the source that was built (or use --no-push)")
    repo = parse_ecr_url(args.repo if args.repo else stack_repo_url(root, args.stack)) if push else None

    builds = {t: build_command(root, t, local_refs[t], version, revision, created, args.source_url,
                               args.platform) for t in TARGETS}
    print(f"image-build: version {version}")
    for t in TARGETS:
        print(f"image-build: {t.stage} tags: {', '.join(tags[t])}")
    if repo:
        print(f"image-build: repository {repo.url} (region {repo.region})")
    if args.dry_run:
        print("image-build: dry run; would run:\n" + "\n".join("  " + " ".join(builds[t]) for t in TARGETS))
        return EXIT_OK

    if not shutil.which("docker"):
        raise BuildError("docker is not installed (not on PATH); build on a machine with Docker and buildx")
    digests = {}
    for t in TARGETS:
        _checked(builds[t], cwd=root, what=f"docker buildx build --target {t.stage}", timeout=None,
                 capture=False)
        digests[t] = _checked(["docker", "image", "inspect", "--format", "{{.Id}}", local_refs[t]], cwd=root,
                              what="docker image inspect")
        print(f"image-build: built {local_refs[t]} ({digests[t]})")
    if repo is None:
        for t in TARGETS:
            for tag in tags[t]:
                if f"{t.local_name}:{tag}" != local_refs[t]:
                    _checked(["docker", "tag", local_refs[t], f"{t.local_name}:{tag}"], cwd=root,
                             what="docker tag")
        refs = ", ".join(f"{t.local_name}:{tag}" for t in TARGETS for tag in tags[t])
        print(f"image-build: tagged locally as {refs}; nothing pushed")
        return EXIT_OK

    if not shutil.which("aws"):
        raise BuildError("the AWS CLI is not installed (not on PATH); it is needed to log in to ECR")
    password = _checked(["aws", "ecr", "get-login-password", "--region", repo.region], cwd=root,
                        what="aws ecr get-login-password", timeout=120)
    _checked(["docker", "login", "--username", "AWS", "--password-stdin", repo.registry], cwd=root,
             what="docker login", input_text=password + "\n", timeout=120)

    # Every tag of both targets is checked before anything is pushed: a refused version pushes neither.
    plans = {t: plan_push(digests[t], {tag: ecr_lookup(repo, tag, root) for tag in tags[t]}) for t in TARGETS}
    conflicts = [tag for t in TARGETS for tag in plans[t].conflicts]
    if conflicts:
        raise BuildError(
            f"{repo.url} already has {', '.join(conflicts)} with different contents; a version is never "
            f"overwritten. Bump image/VERSION (now {version}) and build again.", EXIT_REFUSED)
    for t in TARGETS:
        if plans[t].action == "up-to-date":
            print(f"image-build: {repo.url} already holds this exact {t.stage} image under all its tags; "
                  "nothing to push")
        for tag in plans[t].to_push:
            remote_ref = f"{repo.url}:{tag}"
            _checked(["docker", "tag", local_refs[t], remote_ref], cwd=root, what="docker tag")
            _checked(["docker", "push", remote_ref], cwd=root, what=f"docker push {remote_ref}", timeout=None,
                     capture=False)
            print(f"image-build: pushed {remote_ref}")
    print(f"image-build: image for jobs: {repo.url}:{tags[TRAIN][0]} "
          f"(launcher {repo.url}:{tags[LAUNCHER][0]})")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except BuildError as e:
        print(f"image-build: error: {e}", file=sys.stderr)
        return e.code
    except OSError as e:
        print(f"image-build: error: {e.filename or ''}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
