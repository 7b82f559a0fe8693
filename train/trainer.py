"""The Horovod training loop: data parallelism, mixed precision, checkpoints, spot-safe stop, elastic mode.

Every rank runs `run(cfg)`. Collectives happen only at points every rank reaches in the same order
(step boundaries, checkpoint steps, log steps), so a stop request, a checkpoint or a bad input never
leaves one rank waiting on another.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch

from train import checkpoint as ckpt
from train.checkpoint_writer import CheckpointWriter
from train.config import NCCL_ALGOS, TrainConfig
from train.contract import EXIT_INTERRUPTED_RESUMABLE
from train.cpu import (
    CPU_CYCLE_TIME_MS,
    CPU_GRADIENT_GROUPS,
    cpu_threads_per_worker,
    idle_while_finishing,
    pin_worker,
)
from train.errors import BadInput
from train.gpu import configure_gpu_worker, memory_format
from train.metrics import MetricsLog, check_tensorboard_available
from train.resume import broadcast_state
from train.stop import STOP, StopRequest, stop_budget_s
from train.storage import open_store
from train.summary import RunSummary
from train.task import TaskContext, load_task

# Test hook: seconds to sleep after every step, so a test can signal a run at a step of its choosing.
FAULT_STEP_SLEEP_ENV = "RINGTRAIN_FAULT_STEP_SLEEP_S"


@dataclass
class Progress:
    """What moves with each step. In elastic mode these live on hvd.elastic.TorchState instead."""

    step: int = 0
    data: dict | None = None  # the task's data position after the last step (None: the beginning)
    last_checkpoint_step: int | None = None  # on the state so every rank agrees on it after a reset


@dataclass
class RunResult:
    exit_code: int
    summary: RunSummary | None = None


def configure_horovod_env(cfg: TrainConfig, on_gpu: bool, environ=os.environ) -> None:
    """Horovod reads its tuning knobs from the environment at hvd.init(), NCCL its NCCL_ALGO when Horovod
    creates its communicators (after hvd.init()). A flag wins over the environment; the environment wins
    over our CPU default."""
    if cfg.horovod.nccl_algo is not None:
        environ["NCCL_ALGO"] = NCCL_ALGOS[cfg.horovod.nccl_algo]
    if cfg.horovod.fusion_threshold_mb is not None:
        environ["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.horovod.fusion_threshold_mb * 1024 * 1024))
    if cfg.horovod.cycle_time_ms is not None:
        environ["HOROVOD_CYCLE_TIME"] = str(cfg.horovod.cycle_time_ms)
    elif not on_gpu:
        environ.setdefault("HOROVOD_CYCLE_TIME", str(CPU_CYCLE_TIME_MS))


def lr_at(step: int, cfg: TrainConfig, world_size: int, local_size: int, on_gpu: bool) -> float:
    """Horovod's convention: lr x workers x backward passes per step, reached by linear warmup, then
    the schedule (constant; cosine down to 0 at --steps; step: x factor every N steps after warmup).

    With Adasum the gradients are combined, not averaged, so the world-size factor does not apply
    (on GPUs Horovod's Adasum works across nodes after a local sum, hence local_size there).
    `step` is the 0-based index of the step about to run.
    """
    size_factor = (local_size if on_gpu else 1) if cfg.horovod.adasum else world_size
    scaled = cfg.optim.lr * size_factor * cfg.horovod.backward_passes_per_step
    warmup = cfg.optim.warmup_steps
    if step < warmup:
        return cfg.optim.lr + (scaled - cfg.optim.lr) * step / warmup
    if cfg.optim.schedule == "cosine":
        span = max(cfg.steps - warmup, 1)
        return scaled * 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, span) / span))
    if cfg.optim.schedule == "step":
        return scaled * cfg.optim.step_factor ** ((step - warmup) // cfg.optim.step_every)
    return scaled


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a rank's random stream for one step: a function of (seed, rank, step) only.

    So a resumed run draws exactly what the uninterrupted one drew, with no generator state in the
    checkpoint (saving every rank's state cost a collective on the training path at each checkpoint),
    and every rank draws its own dropout masks.
    """
    return ((seed * 1_000_003 + 7919 * (rank + 1)) * 1_000_033 + step) % (1 << 63)


def gradient_groups(cfg: TrainConfig, on_gpu: bool) -> int:
    """The groups DistributedOptimizer reduces the gradients in; 0: one allreduce per gradient.

    GPUs keep Horovod's way, which overlaps each gradient's reduction with the rest of the backward
    pass; elastic mode and Adasum cannot use groups (config.validate says why)."""
    if cfg.horovod.gradient_groups is not None:
        return cfg.horovod.gradient_groups
    if on_gpu or cfg.horovod.elastic or cfg.horovod.adasum:
        return 0
    return CPU_GRADIENT_GROUPS


def predivide_factor(cfg: TrainConfig, size: int) -> float:
    """With fp16 compression the gradients are summed in fp16: divided by the worker count before the
    sum (Horovod's gradient_predivide_factor), the sum of N loss-scaled gradients cannot overflow
    where one does not. Only for averaging (Horovod refuses it with Adasum)."""
    return float(size) if cfg.horovod.compression == "fp16" and not cfg.horovod.adasum else 1.0


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class Trainer:
    def __init__(self, cfg: TrainConfig, hvd, stop: StopRequest):
        self.cfg = cfg
        self.hvd = hvd
        self.stop = stop
        self.on_gpu = torch.cuda.is_available()
        self.cpus: tuple[int, ...] | None = None  # the cores this worker is pinned to, if any
        self.node_cpus = tuple(sorted(os.sched_getaffinity(0)))  # the cores all workers here share
        if self.on_gpu:
            torch.cuda.set_device(hvd.local_rank())
            configure_gpu_worker(cfg.tf32, hvd.local_size())
        else:
            if cfg.cpu_affinity == "auto":
                self.cpus = pin_worker(hvd.local_rank(), hvd.local_size())
            # Pinned, this process's cores are its share already; otherwise share them out here.
            sharing = 1 if self.cpus else hvd.local_size()
            threads = cpu_threads_per_worker(len(os.sched_getaffinity(0)), sharing, os.environ)
            if threads is not None:
                torch.set_num_threads(threads)
        self.device = torch.device("cuda", hvd.local_rank()) if self.on_gpu else torch.device("cpu")
        self.task = load_task(cfg.task.name)(cfg.task.args, TaskContext(
            data=cfg.data.source, batch_size=cfg.data.batch_size, seed=cfg.seed, steps=cfg.steps,
            device=self.device, s3_endpoint_url=cfg.s3_endpoint_url, local_rank=hvd.local_rank(),
            local_size=hvd.local_size()))
        self._batches = None  # the task's batch iterator, and the position and world it is at
        self._batches_at: tuple | None = None
        self.checkpoints: ckpt.CheckpointStore | None = None
        self._writer: CheckpointWriter | None = None
        self._log: MetricsLog | None = None
        self.resumed_from_step: int | None = None
        self.summary_printed = False
        self.saved_loss: float | None = None  # loss recorded in the checkpoint we resumed from
        self.resumed_write_rate: float | None = None  # bytes/s its write reached (its manifest)
        # Run-level figures; they survive an elastic reset, which re-enters loop().
        self.initial_loss: float | None = None
        self.samples_total = 0
        self.train_time = 0.0
        self.elastic_resets = 0
        self.last_eval: dict | None = None
        # By writers already closed (elastic mode may start several).
        self.checkpoints_written = 0
        self.checkpoint_wait_s = 0.0
        self.checkpoint_write_max_s = 0.0
        self.checkpoint_write_cpu_s = 0.0
        self.checkpoints_aborted = 0
        self.stop_budget_s = stop_budget_s()
        self._slow_write_warned = False
        # Periodic checkpoints due while the previous one was still being written, taken at the first
        # step after it (rank 0; see save_checkpoint), and the most steps one of them was late.
        self.checkpoints_deferred = 0
        self.checkpoint_deferred_steps_max = 0
        self._deferred_since: int | None = None  # the due step of the checkpoint deferred now
        self._checkpoint_steps: list[int] = []     # taken by rank 0 since the last metrics record

    # ---- inputs -----------------------------------------------------------------------------
    def prepare_inputs(self) -> ckpt.Found | None:
        """The task's data, checkpoint store, metrics outputs. Raises BadInput. Returns the checkpoint to
        resume on rank 0, None elsewhere: the others get its state by broadcast (train.resume; in
        elastic mode state.sync())."""
        cfg = self.cfg
        if cfg.metrics.tensorboard_dir:
            check_tensorboard_available()
        if cfg.precision == "fp16" and not self.on_gpu and not _cpu_fp16_autocast_works():
            raise BadInput("--precision fp16 needs a GPU here (CPU autocast lacks float16); use bf16 or fp32")
        if cfg.checkpoint.mode == "async_with_pinned_mem" and not self.on_gpu:
            raise BadInput("--checkpoint-mode async_with_pinned_mem needs a GPU (it stages the state in "
                           "page-locked memory); use --checkpoint-mode async on CPU workers")
        self.task.prepare(self.hvd.rank(), self.hvd.size())
        found = None
        if cfg.checkpoint.uri:
            store = open_store(cfg.checkpoint.uri, cfg.s3_endpoint_url)
            store.check(create=True)
            self.checkpoints = ckpt.CheckpointStore(store, cfg.checkpoint.keep)
            if self.hvd.rank() == 0:
                found = self.checkpoints.latest_valid()
                self.resumed_write_rate = found.write_rate if found else None
                _ = self.writer  # start the writer process now: its start-up overlaps the model build
        if self.hvd.rank() == 0:
            self.open_log(initial_step=found.step if found else 0)
        return found

    def open_log(self, initial_step: int) -> None:
        m = self.cfg.metrics
        try:
            self._log = MetricsLog(m.metrics_file, m.tensorboard_dir, m.progress, self.cfg.steps,
                                   initial_step)
        except OSError as e:
            raise BadInput(f"cannot open metrics output: {e}") from None

    @property
    def log(self) -> MetricsLog | None:
        if self._log is None and self.hvd.rank() == 0:  # elastic: this process became rank 0
            self.open_log(initial_step=0)
        return self._log

    @property
    def writer(self) -> CheckpointWriter | None:
        if self._writer is None and self.checkpoints is not None and self.hvd.rank() == 0:
            self._writer = CheckpointWriter(self.checkpoints.store.uri, self.cfg.s3_endpoint_url,
                                            self.cfg.checkpoint.keep, self.cfg.checkpoint.mode,
                                            cpus=self.node_cpus)
        return self._writer

    def close_writer(self) -> None:
        """Wait for the checkpoint in flight (re-raising its error) and end the writer process."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                writer.close()
                self._warn_if_writes_outlast_a_stop(writer.write_s_max, "a checkpoint write took")
            finally:
                self.checkpoints_written += writer.written
                self.checkpoint_wait_s += writer.waited_s
                self.checkpoint_write_max_s = max(self.checkpoint_write_max_s, writer.write_s_max)
                self.checkpoint_write_cpu_s += writer.write_cpu_s
                self.checkpoints_aborted += writer.aborted

    # ---- model ------------------------------------------------------------------------------
    def build(self) -> None:
        cfg = self.cfg
        hvd = self.hvd
        torch.manual_seed(cfg.seed)  # same initial weights everywhere; rank 0's are broadcast anyway
        self.model = self.task.build_model().to(self.device)
        self.memory_format = memory_format(self.model, self.on_gpu)
        self.model = self.model.to(memory_format=self.memory_format)
        named = list(self.model.named_parameters())
        groups = [{"params": [p for _, p in named]}]
        # The step's stop vote and loss ride in the gradient allreduce: a two-element "parameter",
        # outside the model and the autograd graph, whose "gradient" is set to [stop flag / k, loss]
        # before each backward pass, which then hands it to DistributedOptimizer by calling the hook
        # Horovod registered for it (carry_stats) -- so it joins the same group as the gradients,
        # and the averaged "gradient" is [the fraction of ranks asked to stop, the mean loss]: eight
        # bytes next to the gradients instead of collectives of their own (a stop allreduce per step
        # cost 20-25% of a 1 ms CPU step here; a loss allreduce per logged step about 1%). Set
        # directly, it skips the autograd nodes that carrying it through the graph cost (stack, dot,
        # add and their backward: about 1% of a 5 ms step), and the loss scaler never scales it. It
        # is never updated (lr 0, and its gradient is cleared before the optimizer steps). Adasum
        # does not average, so there it is a separate allreduce. With --compression fp16 the loss is
        # averaged in fp16 too (3 significant digits).
        self.stats_in_gradients = not cfg.horovod.adasum
        # With 2+ workers Horovod's Adasum optimizer is a different kind: it runs the wrapped
        # optimizer per parameter inside backward and reduces the updates, which step() then applies
        # (it has no skip_synchronize). With one worker Horovod gives the ordinary one (its rule).
        self.adasum_updates = cfg.horovod.adasum and hvd.size() > 1
        if self.stats_in_gradients:
            self.step_stats = torch.zeros(2, device=self.device, requires_grad=True)
            named.append(("ringtrain_step_stats", self.step_stats))
            groups.append({"params": [self.step_stats], "lr": 0.0, "weight_decay": 0.0,
                           "ringtrain_stats": True})
        if cfg.optim.name == "sgd":
            base = torch.optim.SGD(groups, lr=cfg.optim.lr, momentum=cfg.optim.momentum,
                                   weight_decay=cfg.optim.weight_decay)
        else:
            base = torch.optim.Adam(groups, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        compression = hvd.Compression.fp16 if cfg.horovod.compression == "fp16" else hvd.Compression.none
        self.gradient_groups = gradient_groups(cfg, self.on_gpu)
        self.optimizer = hvd.DistributedOptimizer(
            base,
            named_parameters=named,
            compression=compression,
            backward_passes_per_step=cfg.horovod.backward_passes_per_step,
            op=hvd.Adasum if cfg.horovod.adasum else hvd.Average,
            gradient_predivide_factor=predivide_factor(cfg, hvd.size()),
            groups=self.gradient_groups or None,
        )
        # Horovod's per-parameter hook (pinned horovod 0.28.1, private API): counts the stats ready
        # and, once the rest of their group is, sends the group (tests/train, allreduce probe). With
        # one worker outside elastic mode Horovod registers no hooks: synchronize() reduces every
        # gradient then, the stats' too.
        self.stats_ready = (self.optimizer._make_hook(self.step_stats)
                            if self.stats_in_gradients and self.optimizer._grad_accs else None)
        # A pinned checkpoint copy (--checkpoint-mode async_with_pinned_mem) runs beside the next
        # step's forward and backward passes, which only read the state: not with Adasum, whose
        # backward pass runs the optimizer, nor in elastic mode, where a reset restores it mid-step.
        self.copy_overlaps_step = not (self.adasum_updates or cfg.horovod.elastic)
        self.amp_dtype = autocast_dtype(cfg.precision)
        self.autocast = (partial(torch.autocast, self.device.type, dtype=self.amp_dtype)
                         if self.amp_dtype is not None else nullcontext)
        self.scaler = torch.amp.GradScaler(self.device.type) if cfg.precision == "fp16" else None
        # Losses below are already averaged over the ranks (they come out of the step's allreduce).
        self.loss_sum = 0.0
        self.loss_count = 0
        self.last_loss: float | None = None

    def apply_checkpoint(self, state: dict, progress) -> None:
        """Load a checkpoint (read by rank 0; on the others broadcast tensor by tensor)."""
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, KeyError, ValueError) as e:
            c = self.cfg
            task_flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(c.task.args).items())
            raise BadInput(f"checkpoint step {state.get('step')} in {c.checkpoint.uri} does not fit this "
                           f"model/optimizer (--task {c.task.name} {task_flags} --optimizer {c.optim.name}): "
                           f"{str(e).splitlines()[0]}") from None
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        progress.step = int(state["step"])
        progress.data = state["sampler"]
        self.resumed_from_step = progress.step
        progress.last_checkpoint_step = progress.step
        self.saved_loss = state.get("loss")

    # ---- one step ---------------------------------------------------------------------------
    def seed_step(self, step: int) -> None:
        """Reseed this device's default generator (dropout) for the step: see step_seed. Only that
        generator: about 2 us, where torch.manual_seed, which seeds every backend, costs 250 us."""
        gpu = self.on_gpu
        generator = torch.cuda.default_generators[self.device.index] if gpu else torch.default_generator
        generator.manual_seed(step_seed(self.cfg.seed, self.hvd.rank(), step))

    def next_batch(self, progress):
        """The task's next batch on the device; progress.data moves past it. The task's iterator is
        (re)started from progress.data whenever that is not where the iterator is: at the start, after
        a resume, after an elastic reset (rolled back, maybe another world size)."""
        rank, size = self.hvd.rank(), self.hvd.size()
        at = self._batches_at
        if self._batches is None or at[0] is not progress.data or at[1:] != (rank, size):
            self._batches = iter(self.task.train_batches(progress.data, rank, size))
        try:
            batch, progress.data = next(self._batches)
        except StopIteration:
            raise BadInput(f"task {self.cfg.task.name}: its training data ended at step {progress.step} "
                           f"of {self.cfg.steps} (train_batches must not end before --steps)") from None
        self._batches_at = (progress.data, rank, size)
        return _to_device(batch, self.device, self.memory_format)

    def carry_stats(self, stop_share: float, loss: torch.Tensor) -> None:
        """Add [stop_share, loss] to the stats' "gradient" and count it ready for this backward pass
        (see build()): like a gradient, it is summed over the step's backward passes and reduced
        with the last."""
        stats = torch.stack((torch.full((), stop_share, device=self.device), loss.float()))
        grad = self.step_stats.grad
        self.step_stats.grad = stats if grad is None else grad + stats
        if self.stats_ready is not None:
            self.stats_ready()

    def train_step(self, progress) -> float:
        """One optimizer step. Returns the fraction of ranks asked to stop (the same on every rank);
        the step's loss, averaged over the ranks, goes to last_loss."""
        cfg, hvd, opt = self.cfg, self.hvd, self.optimizer
        lr = lr_at(progress.step, cfg, hvd.size(), hvd.local_size(), self.on_gpu)
        for group in opt.param_groups:
            if not group.get("ringtrain_stats"):
                group["lr"] = lr
        k = cfg.horovod.backward_passes_per_step
        opt.zero_grad()
        self.seed_step(progress.step)
        # Sampled once per step, before the forward pass: a SIGTERM during the step counts next step.
        stop_flag = 1.0 if self.stop.requested else 0.0
        step_loss = None
        for _ in range(k):
            batch = self.next_batch(progress)
            with self.autocast():
                loss = self.task.loss(self.model, batch)
            scaled = loss / k if k > 1 else loss
            objective = self.scaler.scale(scaled) if self.scaler is not None else scaled
            if self.stats_in_gradients:
                self.carry_stats(stop_flag / k, scaled.detach())
            else:
                step_loss = scaled.detach() if step_loss is None else step_loss + scaled.detach()
            objective.backward()
        if not self.stats_in_gradients:
            stats = torch.stack((torch.full((), stop_flag, device=self.device), step_loss.float()))
            handle = hvd.allreduce_async_(stats, op=hvd.Average, name="ringtrain.step_stats")
        if self.adasum_updates:
            opt.step()  # waits for the Adasum-reduced updates and applies them
        else:
            # Horovod's way: finish the allreduce, then unscale/clip the averaged gradients, then
            # step without a second synchronization.
            opt.synchronize()
        if self.stats_in_gradients:
            stop, mean_loss = self.step_stats.grad.tolist()
            self.step_stats.grad = None  # the optimizer leaves a parameter without a gradient alone
        else:
            stop, mean_loss = hvd.synchronize(handle).tolist()
        if not self.adasum_updates:
            if self._writer is not None:
                self._writer.copied()  # the last checkpoint's copy ran beside this step's passes so far
            if self.scaler is not None:
                self.scaler.unscale_(opt)
            if cfg.optim.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.clip_grad_norm)
            with opt.skip_synchronize():
                if self.scaler is not None:
                    self.scaler.step(opt)
                    self.scaler.update()
                else:
                    opt.step()
        progress.step += 1
        self.last_loss = mean_loss
        if self.initial_loss is None:
            self.initial_loss = mean_loss
        self.loss_sum += mean_loss
        self.loss_count += 1
        return stop

    # ---- evaluation -------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict | None:
        """The task's metrics over its evaluation data, every worker evaluating its share; None for a
        task without evaluation. A collective: every rank calls it at the same steps."""
        hvd = self.hvd
        batches = self.task.eval_batches(hvd.rank(), hvd.size())
        if batches is None:
            return None
        was_training = self.model.training
        self.model.eval()
        sums: dict[str, float] = {}
        try:
            with torch.no_grad(), self.autocast():
                for batch in batches:
                    batch = _to_device(batch, self.device, self.memory_format)
                    for key, value in self.task.eval_sums(self.model, batch).items():
                        sums[key] = sums.get(key, 0.0) + float(value)
        finally:
            self.model.train(was_training)
        totals: dict[str, float] = {}
        for part in hvd.allgather_object(sums, name="ringtrain.eval"):  # a few numbers per rank
            for key, value in part.items():
                totals[key] = totals.get(key, 0.0) + value
        metrics = {f"eval_{k}": float(v) for k, v in self.task.eval_metrics(totals).items()}
        if self.log is not None:
            self.log.log({"step": step, **metrics, "time": time.time()})
        return metrics

    # ---- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, progress, loss: float | None, defer_while_busy: bool = False) -> None:
        """Rank 0 hands the state to its writer process, which writes it (train.checkpoint_writer); no
        collective (the random streams need no saving, see seed_step).

        `defer_while_busy` (periodic checkpoints): while the previous checkpoint is still being
        written, training goes on and the loop calls again at the next step; the checkpoint is taken
        at the first step after that write. Waiting for it was the whole gap between the trainer and a
        bare Horovod loop at 2 workers on 2 cores with a checkpoint every 50 steps to the local store,
        where the niced writer and store took up to ~290 ms for a write due every ~280 ms: 0.964x the
        bare loop, and 1.004x with each run's waits taken out of its window (bench/, headline, 24
        repeats). The final and safety checkpoints wait."""
        if self.hvd.rank() == 0:
            busy = self.writer.busy()
            self._warn_if_writes_outlast_a_stop(self.writer.write_s_max, "a checkpoint write took")
            if defer_while_busy and busy:
                self._defer(progress.step)
                return
            if self._deferred_since is not None:
                self.checkpoint_deferred_steps_max = max(self.checkpoint_deferred_steps_max,
                                                         progress.step - self._deferred_since)
                self._deferred_since = None
            self.writer.submit(progress.step, self.checkpoint_state(progress, loss),
                               forward_changes=self.model.buffers())
            self._checkpoint_steps.append(progress.step)
            if not self.copy_overlaps_step:
                self.writer.copied()
        progress.last_checkpoint_step = progress.step

    def _take_checkpoint_steps(self) -> list[int]:
        steps, self._checkpoint_steps = self._checkpoint_steps, []
        return steps

    def checkpoint_state(self, progress, loss: float | None) -> dict:
        return {
            "step": progress.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "sampler": progress.data,
            "world_size": self.hvd.size(),
            "loss": loss,
        }

    def state_bytes(self) -> int:
        return ckpt.tensor_bytes((self.model.state_dict(), self.optimizer.state))

    def report_stop_budget(self, stopped_at: float) -> None:
        """Say how long the stop's checkpoint should take (at the last write's rate, or the resumed
        checkpoint's) against what is left of the stop budget (RINGTRAIN_STOP_GRACE_S), so a stop that
        cannot make it is visible."""
        left = self.stop_budget_s - (time.monotonic() - stopped_at)
        nbytes, rate, whose = self.state_bytes(), self._writer.write_rate, "the last write's"
        if rate is None:
            rate, whose = self.resumed_write_rate, "the resumed checkpoint's"
        expected = f"{nbytes / rate:.1f} s at {whose} {rate / 1e6:.0f} MB/s" if rate else "unknown"
        line = (f"ringtrain: stop checkpoint of {nbytes / 1e6:.0f} MB: expected write {expected}; "
                f"{left:.0f} s of the {self.stop_budget_s:.0f} s stop budget left")
        if rate and nbytes / rate > left:
            line += " -- it may not finish before the node goes"
        print(line, file=sys.stderr, flush=True)

    def _warn_if_writes_outlast_a_stop(self, write_s: float, what: str) -> None:
        """Once: a checkpoint write longer than the stop budget means a spot stop's checkpoint is lost."""
        if self._slow_write_warned or write_s <= self.stop_budget_s:
            return
        self._slow_write_warned = True
        warnings.warn(f"{what} {write_s:.0f} s, longer than the {self.stop_budget_s:.0f} s a spot stop "
                      f"allows ({self.state_bytes() / 1e6:.1f} MB state): a stop's checkpoint would not "
                      "finish in time", ckpt.CheckpointWarning, stacklevel=3)

    def _defer(self, step: int) -> None:
        """Count a periodic checkpoint deferred at `step` (once, however many steps it waits); warn
        the first time."""
        if self._deferred_since is not None:
            return
        self._deferred_since = step
        self.checkpoints_deferred += 1
        if self.checkpoints_deferred == 1:
            warnings.warn(f"checkpoint step {step} deferred: the previous checkpoint is still being written "
                          f"to {self.cfg.checkpoint.uri}; training goes on and takes it at the first step "
                          "after that write (checkpoints are due faster than the store takes them: raise "
                          "--checkpoint-every; the run's summary counts checkpoints_deferred)",
                          ckpt.CheckpointWarning, stacklevel=3)

    # ---- the loop ---------------------------------------------------------------------------
    def loop(self, progress, commit=None) -> RunResult:
        cfg, hvd = self.cfg, self.hvd
        step_sleep = float(os.environ.get(FAULT_STEP_SLEEP_ENV, "0") or 0)
        samples_per_step = cfg.data.batch_size * cfg.horovod.backward_passes_per_step
        t_start = t_window = time.perf_counter()
        window_samples = 0
        interrupted, stopped_at = False, 0.0
        if hvd.rank() == 0 and self.checkpoints is not None and self.resumed_write_rate:
            # before the first write measures it: from the rate the resumed checkpoint's write reached
            rate = self.resumed_write_rate
            self._warn_if_writes_outlast_a_stop(
                self.state_bytes() / rate, f"the checkpoint resumed was written at {rate / 1e6:.2f} MB/s: "
                "at that rate a checkpoint write takes")
        while progress.step < cfg.steps:
            stopping = self.train_step(progress)
            stop = stopping > 0
            if step_sleep:
                time.sleep(step_sleep)
            window_samples += samples_per_step * hvd.size()
            self.samples_total += samples_per_step * hvd.size()
            if self.log is not None:
                self.log.advance()
            last = progress.step >= cfg.steps
            if progress.step % cfg.metrics.log_every == 0 or last or stop:
                mean = self.loss_sum / max(self.loss_count, 1)
                now = time.perf_counter()
                if self.log is not None:
                    self.log.log({
                        "step": progress.step, "loss": mean,
                        "samples_per_sec": window_samples / max(now - t_window, 1e-9),
                        "lr": self.optimizer.param_groups[0]["lr"], "world_size": hvd.size(),
                        # steps of the checkpoints taken since the previous record: the run report marks them
                        "checkpoints": self._take_checkpoint_steps(),
                        "time": time.time(),
                    })
                self.loss_sum = 0.0
                self.loss_count = 0
                t_window, window_samples = now, 0
            if commit is not None and progress.step % cfg.horovod.commit_every == 0:
                commit()
            if stop and cfg.horovod.elastic and stopping < 1 - 1e-6:
                # Some workers were reclaimed, not the whole job: after a safety checkpoint they leave
                # and the rest carry on (their next collective fails, they roll back to this commit).
                if self.stop.requested:
                    idle_while_finishing()  # this process only finishes up now (train.cpu)
                if self.checkpoints is not None:
                    self.save_checkpoint(progress, None)
                    if self.writer is not None:
                        self.writer.wait()
                commit()
                if self.stop.requested:
                    print(f"ringtrain: rank {hvd.rank()} leaves the elastic job after SIGTERM at step "
                          f"{progress.step}", file=sys.stderr, flush=True)
                    return RunResult(EXIT_INTERRUPTED_RESUMABLE)
                continue
            if stop:
                interrupted = True
                stopped_at = self.stop.at if self.stop.at is not None else time.monotonic()
                break
            if cfg.metrics.eval_every and progress.step % cfg.metrics.eval_every == 0 and not last:
                self.last_eval = self.evaluate(progress.step)
            if self.checkpoints is not None and cfg.checkpoint.every and not last:
                due = progress.step % cfg.checkpoint.every == 0
                if due or self._deferred_since is not None:
                    self.save_checkpoint(progress, None, defer_while_busy=True)
                if due and commit is not None:  # a collective: every rank at the same steps
                    commit()
        self.train_time += time.perf_counter() - t_start
        if not cfg.horovod.elastic:  # (in elastic mode a reset can bring this process back to training)
            # From here every rank only finishes up and waits: the cores go to what it waits on.
            idle_while_finishing()

        # Losses of the steps this process trained, in any call of this loop: in elastic mode a reset
        # (a host rejoining at the last commit) can call it again with every step already done.
        initial_loss = self.initial_loss
        final_loss = self.last_loss
        if final_loss is None:  # nothing left to do: the checkpoint we resumed from already reached --steps
            final_loss = initial_loss = self.saved_loss
        if self.checkpoints is not None and progress.last_checkpoint_step != progress.step:
            if interrupted and self._writer is not None:
                self._writer.abort()  # a periodic write in flight must not delay the stop's
                self.report_stop_budget(stopped_at)
            self.save_checkpoint(progress, final_loss)
        if not interrupted:  # a spot stop has seconds to spare, not an evaluation's worth
            self.last_eval = self.evaluate(progress.step)
        self.close_writer()
        self.task.close()
        summary = RunSummary(
            steps=progress.step,
            final_loss=final_loss,
            initial_loss=initial_loss,
            samples_per_sec=self.samples_total / self.train_time if self.train_time > 0 else 0.0,
            resumed_from_step=self.resumed_from_step,
            checkpoints_written=self.checkpoints_written,
            checkpoint_wait_s=round(self.checkpoint_wait_s, 6),
            checkpoints_deferred=self.checkpoints_deferred,
            # periodic writes aborted so that a stop's checkpoint starts at once
            checkpoints_aborted=self.checkpoints_aborted,
            checkpoint_deferred_steps_max=self.checkpoint_deferred_steps_max,
            # the longest checkpoint write (copy handed over -> uploaded), to set against the interval
            checkpoint_write_max_s=round(self.checkpoint_write_max_s, 6),
            # the writer process's CPU time over all writes (serialization, hashing, the upload's client)
            checkpoint_write_cpu_s=round(self.checkpoint_write_cpu_s, 6),
            world_size=hvd.size(),
            interrupted=interrupted,
            elastic_resets=self.elastic_resets,
            cpu_affinity=list(self.cpus) if self.cpus else None,
            gradient_groups=self.gradient_groups,
            eval=self.last_eval,  # the task's metrics at the last evaluation (None: none ran)
        )
        if hvd.rank() == 0 and not self.summary_printed:
            if self._log is not None:
                self._log.close()
            print(summary.line(), flush=True)
            self.summary_printed = True
        # Nobody exits before rank 0 has written its checkpoint and summary: under horovodrun the first
        # worker to exit non-zero gets the rest terminated.
        hvd.allreduce(torch.zeros(1), name="ringtrain.exit_barrier")
        return RunResult(EXIT_INTERRUPTED_RESUMABLE if interrupted else 0, summary)


def _to_device(batch, device: torch.device, fmt: torch.memory_format = torch.contiguous_format):
    """On a GPU from pinned memory, without blocking the host; images in `fmt` (channels_last for
    convolutional models, train.gpu)."""
    if isinstance(batch, torch.Tensor):
        if device.type != "cuda" or batch.is_cuda:
            return batch.to(device, non_blocking=True)
        fmt = fmt if batch.dim() == 4 else torch.contiguous_format
        return batch.pin_memory().to(device, non_blocking=True, memory_format=fmt)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(b, device, fmt) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, fmt) for k, v in batch.items()}
    return batch


def _cpu_fp16_autocast_works() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            out = torch.nn.functional.linear(torch.ones(2, 2), torch.ones(2, 2))
        return out.dtype == torch.float16
    except (RuntimeError, TypeError):
        return False


def agree_on_inputs(hvd, error: str | None) -> None:
    """Every rank learns whether any rank hit bad input, and all raise the same BadInput."""
    errors = hvd.allgather_object(error, name="ringtrain.inputs")
    for rank, err in enumerate(errors):
        if err:
            raise BadInput(err if rank == 0 else f"(rank {rank}) {err}")


def check_horovod_runtime(cfg: TrainConfig, hvd) -> None:
    """Checks that need hvd.init(). Every rank sees the same size and controller, so all raise alike."""
    if cfg.horovod.adasum and hvd.size() > 1 and not hvd.mpi_enabled():
        raise BadInput("--adasum with 2 or more workers needs Horovod's MPI controller (Horovod implements "
                       "Adasum only over MPI: horovodrun --mpi; the cluster launch always uses Gloo); this "
                       "job runs on Gloo. Drop --adasum, or launch with horovodrun --mpi")


def run(cfg: TrainConfig) -> int:
    configure_horovod_env(cfg, torch.cuda.is_available())
    import horovod.torch as hvd

    hvd.init()
    check_horovod_runtime(cfg, hvd)
    trainer = Trainer(cfg, hvd, STOP)
    if cfg.horovod.elastic:
        from train.elastic import run_elastic

        return run_elastic(trainer, hvd)

    error = None
    found = None
    try:
        found = trainer.prepare_inputs()
    except BadInput as e:
        error = str(e)
    agree_on_inputs(hvd, error)
    trainer.build()
    progress = Progress()
    state = broadcast_state(hvd, found.state if found else None)
    found = None  # rank 0's copy goes once load_state_dict has copied it
    if state is not None:
        error = None
        try:
            trainer.apply_checkpoint(state, progress)
        except BadInput as e:
            error = str(e)
        del state
        agree_on_inputs(hvd, error)
    else:
        hvd.broadcast_parameters(trainer.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(trainer.optimizer, root_rank=0)
    if trainer.writer is not None:
        trainer.writer.wait_ready()
    return trainer.loop(progress).exit_code
