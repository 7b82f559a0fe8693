"""Pure logic of the trainer: config validation, sampler, LR schedule, summary line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from train.config import parse_args
from train.cpu import cpu_threads_per_worker
from train.data import ShardedSampler
from train.errors import BadInput
from train.recipe import lr_at, step_seed


def test_defaults_parse():
    cfg = parse_args([])
    assert cfg.data.source == "synthetic" and cfg.checkpoint.uri is None
    assert cfg.task.name == "demo" and cfg.task.args.model == "mlp"
    assert cfg.checkpoint.mode == "async"


def test_flags_reach_the_config_tree():
    cfg = parse_args(["--model", "cnn", "--steps", "7", "--batch-size", "4", "--compression", "fp16",
                      "--backward-passes-per-step", "2", "--fusion-threshold-mb", "16",
                      "--cycle-time-ms", "2.5",
                      "--checkpoint-dir", "s3://b/ck", "--checkpoint-every", "5", "--keep-checkpoints", "2",
                      "--checkpoint-mode", "async_with_pinned_mem",
                      "--precision", "bf16", "--clip-grad-norm", "1.0", "--elastic", "--log-every", "3"])
    assert (cfg.task.args.model, cfg.steps, cfg.data.batch_size) == ("cnn", 7, 4)
    assert cfg.horovod.compression == "fp16" and cfg.horovod.backward_passes_per_step == 2
    assert cfg.horovod.fusion_threshold_mb == 16 and cfg.horovod.cycle_time_ms == 2.5 and cfg.horovod.elastic
    assert (cfg.checkpoint.uri, cfg.checkpoint.every, cfg.checkpoint.keep) == ("s3://b/ck", 5, 2)
    assert cfg.checkpoint.mode == "async_with_pinned_mem"
    assert cfg.precision == "bf16" and cfg.optim.clip_grad_norm == 1.0 and cfg.metrics.log_every == 3


def test_endpoint_defaults_to_aws_endpoint_url(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert parse_args([]).s3_endpoint_url == "http://127.0.0.1:9"


@pytest.mark.parametrize(("argv", "says"), [
    (["--steps", "0"], "--steps 0: must be >= 1"),
    (["--batch-size", "-1"], "--batch-size -1"),
    (["--model", "resnet"], "invalid choice: 'resnet'"),
    (["--data", "http://x/y"], "--data 'http://x/y': use 'synthetic', s3://bucket/prefix or a local"),
    (["--checkpoint-dir", "gs://b/x"], "--checkpoint-dir 'gs://b/x'"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints 0: must be >= 1"),
    (["--adasum", "--compression", "fp16"], "--adasum with --compression fp16"),
    (["--adasum", "--clip-grad-norm", "1"], "--adasum with --clip-grad-norm"),
    (["--adasum", "--precision", "fp16"], "--adasum with --precision fp16"),
    (["--s3-endpoint-url", "127.0.0.1:9000"], "must start with http:// or https://"),
    (["--gradient-groups", "-1"], "--gradient-groups -1: must be >= 0 (0: per gradient)"),
    (["--gradient-groups", "2", "--elastic"], "--gradient-groups 2 with --elastic: a joining worker"),
    (["--gradient-groups", "1", "--adasum"], "--gradient-groups 1 with --adasum"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--checkpoint-mode", "overlap"], "--checkpoint-mode: invalid choice: 'overlap'"),
])
def test_bad_arguments_name_the_problem(argv, says):
    with pytest.raises(BadInput, match=None) as e:
        parse_args(argv)
    assert says in str(e.value)


def test_sampler_shards_are_disjoint_and_cover_an_epoch():
    world, batch, n = 3, 4, 50
    s = ShardedSampler(n, seed=1)
    seen = []
    for _ in range(n // (world * batch)):
        pos = s.state()
        step = []
        for rank in range(world):
            s.load_state(pos)
            step.append(s.next_indices(rank, world, batch))
        seen.extend(np.concatenate(step).tolist())
    assert len(seen) == len(set(seen)) == (n // (world * batch)) * world * batch
    assert s.state() == {"epoch": 0, "offset": 48}
    s.next_indices(0, world, batch)  # 48 + 12 > 50: next epoch, new order
    assert s.state() == {"epoch": 1, "offset": 12}


def test_sampler_position_restores_exactly():
    a = ShardedSampler(100, seed=5)
    for _ in range(9):
        a.next_indices(1, 2, 8)
    b = ShardedSampler(100, seed=5)
    b.load_state(a.state())
    assert np.array_equal(a.next_indices(1, 2, 8), b.next_indices(1, 2, 8))
    assert not np.array_equal(ShardedSampler(100, seed=6).permutation(0), a.permutation(0))


def test_sampler_refuses_a_dataset_smaller_than_a_global_batch():
    with pytest.raises(BadInput, match="fewer than one global batch"):
        ShardedSampler(10, seed=0).next_indices(0, 2, 8)


def test_lr_scales_with_workers_and_warms_up():
    cfg = parse_args(["--lr", "0.1", "--warmup-steps", "10", "--backward-passes-per-step", "2"])
    assert lr_at(0, cfg, 4, 4, False) == pytest.approx(0.1)
    assert lr_at(5, cfg, 4, 4, False) == pytest.approx(0.1 + (0.8 - 0.1) / 2)
    assert lr_at(10, cfg, 4, 4, False) == pytest.approx(0.8)
    adasum = parse_args(["--lr", "0.1", "--adasum"])
    assert lr_at(0, adasum, 4, 2, False) == pytest.approx(0.1)
    assert lr_at(0, adasum, 4, 2, True) == pytest.approx(0.2)


def test_fusion_threshold_and_cycle_time_reach_horovods_environment():
    from train.recipe import configure_horovod_env

    env: dict[str, str] = {}
    configure_horovod_env(parse_args([]), on_gpu=True, environ=env)
    assert env == {}  # on GPUs Horovod's own defaults stand
    configure_horovod_env(parse_args([]), on_gpu=False, environ=env)
    assert env == {"HOROVOD_CYCLE_TIME": "0.05"}  # the CPU default the benchmarks chose
    env = {"HOROVOD_CYCLE_TIME": "3"}
    configure_horovod_env(parse_args([]), on_gpu=False, environ=env)
    assert env == {"HOROVOD_CYCLE_TIME": "3"}  # the environment wins over our default
    configure_horovod_env(parse_args(["--fusion-threshold-mb", "32", "--cycle-time-ms", "0.25"]),
                          on_gpu=False, environ=env)
    assert env == {"HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "0.25"}


def test_gradient_groups_default_to_one_on_cpu_workers_only():
    from train.recipe import gradient_groups

    assert gradient_groups(parse_args([]), on_gpu=False) == 1  # the CPU default the benchmarks chose
    assert gradient_groups(parse_args([]), on_gpu=True) == 0  # GPUs overlap reduction with backward
    assert gradient_groups(parse_args(["--elastic"]), on_gpu=False) == 0
    assert gradient_groups(parse_args(["--adasum"]), on_gpu=False) == 0
    assert gradient_groups(parse_args(["--gradient-groups", "0"]), on_gpu=False) == 0
    assert gradient_groups(parse_args(["--gradient-groups", "3"]), on_gpu=True) == 3
    assert gradient_groups(parse_args(["--gradient-groups", "0", "--elastic"]), on_gpu=False) == 0


def test_cpu_affinity_flag():
    assert parse_args([]).cpu_affinity == "auto"
    assert parse_args(["--cpu-affinity", "off"]).cpu_affinity == "off"
    with pytest.raises(BadInput, match="--cpu-affinity"):
        parse_args(["--cpu-affinity", "numa"])


def test_cpu_workers_share_the_cores_unless_omp_num_threads_is_set():
    assert cpu_threads_per_worker(2, 2, {}) == 1      # 2 workers on 2 cores: one thread each
    assert cpu_threads_per_worker(16, 4, {}) == 4
    assert cpu_threads_per_worker(2, 3, {}) == 1      # never zero
    assert cpu_threads_per_worker(16, 1, {}) == 16
    assert cpu_threads_per_worker(16, 4, {"OMP_NUM_THREADS": "2"}) is None  # the user's choice stands


def test_each_steps_random_stream_depends_on_seed_rank_and_step_only():
    import torch

    def draws(seed, rank, step, burn=0):
        g = torch.Generator()
        g.manual_seed(12345)
        torch.rand(burn, generator=g)  # whatever was drawn before (e.g. steps before a resume)
        g.manual_seed(step_seed(seed, rank, step))
        return torch.rand(4, generator=g)

    assert torch.equal(draws(1, 0, 7), draws(1, 0, 7, burn=100))  # a resumed run draws the same
    seeds = {step_seed(seed, rank, step) for seed in (0, 1) for rank in range(4) for step in range(1000)}
    assert len(seeds) == 2 * 4 * 1000  # every (seed, rank, step) has a stream of its own
    assert all(0 <= s < 2**63 for s in seeds)


def test_fp16_compression_predivides_by_the_worker_count():
    from train.recipe import predivide_factor

    assert predivide_factor(parse_args(["--compression", "fp16"]), 8) == 8.0
    assert predivide_factor(parse_args([]), 8) == 1.0  # fp32 sums do not overflow: Horovod's default
    assert predivide_factor(parse_args(["--adasum"]), 8) == 1.0  # Horovod refuses it with Adasum


def test_gpu_worker_defaults_and_their_opt_out(monkeypatch):
    from train.gpu import configure_gpu_worker, memory_format

    assert parse_args([]).tf32 and not parse_args(["--no-tf32"]).tf32
    saved = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32, torch.get_num_threads())
    try:
        monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
        configure_gpu_worker(True, local_size=8, environ={})
        assert torch.backends.cudnn.benchmark and torch.backends.cuda.matmul.allow_tf32
        assert torch.get_num_threads() == 2  # 16 cores shared by 8 workers, not 16 threads each
        configure_gpu_worker(False, local_size=8, environ={})
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
         torch.backends.cudnn.allow_tf32) = saved[:3]
        torch.set_num_threads(saved[3])
    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten())
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    assert memory_format(cnn, on_gpu=True) == torch.channels_last
    assert memory_format(cnn, on_gpu=False) == memory_format(mlp, on_gpu=True) == torch.contiguous_format


def test_commit_every_reaches_the_config_and_must_be_positive():
    assert parse_args([]).horovod.commit_every == 10
    assert parse_args(["--commit-every", "50"]).horovod.commit_every == 50
    with pytest.raises(BadInput, match="--commit-every 0: must be >= 1"):
        parse_args(["--commit-every", "0"])


def test_the_stop_budget_is_the_entrypoints_grace_and_a_bad_one_is_bad_input():
    """The trainer measures a stop's checkpoint against the seconds the image's entrypoint gives it
    (both read train.contract.stop_grace_s); a value the entrypoint would refuse, the trainer refuses."""
    from train.stop import stop_budget_s

    assert stop_budget_s({}) == 100.0
    assert stop_budget_s({"RINGTRAIN_STOP_GRACE_S": "60"}) == 60
    for bad in ("soon", "-1", "111", "nan"):
        with pytest.raises(BadInput, match=rf"RINGTRAIN_STOP_GRACE_S='{bad}': allowed are 0\.\.110 seconds"):
            stop_budget_s({"RINGTRAIN_STOP_GRACE_S": bad})
