"""Elastic mode (`--elastic`, horovodrun --min-np/--max-np --host-discovery-script).

Workers may disappear (a spot node reclaimed: SIGKILL, or SIGTERM for a worker that leaves after a
safety checkpoint) and appear (a replacement node listed by the discovery script). The trainer's loop
is the same as in static mode; only the state that must agree across ranks after a reset lives on
hvd.elastic.TorchState, and input checks run per rank, since a joining worker must not wait on
collectives the others are not making.
"""

from __future__ import annotations

import sys

from train.errors import BadInput
from train.trainer import Progress, Trainer


def run_elastic(trainer: Trainer, hvd) -> int:
    """Under hvd.elastic: a lost worker's failure rolls every survivor back to the last commit and
    training continues on the rest; a worker that (re)joins receives rank 0's state in state.sync()."""
    found = trainer.prepare_inputs()  # per rank: a joining worker must not wait on collectives
    trainer.build()
    progress = Progress()
    bad_input = None
    if found is not None:  # rank 0 alone reads the checkpoint: state.sync() brings it to the rest
        try:
            trainer.apply_checkpoint(found.state, progress)
        except BadInput as e:  # raised on every rank after the sync: on rank 0 alone, the others
            bad_input = str(e)  # would carry on without it (elastic), from the initial weights
        found = None
    elif hvd.rank() == 0:  # --init-from, unless a checkpoint won: state.sync() brings it to the rest
        try:
            trainer.weights.apply(trainer.model)
        except BadInput as e:
            bad_input = str(e)
    # The loss scaler's state (--precision fp16) rides on the state as a plain dict, refreshed at each
    # commit and loaded back after every sync or rollback: each rank unscales the averaged gradients
    # by its own scale, so a worker that joined with a fresh scale (65536) while the others had backed
    # off would step differently and the replicas would drift apart.
    state = hvd.elastic.TorchState(model=trainer.model, optimizer=trainer.optimizer, step=progress.step,
                                   data=progress.data,
                                   last_checkpoint_step=progress.last_checkpoint_step,
                                   resumed_from_step=trainer.resumed_from_step, bad_input=bad_input,
                                   scaler=trainer.scaler_state())

    def commit() -> None:
        state.scaler = trainer.scaler_state()
        state.commit()

    def on_reset() -> None:
        # Counted per process, not on the state: state.sync() restores the last commit.
        trainer.elastic_resets += 1
        print(f"ringtrain: elastic reset, now {hvd.size()} workers", file=sys.stderr, flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        if state.bad_input:
            raise BadInput(state.bad_input)
        trainer.resumed_from_step = state.resumed_from_step
        trainer.load_scaler_state(state.scaler)  # rank 0's after a sync, the commit's after a rollback
        return trainer.loop(state, commit=commit)

    return train(state).exit_code
