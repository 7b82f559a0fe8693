"""Peer comparison: the same small CNN under Horovod and under torch DDP (Gloo), 2 workers, batch 32.

The tuning study runs Horovod under several settings against DDP in one interleaved comparison, so
every setting's ratio to DDP is measured under the same machine conditions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.compare import Contender
from bench.image_loop import ImageShape
from bench.launch import ddp_command, horovod_command, run_worker
from bench.lm_loop import LmShape


@dataclass(frozen=True)
class HorovodSettings:
    """Horovod's knobs. None/0 leaves Horovod's (or torch's) own default in place."""

    threads: int = 0                   # torch intra-op threads per worker; 0: torch's default
    cycle_time_ms: float | None = None  # HOROVOD_CYCLE_TIME (Horovod default 1 ms)
    fusion_mb: float | None = None      # HOROVOD_FUSION_THRESHOLD (Horovod default 128 MB)
    autotune: bool = False              # HOROVOD_AUTOTUNE
    compression: str = "none"           # none | fp16
    pin: bool = False                   # workers pinned to their share of the cores (train/cpu.py)
    groups: int = 0                     # DistributedOptimizer(groups=...); 0: one allreduce per gradient

    def env(self) -> dict[str, str]:
        env = {}
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        if self.cycle_time_ms is not None:
            env["HOROVOD_CYCLE_TIME"] = f"{self.cycle_time_ms:g}"
        if self.fusion_mb is not None:
            env["HOROVOD_FUSION_THRESHOLD"] = str(int(self.fusion_mb * 1024 * 1024))
        if self.autotune:
            env["HOROVOD_AUTOTUNE"] = "1"
        return env

    def args(self) -> list[str]:
        pin = ["--pin"] if self.pin else []
        return ["--threads", str(self.threads), "--compression", self.compression,
                "--groups", str(self.groups), *pin]


# One factor at a time: Horovod's defaults, then one thread per worker (what torchrun gives DDP),
# then pinned workers, then each other knob changed on top of that. (This model's gradients total well
# under a megabyte, so any fusion threshold above that fuses them all: 0, which turns fusion off, is the
# informative alternative to the default.)
STUDY: dict[str, HorovodSettings] = {
    "hvd-defaults": HorovodSettings(),
    "hvd-threads1": HorovodSettings(threads=1),
    "hvd-threads1-pin": HorovodSettings(threads=1, pin=True),
    "hvd-threads1-pin-cycle0.5": HorovodSettings(threads=1, pin=True, cycle_time_ms=0.5),
    "hvd-threads1-pin-cycle0.25": HorovodSettings(threads=1, pin=True, cycle_time_ms=0.25),
    "hvd-threads1-pin-cycle2": HorovodSettings(threads=1, pin=True, cycle_time_ms=2),
    "hvd-threads1-pin-fusion0": HorovodSettings(threads=1, pin=True, fusion_mb=0),
    "hvd-threads1-pin-autotune": HorovodSettings(threads=1, pin=True, autotune=True),
    "hvd-threads1-pin-fp16": HorovodSettings(threads=1, pin=True, compression="fp16"),
    "hvd-threads1-pin-cycle0.5-groups1": HorovodSettings(threads=1, pin=True, cycle_time_ms=0.5, groups=1),
    "hvd-threads1-pin-cycle0.1-groups1": HorovodSettings(threads=1, pin=True, cycle_time_ms=0.1, groups=1),
    "hvd-threads1-pin-cycle0.05-groups1": HorovodSettings(threads=1, pin=True, cycle_time_ms=0.05, groups=1),
}


@dataclass(frozen=True)
class LoopShape:
    steps: int
    warmup: int
    batch_size: int = 32
    workers: int = 2
    model: str = "cnn"
    width: int = 32

    def args(self) -> list[str]:
        return ["--steps", str(self.steps), "--warmup", str(self.warmup),
                "--batch-size", str(self.batch_size), "--width", str(self.width), "--model", self.model]

    def trainer_task_args(self) -> list[str]:
        """The trainer's model and data flags: its demo task's model on its synthetic batch."""
        return ["--model", self.model, "--width", str(self.width), "--data", "synthetic"]


def horovod_contender(name: str, settings: HorovodSettings, shape: LoopShape | ImageShape | LmShape,
                      timeout_s: float) -> Contender:
    cmd = horovod_command("bench.worker_hvd", [*shape.args(), *settings.args()], np=shape.workers)
    return Contender(
        name=name,
        run=lambda: run_worker(name, cmd, settings.env(), timeout_s),
        config={"framework": "horovod", "launcher": "horovodrun --gloo", **asdict(settings),
                "env": settings.env(), **asdict(shape)},
    )


def ddp_contender(shape: LoopShape | ImageShape, timeout_s: float, name: str = "ddp",
                  pin: bool = False) -> Contender:
    """DDP as torchrun starts it (torchrun sets OMP_NUM_THREADS=1 per worker by default); with `pin`,
    its workers pinned the way the trainer pins Horovod's, to compare like with like."""
    cmd = ddp_command("bench.worker_ddp", [*shape.args(), *(["--pin"] if pin else [])], np=shape.workers)
    return Contender(
        name=name,
        run=lambda: run_worker(name, cmd, None, timeout_s),
        config={"framework": "ddp", "launcher": "torchrun", "backend": "gloo", "pin": pin, **asdict(shape)},
    )
