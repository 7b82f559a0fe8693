"""The trainer's configuration: one typed tree, built from the command line and validated up front.

Validation is pure (no I/O, no Horovod), so every rank reaches the same verdict on the same
arguments and bad input never leaves one rank waiting for another.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from train.contract import EXIT_BAD_INPUT, EXIT_INTERRUPTED_RESUMABLE
from train.errors import BadInput
from train.task import BUILTIN_TASKS, DEFAULT_TASK, Task, load_task

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPRESSIONS = ("none", "fp16")
CPU_AFFINITIES = ("auto", "off")
OPTIMIZERS = ("sgd", "adam", "adamw")
# How --lr grows with the global batch (workers x backward passes per step): linear for SGD (Goyal et
# al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", section 2.1), the square
# root for Adam and AdamW (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient
# Algorithms": the square-root scaling rule; Hoffer et al. 2017 argue the same for SGD's noise scale).
LR_SCALINGS = ("linear", "sqrt", "none")
DEFAULT_LR_SCALING = {"sgd": "linear", "adam": "sqrt", "adamw": "sqrt"}
# How a checkpoint leaves the live tensors (train.checkpoint.writer), named as torchtitan names them.
CHECKPOINT_MODES = ("async", "async_with_pinned_mem")
# --nccl-algo: the value of NCCL_ALGO each choice sets. Without it NCCL picks per collective (ring, tree
# or, where the hardware has them, CollNet/NVLS; NVIDIA/nccl#790, NVIDIA/nccl-tests#196: two nodes
# often get tree). Gloo on CPU workers always runs a ring (gloo/allreduce.cc), so the flag changes GPU
# runs only.
NCCL_ALGOS = {"ring": "Ring", "tree": "Tree"}
LR_SCHEDULES = ("constant", "cosine", "step")


@dataclass(frozen=True)
class TaskConfig:
    name: str = DEFAULT_TASK  # --task: a built-in name, pkg.module:Class or path.py:Class (train.task)
    args: argparse.Namespace = field(default_factory=argparse.Namespace)  # the task's own flags
    # ... as the command line gave them, each by its full name: a launcher passes them on as they are
    # (to_argv), since only the task's parser knows how to write its values back
    argv: tuple[str, ...] = ()


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
    schedule: str = "constant"  # after warmup: constant, cosine (to 0 at --steps), step (x factor every N)
    step_every: int = 0  # step schedule: steps between decays
    step_factor: float = 0.1
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None
    betas: tuple[float, float] = (0.9, 0.999)  # adam, adamw (torch's defaults)
    lr_scaling: str = "linear"  # LR_SCALINGS; parse_args picks the optimizer's default


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
    commit_every: int = 10  # elastic: steps between commits (each copies the model and optimizer state)


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
    eval_every: int = 0  # steps between evaluations (tasks with evaluation data); 0: at the end only
    progress: bool = True
    lines: bool = False  # each record also as a RINGTRAIN_METRICS line on stdout (train/metrics.py)


@dataclass(frozen=True)
class HealthConfig:
    """What the job checks about itself: the hang watchdog (train/watchdog.py) and the preflight
    bandwidth test (train/preflight.py)."""

    hang_timeout_s: float = 300.0   # T: no step for max(K x median step, T) ends the run; 0: no watchdog
    hang_factor: float = 10.0       # K
    preflight: bool = True
    preflight_min_busbw_gbps: float | None = None  # None: measure and report only
    preflight_mib: float | None = None  # None: 2048 on GPUs (the floor's nccl-tests size), 2 on CPUs
    preflight_only: bool = False  # run the preflight and exit (the job flow's check before an elastic job)


@dataclass(frozen=True)
class WeightsConfig:
    """Where the model's weights come from and go to, besides checkpoints (train/init_from.py,
    train/export.py)."""

    init_from: str | None = None  # safetensors / state_dict file or an export, local or s3://
    init_partial: bool = False    # load what fits, report the rest (a new head)
    export_dir: str | None = None  # None: exports/<job> beside checkpoints/<job>, if in that layout
    export: bool = True


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    seed: int = 0
    precision: str = "auto"  # auto: bf16 on GPUs that support it, else fp32 (train.recipe.resolve_precision)
    tf32: bool = True  # GPU workers: TF32 for fp32 matmuls and convolutions
    cpu_affinity: str = "auto"  # auto: CPU workers pinned to their share of the host's cores; off
    s3_endpoint_url: str | None = None
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    horovod: HorovodConfig = field(default_factory=HorovodConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    # The flags the command line named (each by its first option string, the task's too), so that a
    # launcher adds a setting only where the command left it to the default: `--data synthetic` named on
    # purpose is a choice, not a default to fill in (with_flags).
    named: frozenset[str] = field(default=frozenset(), compare=False)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument raises BadInput (one message, exit code 2) instead of exiting; and it
    keeps what each flag it met was given (`seen`: the action and its argument strings, in order)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[argparse.Action, list[str]]] = []

    def error(self, message: str) -> None:  # type: ignore[override]
        raise BadInput(f"{message} (see `python -m train --help`)")

    def _get_values(self, action, arg_strings):  # argparse calls it once per flag met, with its strings
        self.seen.append((action, list(arg_strings)))
        return super()._get_values(action, arg_strings)


def build_parser(task_cls: type[Task] | None = None, task: str = DEFAULT_TASK,
                 environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The trainer's flags, and those of the task (`--task`, default demo) in a group of their own.
    `environ` gives the defaults read from the environment (default: os.environ)."""
    environ = os.environ if environ is None else environ
    p = _Parser(
        prog="python -m train",
        description="Horovod data-parallel trainer: gradients are averaged by allreduce, over NCCL on GPUs "
                    "(ring or tree, NCCL's choice; --nccl-algo fixes it) and over Gloo's ring on CPUs. "
                    "Rank 0 ends with one line `RINGTRAIN_SUMMARY {json}`.",
        epilog=f"exit codes: 0 done; {EXIT_INTERRUPTED_RESUMABLE} stopped by SIGTERM after writing a "
               f"checkpoint (resumable: run the same command again); {EXIT_BAD_INPUT} bad input (arguments, "
               "dataset, endpoint, credentials), on every rank.",
    )
    p.add_argument("--task", default=DEFAULT_TASK,
                   help=f"what to train: a built-in task ({', '.join(BUILTIN_TASKS)}), pkg.module:Class or "
                        "path/to/file.py:Class (a train.task.Task); its flags are listed below")
    p.add_argument("--steps", type=int, default=100,
                   help="optimizer steps in total (a resumed run counts on)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per worker per backward pass")
    p.add_argument("--lr", type=float, default=0.05,
                   help="per-worker learning rate, scaled with the global batch by --lr-scaling")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                   help="sgd (with --momentum), adam, adamw (decoupled weight decay; with --betas)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999), metavar=("BETA1", "BETA2"),
                   help="adam/adamw: the moments' decay rates (default 0.9 0.999)")
    p.add_argument("--lr-scaling", choices=LR_SCALINGS, default=None,
                   help="how --lr grows with workers x backward passes: linear (Goyal et al. 2017; "
                        "sgd's default), sqrt (Malladi et al. 2022; adam's and adamw's default), none")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear LR warmup from lr to the scaled lr")
    p.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="constant",
                   help="after warmup: constant; cosine (down to 0 at --steps); step (x --lr-step-factor "
                        "every --lr-step-every steps)")
    p.add_argument("--lr-step-every", type=int, default=0, help="step schedule: steps between decays")
    p.add_argument("--lr-step-factor", type=float, default=0.1, help="step schedule: factor per decay")
    p.add_argument("--weight-decay", type=float, default=0.0,
                   help="weight decay: an L2 term with sgd and adam (coupled, as torch's), decoupled with "
                        "adamw (Loshchilov & Hutter); a task may spare some parameters (lm: norms, biases)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="synthetic", help="synthetic | s3://bucket/prefix | /local/dir")
    p.add_argument("--checkpoint-dir", default=None, help="s3://bucket/prefix or /local/dir")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: end only)")
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--checkpoint-mode", choices=CHECKPOINT_MODES, default="async",
                   help="async: rank 0 copies the state into the writer process's shared memory at the "
                        "checkpoint's step; async_with_pinned_mem (GPU only): into page-locked memory with "
                        "non-blocking copies that run beside the next step's forward and backward passes")
    p.add_argument("--s3-endpoint-url", default=environ.get("AWS_ENDPOINT_URL") or None,
                   help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL, else AWS)")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="auto (default): bf16 autocast on GPUs that support it (Ampere and later), fp32 "
                        "elsewhere (CPU workers included); fp32; bf16; fp16 (with a loss scaler)")
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
    p.add_argument("--commit-every", type=int, default=10,
                   help="elastic: steps between commits, the state a reset rolls back to (each commit copies "
                        "the model and optimizer state, on the GPU too); checkpoint steps also commit")
    p.add_argument("--no-tf32", action="store_true",
                   help="GPU workers: full fp32 matmuls and convolutions (default: TF32 on tensor cores)")
    p.add_argument("--metrics-file", default=None, help="JSON-lines metrics, written by rank 0")
    p.add_argument("--metrics-lines", action="store_true",
                   help="rank 0 also prints each metrics record as a `RINGTRAIN_METRICS {json}` line on "
                        "stdout (the AWS backend reads them from the launcher's log)")
    p.add_argument("--tensorboard-dir", default=None, help="TensorBoard event files: a directory or s3://...")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=0,
                   help="steps between evaluations, for tasks with evaluation data (0: at the end only)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on rank 0")
    p.add_argument("--hang-timeout", type=float, default=300.0,
                   help="hang watchdog: a rank that sees no step complete for max(--hang-factor x the median "
                        "step time, this many seconds) writes every thread's stack and the collective it "
                        "waits in, and exits 76 (restartable); 0: no watchdog (default 300)")
    p.add_argument("--hang-factor", type=float, default=10.0, help="hang watchdog: K (default 10)")
    p.add_argument("--no-preflight", action="store_true",
                   help="skip the allreduce bandwidth test before training")
    p.add_argument("--preflight-min-busbw", type=float, default=None, metavar="GBPS",
                   help="preflight: fail fast (exit 69, naming the slow host) when the allreduce bus "
                        "bandwidth (nccl-tests' busbw) is below this many GB/s; unset: report only")
    p.add_argument("--preflight-mib", type=float, default=None,
                   help="preflight: MiB per allreduce (default 2048 on GPUs, 2 on CPUs)")
    p.add_argument("--preflight-only", action="store_true",
                   help="run the preflight and exit: 0 when it passes, 69 below --preflight-min-busbw (the "
                        "job flow runs this as a static job before an elastic one, to keep a slow host out)")
    p.add_argument("--init-from", default=None,
                   help="start from these weights: a safetensors file, a torch state_dict file or an "
                        "export (s3://... or a local path); strict unless --init-partial. A resume from a "
                        "checkpoint wins over it")
    p.add_argument("--init-partial", action="store_true",
                   help="with --init-from: load the keys that fit, report the missing, unexpected and "
                        "mismatched ones (e.g. a new classifier head)")
    p.add_argument("--export-dir", default=None,
                   help="where rank 0 writes the model at the end (model.safetensors + model.json): "
                        "s3://bucket/prefix or a directory (default: exports/<job> beside --checkpoint-dir's "
                        "checkpoints/<job>)")
    p.add_argument("--no-export", action="store_true", help="write no export at the end")
    if task_cls is not None:
        try:
            task_cls.add_arguments(p.add_argument_group(f"task {task}"))
        except argparse.ArgumentError as e:
            raise BadInput(f"--task {task}: its flags clash with the trainer's: {e}") from None
    return p


def _task_spec(argv: list[str]) -> str:
    """The value of --task in argv (the last one wins, as with argparse), without parsing the rest."""
    spec = DEFAULT_TASK
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--task" and i + 1 < len(argv):
            spec = argv[i + 1]
        elif arg.startswith("--task="):
            spec = arg.split("=", 1)[1]
    return spec


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> TrainConfig:
    """Parse and validate; raises BadInput naming what is wrong and what is allowed. `environ` gives the
    defaults read from the environment (default: os.environ; a launcher passes {}: the workers' decides)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    spec = _task_spec(argv)
    task_cls = load_task(spec)
    parser = build_parser(task_cls, spec, environ)
    a = parser.parse_args(argv)
    trainer_flags = {action.dest for action in build_parser()._actions}
    task_args = argparse.Namespace(**{k: v for k, v in vars(a).items() if k not in trainer_flags})
    # The task's flags as given, in order, each by its full name (an abbreviation or --flag=value too).
    task_argv = tuple(part for action, strings in parser.seen if action.dest not in trainer_flags
                      for part in (action.option_strings[0], *strings))

    def value(dest: str):
        if dest.startswith("no_"):  # the --no-* flags hold the negation of their field
            return not getattr(a, dest)
        if dest == "lr_scaling":
            return a.lr_scaling or DEFAULT_LR_SCALING[a.optimizer]
        return tuple(a.betas) if dest == "betas" else getattr(a, dest)

    sections = {name: section(**{f: value(dest) for dest, f in _FIELDS[name].items()})
                for name, section in _SECTIONS.items()}
    cfg = TrainConfig(**{f: value(dest) for dest, f in _FIELDS[""].items()}, **sections,
                      task=TaskConfig(name=spec, args=task_args, argv=task_argv),
                      named=frozenset(action.option_strings[0] for action, _ in parser.seen))
    validate(cfg, task_cls.check_arguments(task_args))
    return cfg


# Where each trainer flag (its argparse dest) lives in TrainConfig: by section ("": TrainConfig itself),
# dest: field. The --no-* flags hold the negation of their field.
_FIELDS: dict[str, dict[str, str]] = {
    "": {"steps": "steps", "seed": "seed", "precision": "precision", "no_tf32": "tf32",
         "cpu_affinity": "cpu_affinity", "s3_endpoint_url": "s3_endpoint_url"},
    "data": {"data": "source", "batch_size": "batch_size"},
    "optim": {"optimizer": "name", "lr": "lr", "momentum": "momentum", "warmup_steps": "warmup_steps",
              "lr_schedule": "schedule", "lr_step_every": "step_every", "lr_step_factor": "step_factor",
              "weight_decay": "weight_decay", "clip_grad_norm": "clip_grad_norm", "betas": "betas",
              "lr_scaling": "lr_scaling"},
    "horovod": {"compression": "compression", "backward_passes_per_step": "backward_passes_per_step",
                "adasum": "adasum", "fusion_threshold_mb": "fusion_threshold_mb",
                "cycle_time_ms": "cycle_time_ms", "gradient_groups": "gradient_groups", "elastic": "elastic",
                "nccl_algo": "nccl_algo", "commit_every": "commit_every"},
    "checkpoint": {"checkpoint_dir": "uri", "checkpoint_every": "every", "keep_checkpoints": "keep",
                   "checkpoint_mode": "mode"},
    "metrics": {"metrics_file": "metrics_file", "tensorboard_dir": "tensorboard_dir",
                "log_every": "log_every", "eval_every": "eval_every", "no_progress": "progress",
                "metrics_lines": "lines"},
    "health": {"hang_timeout": "hang_timeout_s", "hang_factor": "hang_factor", "no_preflight": "preflight",
               "preflight_min_busbw": "preflight_min_busbw_gbps", "preflight_mib": "preflight_mib",
               "preflight_only": "preflight_only"},
    "weights": {"init_from": "init_from", "init_partial": "init_partial", "export_dir": "export_dir",
                "no_export": "export"},
}
_SECTIONS = {"data": DataConfig, "optim": OptimConfig, "horovod": HorovodConfig,
             "checkpoint": CheckpointConfig, "metrics": MetricsConfig, "health": HealthConfig,
             "weights": WeightsConfig}
_PLACE = {dest: (section, f) for section, fields in _FIELDS.items() for dest, f in fields.items()}


def _field(cfg: TrainConfig, dest: str):
    section, name = _PLACE[dest]
    return getattr(getattr(cfg, section) if section else cfg, name)


def _text(value: object) -> str:
    """A flag's value as the parser reads it back: 20.0 as 20, as a person would write it."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def to_argv(cfg: TrainConfig) -> list[str]:
    """The trainer's command line for `cfg` (pure): --task, each trainer flag the command named or whose
    value is not the default, in the parser's order, then the task's own flags as they were given.
    parse_args(to_argv(cfg)) gives cfg back (tests/train/test_config.py)."""
    argv = ["--task", cfg.task.name] if cfg.task.name != DEFAULT_TASK or "--task" in cfg.named else []
    # --lr-scaling's default is the optimizer's
    default = TrainConfig(optim=OptimConfig(lr_scaling=DEFAULT_LR_SCALING[cfg.optim.name]))
    for action in build_parser(environ={})._actions:
        if action.dest not in _PLACE:
            continue
        option, value = action.option_strings[0], _field(cfg, action.dest)
        if isinstance(action, argparse._StoreTrueAction):
            if value is (not option.startswith("--no-")):
                argv.append(option)
        elif value is not None and (value != _field(default, action.dest) or option in cfg.named):
            argv += [option, *map(_text, value if isinstance(value, tuple) else (value,))]
    return [*argv, *cfg.task.argv]


def with_flags(cfg: TrainConfig, flags: Iterable[tuple[str, str]]) -> TrainConfig:
    """`cfg` plus those of `flags` (option, value: the trainer's or the task's) that its command line does
    not name, read by the parser as the workers will read them. What the command names wins."""
    added = [part for option, value in flags if option not in cfg.named for part in (option, value)]
    if not added:
        return cfg
    return parse_args([*to_argv(cfg), *added], environ={})


def validate(cfg: TrainConfig, task_problems: list[str] = ()) -> None:
    problems: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            problems.append(msg)

    need(cfg.steps >= 1, f"--steps {cfg.steps}: must be >= 1")
    need(cfg.data.batch_size >= 1, f"--batch-size {cfg.data.batch_size}: must be >= 1")
    need(cfg.optim.lr > 0, f"--lr {cfg.optim.lr}: must be > 0")
    need(0.0 <= cfg.optim.momentum < 1.0, f"--momentum {cfg.optim.momentum}: must be in [0, 1)")
    need(cfg.optim.warmup_steps >= 0, f"--warmup-steps {cfg.optim.warmup_steps}: must be >= 0")
    need(cfg.optim.weight_decay >= 0, f"--weight-decay {cfg.optim.weight_decay}: must be >= 0")
    need(all(0.0 <= b < 1.0 for b in cfg.optim.betas),
         f"--betas {' '.join(map(str, cfg.optim.betas))}: each must be in [0, 1)")
    need(cfg.optim.schedule != "step" or cfg.optim.step_every >= 1,
         f"--lr-schedule step needs --lr-step-every >= 1 (got {cfg.optim.step_every})")
    need(0 < cfg.optim.step_factor <= 1, f"--lr-step-factor {cfg.optim.step_factor}: must be in (0, 1]")
    need(cfg.metrics.eval_every >= 0, f"--eval-every {cfg.metrics.eval_every}: must be >= 0 (0: at the end)")
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
    need(cfg.horovod.commit_every >= 1, f"--commit-every {cfg.horovod.commit_every}: must be >= 1")
    need(cfg.checkpoint.every >= 0, f"--checkpoint-every {cfg.checkpoint.every}: must be >= 0 (0: end only)")
    need(cfg.checkpoint.keep >= 1, f"--keep-checkpoints {cfg.checkpoint.keep}: must be >= 1")
    need(cfg.metrics.log_every >= 1, f"--log-every {cfg.metrics.log_every}: must be >= 1")
    h = cfg.health
    need(h.hang_timeout_s >= 0, f"--hang-timeout {h.hang_timeout_s:g}: must be >= 0 seconds (0: no watchdog)")
    need(h.hang_factor > 0, f"--hang-factor {h.hang_factor:g}: must be > 0")
    need(h.preflight_min_busbw_gbps is None or h.preflight_min_busbw_gbps > 0,
         f"--preflight-min-busbw {h.preflight_min_busbw_gbps}: must be > 0 GB/s")
    need(h.preflight_mib is None or h.preflight_mib > 0, f"--preflight-mib {h.preflight_mib}: must be > 0")
    need(not (h.preflight_only and not h.preflight), "--preflight-only with --no-preflight: choose one")
    need(not (h.preflight_only and cfg.horovod.elastic),
         "--preflight-only with --elastic: the preflight runs as a static job (a worker joining an elastic "
         "job would meet no other in its collectives); drop --elastic")
    need(_is_data_uri(cfg.data.source),
         f"--data {cfg.data.source!r}: use 'synthetic', s3://bucket/prefix or a local directory path")
    if cfg.checkpoint.uri is not None:
        need(_is_storage_uri(cfg.checkpoint.uri),
             f"--checkpoint-dir {cfg.checkpoint.uri!r}: use s3://bucket/prefix or a local directory path")
    for flag, uri in (("--export-dir", cfg.weights.export_dir), ("--init-from", cfg.weights.init_from),
                      ("--tensorboard-dir", cfg.metrics.tensorboard_dir)):
        if uri is not None:
            need(_is_storage_uri(uri), f"{flag} {uri!r}: use s3://bucket/prefix or a local path")
    need(not cfg.weights.init_partial or cfg.weights.init_from is not None,
         "--init-partial: only with --init-from")
    if cfg.s3_endpoint_url:
        need(cfg.s3_endpoint_url.startswith(("http://", "https://")),
             f"--s3-endpoint-url {cfg.s3_endpoint_url!r}: must start with http:// or https://")
    problems += task_problems
    if problems:
        raise BadInput("; ".join(problems))


def _is_storage_uri(uri: str) -> bool:
    if uri.startswith("s3://"):
        return len(uri) > len("s3://") and not uri[len("s3://"):].startswith("/")
    return bool(uri) and "://" not in uri


def _is_data_uri(uri: str) -> bool:
    return uri == "synthetic" or _is_storage_uri(uri)
