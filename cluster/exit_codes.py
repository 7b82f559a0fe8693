"""A job's exit code as the trainer meant it, from the launcher's exit code and output: one mapping for
every executor (the local one and the MPI Operator's launcher on EKS).

horovodrun exits 1 whenever a worker exits non-zero, whatever the code: a worker that stopped on a spot
reclaim after its checkpoint (75, resumable) and one that crashed look alike from the launcher's exit
code. What tells them apart is in the launcher's output (docs/ARCHITECTURE.md, contracts): the trainer's
`RINGTRAIN_SUMMARY` line (`interrupted`) and horovodrun's `Process <rank> exit with status code <code>.`
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from train.contract import EXIT_INTERRUPTED_RESUMABLE
from train.summary import last_summary

# horovodrun's line when a worker ends non-zero (gloo_run.py): "Process 1 exit with status code 75."
WORKER_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.")
# Workers that horovodrun (or a reclaim) killed after the first one failed: SIGTERM, SIGKILL, ssh lost.
KILLED = (143, 137, 255, -15, -9)


def worker_exit_codes(lines: Iterable[str]) -> dict[int, int]:
    codes = {}
    for line in lines:
        m = WORKER_EXIT.match(line.strip())
        if m:
            codes[int(m.group(1))] = int(m.group(2))
    return codes


def job_exit_code(launcher_rc: int | None, lines: Sequence[str]) -> int | None:
    """The job's exit code (pure): 0 done, 75 interrupted after a checkpoint (resumable), else the first
    worker's own failure code, else the launcher's; None while the launcher has not ended."""
    if launcher_rc is None:
        return None
    summary = last_summary(lines)
    if summary is not None and summary.interrupted:
        return EXIT_INTERRUPTED_RESUMABLE
    if launcher_rc == 0:
        return 0
    own = [c for c in worker_exit_codes(lines).values() if c not in (0, *KILLED)]
    if own and all(c == EXIT_INTERRUPTED_RESUMABLE for c in own):
        # The trainer exits 75 only after rank 0 wrote the checkpoint (its exit barrier).
        return EXIT_INTERRUPTED_RESUMABLE
    others = [c for c in own if c != EXIT_INTERRUPTED_RESUMABLE]
    return others[0] if others else launcher_rc


def failure_message(code: int | None, lines: Sequence[str]) -> str:
    """Why a job failed, from its output (pure): the trainer's own messages first, else which worker
    exited how (horovodrun's traceback around that says nothing more)."""
    if code == EXIT_INTERRUPTED_RESUMABLE:
        return "interrupted after a checkpoint (resumable)"
    trainer = [ln.split(">:", 1)[-1].strip() for ln in lines if "train: " in ln]
    if trainer:
        return f"exit code {code}: " + " | ".join(dict.fromkeys(trainer[-3:]))
    exits = [ln.strip() for ln in lines if WORKER_EXIT.match(ln.strip())]
    if exits:
        return f"exit code {code}: " + " ".join(exits[:3])
    tail = [ln.strip() for ln in lines if ln.strip()][-3:]
    return f"exit code {code}: " + " | ".join(tail)
