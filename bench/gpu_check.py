"""The trainer's GPU paths and a synthetic ResNet-50 benchmark on one GPU, in one call of a few minutes,
on a machine without network (`scripts/gpu-check`; the device tool's machines: Python 3.12, a CUDA
torch preinstalled, other packages carried as wheels). Writes a JSON report; each check records ok,
failed (with the error) or skipped (with the reason), so a missing piece never hides the rest.

With Horovod importable, the trainer itself runs (`python -m train`, one worker: fp16 + GradScaler
with pinned checkpoint staging, then a resume, then bf16). Without it (Horovod is built from source,
which that machine cannot download), the same paths run as components: the project's CNN trained
under fp16 autocast + GradScaler and under bf16 autocast in channels_last, the checkpoint writer in
async_with_pinned_mem mode, and the restore through CheckpointStore, compared bitwise.

Then the trainer's own step against bare loops: the image task's (bench/gpu_step.py: ResNet-50, batch
256, synthetic and packed JPEGs) and the lm task's (bench/gpu_lm.py: GPT-2 small at context 1,024, fed
by the task's token stream, without and with --compile, with MFU).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check(report: dict, name: str, fn) -> None:
    started = time.perf_counter()
    try:
        result = fn()
        entry = {"status": "ok", **(result or {})}
    except Skip as why:
        entry = {"status": "skipped", "reason": str(why)}
    except Exception as e:  # noqa: BLE001 - recorded, and the next check runs
        entry = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                 "traceback": traceback.format_exc()[-2000:]}
    entry["seconds"] = round(time.perf_counter() - started, 2)
    report["checks"][name] = entry
    print(f"gpu-check: {name}: {entry['status']} {entry.get('reason') or entry.get('error') or ''}",
          file=sys.stderr, flush=True)


class Skip(Exception):
    pass


def train_components(precision: str, steps: int = 60) -> dict:
    import torch
    import torch.nn.functional as F

    from train.data import INPUT_SHAPE, NUM_CLASSES, synthetic_batch
    from train.gpu import configure_gpu_worker, memory_format
    from train.model import build_model

    configure_gpu_worker(tf32=True, local_size=1)
    torch.manual_seed(0)
    model = build_model("cnn", INPUT_SHAPE, NUM_CLASSES, 64, 0.0).cuda()
    fmt = memory_format(model, on_gpu=True)
    model = model.to(memory_format=fmt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = synthetic_batch(0, 0, 256)
    x = x.pin_memory().cuda(non_blocking=True).to(memory_format=fmt)
    y = y.pin_memory().cuda(non_blocking=True)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
    if not all(math.isfinite(v) for v in losses) or losses[-1] >= losses[0]:
        raise AssertionError(f"{precision}: loss {losses[0]:.3f} -> {losses[-1]:.3f} (not finite or rising)")
    return {"initial_loss": losses[0], "final_loss": losses[-1], "steps": steps,
            "scale": scaler.get_scale() if scaler is not None else None}


def pinned_staging_and_restore(mib: int = 512) -> dict:
    import torch

    from train.checkpoint import store as ckpt
    from train.checkpoint.writer import CheckpointWriter
    from train.storage import open_store

    with tempfile.TemporaryDirectory() as root:
        writer = CheckpointWriter(root, None, keep=1, mode="async_with_pinned_mem")
        try:
            writer.wait_ready()
            params = torch.randn(mib << 18, device="cuda")  # mib MiB of float32
            stats = torch.zeros(1024, device="cuda")
            expected = {"params": params.cpu(), "stats": stats.cpu()}
            torch.cuda.synchronize()
            started = time.perf_counter()
            writer.submit(1, {"params": params, "stats": stats}, forward_changes=[stats])
            submit_s = time.perf_counter() - started
            stats.add_(1)  # the next forward pass, queued behind the buffer's copy
            writer.copied()
            copied_s = time.perf_counter() - started
            params.add_(1)  # the optimizer step
            writer.wait()
            written_s = time.perf_counter() - started
        finally:
            writer.close()
        started = time.perf_counter()
        found = ckpt.CheckpointStore(open_store(root), keep=1).latest_valid()
        restore_s = time.perf_counter() - started
        for name in expected:
            if not torch.equal(found.state[name], expected[name]):
                raise AssertionError(f"restored {name} differs from the state at submit")
    return {"state_mib": mib, "submit_s": round(submit_s, 4), "copied_s": round(copied_s, 4),
            "device_to_host_gb_s": round((mib / 1024) / max(copied_s, 1e-9), 2),
            "write_s": round(written_s, 2), "restore_s": round(restore_s, 2), "bitwise_equal": True}


def trainer_runs(work: Path) -> dict:
    try:
        import horovod.torch  # noqa: F401
    except ImportError as e:
        raise Skip(f"Horovod is not importable here ({e}): it is built from source (scripts/build-horovod), "
                   "which this machine cannot download; the components above ran instead") from None
    ck = work / "ck"
    common = [sys.executable, "-m", "train", "--no-progress", "--model", "cnn", "--width", "64",
              "--checkpoint-dir", str(ck), "--checkpoint-mode", "async_with_pinned_mem",
              "--checkpoint-every", "10"]
    out = {}
    for name, extra in (("fp16", ["--precision", "fp16", "--steps", "40"]),
                        ("resume_bf16", ["--precision", "bf16", "--steps", "60"])):
        r = subprocess.run(common + extra, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError(f"{name}: exit {r.returncode}: {r.stderr[-1500:]}")
        line = next(x for x in r.stdout.splitlines() if x.startswith("RINGTRAIN_SUMMARY "))
        out[name] = json.loads(line.split(" ", 1)[1])
    if out["resume_bf16"]["resumed_from_step"] != 40:
        raise AssertionError(f"the bf16 run resumed from {out['resume_bf16']['resumed_from_step']}, not 40")
    return out


def resnet50(batch_size: int = 64, steps: int = 30, warmup: int = 10) -> dict:
    """Horovod's pytorch_synthetic_benchmark shape: ResNet-50, synthetic 224x224 images, SGD; bf16
    autocast, channels_last. Images/s over `steps` after `warmup`."""
    import torch
    import torch.nn.functional as F

    try:
        import torchvision
    except ImportError as e:
        raise Skip(f"torchvision is not importable here ({e}): no ResNet-50") from None
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch_size, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch_size,), device="cuda")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    return {"images_per_sec": round(batch_size * steps / elapsed, 1), "batch_size": batch_size,
            "steps": steps, "precision": "bf16 autocast", "memory_format": "channels_last",
            "torchvision": torchvision.__version__}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-check.json", help="the JSON report's path")
    p.add_argument("--state-mib", type=int, default=512, help="size of the pinned staging check's state")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    report: dict = {"python": sys.version.split()[0], "torch": torch.__version__,
                    "cuda": torch.version.cuda, "checks": {}}
    if not torch.cuda.is_available():
        report["gpu"] = None
        report["status"] = "skipped: no CUDA device here"
    else:
        report["gpu"] = torch.cuda.get_device_name(0)
        check(report, "fp16_gradscaler", lambda: train_components("fp16"))
        check(report, "bf16", lambda: train_components("bf16"))
        check(report, "pinned_staging_and_restore", lambda: pinned_staging_and_restore(args.state_mib))
        with tempfile.TemporaryDirectory() as work:
            check(report, "trainer_fp16_then_bf16_resume", lambda: trainer_runs(Path(work)))
        check(report, "resnet50_synthetic", resnet50)
        from bench.gpu_step import measure  # the trainer's own step against a bare loop (issue 35)

        measure(report, check, lambda: resnet50(batch_size=256))
        from bench.gpu_lm import measure as measure_lm  # the lm task's step and input (issue 36)

        measure_lm(report, check)
        failed = [k for k, v in report["checks"].items() if v["status"] == "failed"]
        report["status"] = f"failed: {', '.join(failed)}" if failed else "ok"
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"gpu-check: {report['status']}; report in {args.out}", file=sys.stderr)
    return 1 if report["status"].startswith("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
