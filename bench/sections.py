"""The benchmark sections (checkpoint_throughput's is bench/checkpoint_throughput.py). Each returns a
JSON-able dict with a "status" and its figures."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from bench.compare import Contender, run_comparison
from bench.figures import BusyCore, Ratio, Recovery, StallRow
from bench.image_loop import ImageShape, pack_digits
from bench.input_pipeline import DecodeShape
from bench.launch import ROOT, BenchError
from bench.machine import cpu_seconds, lowest_priority
from bench.neighbour import neighbour_slowdown
from bench.peer import STUDY, HorovodSettings, LoopShape, ddp_contender, horovod_contender
from bench.shard_read import ReadShape
from bench.stats import median, paired_ratios
from bench.trainer_run import TrainerRun, stall_estimate, step_durations
from infra.storage_layout import checkpoint_key_prefix
from train.summary import RunSummary

Progress = Callable[[str], None]

# The trainer runs here with its own defaults (no tuning flags): on CPU workers (train/cpu.py) each
# worker pinned to its share of the cores, one torch thread per core of it, Horovod's cycle time 0.05
# ms, the gradients allreduced in one group. PRODUCTION is the same for the bare Horovod loop at 2
# workers on 2 cores (a test holds the two together). The study below is the evidence for each choice.
TRAINER_DEFAULTS = None
PRODUCTION = HorovodSettings(threads=1, pin=True, cycle_time_ms=0.05, groups=1)
STORE_BUCKET = "bench"
# The local S3 server runs at the lowest CPU priority (niceness 19, as the trainer runs its checkpoint
# writer): on AWS, S3's work happens on S3's machines, not on the training node, so here it should only
# use what training leaves. The trainer's own side of every upload (the copy on the training thread;
# serialization, hashing and boto3 in its writer process) is measured.
STORE_PRIORITY = "nice 19, every thread (bench.machine.lowest_priority)"


@contextlib.contextmanager
def object_store():
    """A moto S3 server on loopback with the bench bucket, at the lowest priority; yields the store."""
    from cluster.local.objectstore import ObjectStore

    with ObjectStore() as store:
        lowest_priority(store.pid)
        store.client().create_bucket(Bucket=STORE_BUCKET)
        yield store


@dataclass(frozen=True)
class StallLayout:
    """Where a checkpoint's CPU work (copy, serialization, hashing, upload) can run: on a node whose
    cores training fills, it takes cycles from training; with a core to spare, as on GPU nodes, whose
    cores mostly wait on the GPUs, only what the training process itself pays (the copy into the
    writer's shared memory) is left, and what the cores' sharing costs (`spare_core`: measured beside
    it with bench.neighbour)."""

    name: str
    workers: int
    env: tuple[tuple[str, str], ...] = ()
    spare_core: bool = False


SATURATED = StallLayout("2 workers on 2 cores", workers=2)
SPARE_CORE = StallLayout("1 worker, 1 thread, 2 cores", workers=1, env=(("OMP_NUM_THREADS", "1"),),
                         spare_core=True)


@dataclass(frozen=True)
class StallSize:
    """One model size of the checkpoint-stall section: the MLP's width, the checkpoint interval and
    the run's length in steps. The interval must outlast a write (or the checkpoints queue up and the
    figure measures the store's throughput) with a fifth of it to spare for a baseline after it; the
    smallest model's steps are so short that it needs the longest interval. The row says when a write
    outlasted its interval (write_within_after)."""

    width: int
    every: int
    steps: int       # timed steps, after the warmup
    warmup: int

    def shape(self, workers: int) -> LoopShape:
        return LoopShape(steps=self.steps, warmup=self.warmup, model="mlp", width=self.width,
                         workers=workers)

    def profiled(self) -> list[int]:
        """The checkpoints measured: the first after warmup is the run's first upload (its client's
        first requests), so from the second on, each with a whole interval after it."""
        total = self.warmup + self.steps
        steps = list(range(2 * self.every, total - self.every + 1, self.every))
        if not steps:
            raise ValueError(f"stall size w{self.width}: no checkpoint with {self.every} steps after it "
                             f"in {total} steps")
        return steps


@dataclass(frozen=True)
class ThroughputSize:
    """One state size of the checkpoint-throughput section (decimal MB of float32 tensor data) and
    its number of paired repeats (bench/checkpoint_throughput.py)."""

    size_mb: int
    repeats: int


@dataclass(frozen=True)
class Plan:
    """How big each section is: the full run and --quick differ only here."""

    repeats: int                     # peer study
    headline_repeats: int
    study_shape: LoopShape           # peer study (shorter runs: nine contenders)
    shape: LoopShape                 # headline (trainer, bare Horovod, DDP) and recovery
    study: tuple[str, ...]           # settings of STUDY to run
    checkpoint_every: int            # headline trainer run
    stall_sizes: tuple[StallSize, ...]
    stall_repeats: int
    stall_layouts: tuple[StallLayout, ...]
    neighbour_pairs: int             # spare-core layout: block pairs of bench.neighbour per size
    recovery_steps: int
    recovery_reclaim_at: int
    recovery_checkpoint_every: int
    plan_runs: int
    plan_cold_runs: int
    timeout_s: float
    image_shape: ImageShape          # image task (its `data` is filled in with the packed digits)
    image_repeats: int
    decode_shape: DecodeShape        # input pipeline: one DataLoader worker vs a bare decode loop
    read_shape: ReadShape            # shard stream vs bare boto3
    pipeline_repeats: int            # both input-pipeline comparisons
    throughput_sizes: tuple[ThroughputSize, ...]  # checkpoint throughput: state sizes and their repeats


FULL = Plan(
    # Headline repeats: enough for an interval of the efficiency median narrow enough to decide its
    # target (the width goes as 1/sqrt(repeats)); a multiple of the 4 contenders, so that each runs
    # in each slot of the rotation equally often.
    repeats=3, headline_repeats=24, study_shape=LoopShape(steps=100, warmup=20, width=64),
    shape=LoopShape(steps=200, warmup=20, width=64), study=tuple(STUDY), checkpoint_every=50,
    # Intervals: each must outlast a write (see StallSize). Lengths: enough checkpoints a run that the
    # median's interval is narrower than a step at every size, so that a verdict can stand.
    stall_sizes=(StallSize(256, every=200, steps=11950, warmup=50),
                 StallSize(1024, every=50, steps=950, warmup=50),
                 StallSize(2048, every=50, steps=550, warmup=50)),
    stall_repeats=3, stall_layouts=(SATURATED, SPARE_CORE), neighbour_pairs=40,
    recovery_steps=160, recovery_reclaim_at=70, recovery_checkpoint_every=50,
    plan_runs=3, plan_cold_runs=2, timeout_s=300,
    # Image task: the smallest torchvision model whose step, on one core, is about as long as the
    # loader process's decoding of a batch beside it. A run's start-up (horovodrun, torchvision, the
    # loader's forkserver) outweighs its window, so 6 repeats: the fewest with a 95 % interval.
    image_shape=ImageShape("", steps=40, warmup=10, model="shufflenet_v2_x0_5"), image_repeats=6,
    # Runs of about a second each (shorter ones swung widely from repeat to repeat); 10 repeats give
    # each ratio an interval from the 2nd to the 9th per-repeat ratio.
    decode_shape=DecodeShape(shards=8, per_shard=128), read_shape=ReadShape(shards=32, shard_mb=4),
    pipeline_repeats=10,
    # The states of issue 28. Six pairs are the fewest with a 95 % interval of the median
    # (bench.stats.median_interval): the large sizes, whose pairs take minutes, get six.
    throughput_sizes=(ThroughputSize(100, repeats=12), ThroughputSize(1000, repeats=6),
                      ThroughputSize(4000, repeats=6)),
)
QUICK = Plan(
    repeats=1, headline_repeats=1, study_shape=LoopShape(steps=30, warmup=10, width=16),
    shape=LoopShape(steps=30, warmup=10, width=16),
    study=("hvd-defaults", "hvd-threads1-pin-cycle0.5"), checkpoint_every=10,
    stall_sizes=(StallSize(256, every=8, steps=24, warmup=8),), stall_repeats=1, stall_layouts=(SATURATED,),
    neighbour_pairs=4,
    recovery_steps=40, recovery_reclaim_at=15, recovery_checkpoint_every=10,
    plan_runs=1, plan_cold_runs=1, timeout_s=180,
    # decoding in the training processes: no loader process to start in each of the four runs (the
    # smoke test's time); the full run's DataLoader process is the task's default path
    image_shape=ImageShape("", steps=10, warmup=10, model="shufflenet_v2_x0_5", image_size=16,
                           loader_workers=0),
    image_repeats=1,
    decode_shape=DecodeShape(shards=2, per_shard=32), read_shape=ReadShape(shards=4, shard_mb=1),
    pipeline_repeats=2,
    # multipart on both sides, as at every real size: two parts of ours (16 MiB), three of boto3's (8 MiB)
    throughput_sizes=(ThroughputSize(20, repeats=2),),
)


def study_section(plan: Plan, progress: Progress) -> dict:
    """Peer comparison and tuning study: bare Horovod under each setting vs bare DDP, interleaved."""
    contenders = [ddp_contender(plan.study_shape, plan.timeout_s),
                  ddp_contender(plan.study_shape, plan.timeout_s, name="ddp-pin", pin=True)]
    contenders += [horovod_contender(name, STUDY[name], plan.study_shape, plan.timeout_s)
                   for name in plan.study]
    comparison = run_comparison(contenders, "ddp", plan.repeats, progress=progress)
    ratios = {name: r["median"] for name, r in comparison["ratios"].items() if name in STUDY}
    best = max(ratios, key=ratios.get)  # the best Horovod setting
    return {"status": "ok", "comparison": comparison, "best": best, "best_ratio_to_ddp": ratios[best],
            "reaches_ddp": {name: r >= 1.0 for name, r in ratios.items()}}


def headline_section(plan: Plan, progress: Progress) -> dict:
    """Trainer efficiency and peer comparison in one interleaved run: the trainer with production
    features on (checkpoints to the local S3 store every N steps, metrics file), the bare Horovod loop
    with the same settings, and DDP; all the same model, batch and workers."""
    with object_store() as store, tempfile.TemporaryDirectory(prefix="bench-headline-") as tmp:
        trainer = TrainerRun(plan.shape, TRAINER_DEFAULTS, plan.checkpoint_every, store.endpoint_url,
                             STORE_BUCKET)
        contenders = [
            Contender("trainer", lambda: trainer.run("trainer", Path(tmp), store.env(), plan.timeout_s),
                      {"what": "python -m train under horovodrun (cluster.launch.horovodrun_command)",
                       "checkpoint_every": plan.checkpoint_every,
                       "checkpoints_in_window": checkpoints_in_window(
                           plan.shape.warmup, plan.shape.warmup + plan.shape.steps, plan.checkpoint_every),
                       "checkpoint_store": f"moto S3 on loopback at {STORE_PRIORITY}",
                       "metrics_file": True, "settings": "the trainer's defaults (no tuning flags)",
                       **asdict(plan.shape)}),
            horovod_contender("bare-hvd", PRODUCTION, plan.shape, plan.timeout_s),
            ddp_contender(plan.shape, plan.timeout_s),
            ddp_contender(plan.shape, plan.timeout_s, name="ddp-pin", pin=True),
        ]
        comparison = run_comparison(contenders, "bare-hvd", plan.headline_repeats, progress=progress)
    return {**peer_figures(comparison, plan.shape),
            "trainer_checkpoints": trainer_checkpoints(comparison["contenders"]["trainer"]["runs"])}


# The trainer against the bare Horovod loop with its settings, and against DDP as torchrun starts it
# (one thread per worker, unpinned): the trainer must be no slower than what a user gets from torchrun
# and DDP. The image task's rows keep the headline's targets.
EFFICIENCY_TARGET = 0.97
PEER_TARGET = 1.0


def peer_figures(comparison: dict, shape: LoopShape | ImageShape) -> dict:
    """Pure: the headline's and the image section's ratios from their comparison of the trainer, the
    bare Horovod loop, DDP and (when run) DDP pinned like the trainer (like with like: no target)."""
    samples = {name: c["samples"] for name, c in comparison["contenders"].items()}
    return {
        "status": "ok",
        "comparison": comparison,
        "window": f"steps {shape.warmup}..{shape.warmup + shape.steps} of every run "
                  f"(the first {shape.warmup} are warmup and untimed for all contenders)",
        "efficiency": Ratio.of(comparison["ratios"]["trainer"]["per_repeat"], EFFICIENCY_TARGET).to_json(),
        "peer": {"trainer": Ratio.of(paired_ratios(samples["trainer"], samples["ddp"]),
                                     PEER_TARGET).to_json(),
                 "bare-hvd": Ratio.of(paired_ratios(samples["bare-hvd"], samples["ddp"])).to_json()},
        "peer_pinned": {name: Ratio.of(paired_ratios(samples[name], samples["ddp-pin"])).to_json()
                        for name in ("trainer", "bare-hvd") if "ddp-pin" in samples},
    }


def trainer_checkpoints(runs: list[dict]) -> dict:
    """Per run, what the trainer's checkpoints did: written (the final one, after the window,
    included), deferred past their step because the previous write went on (train.trainer), the
    time training waited for a write in flight (the final checkpoint's), and the longest write."""
    return {"written": [r["checkpoints_written"] for r in runs],
            "deferred": [r["checkpoints_deferred"] for r in runs],
            "wait_s": [r["checkpoint_wait_s"] for r in runs],
            "write_max_s": [r["checkpoint_write_max_s"] for r in runs]}


def stall_section(plan: Plan, progress: Progress) -> dict:
    """Checkpoint stall: per layout and model size, the trainer checkpointing every K steps to the
    local S3 store and the same trainer without checkpoints, interleaved, every step timed
    (STALL_METHOD says how the figures come from them)."""
    rows = []
    with object_store() as store, tempfile.TemporaryDirectory(prefix="bench-stall-") as tmp:
        for layout, size in ((lay, z) for lay in plan.stall_layouts for z in plan.stall_sizes):
            records = stall_runs(plan, layout, size, store, Path(tmp))
            nbytes = checkpoint_bytes(store.client(), STORE_BUCKET, records["checkpoints"][-1]["run_id"])
            try:
                row = stall_row(layout, size, records, nbytes)
            except ValueError as e:
                raise BenchError(f"checkpoint stall, {layout.name}, width {size.width}: {e}") from None
            if layout.spare_core:
                row = dataclasses.replace(row, neighbour=busy_core(row, plan.neighbour_pairs))
            progress(stall_progress(row))
            rows.append(row)
    return {"status": "ok", "store_priority": STORE_PRIORITY, "repeats": plan.stall_repeats,
            "sizes": [row.to_json() for row in rows], "method": STALL_METHOD}


def stall_runs(plan: Plan, layout: StallLayout, size: StallSize, store,
               tmp: Path) -> dict[str, list[dict]]:
    """The trainer with and without checkpoints, interleaved (the order swapped every repeat), each
    run's record with the store server's CPU time over it (`store_cpu_s`)."""
    shape = size.shape(layout.workers)
    env = {**store.env(), **dict(layout.env)}
    tag = f"w{size.width}-np{layout.workers}"
    runs = {"checkpoints": TrainerRun(shape, TRAINER_DEFAULTS, size.every, store.endpoint_url, STORE_BUCKET,
                                      log_every=1),
            "no-checkpoints": TrainerRun(shape, TRAINER_DEFAULTS, 0, log_every=1)}
    server = psutil.Process(store.pid)
    records: dict[str, list[dict]] = {name: [] for name in runs}
    for rep in range(plan.stall_repeats):
        for name in (list(runs) if rep % 2 == 0 else list(runs)[::-1]):
            before = cpu_seconds(server)
            record = runs[name].run(f"stall-{tag}-{name}", tmp, env, plan.timeout_s)
            record["store_cpu_s"] = cpu_seconds(server) - before
            records[name].append(record)
    return records


def stall_row(layout: StallLayout, size: StallSize, records: dict[str, list[dict]],
              nbytes: int) -> StallRow:
    """Pure: one row of the stall section from its runs' records (bench.trainer_run.TrainerRun.run,
    with `store_cpu_s`) and the checkpoint's size. ValueError where the estimate cannot be made."""
    shape = size.shape(layout.workers)
    with_ckpt, without = records["checkpoints"], records["no-checkpoints"]
    in_window = checkpoints_in_window(shape.warmup, shape.warmup + shape.steps, size.every)
    ab_lost = [(a["window_s"] - b["window_s"]) / in_window for a, b in zip(with_ckpt, without, strict=True)]
    write_max = [r["checkpoint_write_max_s"] for r in with_ckpt]
    durations = {name: [step_durations(r["records"]) for r in rs] for name, rs in records.items()}
    profiled = size.profiled()
    profile = stall_estimate(durations["checkpoints"], profiled, size.every, write_s=max(write_max))
    # the null control: the same estimate, at the same after steps, over the runs that wrote nothing
    null = stall_estimate(durations["no-checkpoints"], profiled, size.every, after=profile["after_steps"])
    step_s = median([r["window_s"] / shape.steps for r in without])
    # CPU time per checkpoint: the writer process's (its own accounting) and the store server's
    per_run = [(r, max(1, r["checkpoints_written"])) for r in with_ckpt]
    lost, interval = profile["lost_per_checkpoint_s"], profile["lost_interval_s"]
    contained = profile["write_within_after"]
    return StallRow(
        layout=layout.name, workers=layout.workers, env=dict(layout.env), model="mlp", width=size.width,
        checkpoint_bytes=nbytes, every=size.every, steps=shape.steps, warmup=shape.warmup,
        checkpoints_in_window=in_window, profiled_after_steps=tuple(profiled), baseline_step_s=step_s,
        lost_per_checkpoint_s=lost,
        lost_per_checkpoint_samples_s=tuple(profile["lost_per_checkpoint_samples_s"]),
        lost_interval_s=None if interval is None else tuple(interval),
        checkpoints_measured=profile["checkpoints_measured"], lost_in_steps=lost / step_s,
        below_one_step=contained and lost < step_s,
        verdict_decided=contained and interval is not None and not interval[0] < step_s <= interval[1],
        null_lost_per_checkpoint_s=null["lost_per_checkpoint_s"],
        null_lost_interval_s=None if null["lost_interval_s"] is None else tuple(null["lost_interval_s"]),
        write_max_s=tuple(write_max), after_steps=profile["after_steps"], write_within_after=contained,
        writer_wait_s=tuple(r["checkpoint_wait_s"] for r in with_ckpt),
        checkpoints_deferred=tuple(r["checkpoints_deferred"] for r in with_ckpt),
        writer_cpu_per_checkpoint_s=median([r["checkpoint_write_cpu_s"] / n for r, n in per_run]),
        store_cpu_per_checkpoint_s=median([r["store_cpu_s"] / n for r, n in per_run]),
        store_cpu_without_checkpoints_s=tuple(r["store_cpu_s"] for r in without),
        ab_lost_per_checkpoint_s=median(ab_lost), ab_lost_per_repeat_s=tuple(ab_lost),
        first_step_excess_s=profile["first_step_excess_s"],
        excess_by_position_s=tuple(profile["excess_by_position_s"]),
        window_s={name: [r["window_s"] for r in rs] for name, rs in records.items()},
        # raw samples: the checkpointing runs' per-step durations, as [step, seconds]
        step_durations_s=[[[k, round(d, 6)] for k, d in sorted(run.items())]
                          for run in durations["checkpoints"]],
    )


def busy_core(row: StallRow, pairs: int) -> BusyCore:
    """With a core to spare: the step's slowdown while a neighbour does a checkpoint's CPU work there
    (bench.neighbour), charged for as long as the writer's and the store's CPU time keep it busy."""
    n = neighbour_slowdown(row.width, row.checkpoint_bytes, pairs=pairs)
    return BusyCore(n["ratio"], None if n["interval"] is None else tuple(n["interval"]),
                    (n["ratio"] - 1) * row.writer_cpu_per_checkpoint_s,
                    (n["ratio"] - 1) * row.store_cpu_per_checkpoint_s, record=n)


def stall_progress(row: StallRow) -> str:
    """One row's figures, as the run prints them when the row is done."""
    busy = ""
    if row.neighbour is not None:
        n = row.neighbour
        busy = (f"; a busy spare core: the step {n.ratio:.3f}x as long, the writer's CPU per checkpoint "
                f"costing {n.cost_of_writer_cpu_s * 1e3:.2f} ms, "
                f"the store's {n.cost_of_store_cpu_s * 1e3:.2f} ms")
    return (f"checkpoint stall: {row.layout}, mlp width {row.width}: {row.checkpoint_bytes / 1e6:.1f} MB, "
            f"lost per checkpoint {row.lost_per_checkpoint_s * 1e3:.1f} ms ({row.verdict()}), "
            f"the same estimate without checkpoints {row.null_lost_per_checkpoint_s * 1e3:.1f} ms "
            f"(longest write {max(row.write_max_s) * 1e3:.0f} ms"
            f"{'' if row.write_within_after else ', longer than 4/5 of an interval'}; without-checkpoints "
            f"cross-check {[round(x * 1e3, 1) for x in row.ab_lost_per_repeat_s]} ms){busy}")


STALL_METHOD = (
    "every step timed; lost per checkpoint = the time of the steps after it that cover the longest write "
    "(after_steps, at least half the interval) minus as many steps at the mean of the rest of the interval, "
    "median over the checkpoints after profiled_after_steps of every repeat, with a distribution-free 95 % "
    "interval (lost_interval_s); no verdict when the write outlasts 4/5 of the interval; one step = the "
    "run without checkpoints' window / steps; verdict_decided when the interval lies on one side of one "
    "step. Null control (null_*): the same estimate, same after steps, over the runs without checkpoints "
    "at the same steps: what the method reads where nothing was written. Cross-check (ab_*): the trainer "
    "with and without checkpoints, interleaved, same window (the steps after the warmup), (window with - "
    "window without) / checkpoints in the window, median over repeats. The writer process and the moto "
    "S3 server share the same cores as training here (on AWS, S3's side runs elsewhere), so with the "
    "cores full their CPU shows up as lost training time; the spare-core layout shows what is left when "
    "it has a core to run on. neighbour (spare-core layout): the same model's step in one process, blocks "
    "alternating with a neighbour process doing a checkpoint's CPU work stopped and running, median ratio "
    "of the blocks' median steps (bench.neighbour); cost_of_writer_cpu_s / cost_of_store_cpu_s = "
    "(ratio - 1) x the writer process's / the store server's CPU time per checkpoint (median over the "
    "runs: the trainer's checkpoint_write_cpu_s, the server process's CPU over the run, each over the "
    "checkpoints written).")


def checkpoints_in_window(start_step: int, end_step: int, every: int) -> int:
    """Periodic checkpoints the trainer writes after steps in (start, end]; it skips one at the last
    step of the run (the final checkpoint is written after the loop, outside the timed window)."""
    n = sum(1 for s in range(start_step + 1, end_step) if s % every == 0)
    if n == 0:
        raise ValueError(f"no checkpoint falls in steps {start_step}..{end_step} with every={every}")
    return n


def checkpoint_bytes(client, bucket: str, run_id: str) -> int:
    prefix = checkpoint_key_prefix(run_id)
    objects = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    sizes = [o["Size"] for o in objects if o["Key"].endswith("/state.pt")]
    if not sizes:
        raise BenchError(f"no checkpoint found under s3://{bucket}/{prefix}")
    return max(sizes)


def recovery_section(plan: Plan, progress: Progress) -> dict:
    """On the local cluster (2 hosts): reclaim one host mid-run (SIGTERM, then it goes away); the flow
    resubmits and the trainer resumes from its checkpoint. Measures SIGTERM -> first resumed step,
    and steps of work lost."""
    from cluster.backend import BackendError
    from cluster.flow import DatasetSpec, FlowOptions, run_job
    from cluster.job import JobSpec, trainer_config
    from cluster.local.backend import LocalBackend

    events: list[tuple[float, str]] = []

    def out(line: str) -> None:
        events.append((time.time(), line))
        progress(f"  flow: {line}")

    job = JobSpec(name="bench-recovery", num_hosts=2, trainer=trainer_config((
        "--model", "cnn", "--width", str(plan.shape.width), "--batch-size", str(plan.shape.batch_size),
        "--steps", str(plan.recovery_steps), "--checkpoint-every", str(plan.recovery_checkpoint_every),
        "--log-every", "1")))
    opts = FlowOptions(dataset=DatasetSpec(shards=2, samples_per_shard=512),
                       reclaim_at_step=plan.recovery_reclaim_at, progress_bar=False,
                       job_timeout_s=plan.timeout_s * 2)
    # One more try if the flow itself fails (a fresh cluster each time); every failure is recorded.
    failures: list[str] = []
    for _ in range(2):
        events.clear()
        try:
            result = run_job(LocalBackend(2, reclaim_grace_s=10, log=out), job, opts, out=out)
        except BackendError as e:
            failures.append(f"the local cluster run failed: {e}")
            continue
        if result.succeeded and len(result.attempts) >= 2:
            break
        failures.append(f"expected an interrupted attempt and a resumed one; got {len(result.attempts)} "
                        f"attempt(s), exit {result.exit_code}: {result.message}")
    else:
        raise BenchError("recovery: " + " | ".join(failures))
    return {"status": "ok", **recovery_figures(events, result.attempts[0].summary,
                                                result.attempts[1].summary, result.metrics).to_json(),
            "network_namespaces": not any("no network namespaces" in line for _, line in events),
            "failed_tries": failures,
            "job": {"hosts": 2, "steps": plan.recovery_steps,
                    "checkpoint_every": plan.recovery_checkpoint_every,
                    "reclaim_at_step": plan.recovery_reclaim_at, "grace_s": 10}}


def recovery_figures(events: list[tuple[float, str]], first: RunSummary | None, second: RunSummary | None,
                     metrics: list[dict]) -> Recovery:
    """Pure: from the flow's timestamped messages and the two attempts' summaries/metrics."""
    sigterm = [t for t, line in events if line.startswith("fault injection: reclaiming")]
    if not sigterm:
        raise ValueError("the flow never reported the reclaim")
    if first is None or second is None:
        raise ValueError("an attempt reported no summary")
    resumed_from = second.resumed_from_step
    if resumed_from is None:
        raise ValueError("the second attempt did not resume from a checkpoint")
    after = sorted((r for r in metrics if int(r["step"]) > resumed_from), key=lambda r: r["step"])
    if not after:
        raise ValueError(f"no metrics after step {resumed_from} in the resumed attempt")
    reached = first.steps
    resubmitted = [t for t, line in events if line.startswith("attempt 2: submitted")]
    return Recovery(
        sigterm_to_resumed_s=float(after[0]["time"]) - sigterm[0],
        sigterm_to_resubmitted_s=resubmitted[0] - sigterm[0] if resubmitted else None,
        first_resumed_step=int(after[0]["step"]),
        interrupted_at_step=reached,
        resumed_from_step=int(resumed_from),
        steps_lost=reached - int(resumed_from),
        checkpoints_written_before_stop=first.checkpoints_written,
    )


def plan_time_section(plan: Plan, progress: Progress) -> dict:
    """bench/plan_time.py (owned by infra) run as it is; its figures are copied in."""
    script = ROOT / "bench" / "plan_time.py"
    if not script.exists():
        return {"status": "skipped", "reason": "bench/plan_time.py is not there"}
    results = ROOT / "bench" / "results" / "plan_time.json"
    cmd = [sys.executable, str(script), "--runs", str(plan.plan_runs),
           "--cold-runs", str(plan.plan_cold_runs)]
    started = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=plan.timeout_s * 2)
    except subprocess.TimeoutExpired:
        raise BenchError(f"plan time: {' '.join(cmd)} did not finish in {plan.timeout_s * 2:.0f}s") from None
    if proc.returncode != 0:
        raise BenchError(f"plan time: exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    progress(proc.stdout.strip())
    if not results.exists() or results.stat().st_mtime < started:
        raise BenchError(f"plan time: {results} was not written by this run")
    return {"status": "ok", "command": " ".join(["python", "bench/plan_time.py", *cmd[2:]]),
            "figures": json.loads(results.read_text())}


# Targets of issue 27's input-pipeline rows.
DECODE_TARGET = 0.95
READ_TARGET = 0.9


def image_task_section(plan: Plan, progress: Progress) -> dict:
    """The trainer on the image task against a bare Horovod loop and torch DDP (Gloo): the same
    torchvision model, batch, workers and DataLoader over the same shards (bench/image_loop.py),
    interleaved. The data: scikit-learn's handwritten digits packed with `python -m train.data pack
    images` into a temp directory, read from disk: the store's side is the shard_read section's, and a
    moto server on these 2 cores would add its CPU to every contender's noise. No checkpoints here
    (their cost is the checkpoint_stall section's); the trainer writes its metrics file."""
    with tempfile.TemporaryDirectory(prefix="bench-image-") as tmp:
        shape = dataclasses.replace(plan.image_shape, data=pack_digits(Path(tmp)))
        trainer = TrainerRun(shape, TRAINER_DEFAULTS, 0)
        contenders = [
            Contender("trainer", lambda: trainer.run("image-trainer", Path(tmp), {}, plan.timeout_s),
                      {"what": "python -m train --task image under horovodrun "
                               "(cluster.launch.horovodrun_command)",
                       "metrics_file": True, "checkpoints": False,
                       "settings": "the trainer's defaults (no tuning flags)", **asdict(shape)}),
            horovod_contender("bare-hvd", PRODUCTION, shape, plan.timeout_s),
            ddp_contender(shape, plan.timeout_s),
            # like with like: DDP's workers (and their DataLoader processes) pinned as the trainer's are
            ddp_contender(shape, plan.timeout_s, name="ddp-pin", pin=True),
        ]
        comparison = run_comparison(contenders, "bare-hvd", plan.image_repeats, progress=progress)
    return {**peer_figures(comparison, shape),
            "data": "scikit-learn's 1797 handwritten digits (8x8 PNGs, cluster/example_data.py), packed with "
                    "`python -m train.data pack images --samples-per-shard 100` into a temp directory"}


def input_pipeline_section(plan: Plan, progress: Progress) -> dict:
    """One DataLoader worker of the image task against a bare loop decoding the same shards with the
    same transforms (bench/input_pipeline.py)."""
    from bench.input_pipeline import loader_vs_bare

    comparison = loader_vs_bare(plan.decode_shape, plan.pipeline_repeats, progress)
    return {"status": "ok", "comparison": comparison,
            "ratio": Ratio.of(comparison["ratios"]["loader-worker"]["per_repeat"], DECODE_TARGET).to_json()}


def shard_read_section(plan: Plan, progress: Progress) -> dict:
    """The shard stream from the local S3 store against a bare boto3 loop reading the same objects
    (bench/shard_read.py)."""
    from bench.shard_read import stream_vs_boto3

    comparison = stream_vs_boto3(plan.read_shape, plan.pipeline_repeats, progress)
    return {"status": "ok", "comparison": comparison,
            "ratio": Ratio.of(comparison["ratios"]["shard-stream"]["per_repeat"], READ_TARGET).to_json()}
