"""`python -m train`'s run on every rank: Horovod's environment and init, the checks that need it, the
agreement on inputs, resume, then the trainer's loop (train.trainer; elastic mode: train.elastic).

Collectives happen only at points every rank reaches in the same order, so a bad input on one rank
raises the same BadInput on all of them instead of leaving the others waiting.
"""

from __future__ import annotations

import sys

import torch

from train.checkpoint.resume import broadcast_state
from train.config import TrainConfig
from train.contract import EXIT_PREFLIGHT_FAILED
from train.errors import BadInput
from train.preflight import measure
from train.recipe import configure_horovod_env
from train.stop import STOP
from train.trainer import Progress, Trainer


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


def preflight(cfg: TrainConfig, hvd, trainer: Trainer) -> bool:
    """The allreduce bandwidth test (train/preflight.py), on every rank before training. True: below the
    floor, the job stops (every rank agrees on the figure).

    Not in elastic mode: a worker that joins a running elastic job starts here too, and its collectives
    would meet no others (the running ranks are resynchronising their state), so the job would hang."""
    h = cfg.health
    if not h.preflight or hvd.size() < 2 or cfg.horovod.elastic:
        return False
    mib = h.preflight_mib if h.preflight_mib is not None else (2048 if trainer.on_gpu else 2)
    floor = h.preflight_min_busbw_gbps * 1e9 if h.preflight_min_busbw_gbps is not None else None
    result = measure(hvd, int(mib * 2**20), floor, trainer.device)
    trainer.note_preflight(result.record())
    if hvd.rank() == 0:
        print(f"ringtrain: {result.describe()}", file=sys.stderr, flush=True)
    if result.passed:
        return False
    if hvd.rank() == 0 and not h.preflight_only:   # (then the caller decides: cluster/preflight_gate.py)
        print(f"train: error: {result.describe()}; the job stops before training (exit "
              f"{EXIT_PREFLIGHT_FAILED}, not retried)", file=sys.stderr, flush=True)
    return True


def run(cfg: TrainConfig) -> int:
    configure_horovod_env(cfg, torch.cuda.is_available())
    import horovod.torch as hvd

    hvd.init()
    check_horovod_runtime(cfg, hvd)
    if cfg.horovod.elastic:
        from train.elastic import run_elastic

        return run_elastic(Trainer(cfg, hvd, STOP), hvd)   # (no preflight: see preflight())

    error = None
    found = None
    try:
        trainer = Trainer(cfg, hvd, STOP)  # (it constructs the task: the task's errors are agreed on too)
        found = trainer.prepare_inputs()
    except BadInput as e:
        error = str(e)
    agree_on_inputs(hvd, error)
    failed = preflight(cfg, hvd, trainer)
    if cfg.health.preflight_only:
        trainer.close_log()   # the preflight's record is what the caller reads
        return EXIT_PREFLIGHT_FAILED if failed else 0
    if failed:
        return EXIT_PREFLIGHT_FAILED
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
        error = None
        if hvd.rank() == 0:
            try:
                trainer.weights.apply(trainer.model)  # --init-from (train.weights)
            except BadInput as e:
                error = str(e)
        agree_on_inputs(hvd, error)
        hvd.broadcast_parameters(trainer.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(trainer.optimizer, root_rank=0)
    trainer.checkpointer.wait_ready()
    return trainer.loop(progress).exit_code
