"""Peer comparison: the same small CNN under Horovod and under torch DDP (Gloo), 2 workers, batch 32.

The tuning study runs Horovod under several settings against DDP in one interleaved comparison, so
every setting's ratio to DDP is measured under the same machine conditions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.compare import Contender
from bench.launch import ddp_command, horovod_command, run_worker


@dataclass(frozen=True)
class HorovodSettings:
    """Horovod's knobs. None/0 leaves Horovod's (or torch's) own default in place."""

    threads: int = 0                   # torch intra-op threads per worker; 0: torch's default
    cycle_time_ms: float | None = None  # HOROVOD_CYCLE_TIME (Horovod default 1 ms)
    fusion_mb: float | None = None      # HOROVOD_FUSION_THRESHOLD (Horovod default 128 MB)
    autotune: bool = False              # HOROVOD_AUTOTUNE
    compression: str = "none"           # none | fp16
    wait: str = "spin"                  # spin: Horovod's own wait in step(); poll: poll with sleeps

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
        return ["--threads", str(self.threads), "--compression", self.compression, "--wait", self.wait]


# One factor at a time: Horovod's defaults, then one thread per worker (what torchrun gives DDP),
# then each other knob changed on top of that. (This model's gradients total well under a megabyte,
# so any fusion threshold above that fuses them all: 0, which turns fusion off, is the informative
# alternative to the default.)
STUDY: dict[str, HorovodSettings] = {
    "hvd-defaults": HorovodSettings(),
    "hvd-threads1": HorovodSettings(threads=1),
    "hvd-threads1-cycle0.1": HorovodSettings(threads=1, cycle_time_ms=0.1),
    "hvd-threads1-cycle5": HorovodSettings(threads=1, cycle_time_ms=5),
    "hvd-threads1-fusion0": HorovodSettings(threads=1, fusion_mb=0),
    "hvd-threads1-autotune": HorovodSettings(threads=1, autotune=True),
    "hvd-threads1-fp16": HorovodSettings(threads=1, compression="fp16"),
    "hvd-threads1-poll": HorovodSettings(threads=1, wait="poll"),
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


def horovod_contender(name: str, settings: HorovodSettings, shape: LoopShape, timeout_s: float) -> Contender:
    cmd = horovod_command("bench.worker_hvd", [*shape.args(), *settings.args()], np=shape.workers)
    return Contender(
        name=name,
        run=lambda: run_worker(name, cmd, settings.env(), timeout_s),
        config={"framework": "horovod", "launcher": "horovodrun --gloo", **asdict(settings),
                "env": settings.env(), **asdict(shape)},
    )


def ddp_contender(shape: LoopShape, timeout_s: float, name: str = "ddp") -> Contender:
    """DDP as torchrun starts it: torchrun sets OMP_NUM_THREADS=1 per worker by default."""
    cmd = ddp_command("bench.worker_ddp", shape.args(), np=shape.workers)
    return Contender(
        name=name,
        run=lambda: run_worker(name, cmd, None, timeout_s),
        config={"framework": "ddp", "launcher": "torchrun", "backend": "gloo", **asdict(shape)},
    )
