"""scripts/gpu-check: on a machine without a GPU it says so in its report instead of failing; the GPU
checks themselves run where a GPU is (the device tool's machines)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from bench import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the checks run instead")
def test_without_a_gpu_the_report_says_so(tmp_path):
    out = tmp_path / "report.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["gpu"] is None and report["status"] == "skipped: no CUDA device here"
    assert report["torch"] == torch.__version__ and report["checks"] == {}


def test_a_failing_check_is_recorded_and_the_next_still_runs():
    report: dict = {"checks": {}}

    def broken():
        raise RuntimeError("on purpose")

    def missing():
        raise gpu_check.Skip("torchvision is not importable here")

    gpu_check.check(report, "broken", broken)
    gpu_check.check(report, "missing", missing)
    gpu_check.check(report, "fine", lambda: {"figure": 1})
    assert report["checks"]["broken"]["status"] == "failed"
    assert "RuntimeError: on purpose" in report["checks"]["broken"]["error"]
    missing = report["checks"]["missing"]
    assert (missing["status"], missing["reason"]) == ("skipped", "torchvision is not importable here")
    assert report["checks"]["fine"]["status"] == "ok" and report["checks"]["fine"]["figure"] == 1


def test_the_script_runs_the_module_with_the_machines_python(tmp_path):
    script = (gpu_check.ROOT / "scripts" / "gpu-check").read_text()
    assert "exec python3 -m bench.gpu_check" in script
    r = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--help"], cwd=gpu_check.ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--state-mib" in r.stdout
