"""image/build.py: tags, ECR URLs, the immutable-version rule, and the whole flow with a fake `docker`,
`aws` and `pulumi` on PATH (real git, in a scratch repository)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.image.helpers import DOCKERFILE, IMAGE_DIR, fake_executable, load_image_module

build = load_image_module("build")

REPO_URL = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ringtrain/train"
LOCAL_DIGEST = "sha256:" + "a" * 64
OTHER_DIGEST = "sha256:" + "b" * 64


# --------------------------------------------------------------------------------------------------
# Pure logic


def test_tags_from_version_and_dockerfile_pins():
    pins = build.Pins.from_dockerfile(DOCKERFILE.read_text())
    assert pins == build.Pins(cuda="12.6.3", torch="2.13.0", horovod="0.28.1")
    assert build.compute_tags("0.1.0", pins, "0123456789ab") == [
        "0.1.0", "0.1.0-cuda12.6.3-torch2.13.0-hvd0.28.1", "git-0123456789ab"]
    assert build.compute_tags("0.1.0", pins, "0123456789ab", build.LAUNCHER) == [
        "0.1.0-launcher", "git-0123456789ab-launcher"]


def test_version_must_be_semver():
    assert build.parse_version("1.2.3\n") == "1.2.3"
    assert build.parse_version("1.2.3-rc.1") == "1.2.3-rc.1"
    for bad in ("1.2", "v1.2.3", "01.2.3", "1.2.3 beta", ""):
        with pytest.raises(build.BuildError, match="semantic version"):
            build.parse_version(bad)


def test_dockerfile_without_a_pin_is_refused():
    with pytest.raises(build.BuildError, match="no default for ARG TORCH_VERSION"):
        build.Pins.from_dockerfile("ARG CUDA_VERSION=12.6.3\nARG HOROVOD_VERSION=0.28.1\n")


def test_ecr_url_parsing():
    repo = build.parse_ecr_url(REPO_URL)
    assert (repo.registry, repo.region, repo.name) == (
        "123456789012.dkr.ecr.us-east-1.amazonaws.com", "us-east-1", "ringtrain/train")
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    for bad in ("docker.io/library/ubuntu", "123.dkr.ecr.us-east-1.amazonaws.com/x", f"{registry}/",
                f"{registry}/X:1"):
        with pytest.raises(build.BuildError, match="not an ECR repository URL"):
            build.parse_ecr_url(bad)


def _ecr_answer(manifest_digest: str | None, config_digest: str | None) -> dict:
    if manifest_digest is None:
        return {"images": [], "failures": [{"failureCode": "ImageNotFound"}]}
    manifest = {"schemaVersion": 2, "config": {"digest": config_digest}, "layers": []}
    return {"images": [{"imageId": {"imageDigest": manifest_digest}, "imageManifest": json.dumps(manifest)}]}


def test_remote_digests_from_batch_get_image():
    assert build.remote_digests(_ecr_answer(None, None)) is None
    assert build.remote_digests(_ecr_answer(OTHER_DIGEST, LOCAL_DIGEST)) == {OTHER_DIGEST, LOCAL_DIGEST}


def test_push_plan():
    same, other = {LOCAL_DIGEST}, {OTHER_DIGEST}
    fresh = build.plan_push(LOCAL_DIGEST, {"1.0.0": None, "git-x": None})
    assert fresh == build.PushPlan("push", ["1.0.0", "git-x"])
    assert build.plan_push(LOCAL_DIGEST, {"1.0.0": same, "git-x": None}) == build.PushPlan("push", ["git-x"])
    assert build.plan_push(LOCAL_DIGEST, {"1.0.0": same, "git-x": same}) == build.PushPlan("up-to-date")
    refused = build.plan_push(LOCAL_DIGEST, {"1.0.0": other, "git-x": None})
    assert refused.action == "refuse" and refused.conflicts == ["1.0.0"] and refused.to_push == []


# --------------------------------------------------------------------------------------------------
# The flow, with fake tools


FAKE_DOCKER = """
    import json, os, sys
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps(["docker"] + sys.argv[1:]) + "\\n")
    args = sys.argv[1:]
    if args[:2] == ["buildx", "build"]:
        sys.exit(int(os.environ.get("FAKE_BUILD_RC", "0")))
    if args[:2] == ["image", "inspect"]:
        print(os.environ["FAKE_LOCAL_DIGEST"])
    elif args[:1] == ["login"]:
        assert sys.stdin.read().strip() == "ecr-password"
    elif args[:1] in (["tag"], ["push"]):
        pass
    else:
        sys.exit(f"fake docker: unexpected {args}")
"""
FAKE_AWS = """
    import json, os, sys
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps(["aws"] + sys.argv[1:]) + "\\n")
    args = sys.argv[1:]
    if args[:2] == ["ecr", "get-login-password"]:
        print("ecr-password")
    elif args[:2] == ["ecr", "batch-get-image"]:
        tag = args[args.index("--image-ids") + 1].split("=", 1)[1]
        held = json.loads(os.environ.get("FAKE_ECR", "{}"))
        print(json.dumps(held.get(tag, {"images": [], "failures": [{"failureCode": "ImageNotFound"}]})))
    else:
        sys.exit(f"fake aws: unexpected {args}")
"""
FAKE_PULUMI = f"""
    import sys
    assert sys.argv[1:4] == ["stack", "output", "ecrRepositoryUrl"], sys.argv
    print("{REPO_URL}")
"""


@pytest.fixture
def scratch(tmp_path):
    """A scratch git repository holding image/VERSION and image/Dockerfile, plus a bin dir of fakes."""
    repo = tmp_path / "repo"
    (repo / "image").mkdir(parents=True)
    shutil.copy(DOCKERFILE, repo / "image" / "Dockerfile")
    (repo / "image" / "VERSION").write_text((IMAGE_DIR / "VERSION").read_text())
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "image"], check=True)
    rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    bin_dir = tmp_path / "bin"
    fake_executable(bin_dir, "docker", FAKE_DOCKER)
    fake_executable(bin_dir, "aws", FAKE_AWS)
    log = tmp_path / "calls.jsonl"
    log.touch()
    git_dir = str(Path(shutil.which("git")).parent)
    env = {"PATH": f"{bin_dir}:{git_dir}", "FAKE_LOG": str(log), "FAKE_LOCAL_DIGEST": LOCAL_DIGEST,
           "HOME": str(tmp_path)}
    return {"repo": repo, "rev": rev, "bin": bin_dir, "log": log, "env": env}


def run_build(scratch, *args, **env):
    res = subprocess.run([sys.executable, str(IMAGE_DIR / "build.py"), "--root", str(scratch["repo"]), *args],
                         env={**scratch["env"], **env}, capture_output=True, text=True, timeout=120)
    calls = [json.loads(line) for line in scratch["log"].read_text().splitlines()]
    return res, calls


def tags_for(scratch) -> list[str]:
    version = (IMAGE_DIR / "VERSION").read_text().strip()
    return [version, f"{version}-cuda12.6.3-torch2.13.0-hvd0.28.1", f"git-{scratch['rev'][:12]}"]


def launcher_tags_for(scratch) -> list[str]:
    version = (IMAGE_DIR / "VERSION").read_text().strip()
    return [f"{version}-launcher", f"git-{scratch['rev'][:12]}-launcher"]


def test_new_version_is_built_and_pushed_under_three_tags_and_its_launcher_under_two(scratch):
    res, calls = run_build(scratch, "--repo", REPO_URL)
    assert res.returncode == 0, res.stderr
    build_calls = [c for c in calls if c[1:3] == ["buildx", "build"]]
    targets = [c[c.index("--target") + 1] for c in build_calls]
    assert targets == ["train", "launcher"], "both targets, from the same script and version"
    for build_call in build_calls:
        assert f"VCS_REF={scratch['rev']}" in build_call and "--platform" in build_call
        assert build_call[-1] == str(scratch["repo"].resolve())
    assert ["docker", "login", "--username", "AWS", "--password-stdin",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com"] in calls
    pushed = [c[2] for c in calls if c[:2] == ["docker", "push"]]
    assert pushed == [f"{REPO_URL}:{t}" for t in tags_for(scratch) + launcher_tags_for(scratch)]
    tagged = {c[3]: c[2] for c in calls if c[:2] == ["docker", "tag"]}  # remote ref -> local ref
    assert tagged[f"{REPO_URL}:{launcher_tags_for(scratch)[0]}"].startswith("ringtrain-launcher:")
    assert tagged[f"{REPO_URL}:{tags_for(scratch)[0]}"].startswith("ringtrain-train:")
    assert f"image for jobs: {REPO_URL}:{tags_for(scratch)[0]}" in res.stdout
    assert f"launcher {REPO_URL}:{launcher_tags_for(scratch)[0]}" in res.stdout


def test_a_launcher_tag_with_different_contents_refuses_both_pushes(scratch):
    held = {launcher_tags_for(scratch)[0]: _ecr_answer(OTHER_DIGEST, "sha256:" + "d" * 64)}
    res, calls = run_build(scratch, "--repo", REPO_URL, FAKE_ECR=json.dumps(held))
    assert res.returncode == 1
    assert f"already has {launcher_tags_for(scratch)[0]} with different contents" in res.stderr
    assert not any(c[:2] in (["docker", "push"], ["docker", "tag"]) for c in calls)


def test_same_contents_already_pushed_is_not_pushed_again(scratch):
    held = {t: _ecr_answer("sha256:" + "c" * 64, LOCAL_DIGEST)
            for t in tags_for(scratch) + launcher_tags_for(scratch)}
    res, calls = run_build(scratch, "--repo", REPO_URL, FAKE_ECR=json.dumps(held))
    assert res.returncode == 0, res.stderr
    assert "nothing to push" in res.stdout
    assert not any(c[:2] == ["docker", "push"] for c in calls)


def test_existing_version_with_different_contents_is_refused(scratch):
    version = tags_for(scratch)[0]
    held = {version: _ecr_answer(OTHER_DIGEST, "sha256:" + "d" * 64)}
    res, calls = run_build(scratch, "--repo", REPO_URL, FAKE_ECR=json.dumps(held))
    assert res.returncode == 1
    assert f"already has {version} with different contents" in res.stderr
    assert "Bump image/VERSION" in res.stderr
    assert not any(c[:2] in (["docker", "push"], ["docker", "tag"]) for c in calls)
    assert "Traceback" not in res.stderr


def test_repository_comes_from_the_stack_output_without_repo(scratch):
    res, _ = run_build(scratch)
    assert res.returncode == 2
    assert "no --repo given and the Pulumi CLI is not installed" in res.stderr
    fake_executable(scratch["bin"], "pulumi", FAKE_PULUMI)
    res, calls = run_build(scratch)
    assert res.returncode == 0, res.stderr
    assert any(c[:2] == ["docker", "push"] and c[2].startswith(REPO_URL + ":") for c in calls)


def test_uncommitted_changes_block_a_push_but_not_a_local_build(scratch):
    (scratch["repo"] / "image" / "Dockerfile").write_text(DOCKERFILE.read_text() + "\n# edited\n")
    res, calls = run_build(scratch, "--repo", REPO_URL)
    assert res.returncode == 2 and "uncommitted changes" in res.stderr
    assert calls == [], "nothing was built or pushed"
    res, calls = run_build(scratch, "--no-push")
    assert res.returncode == 0, res.stderr
    assert not any(c[0] == "aws" or c[:2] == ["docker", "push"] for c in calls)
    local_tags = [c[3] for c in calls if c[:2] == ["docker", "tag"]]
    assert local_tags == ([f"ringtrain-train:{t}" for t in tags_for(scratch)[1:]]
                          + [f"ringtrain-launcher:{t}" for t in launcher_tags_for(scratch)])


def test_bad_version_file_and_bad_repo_are_input_errors(scratch):
    res, calls = run_build(scratch, "--repo", "docker.io/me/train")
    assert res.returncode == 2 and "not an ECR repository URL" in res.stderr and calls == []
    (scratch["repo"] / "image" / "VERSION").write_text("one\n")
    subprocess.run(["git", "-C", str(scratch["repo"]), "-c", "user.email=t@e", "-c", "user.name=t",
                    "commit", "-qam", "bad"], check=True)
    res, calls = run_build(scratch, "--repo", REPO_URL)
    assert res.returncode == 2 and "image/VERSION holds 'one'" in res.stderr and calls == []


def test_a_failed_docker_build_stops_everything(scratch):
    res, calls = run_build(scratch, "--repo", REPO_URL, FAKE_BUILD_RC="1")
    assert res.returncode == 1 and "docker buildx build --target train failed (exit 1)" in res.stderr
    assert not any(c[0] == "aws" or c[:2] == ["docker", "push"] for c in calls)


def test_dry_run_runs_nothing(scratch):
    res, calls = run_build(scratch, "--repo", REPO_URL, "--dry-run")
    assert res.returncode == 0 and calls == []
    assert "would run:" in res.stdout and "docker buildx build" in res.stdout
    assert "--target train" in res.stdout and "--target launcher" in res.stdout
    assert "launcher tags: " + ", ".join(launcher_tags_for(scratch)) in res.stdout


def test_wrapper_script_runs_the_same_program():
    wrapper = Path(__file__).resolve().parents[2] / "scripts" / "image-build"
    assert os.access(wrapper, os.X_OK)
    res = subprocess.run([str(wrapper), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "ecrRepositoryUrl" in res.stdout and "different contents" in res.stdout
