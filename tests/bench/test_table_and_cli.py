"""The printed table, the command line, and the settings each contender runs with."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import table
from bench.__main__ import parse_args
from bench.machine import cpu_model
from bench.peer import STUDY, HorovodSettings

ROOT = Path(__file__).resolve().parents[2]


def test_table_shows_medians_ratios_and_failures(results):
    text = table.render(results)
    assert "2 cores, Test CPU" in text and "horovod 0.28.1" in text
    assert "1.10x" in text and "(baseline)" in text and "best: hvd at 1.10x DDP" in text
    assert "[recovery] FAILED: the local cluster did not come up" in text


def test_horovod_settings_become_the_environment_horovod_reads():
    s = HorovodSettings(threads=1, cycle_time_ms=0.1, fusion_mb=4, autotune=True, compression="fp16")
    assert s.env() == {"OMP_NUM_THREADS": "1", "HOROVOD_CYCLE_TIME": "0.1",
                       "HOROVOD_FUSION_THRESHOLD": str(4 * 1024 * 1024), "HOROVOD_AUTOTUNE": "1"}
    assert s.args()[s.args().index("--compression") + 1] == "fp16"
    assert HorovodSettings().env() == {}  # defaults are Horovod's and torch's own
    assert STUDY["hvd-defaults"] == HorovodSettings()
    # One factor at a time on top of one thread per worker.
    for name, settings in STUDY.items():
        if name not in ("hvd-defaults", "hvd-threads1"):
            assert settings.threads == 1 and name.startswith("hvd-threads1-")


def test_cpu_model_from_cpuinfo():
    cpuinfo = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
    assert cpu_model(cpuinfo) == "Intel(R) Xeon(R) Processor"


def test_cli_defaults_and_choices():
    a = parse_args([])
    assert a.name == "latest" and not a.quick and a.sections[0] == "peer_study"
    q = parse_args(["--quick", "--sections", "headline, recovery"])
    assert q.name == "quick" and q.sections == ["headline", "recovery"]


@pytest.mark.parametrize("argv,message", [
    (["--sections", "peer,nope"], "--sections 'peer,nope': unknown ['peer', 'nope']; allowed: peer_study"),
    (["--repeats", "0"], "--repeats 0: must be >= 1"),
    (["--name", "a/b"], "--name 'a/b'"),
])
def test_bad_arguments_are_one_message_and_exit_2(argv, message):
    proc = subprocess.run([sys.executable, "-m", "bench", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_quick_run_writes_valid_results(tmp_path):
    """Smoke: real Horovod and DDP workers, one short repeat; checks the document, not the speed."""
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--sections", "peer_study,headline",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "quick.json").read_text())
    comp = doc["sections"]["peer_study"]["comparison"]
    assert set(comp["contenders"]) == {"ddp", "hvd-defaults", "hvd-threads1"}
    for c in comp["contenders"].values():
        assert c["samples"][0] > 0 and c["runs"][0]["world_size"] == 2
    assert comp["contenders"]["hvd-threads1"]["runs"][0]["torch_threads"] == 1
    assert set(comp["ratios"]) == {"hvd-defaults", "hvd-threads1"}
    assert "[peer_study]" in proc.stdout
    # The real trainer ran with checkpoints to the local S3 store and its window was read from its metrics.
    head = doc["sections"]["headline"]
    assert head["status"] == "ok", head.get("reason")
    trainer_run = head["comparison"]["contenders"]["trainer"]["runs"][0]
    assert trainer_run["checkpoints_written"] >= 2 and trainer_run["samples_per_sec"] > 0
    assert set(head["peer"]) == {"trainer", "bare-hvd"} and "trainer_vs_bare_hvd" in head["efficiency"]


def test_readme_section_is_rendered_from_the_results(results):
    from bench.report import markdown

    text = markdown(results)
    assert text.startswith("## Performance")
    assert "`scripts/bench`" in text and "2 cores (Test CPU)" in text
    assert "| hvd | 104 | 1.10× | 1.10, 1.10 |" in text and "| (DDP) | 95 | 1.00× | |" in text
    assert "Not measured in this run: recovery (failed: the local cluster did not come up)" in text
