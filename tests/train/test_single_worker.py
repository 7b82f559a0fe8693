"""`python -m train` as one real process (Horovod size 1): knobs, exit codes, resume, bad input."""

from __future__ import annotations

import itertools
import json
import re
import signal
import sys
import textwrap

import pytest
import torch

from cluster.local.objectstore import LOCAL_CREDENTIALS
from tests.train.proc import finish, metrics_steps, run, start, train_cmd, wait_for, worker_env
from train.checkpoint import store as ckpt
from train.storage import open_store
from train.summary import parse_summary

pytestmark = pytest.mark.slow  # each test starts a trainer or writer process of its own


def test_horovod_knobs_mixed_precision_and_metrics(tmp_path, local_dataset):
    metrics = tmp_path / "m.jsonl"
    r = run(train_cmd("--data", str(local_dataset), "--steps", "40", "--lr", "0.05", "--precision", "bf16",
                      "--compression", "fp16", "--backward-passes-per-step", "2", "--clip-grad-norm", "1.0",
                      "--warmup-steps", "4", "--log-every", "10", "--fusion-threshold-mb", "8",
                      "--cycle-time-ms", "2", "--metrics-file", str(metrics)))
    assert r.returncode == 0, r.stderr[-3000:]
    s = parse_summary(r.stdout)
    assert s.steps == 40 and s.world_size == 1 and s.interrupted is False
    assert s.resumed_from_step is None and s.checkpoints_written == 0 and s.elastic_resets == 0
    assert s.final_loss < 0.6 * s.initial_loss, s
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [rec["step"] for rec in records] == [10, 20, 30, 40]
    assert set(records[0]) >= {"step", "loss", "samples_per_sec", "lr", "world_size"}
    # lr x 1 worker x 2 backward passes after warmup
    assert records[-1]["lr"] == pytest.approx(0.1) and records[-1]["world_size"] == 1
    assert records[-1]["loss"] < records[0]["loss"]


def test_fp16_with_grad_scaler_on_cnn(tmp_path, local_dataset):
    r = run(train_cmd("--data", str(local_dataset), "--model", "cnn", "--width", "4", "--steps", "6",
                      "--precision", "fp16", "--checkpoint-dir", str(tmp_path / "ck")))
    assert r.returncode == 0, r.stderr[-3000:]
    state = ckpt.CheckpointStore(open_store(str(tmp_path / "ck")), keep=3).latest_valid().state
    assert state["scaler"]["scale"] > 0  # the GradScaler's state travels with the checkpoint


def test_sigterm_checkpoints_exits_75_and_resume_continues(tmp_path, local_dataset):
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    # --adasum: the stop vote goes through its own allreduce there (the 2-worker test covers the
    # vote carried in the gradients).
    args = ("--data", str(local_dataset), "--log-every", "1", "--checkpoint-dir", str(ck),
            "--metrics-file", str(metrics), "--adasum")
    proc = start(train_cmd(*args, "--steps", "400"), env=worker_env({"RINGTRAIN_FAULT_STEP_SLEEP_S": "0.02"}))
    wait_for(lambda: len(metrics_steps(metrics)) >= 5, 60, "5 steps", proc)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == 75, out[-3000:]
    s = parse_summary(out)
    assert s.interrupted is True and 5 <= s.steps < 400 and s.checkpoints_written == 1
    stopped_at = s.steps
    assert ckpt.CheckpointStore(open_store(str(ck)), keep=3).valid_steps() == [stopped_at]

    r = run(train_cmd(*args, "--steps", str(stopped_at + 3)))
    assert r.returncode == 0, r.stderr[-3000:]
    s2 = parse_summary(r.stdout)
    assert s2.resumed_from_step == stopped_at and s2.steps == stopped_at + 3 and not s2.interrupted


def test_corrupt_newest_checkpoint_is_skipped_on_start(tmp_path, local_dataset):
    ck = tmp_path / "ck"
    base = ("--data", str(local_dataset), "--checkpoint-dir", str(ck), "--checkpoint-every", "5")
    first = run(train_cmd(*base, "--steps", "10"))
    assert first.returncode == 0, first.stderr[-3000:]
    (ck / "step-000000010" / "state.pt").write_bytes(b"not a checkpoint")
    r = run(train_cmd(*base, "--steps", "12"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert parse_summary(r.stdout).resumed_from_step == 5
    assert "skipping checkpoint" in r.stderr
    assert "step-000000010: state.pt fails its xxh3_128 check" in r.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--data", "/nonexistent/ringtrain-data"], "train: error: /nonexistent/ringtrain-data: no such dir"),
    (["--steps", "-3"], "train: error: --steps -3: must be >= 1"),
    (["--data", "s3://bucket/ds", "--s3-endpoint-url", "http://127.0.0.1:9"], "cannot reach the S3 endpoint"),
])
def test_bad_input_is_one_message_and_exit_2(args, says):
    r = run(train_cmd(*args), timeout=60, env=worker_env(LOCAL_CREDENTIALS))
    assert r.returncode == 2
    assert says in r.stderr and r.stderr.count("train: error:") == 1
    assert "Traceback" not in r.stderr and "RINGTRAIN_SUMMARY" not in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the mode runs")
def test_the_pinned_checkpoint_mode_on_a_cpu_worker_is_one_clear_error(tmp_path):
    r = run(train_cmd("--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-mode", "async_with_pinned_mem"),
            timeout=60)
    assert r.returncode == 2 and r.stderr.count("train: error:") == 1, r.stderr[-3000:]
    assert "--checkpoint-mode async_with_pinned_mem needs a GPU" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


def test_tensorboard_event_files_are_written(tmp_path):
    # tensorboard is a pinned dependency (pyproject.toml), so event files are always expected.
    r = run(train_cmd("--steps", "3", "--log-every", "1", "--tensorboard-dir", str(tmp_path / "tb")))
    assert r.returncode == 0, r.stderr[-3000:]
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_checkpoint_holds_the_whole_state_and_must_fit_the_model(tmp_path):
    ck = str(tmp_path / "ck")
    r = run(train_cmd("--steps", "3", "--dropout", "0.2", "--width", "8", "--checkpoint-dir", ck))
    assert r.returncode == 0, r.stderr[-3000:]
    state = ckpt.CheckpointStore(open_store(ck), keep=3).latest_valid().state
    assert set(state) >= {"model", "optimizer", "scaler", "sampler", "step", "world_size"}
    assert state["step"] == 3 and "rng" not in state  # random streams are derived per step, not saved
    assert state["optimizer"]["state"]  # momentum buffers
    r = run(train_cmd("--steps", "4", "--checkpoint-dir", ck, "--width", "16"))
    assert r.returncode == 2 and "does not fit this model/optimizer" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_periodic_checkpoint_is_the_state_at_its_step(tmp_path):
    """A periodic checkpoint at step 3 (written while training goes on) holds exactly the state a run
    that stops at step 3 saves (its final checkpoint, waited for before the trainer exits)."""
    common = ("--model", "mlp", "--width", "2048", "--seed", "7")
    late = run(train_cmd("--steps", "5", "--checkpoint-every", "3", "--checkpoint-dir",
                         str(tmp_path / "late"), *common))
    assert late.returncode == 0, late.stderr[-3000:]
    stopped = run(train_cmd("--steps", "3", "--checkpoint-dir", str(tmp_path / "stopped"), *common))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    a = ckpt.CheckpointStore(open_store(str(tmp_path / "late")), keep=3).read(3).state
    b = ckpt.CheckpointStore(open_store(str(tmp_path / "stopped")), keep=3).read(3).state
    for name, tensor in b["model"].items():
        assert torch.equal(tensor, a["model"][name]), f"parameter {name} differs"
    for pid, st in b["optimizer"]["state"].items():
        assert torch.equal(st["momentum_buffer"], a["optimizer"]["state"][pid]["momentum_buffer"])


def test_a_state_too_large_for_the_stop_budget_is_warned_about_at_start_after_a_resume(tmp_path):
    """A fresh run learns its write rate from its first write (and warns then); each manifest records
    it, so a resumed run warns at start-up, before it trains or writes anything."""
    ck = tmp_path / "ck"
    fresh = run(train_cmd("--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", str(ck)),
                env=worker_env({"RINGTRAIN_STOP_GRACE_S": "0.000001"}))
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    took = "train: warning: a checkpoint write took 0 s, longer than the 0 s a spot stop allows"
    assert took in fresh.stderr
    assert "the checkpoint resumed" not in fresh.stderr
    manifest_path = ck / "step-000000004" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["write_bytes_per_s"] > 0
    nbytes = manifest["objects"]["state.pt"]["bytes"]
    manifest["write_bytes_per_s"] = nbytes // 200  # a store that takes about 200 s for this state
    manifest_path.write_text(json.dumps(manifest))
    resumed = run(train_cmd("--steps", "4", "--checkpoint-dir", str(ck)))  # nothing left to train
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert parse_summary(resumed.stdout).checkpoints_written == 0
    said = re.search(r"train: warning: the checkpoint resumed was written at 0\.00 MB/s: at that rate a "
                     r"checkpoint write takes (\d+) s, longer than the 100 s a spot stop allows \((\S+) MB "
                     r"state\)", resumed.stderr)
    assert said and 150 < int(said[1]) < 250 and float(said[2]) * 1e6 == pytest.approx(nbytes, rel=0.1), \
        resumed.stderr


def test_a_checkpoint_due_during_a_slow_write_is_deferred_and_training_does_not_wait(tmp_path, local_dataset):
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    r = run(train_cmd("--data", str(local_dataset), "--steps", "120", "--checkpoint-dir", str(ck),
                      "--checkpoint-every", "10", "--keep-checkpoints", "20", "--log-every", "1",
                      "--metrics-file", str(metrics)),
            env=worker_env({"RINGTRAIN_FAULT_STEP_SLEEP_S": "0.02", ckpt.FAULT_DELAY_ENV: "1"}))
    assert r.returncode == 0, r.stderr[-3000:]
    s = parse_summary(r.stdout)
    # Each write takes over a second, ~50 steps: the checkpoints due meanwhile wait for it, not training.
    assert s.checkpoints_deferred >= 1 and s.checkpoint_deferred_steps_max >= 10, s
    assert r.stderr.count("deferred: the previous checkpoint is still being written") == 1
    times = {rec["step"]: rec["time"] for rec in map(json.loads, metrics.read_text().splitlines())}
    longest = max(times[k] - times[k - 1] for k in range(2, 120))
    assert longest < 0.5, f"a step took {longest:.2f} s: training waited for a write"
    steps = ckpt.CheckpointStore(open_store(str(ck)), keep=20).valid_steps()
    assert steps[0] == 10 and steps[-1] == 120 and any(k % 10 for k in steps), steps
    assert len(steps) == s.checkpoints_written
    # the metrics records list every checkpoint at the step it was taken (deferred ones too), but the
    # final one, taken after the last record (the run report reads them: cluster/report.py)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [c for rec in records for c in rec["checkpoints"]] + [120] == steps
    # a write apart, the final one aside
    assert all(b - a >= 40 for a, b in itertools.pairwise(steps[:-1])), steps


def test_a_stop_during_a_periodic_upload_aborts_it_and_writes_the_stop_checkpoint(object_store, s3_bucket,
                                                                                  monkeypatch):
    """The periodic checkpoint's multipart upload is under way (5 MiB parts, each read held back half
    a second) when SIGTERM comes: it is aborted (no manifest, no parts left), and the stop's
    checkpoint is written at once, not after it."""
    for k, v in LOCAL_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    uri = f"s3://{s3_bucket}/ck"
    env = worker_env({**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": object_store.endpoint_url,
                      "RINGTRAIN_S3_PART_MIB": "5", ckpt.FAULT_READ_DELAY_ENV: "0.5",
                      "RINGTRAIN_FAULT_STEP_SLEEP_S": "0.05"})
    client = object_store.client()
    proc = start(train_cmd("--width", "2048", "--steps", "400", "--checkpoint-dir", uri,
                           "--checkpoint-every", "5"), env=env)
    try:
        wait_for(lambda: client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads"), 120,
                 "a periodic checkpoint's multipart upload", proc)
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, out[-3000:]
    s = parse_summary(out)
    assert s.checkpoints_aborted == 1 and s.interrupted, s
    assert "stop checkpoint of" in out and "of the 100 s stop budget left" in out
    checkpoints = ckpt.CheckpointStore(open_store(uri, object_store.endpoint_url), keep=3)
    assert checkpoints.valid_steps() == [s.steps]  # the aborted one: no manifest
    assert checkpoints.latest_valid().step == s.steps
    assert "Uploads" not in client.list_multipart_uploads(Bucket=s3_bucket)  # and no parts left
    assert all(k.startswith(f"ck/step-{s.steps:09d}/") for k in
               (o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket).get("Contents", [])))


def test_elastic_commits_come_every_commit_every_steps_not_every_log_step():
    """A commit copies the whole model and optimizer state (on the GPU too): it has its own interval."""
    script = textwrap.dedent("""
        import horovod.torch as hvd
        from train.config import parse_args
        from train.stop import StopRequest
        from train.trainer import Progress, Trainer
        hvd.init()
        trainer = Trainer(parse_args(["--steps", "20", "--commit-every", "5", "--log-every", "2",
                                      "--no-progress"]), hvd, StopRequest())
        trainer.prepare_inputs()
        trainer.build()
        progress, commits = Progress(), []
        trainer.loop(progress, commit=lambda: commits.append(progress.step))
        print("COMMITS", commits)
    """)
    r = run([sys.executable, "-c", script], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "COMMITS [5, 10, 15, 20]" in r.stdout, r.stdout[-2000:]
