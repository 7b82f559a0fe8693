"""The built-in image and lm tasks across 2 workers, from shards in the local S3 store (moto), stopped
by a spot-style SIGTERM and resumed; a worker's memory does not grow with the number of shards."""

from __future__ import annotations

import json
import signal
import sys

import numpy as np
import pytest

from cluster.local.objectstore import LOCAL_CREDENTIALS
from tests.train.proc import (
    finish,
    horovodrun_cmd,
    metrics_steps,
    run,
    start,
    train_workers,
    wait_for,
    worker_env,
)
from train.summary import parse_summary

pytestmark = pytest.mark.slow

STDLIB_PACKAGES = ("json", "email")  # a few hundred kB of the standard library's own source


@pytest.fixture(scope="module")
def store_env(object_store):
    client = object_store.client()
    client.create_bucket(Bucket="tasks")
    return {**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": object_store.endpoint_url}


@pytest.fixture(scope="module")
def digits_on_s3(store_env, tmp_path_factory, object_store):
    folder = tmp_path_factory.mktemp("digits")
    r = run([sys.executable, "-m", "cluster.example_data", "digits", "--out", str(folder)],
            env=worker_env(store_env))
    assert r.returncode == 0, r.stderr
    r = run([sys.executable, "-m", "train.data", "pack", "images", "--src", str(folder),
             "--out", "s3://tasks/digits/train", "--eval-out", "s3://tasks/digits/eval",
             "--eval-fraction", "0.1", "--samples-per-shard", "100"], env=worker_env(store_env))
    assert r.returncode == 0, r.stderr
    return "s3://tasks/digits"


@pytest.fixture(scope="module")
def stdlib_on_s3(store_env, tmp_path_factory):
    """The json and email packages as Parquet, a 512-token BPE trained on them, their token shards."""
    scratch = tmp_path_factory.mktemp("stdlib")
    for cmd in (["cluster.example_data", "stdlib-parquet", "--out", f"{scratch}/pq", "--packages",
                 *STDLIB_PACKAGES],
                ["train.data", "tokenizer", "train", "--src", f"{scratch}/pq", "--vocab-size", "512",
                 "--out", f"{scratch}/tokenizer.json"],
                ["train.data", "pack", "tokens", "--src", f"{scratch}/pq",
                 "--tokenizer", f"{scratch}/tokenizer.json", "--out", "s3://tasks/stdlib/train",
                 "--eval-out", "s3://tasks/stdlib/eval",
                 "--eval-fraction", "0.05", "--block-tokens", "2048", "--shard-mb", "0.25"]):
        r = run([sys.executable, "-m", *cmd], env=worker_env(store_env))
        assert r.returncode == 0, r.stderr
    return "s3://tasks/stdlib"


def _losses(path) -> dict[int, float]:
    records = map(json.loads, path.read_text().splitlines())
    return {rec["step"]: rec["loss"] for rec in records if "loss" in rec}


def _stop_one_worker_at(proc, metrics, at: int, whole_node: bool = False) -> dict:
    """SIGTERM one worker at step `at` or later, as a spot reclaim of its node does; `whole_node`: every
    process of it too (DataLoader workers and their forkserver), as a node going away signals them all."""
    wait_for(lambda: metrics_steps(metrics) and metrics_steps(metrics)[-1] >= at, 240, f"step {at}", proc)
    workers = wait_for(lambda: len(train_workers(proc)) == 2 and train_workers(proc), 10, "2 workers")
    node = [workers[1], *(workers[1].children(recursive=True) if whole_node else ())]
    if whole_node:
        assert len(node) >= 4, node  # the trainer, its checkpoint writer, the forkserver, a loader worker
    for p in node:
        p.send_signal(signal.SIGTERM)
    out = finish(proc, timeout=240)
    s = parse_summary(out)
    assert s.interrupted is True, out[-3000:]
    return s


def test_image_task_on_two_workers_resumes_with_the_same_losses_bit_for_bit(digits_on_s3, store_env,
                                                                            tmp_path):
    steps = 10
    common = ("--task", "image", "--data", f"{digits_on_s3}/train", "--eval-data", f"{digits_on_s3}/eval",
              "--model", "shufflenet_v2_x0_5", "--image-size", "16", "--batch-size", "8",
              "--loader-workers", "2",
              "--steps", str(steps), "--lr", "0.02", "--warmup-steps", "4", "--lr-schedule", "cosine",
              "--weight-decay", "1e-4", "--log-every", "1", "--checkpoint-every", "3", "--seed", "3",
              "--cpu-affinity", "off")
    ref_metrics = tmp_path / "ref.jsonl"
    ref = run(horovodrun_cmd(2, *common, "--checkpoint-dir", "s3://tasks/ck/image-ref",
                             "--metrics-file", str(ref_metrics)), env=worker_env(store_env), timeout=400)
    assert ref.returncode == 0, ref.stdout[-4000:]
    s_ref = parse_summary(ref.stdout)
    assert s_ref.eval["eval_samples"] == 180 and 0 <= s_ref.eval["eval_top1"] <= 1

    metrics = tmp_path / "spot.jsonl"
    proc = start(horovodrun_cmd(2, *common, "--checkpoint-dir", "s3://tasks/ck/image-spot",
                                "--metrics-file", str(metrics)),
                 env=worker_env({**store_env, "RINGTRAIN_FAULT_STEP_SLEEP_S": "0.3"}))
    s = _stop_one_worker_at(proc, metrics, 4, whole_node=True)  # the trainer still stops at a step
    assert 4 <= s.steps < steps
    resumed = run(horovodrun_cmd(2, *common, "--checkpoint-dir", "s3://tasks/ck/image-spot",
                                 "--metrics-file", str(metrics)), env=worker_env(store_env), timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    s2 = parse_summary(resumed.stdout)
    assert s2.resumed_from_step == s.steps and s2.steps == steps
    # every step's loss, before the stop and after the resume, is the uninterrupted run's, to the bit
    assert _losses(metrics) == _losses(ref_metrics)
    assert s2.eval == s_ref.eval


def test_lm_task_on_two_workers_resumes_bit_for_bit_and_its_loss_and_perplexity_fall(stdlib_on_s3, store_env,
                                                                                      tmp_path):
    steps = 30
    common = ("--task", "lm", "--data", f"{stdlib_on_s3}/train", "--eval-data", f"{stdlib_on_s3}/eval",
              "--layers", "1", "--heads", "2", "--dim", "32", "--seq-len", "64", "--batch-size", "16",
              "--optimizer", "adam", "--lr", "0.004", "--warmup-steps", "5", "--lr-schedule", "cosine",
              "--steps", str(steps), "--log-every", "1", "--checkpoint-every", "5", "--eval-every", "15",
              "--cpu-affinity", "off")
    ref_metrics = tmp_path / "ref.jsonl"
    ref = run(horovodrun_cmd(2, *common, "--checkpoint-dir", "s3://tasks/ck/lm-ref",
                             "--metrics-file", str(ref_metrics)), env=worker_env(store_env), timeout=400)
    assert ref.returncode == 0, ref.stdout[-4000:]
    metrics = tmp_path / "m.jsonl"
    proc = start(horovodrun_cmd(2, *common, "--checkpoint-dir", "s3://tasks/ck/lm",
                                "--metrics-file", str(metrics)),
                 env=worker_env({**store_env, "RINGTRAIN_FAULT_STEP_SLEEP_S": "0.1"}))
    s = _stop_one_worker_at(proc, metrics, 8)
    resumed = run(horovodrun_cmd(2, *common, "--checkpoint-dir", "s3://tasks/ck/lm",
                                 "--metrics-file", str(metrics)), env=worker_env(store_env), timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    s2 = parse_summary(resumed.stdout)
    assert s2.resumed_from_step == s.steps and s2.steps == steps and s2.world_size == 2
    losses = _losses(metrics)
    assert losses == _losses(ref_metrics)  # every step's loss, before the stop and after, to the bit
    assert s2.eval == parse_summary(ref.stdout).eval
    first, last = (np.mean([losses[k] for k in ks]) for ks in (range(1, 6), range(steps - 4, steps + 1)))
    assert last < first - 0.5, losses  # nats: from ln(512) = 6.24, a uniform guess
    evals = [rec for rec in map(json.loads, metrics.read_text().splitlines()) if "eval_perplexity" in rec]
    assert [e["step"] for e in evals] == [15, 30]
    assert evals[1]["eval_perplexity"] < evals[0]["eval_perplexity"]
    assert evals[1]["eval_perplexity"] < 512 / 2  # better than a uniform guess over the vocabulary
