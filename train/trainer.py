"""The Horovod training loop: data parallelism, mixed precision, checkpoints, spot-safe stop, elastic mode.

Every rank runs it (train.run sets it up). Collectives happen only at points every rank reaches in the
same order (step boundaries, checkpoint steps, log steps), so a stop request, a checkpoint or a bad
input never leaves one rank waiting on another. The checkpoints' policy is the Checkpointer's
(train.checkpoint.checkpointer), the recipe's arithmetic train.recipe's.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch

from train import export
from train.checkpoint import store as ckpt
from train.checkpoint.checkpointer import Checkpointer
from train.config import TrainConfig
from train.contract import EXIT_INTERRUPTED_RESUMABLE, FAULT_STEP_SLEEP_ENV
from train.cpu import fp16_autocast_works, idle_while_finishing
from train.errors import BadInput
from train.evaluation import evaluate
from train.gpu import memory_format, to_device
from train.metrics import MetricsLog
from train.placement import place_worker
from train.recipe import (
    autocast_dtype,
    build_optimizer,
    gradient_groups,
    layout_change,
    lr_at,
    predivide_factor,
    resolve_precision,
    step_seed,
)
from train.stop import StopRequest
from train.stragglers import OwnTime, straggler_fields
from train.summary import RunSummary
from train.task import TaskContext, load_task, task_code
from train.tensorboard_dir import check_tensorboard_dir
from train.throughput import TokenRate
from train.watchdog import Watchdog
from train.weights import Weights


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


@dataclass
class _Window:
    """The steps since the last metrics record: when it began (perf_counter) and the samples since."""

    since: float
    samples: int = 0


class Trainer:
    def __init__(self, cfg: TrainConfig, hvd, stop: StopRequest):
        self.cfg = cfg
        self.hvd = hvd
        self.stop = stop
        placement = place_worker(cfg, hvd.local_rank(), hvd.local_size())
        self.on_gpu, self.device, self.cpus = placement.on_gpu, placement.device, placement.cpus
        self.precision = resolve_precision(cfg.precision, self.on_gpu,
                                           self.on_gpu and torch.cuda.is_bf16_supported())
        context = TaskContext(data=cfg.data.source, batch_size=cfg.data.batch_size, seed=cfg.seed,
                              steps=cfg.steps, device=self.device, s3_endpoint_url=cfg.s3_endpoint_url,
                              local_rank=hvd.local_rank(), local_size=hvd.local_size())
        with task_code(cfg.task.name, "its constructor"):
            self.task = load_task(cfg.task.name)(cfg.task.args, context)
        self._batches = None  # the task's batch iterator, and the position and world it is at
        self._batches_at: tuple | None = None
        self.checkpointer = Checkpointer(cfg.checkpoint, cfg.s3_endpoint_url, hvd, placement.node_cpus,
                                         self.state_bytes)
        self.weights = Weights(cfg, self.task)  # --init-from in, the export out (rank 0)
        self._log: MetricsLog | None = None
        self.resumed_from_step: int | None = None
        self.summary_printed = False
        self.saved_loss: float | None = None  # loss recorded in the checkpoint we resumed from
        # Run-level figures; they survive an elastic reset, which re-enters loop().
        self.initial_loss: float | None = None
        self.samples_total = 0
        self.train_time = 0.0
        self.elastic_resets = 0
        self.last_eval: dict | None = None
        self.watchdog = Watchdog(factor=cfg.health.hang_factor, floor_s=cfg.health.hang_timeout_s,
                                 rank=hvd.rank())
        self.own_time = OwnTime()   # this rank's own work per step, for the straggler figures
        self.preflight: dict | None = None   # train/preflight.py's record, logged with the first metrics
        self.eval_time = 0.0  # seconds evaluating, left out of train_time and samples/s
        self._window: _Window | None = None  # the loop's throughput window, while it runs

    # ---- inputs -----------------------------------------------------------------------------
    def prepare_inputs(self) -> ckpt.Found | None:
        """The task's data, checkpoint store, metrics outputs. Raises BadInput. Returns the checkpoint to
        resume on rank 0, None elsewhere: the others get its state by broadcast (train.checkpoint.resume; in
        elastic mode state.sync())."""
        cfg = self.cfg
        if cfg.metrics.tensorboard_dir:
            check_tensorboard_dir(cfg.metrics.tensorboard_dir, cfg.s3_endpoint_url)
        if self.precision == "fp16" and not self.on_gpu and not fp16_autocast_works():
            raise BadInput("--precision fp16 needs a GPU here (CPU autocast lacks float16); use bf16 or fp32")
        if cfg.checkpoint.mode == "async_with_pinned_mem" and not self.on_gpu:
            raise BadInput("--checkpoint-mode async_with_pinned_mem needs a GPU (it stages the state in "
                           "page-locked memory); use --checkpoint-mode async on CPU workers")
        with task_code(cfg.task.name, "prepare()"):
            self.task.prepare(self.hvd.rank(), self.hvd.size())
        found = self.checkpointer.open()
        if self.hvd.rank() == 0:
            self.weights.prepare(resuming=found is not None)
            self.open_log(initial_step=found.step if found else 0)
        return found

    def open_log(self, initial_step: int) -> None:
        m = self.cfg.metrics
        try:
            self._log = MetricsLog(m.metrics_file, m.tensorboard_dir, m.progress, self.cfg.steps,
                                   initial_step, lines=m.lines)
        except OSError as e:
            raise BadInput(f"cannot open metrics output: {e}") from None
        if self.preflight is not None:
            self._log.log({"step": initial_step, "preflight": self.preflight, "time": time.time()})

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()

    def note_preflight(self, record: dict) -> None:
        """train/preflight.py's result: into the metrics now if they are open, else when they open."""
        self.preflight = record
        if self._log is not None:
            self._log.log({"step": 0, "preflight": record, "time": time.time()})

    @property
    def log(self) -> MetricsLog | None:
        if self._log is None and self.hvd.rank() == 0:  # elastic: this process became rank 0
            self.open_log(initial_step=0)
        return self._log

    # ---- model ------------------------------------------------------------------------------
    def build(self) -> None:
        cfg = self.cfg
        hvd = self.hvd
        torch.manual_seed(cfg.seed)  # same initial weights everywhere; rank 0's are broadcast anyway
        self.model = self.task.build_model().to(self.device)
        self.memory_format = memory_format(self.model, self.on_gpu)
        self.model = self.model.to(memory_format=self.memory_format)
        named = list(self.model.named_parameters())
        groups = self.task.parameter_groups(self.model, cfg.optim.weight_decay)
        self.token_rate = TokenRate.of(self.task, self.model, self.device)
        # The step's stop vote and loss ride in the gradient allreduce: a two-element "parameter",
        # outside the model and the autograd graph, whose "gradient" is set to [stop flag / k, loss]
        # before each backward pass, which then hands it to DistributedOptimizer by calling the hook
        # Horovod registered for it (carry_stats) -- so it joins the same group as the gradients,
        # and the averaged "gradient" is [the fraction of ranks asked to stop, the mean loss]: eight
        # bytes next to the gradients instead of collectives of their own (each collective costs a
        # negotiation round). Set directly, it skips the autograd nodes that carrying it through the
        # graph would add, and the loss scaler never scales it. It is never updated (lr 0, and its
        # gradient is cleared before the optimizer steps). Adasum does not average, so there it is a
        # separate allreduce. With --compression fp16 the loss is averaged in fp16 too (3 significant
        # digits).
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
        base = build_optimizer(cfg, groups)
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
        self.amp_dtype = autocast_dtype(self.precision)
        self.autocast = (partial(torch.autocast, self.device.type, dtype=self.amp_dtype)
                         if self.amp_dtype is not None else nullcontext)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == "fp16" else None
        # Losses below are already averaged over the ranks (they come out of the step's allreduce).
        self.loss_sum = 0.0
        self.loss_count = 0
        self.last_loss: float | None = None

    def scaler_state(self) -> dict | None:
        """The loss scaler's state (--precision fp16), or None."""
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_scaler_state(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

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
        self.load_scaler_state(state.get("scaler"))
        if self.hvd.rank() == 0:
            change = layout_change(state, self.cfg, self.hvd.size(), self.hvd.local_size(), self.on_gpu)
            if change:
                print(change, file=sys.stderr, flush=True)
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
        return to_device(batch, self.device, self.memory_format)

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
        self.own_time.start()
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
        self.own_time.stop()
        with self.watchdog.waiting_in(f"the gradient allreduce of step {progress.step + 1}"):
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
            self.checkpointer.copied()  # the last checkpoint's copy ran beside this step's passes so far
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
        """The task's metrics (train.evaluation), logged; None for a task without evaluation. A
        collective: every rank calls it at the same steps."""
        started = time.perf_counter()
        metrics = evaluate(self.task, self.model, self.hvd, self.autocast, self.device, self.memory_format)
        if metrics is not None and self.log is not None:
            self.log.log({"step": step, **metrics, "time": time.time()})
        # Samples/s and training time leave evaluation out: its time moves the throughput window on.
        spent = time.perf_counter() - started
        self.eval_time += spent
        if self._window is not None:
            self._window.since += spent
        return metrics

    # ---- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self, progress, loss: float | None, defer_while_busy: bool = False) -> None:
        """Hand the state to the checkpointer (rank 0 writes it; train.checkpoint.checkpointer)."""
        if self.checkpointer.save(progress.step, partial(self.checkpoint_state, progress, loss),
                                  self.model.buffers, copy_overlaps_step=self.copy_overlaps_step,
                                  defer_while_busy=defer_while_busy):
            progress.last_checkpoint_step = progress.step

    def checkpoint_state(self, progress, loss: float | None) -> dict:
        return {
            "step": progress.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler_state(),
            "sampler": progress.data,
            "world_size": self.hvd.size(),
            "local_size": self.hvd.local_size(),
            "batch_size": self.cfg.data.batch_size,
            "backward_passes_per_step": self.cfg.horovod.backward_passes_per_step,
            "loss": loss,
            export.CHECKPOINT_KEY: self.weights.record(progress.step, self.last_eval),  # `ringtrain export`
        }

    def state_bytes(self) -> int:
        return ckpt.tensor_bytes((self.model.state_dict(), self.optimizer.state))

    # ---- the loop ---------------------------------------------------------------------------
    def loop(self, progress, commit=None) -> RunResult:
        """Train from progress.step to --steps, or until a stop, then finish. `commit` (elastic mode):
        the state's commit, a collective, made at the same steps on every rank."""
        step_sleep = float(os.environ.get(FAULT_STEP_SLEEP_ENV, "0") or 0)
        window = self._window = _Window(time.perf_counter())
        t_start = window.since
        self.checkpointer.warn_if_resumed_rate_outlasts_a_stop()
        self.watchdog.rank = self.hvd.rank()   # elastic: a reset may renumber this process
        try:
            return self._loop(progress, commit, step_sleep, window, t_start)
        except BaseException:
            self.watchdog.stop()   # an elastic reset's rendezvous is not a hung step
            raise

    def _loop(self, progress, commit, step_sleep: float, window: _Window, t_start: float) -> RunResult:
        cfg = self.cfg
        stopped_at = None  # time.monotonic() of the stop this loop ends on
        eval_before = self.eval_time
        while progress.step < cfg.steps:
            stopping = self.train_step(progress)
            if step_sleep:
                time.sleep(step_sleep)
            self.watchdog.beat(progress.step)
            self.watchdog.start()   # armed once the first step is done (a no-op after that)
            last = progress.step >= cfg.steps
            self.record_step(progress, window, flush=last or stopping > 0)
            if commit is not None and progress.step % cfg.horovod.commit_every == 0:
                commit()
            if stopping > 0 and cfg.horovod.elastic and stopping < 1 - 1e-6:
                if self.partial_stop(progress, commit):
                    return RunResult(EXIT_INTERRUPTED_RESUMABLE)
                continue
            if stopping > 0:
                stopped_at = self.stop.at if self.stop.at is not None else time.monotonic()
                break
            self.between_steps(progress, last, commit)
        self.train_time += time.perf_counter() - t_start - (self.eval_time - eval_before)
        self._window = None
        return self.finish(progress, stopped_at)

    def record_step(self, progress, window: _Window, flush: bool) -> None:
        """Count the step's samples; every --log-every steps (and when `flush`) log the mean loss and
        the throughput since the last record, and start a new window."""
        cfg, hvd = self.cfg, self.hvd
        samples = cfg.data.batch_size * cfg.horovod.backward_passes_per_step * hvd.size()
        window.samples += samples
        self.samples_total += samples
        if self.log is not None:
            self.log.advance()
        if not (flush or progress.step % cfg.metrics.log_every == 0):
            return
        mean = self.loss_sum / max(self.loss_count, 1)
        own = self.own_time.take_mean()
        per_rank = [own]
        if hvd.size() > 1:   # every rank logs at the same steps: a collective is safe here
            with self.watchdog.waiting_in("the per-rank step time allgather"):
                per_rank = hvd.allgather(torch.tensor([own]), name="ringtrain.own_time").tolist()
        now = time.perf_counter()
        if self.log is not None:
            rate = window.samples / max(now - window.since, 1e-9)
            self.log.log({
                "step": progress.step, "loss": mean, "samples_per_sec": rate,
                **self.token_rate.record(rate, hvd.size()),  # tokens/s and MFU, for tasks counting tokens
                "lr": self.optimizer.param_groups[0]["lr"], "world_size": hvd.size(),
                # steps of the checkpoints taken since the previous record: the run report marks them
                "checkpoints": self.checkpointer.take_steps(),
                **straggler_fields(per_rank),
                "time": time.time(),
            })
        self.loss_sum = 0.0
        self.loss_count = 0
        window.since, window.samples = now, 0

    def partial_stop(self, progress, commit) -> bool:
        """Elastic mode, some workers reclaimed, not the whole job: after a safety checkpoint they leave
        and the rest carry on (their next collective fails, they roll back to this commit). True: this
        process is one that leaves."""
        if self.stop.requested:
            idle_while_finishing()  # this process only finishes up now (train.cpu)
        with self.watchdog.paused():
            if self.checkpointer.enabled:
                self.save_checkpoint(progress, None)
                self.checkpointer.wait()
            commit()
        if self.stop.requested:
            print(f"ringtrain: rank {self.hvd.rank()} leaves the elastic job after SIGTERM at step "
                  f"{progress.step}", file=sys.stderr, flush=True)
            return True
        return False

    def between_steps(self, progress, last: bool, commit) -> None:
        """The periodic work after a step: an evaluation, a checkpoint (and in elastic mode a commit
        with it). Not after the last step: finishing does both."""
        cfg = self.cfg
        with self.watchdog.paused():   # an evaluation or a checkpoint is not a hung step
            if cfg.metrics.eval_every and progress.step % cfg.metrics.eval_every == 0 and not last:
                self.last_eval = self.evaluate(progress.step)
            if self.checkpointer.due(progress.step, last):
                self.save_checkpoint(progress, None, defer_while_busy=True)
                if commit is not None and progress.step % cfg.checkpoint.every == 0:
                    commit()  # a collective: every rank at the same steps (a deferred one is rank 0's alone)

    def finish(self, progress, stopped_at: float | None) -> RunResult:
        """The final (or the stop's) checkpoint, the final evaluation, the summary, and a barrier."""
        hvd = self.hvd
        interrupted = stopped_at is not None
        self.watchdog.stop()   # finishing (the last checkpoint, evaluation) is bounded by its own limits
        if not self.cfg.horovod.elastic:  # (in elastic mode a reset can bring this process back to training)
            # From here every rank only finishes up and waits: the cores go to what it waits on.
            idle_while_finishing()
        # Losses of the steps this process trained, in any call of loop: in elastic mode a reset
        # (a host rejoining at the last commit) can call it again with every step already done.
        initial_loss = self.initial_loss
        final_loss = self.last_loss
        if final_loss is None:  # nothing left to do: the checkpoint we resumed from already reached --steps
            final_loss = initial_loss = self.saved_loss
        if self.checkpointer.enabled and progress.last_checkpoint_step != progress.step:
            if interrupted:
                self.checkpointer.abort_for_stop(stopped_at)
            self.save_checkpoint(progress, final_loss)
        if not interrupted:  # a spot stop has seconds to spare, not an evaluation's worth
            self.last_eval = self.evaluate(progress.step)
            if hvd.rank() == 0:
                self.weights.write_export(self.model, progress.step, self.last_eval)
        self.checkpointer.close()
        self.task.close()
        summary = RunSummary(
            steps=progress.step,
            final_loss=final_loss,
            initial_loss=initial_loss,
            samples_per_sec=self.samples_total / self.train_time if self.train_time > 0 else 0.0,
            throughput=self.token_rate.record(self.samples_total / self.train_time, hvd.size()) or None
            if self.train_time > 0 else None,
            resumed_from_step=self.resumed_from_step,
            **self.checkpointer.summary_fields(),
            world_size=hvd.size(),
            interrupted=interrupted,
            elastic_resets=self.elastic_resets,
            cpu_affinity=list(self.cpus) if self.cpus else None,
            gradient_groups=self.gradient_groups,
            eval=self.last_eval,  # the task's metrics at the last evaluation (None: none ran)
            init_from=self.weights.init_report,
            export=self.weights.exported_to,
        )
        if hvd.rank() == 0 and not self.summary_printed:
            self.close_log()
            print(summary.line(), flush=True)
            self.summary_printed = True
        # Nobody exits before rank 0 has written its checkpoint and summary: under horovodrun the first
        # worker to exit non-zero gets the rest terminated.
        hvd.allreduce(torch.zeros(1), name="ringtrain.exit_barrier")
        return RunResult(EXIT_INTERRUPTED_RESUMABLE if interrupted else 0, summary)
