"""The checkpoint writer process: how train.checkpoint.writer starts it, and what it does: rebuild each
checkpoint's state over the shared buffer and write it (CheckpointStore.write) on a thread, while its
main thread keeps reading, so a stop can abort a periodic write; once the trainer has its reply, that
thread prunes the older checkpoints, off the trainer's wait.

A process, not a thread: serialization and the upload's client work never hold the trainer's
interpreter lock. It runs at niceness 19 once started (its start-up, which the trainer waits for, at
normal priority: ranks waiting on each other spin and would starve it), dies with the trainer
(PR_SET_PDEATHSIG: at most a checkpoint without its manifest is left, which readers skip), ends when
the trainer closes the connection, and ignores SIGTERM/SIGINT, which a spot reclaim sends the whole
process group: the trainer decides when writing stops.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle

import torch

from train.checkpoint.store import CheckpointStore, WriteCancelled
from train.checkpoint.wire import CheckpointWriterError, rebuild
from train.cpu import every_thread
from train.storage import open_store

NICE = 19
IGNORED_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def serve(conn: Connection, checkpoints: CheckpointStore) -> None:
    """Write each checkpoint the trainer sends; abort the one being written when it says so; return
    when it closes the connection. The trainer sends a write only once the previous one has replied."""
    buffer: mmap.mmap | None = None
    writing, cancelled, thread = None, threading.Event(), None
    while True:
        try:
            # Wait in poll(POLLIN), not blocked in a read: each reply the trainer reads signals write
            # space on this socket, which would wake a blocked reader (~50 us of the training thread's
            # time per checkpoint on a 2-core VM, where waking an idle vCPU exits to the host).
            conn.poll(None)
            kind, step, skeleton, new_buffer = conn.recv()
            fd = recv_handle(conn) if new_buffer else None
        except (EOFError, OSError):  # the trainer has gone (a reset: it closed with our reply unread)
            cancelled.set()  # nobody waits for it any more
            return
        if kind == "abort":
            if step == writing:
                cancelled.set()
            continue
        if fd is not None:  # a new, larger buffer
            if buffer is not None:
                with contextlib.suppress(BufferError):  # a tensor still over it: left to the GC
                    buffer.close()
            buffer = mmap.mmap(fd, os.fstat(fd).st_size)
            os.close(fd)
        if thread is not None:
            thread.join()  # its prune: the store's record is the thread's until then
        writing, cancelled = step, threading.Event()
        thread = threading.Thread(target=_write, args=(conn, checkpoints, step, rebuild(skeleton, buffer),
                                                       cancelled), name="ringtrain-checkpoint-write")
        thread.start()


def _write(conn: Connection, checkpoints: CheckpointStore, step: int, state, cancelled) -> None:
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        nbytes = checkpoints.write(step, state, cancelled)
        reply = ("done", step, (time.perf_counter() - started, time.process_time() - cpu_started, nbytes))
    except WriteCancelled:
        reply = ("aborted", step, None)
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which re-raises it
        reply = ("error", step, _portable(e))
    del state
    _reply(conn, reply)
    if reply[0] == "done":
        try:
            checkpoints.prune()
        except Exception as e:  # noqa: BLE001 - the new checkpoint is safe; the next prune tries again
            print(f"train: warning: could not delete checkpoints older than step {step} under "
                  f"{checkpoints.store.uri}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _portable(e: BaseException) -> BaseException:
    """`e` where it survives pickling, so the trainer re-raises it with its type (a BadInput exits 2);
    else its text. Some exceptions pickle but do not unpickle (extra required arguments)."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - the text still carries the error
        return CheckpointWriterError(f"{type(e).__name__}: {e}")


def _reply(conn: Connection, message) -> bool:
    """Send to the trainer; False when it has gone (it exited, e.g. on bad input): time to end."""
    try:
        conn.send(message)
    except OSError:
        return False
    return True


def start(uri: str, endpoint_url: str | None, keep: int, cpus) -> tuple[subprocess.Popen, Connection]:
    """Start the writer process for checkpoints under `uri`; the trainer's end of its connection.
    `cpus`: the cores it may run on (a pinned worker passes the node's, so it fills whichever is idle)."""
    ours, theirs = Pipe()
    args = {"fd": theirs.fileno(), "parent_pid": os.getpid(), "uri": uri, "endpoint_url": endpoint_url,
            "keep": keep}
    # Blocked (a mask survives exec) until the child ignores them: a SIGTERM during its start-up
    # must not kill it. Blocked, not ignored, so the trainer still gets one sent meanwhile.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED_SIGNALS)
    try:
        proc = subprocess.Popen([sys.executable, "-m", __name__, json.dumps(args)], pass_fds=[args["fd"]],
                                stdin=subprocess.DEVNULL)
    except BaseException:
        ours.close()
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        theirs.close()
    if cpus:
        with contextlib.suppress(OSError):  # the child has ended meanwhile: its error comes as its reply
            os.sched_setaffinity(proc.pid, cpus)
    return proc, ours


def main(fd: int, parent_pid: int, uri: str, endpoint_url: str | None, keep: int) -> int:
    with contextlib.suppress(OSError, AttributeError):  # SIGKILL us when the trainer's thread ends
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # it ended before prctl
        return 0
    torch.set_num_threads(1)  # its serialization stays on one core, not the trainer's too
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED_SIGNALS)  # blocked by the trainer across exec
    conn = Connection(fd)
    try:
        checkpoints = CheckpointStore(open_store(uri, endpoint_url), keep)
        # One request now: the client's first loads botocore's service model and opens the connection
        # (tens of ms of CPU), which would otherwise slow the first checkpoint.
        checkpoints.store.check(create=True)
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which re-raises it
        _reply(conn, ("error", None, _portable(e)))
        return 1
    # From here the trainer trains while we write: every thread we have, and so those they start (the
    # upload's), which inherit it.
    every_thread(lambda tid: os.setpriority(os.PRIO_PROCESS, tid, NICE))
    if _reply(conn, ("ready", None, None)):
        serve(conn, checkpoints)
    return 0


if __name__ == "__main__":
    sys.exit(main(**json.loads(sys.argv[1])))
