"""The trainer's configuration: one typed tree, built from the command line and validated up front.

Validation is pure (no I/O, no Horovod), so every rank reaches the same verdict on the same
arguments and bad input never leaves one rank waiting for another.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from cluster.job import EXIT_BAD_INPUT, EXIT_INTERRUPTED_RESUMABLE
from train.errors import BadInput

MODELS = ("mlp", "cnn")
PRECISIONS = ("fp32", "bf16", "fp16")
COMPRESSIONS = ("none", "fp16")
CPU_AFFINITIES = ("auto", "off")
OPTIMIZERS = ("sgd", "adam")
# How a checkpoint leaves the live tensors (train.checkpoint_writer), named as torchtitan names them.
CHECKPOINT_MODES = ("async", "async_with_pinned_mem")
# --nccl-algo: the value of NCCL_ALGO each choice sets. Without it NCCL picks per collective (ring, tree
# or, where the hardware has them, CollNet/NVLS; NVIDIA/nccl#790, NVIDIA/nccl-tests#196: two nodes
# often get tree). Gloo on CPU workers always runs a ring (gloo/allreduce.cc), so the flag changes GPU
# runs only.
NCCL_ALGOS = {"ring": "Ring", "tree": "Tree"}


@dataclass(frozen=True)
class ModelConfig:
    name: str = "mlp"
    width: int = 128  # hidden units (mlp) or channels (cnn)
    dropout: float = 0.0


@dataclass(frozen=True)
class DataConfig:
    # "synthetic", "s3://bucket/prefix" or a local directory written by `python -m train.data generate`
    source: str = "synthetic"
    batch_size: int = 32  # per worker, per backward pass


@dataclass(frozen=True)
class OptimConfig:
    name: str = "sgd"
    lr: float = 0.05  # per worker; scaled by world size x backward passes per step (Horovod convention)
    momentum: float = 0.9
    warmup_steps: int = 0
    clip_grad_norm: float | None = None


@dataclass(frozen=True)
class HorovodConfig:
    compression: str = "none"
    backward_passes_per_step: int = 1
    adasum: bool = False
    fusion_threshold_mb: float | None = None  # None: Horovod's default (HOROVOD_FUSION_THRESHOLD)
    cycle_time_ms: float | None = None  # None: $HOROVOD_CYCLE_TIME, else 0.05 ms on CPU, Horovod's 1 on GPU
    gradient_groups: int | None = None  # None: 1 on CPU workers, 0 (per-gradient) on GPU, elastic, Adasum
    elastic: bool = False
    nccl_algo: str | None = None  # a key of NCCL_ALGOS; None: NCCL chooses (or $NCCL_ALGO decides)


@dataclass(frozen=True)
class CheckpointConfig:
    uri: str | None = None  # s3://bucket/prefix or a local directory; None: no checkpoints
    every: int = 0  # steps between checkpoints; 0: only at the end and on SIGTERM
    keep: int = 3
    mode: str = "async"  # CHECKPOINT_MODES


@dataclass(frozen=True)
class MetricsConfig:
    metrics_file: str | None = None
    tensorboard_dir: str | None = None
    log_every: int = 10
    progress: bool = True


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    seed: int = 0
    precision: str = "fp32"
    cpu_affinity: str = "auto"  # auto: CPU workers pinned to their share of the host's cores; off
    s3_endpoint_url: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    horovod: HorovodConfig = field(default_factory=HorovodConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument raises BadInput (one message, exit code 2) instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise BadInput(f"{message} (see `python -m train --help`)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m train",
        description="Horovod data-parallel trainer: gradients are averaged by allreduce, over NCCL on GPUs "
                    "(ring or tree, NCCL's choice; --nccl-algo fixes it) and over Gloo's ring on CPUs. "
                    "Rank 0 ends with one line `RINGTRAIN_SUMMARY {json}`.",
        epilog=f"exit codes: 0 done; {EXIT_INTERRUPTED_RESUMABLE} stopped by SIGTERM after writing a "
               f"checkpoint (resumable: run the same command again); {EXIT_BAD_INPUT} bad input (arguments, "
               "dataset, endpoint, credentials), on every rank.",
    )
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--width", type=int, default=128, help="hidden units (mlp) or channels (cnn)")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=100,
                   help="optimizer steps in total (a resumed run counts on)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per worker per backward pass")
    p.add_argument("--lr", type=float, default=0.05, help="per-worker learning rate, scaled by world size")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--warmup-steps", type=int, default=0, help="linear LR warmup from lr to the scaled lr")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="synthetic", help="synthetic | s3://bucket/prefix | /local/dir")
    p.add_argument("--checkpoint-dir", default=None, help="s3://bucket/prefix or /local/dir")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: end only)")
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--checkpoint-mode", choices=CHECKPOINT_MODES, default="async",
                   help="async: rank 0 copies the state into the writer process's shared memory at the "
                        "checkpoint's step; async_with_pinned_mem (GPU only): into page-locked memory with "
                        "non-blocking copies that run beside the next step's forward and backward passes")
    p.add_argument("--s3-endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL") or None,
                   help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL, else AWS)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--compression", choices=COMPRESSIONS, default="none")
    p.add_argument("--backward-passes-per-step", type=int, default=1)
    p.add_argument("--adasum", action="store_true", help="reduce gradients with Adasum instead of averaging")
    p.add_argument("--fusion-threshold-mb", type=float, default=None)
    p.add_argument("--cycle-time-ms", type=float, default=None,
                   help="Horovod's cycle time (default: $HOROVOD_CYCLE_TIME, else 0.05 on CPU workers, "
                        "Horovod's own 1 on GPUs)")
    p.add_argument("--gradient-groups", type=int, default=None,
                   help="allreduce the gradients in N groups, each sent once all its gradients are ready "
                        "(Horovod's groups); 0: each gradient as soon as it is ready, fused per cycle "
                        "(Horovod's default). Default: 1 on CPU workers, 0 on GPUs and with --elastic "
                        "or --adasum")
    p.add_argument("--nccl-algo", choices=tuple(NCCL_ALGOS), default=None,
                   help="GPU workers: the allreduce algorithm NCCL must use (sets NCCL_ALGO=Ring or Tree). "
                        "Default: $NCCL_ALGO if set, else NCCL chooses per collective (ring or tree). CPU "
                        "workers reduce over Gloo, always a ring")
    p.add_argument("--cpu-affinity", choices=CPU_AFFINITIES, default="auto",
                   help="auto: pin each CPU worker's threads to its share of the host's cores (GPU workers "
                        "are never pinned); off: leave placement to the OS")
    p.add_argument("--clip-grad-norm", type=float, default=None)
    p.add_argument("--elastic", action="store_true",
                   help="run under hvd.elastic (horovodrun --min-np/--max-np)")
    p.add_argument("--metrics-file", default=None, help="JSON-lines metrics, written by rank 0")
    p.add_argument("--tensorboard-dir", default=None)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on rank 0")
    return p


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Parse and validate; raises BadInput naming what is wrong and what is allowed."""
    a = build_parser().parse_args(argv)
    cfg = TrainConfig(
        steps=a.steps,
        seed=a.seed,
        precision=a.precision,
        cpu_affinity=a.cpu_affinity,
        s3_endpoint_url=a.s3_endpoint_url,
        model=ModelConfig(name=a.model, width=a.width, dropout=a.dropout),
        data=DataConfig(source=a.data, batch_size=a.batch_size),
        optim=OptimConfig(name=a.optimizer, lr=a.lr, momentum=a.momentum, warmup_steps=a.warmup_steps,
                          clip_grad_norm=a.clip_grad_norm),
        horovod=HorovodConfig(compression=a.compression, backward_passes_per_step=a.backward_passes_per_step,
                              adasum=a.adasum, fusion_threshold_mb=a.fusion_threshold_mb,
                              cycle_time_ms=a.cycle_time_ms, gradient_groups=a.gradient_groups,
                              elastic=a.elastic, nccl_algo=a.nccl_algo),
        checkpoint=CheckpointConfig(uri=a.checkpoint_dir, every=a.checkpoint_every, keep=a.keep_checkpoints,
                                    mode=a.checkpoint_mode),
        metrics=MetricsConfig(metrics_file=a.metrics_file, tensorboard_dir=a.tensorboard_dir,
                              log_every=a.log_every, progress=not a.no_progress),
    )
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    problems: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            problems.append(msg)

    need(cfg.steps >= 1, f"--steps {cfg.steps}: must be >= 1")
    need(cfg.data.batch_size >= 1, f"--batch-size {cfg.data.batch_size}: must be >= 1")
    need(cfg.model.width >= 1, f"--width {cfg.model.width}: must be >= 1")
    need(0.0 <= cfg.model.dropout < 1.0, f"--dropout {cfg.model.dropout}: must be in [0, 1)")
    need(cfg.optim.lr > 0, f"--lr {cfg.optim.lr}: must be > 0")
    need(0.0 <= cfg.optim.momentum < 1.0, f"--momentum {cfg.optim.momentum}: must be in [0, 1)")
    need(cfg.optim.warmup_steps >= 0, f"--warmup-steps {cfg.optim.warmup_steps}: must be >= 0")
    need(cfg.optim.clip_grad_norm is None or cfg.optim.clip_grad_norm > 0,
         f"--clip-grad-norm {cfg.optim.clip_grad_norm}: must be > 0")
    need(cfg.horovod.backward_passes_per_step >= 1,
         f"--backward-passes-per-step {cfg.horovod.backward_passes_per_step}: must be >= 1")
    need(cfg.horovod.fusion_threshold_mb is None or cfg.horovod.fusion_threshold_mb >= 0,
         f"--fusion-threshold-mb {cfg.horovod.fusion_threshold_mb}: must be >= 0")
    need(cfg.horovod.cycle_time_ms is None or cfg.horovod.cycle_time_ms > 0,
         f"--cycle-time-ms {cfg.horovod.cycle_time_ms}: must be > 0")
    groups = cfg.horovod.gradient_groups
    need(groups is None or groups >= 0, f"--gradient-groups {groups}: must be >= 0 (0: per gradient)")
    grouped = groups is not None and groups > 0
    # Horovod forms the groups with a collective inside the optimizer's constructor, which a worker
    # joining an elastic job would make alone; its Adasum optimizer reduces each parameter on its own.
    need(not (grouped and cfg.horovod.elastic),
         f"--gradient-groups {groups} with --elastic: a joining worker cannot form groups with the "
         "running ones; use --gradient-groups 0 or leave it out")
    need(not (grouped and cfg.horovod.adasum),
         f"--gradient-groups {groups} with --adasum: Horovod's Adasum optimizer reduces each parameter "
         "on its own; use --gradient-groups 0 or leave it out")
    need(not (cfg.horovod.adasum and cfg.horovod.compression != "none"),
         "--adasum with --compression fp16: Horovod's Adasum path takes uncompressed gradients; pick one")
    # Horovod's Adasum optimizer (2+ workers) applies each parameter's update inside the backward pass
    # and reduces the updates, so there is no reduced gradient to unscale or clip before the step.
    need(not (cfg.horovod.adasum and cfg.optim.clip_grad_norm is not None),
         "--adasum with --clip-grad-norm: Horovod's Adasum optimizer updates each parameter inside the "
         "backward pass, before gradients could be clipped; pick one")
    need(not (cfg.horovod.adasum and cfg.precision == "fp16"),
         "--adasum with --precision fp16: loss scaling must unscale gradients before the update, which "
         "Horovod's Adasum optimizer applies inside the backward pass; use --precision bf16 or fp32")
    need(cfg.checkpoint.every >= 0, f"--checkpoint-every {cfg.checkpoint.every}: must be >= 0 (0: end only)")
    need(cfg.checkpoint.keep >= 1, f"--keep-checkpoints {cfg.checkpoint.keep}: must be >= 1")
    need(cfg.metrics.log_every >= 1, f"--log-every {cfg.metrics.log_every}: must be >= 1")
    need(_is_data_uri(cfg.data.source),
         f"--data {cfg.data.source!r}: use 'synthetic', s3://bucket/prefix or a local directory path")
    if cfg.checkpoint.uri is not None:
        need(_is_storage_uri(cfg.checkpoint.uri),
             f"--checkpoint-dir {cfg.checkpoint.uri!r}: use s3://bucket/prefix or a local directory path")
    if cfg.s3_endpoint_url:
        need(cfg.s3_endpoint_url.startswith(("http://", "https://")),
             f"--s3-endpoint-url {cfg.s3_endpoint_url!r}: must start with http:// or https://")
    if problems:
        raise BadInput("; ".join(problems))


def _is_storage_uri(uri: str) -> bool:
    if uri.startswith("s3://"):
        return len(uri) > len("s3://") and not uri[len("s3://"):].startswith("/")
    return bool(uri) and "://" not in uri


def _is_data_uri(uri: str) -> bool:
    return uri == "synthetic" or _is_storage_uri(uri)
