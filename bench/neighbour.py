"""What a busy spare core costs a training step on this machine.

With a core to spare, a checkpoint's write (serialization, hashing, the upload and the local store's
side of it) runs beside training, not in its way; yet the training step still slows while the write
runs, because the two cores share what lies under them: the last-level cache, memory bandwidth and,
on a VM, whatever the host shares. This times the stall section's own model step in one process
while a neighbour process does a checkpoint's CPU work (train.checkpoint.store.save and sha256 of a
state of the checkpoint's size, over and over, at the lowest priority, as the writer runs), in blocks
alternating between the neighbour stopped (SIGSTOP) and running, and reports the median of the
per-pair ratios of the median step. Times the CPU time a checkpoint keeps the spare core busy (the
writer's and the local store's, measured by the stall section), it is the part of the checkpoint
stall that comes from sharing the machine, which the trainer cannot remove.

    python -m bench.neighbour busy BYTES   # the neighbour's loop (started by neighbour_slowdown)
"""

from __future__ import annotations

import hashlib
import io
import os
import select
import signal
import subprocess
import sys
import time

import psutil

from bench.launch import ROOT, BenchError, with_root_on_path
from bench.machine import cpu_seconds
from bench.stats import median, median_interval

WARMUP_STEPS = 30
START_TIMEOUT_S = 60.0  # python and torch's import, on a busy machine
SETTLE_S = 0.005  # after SIGCONT, before timing: the neighbour is back on its core


def busy(nbytes: int) -> None:
    """A checkpoint's CPU work without the upload, in a loop until killed."""
    import torch

    from train.checkpoint.store import save

    torch.set_num_threads(1)
    state = {"weights": torch.randn(max(1, nbytes // 4))}
    print("ready", flush=True)
    while True:
        buf = io.BytesIO()
        save(state, buf)
        hashlib.sha256(buf.getbuffer()).digest()


def block_ratios(idle: list[float], loaded: list[float]) -> list[float]:
    """Per pair of blocks, the loaded block's median step over the idle block's."""
    if len(idle) != len(loaded) or not idle:
        raise ValueError(f"need pairs of blocks, got {len(idle)} idle and {len(loaded)} loaded")
    return [b / a for a, b in zip(idle, loaded, strict=True)]


def neighbour_slowdown(width: int, nbytes: int, pairs: int = 40, block_s: float = 0.15,
                       batch_size: int = 32) -> dict:
    """The stall section's MLP of `width` trained on one thread, blocks of about `block_s` alternating
    (idle, loaded / loaded, idle: ABBA) with a neighbour doing a `nbytes` checkpoint's CPU work."""
    import torch

    from bench.machine import lowest_priority
    from bench.model import batch, build

    if pairs < 1 or block_s <= 0:
        raise ValueError(f"pairs={pairs}, block_s={block_s}: need at least one pair and a positive block")
    torch.set_num_threads(1)
    model = build("mlp", width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # the trainer's default
    x, y = batch(0, 0, batch_size)

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        return time.perf_counter() - start

    warm = [step() for _ in range(WARMUP_STEPS)]
    steps_per_block = max(5, round(block_s / median(warm)))
    proc = subprocess.Popen([sys.executable, "-m", "bench.neighbour", "busy", str(nbytes)], cwd=ROOT,
                            env=with_root_on_path(os.environ), stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        started = select.select([proc.stdout], [], [], START_TIMEOUT_S)[0]
        if not started or proc.stdout.readline() != "ready\n":
            raise BenchError(f"the neighbour process did not start within {START_TIMEOUT_S:.0f} s "
                             f"(exit status {proc.poll()})")
        lowest_priority(proc.pid)
        os.kill(proc.pid, signal.SIGSTOP)
        neighbour = psutil.Process(proc.pid)
        idle, loaded = [], []
        share: dict[bool, list[float]] = {False: [], True: []}  # the neighbour's CPU / wall, per block
        for p in range(pairs):
            for running in ((False, True) if p % 2 == 0 else (True, False)):
                if running:
                    os.kill(proc.pid, signal.SIGCONT)
                    time.sleep(SETTLE_S)
                cpu0, wall0 = cpu_seconds(neighbour), time.perf_counter()
                durations = [step() for _ in range(steps_per_block)]
                share[running].append((cpu_seconds(neighbour) - cpu0) / (time.perf_counter() - wall0))
                if running:
                    os.kill(proc.pid, signal.SIGSTOP)
                (loaded if running else idle).append(median(durations))
    finally:
        proc.kill()
        proc.wait()
    ratios = block_ratios(idle, loaded)
    interval = median_interval(ratios)
    return {
        "ratio": median(ratios),
        "interval": [interval.low, interval.high] if interval else None,
        "per_pair": ratios,
        "pairs": pairs,
        "steps_per_block": steps_per_block,
        "idle_step_s": median(idle),
        # the neighbour's CPU time over the blocks' wall time: near 1 running when it had a core to
        # itself, 0 stopped
        "neighbour_cpu_share": median(share[True]),
        "neighbour_cpu_share_stopped": median(share[False]),
        "neighbour": f"serialize + sha256 of a {nbytes}-byte state in a loop, nice 19 (bench.neighbour.busy)",
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "busy" or not args[1].isdigit():
        print("usage: python -m bench.neighbour busy BYTES", file=sys.stderr)
        return 2
    busy(int(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
