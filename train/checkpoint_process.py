"""The checkpoint writer process: rebuilds each checkpoint's state over the shared buffer, serializes,
checksums and uploads it (CheckpointStore.write) on a thread, and replies done, aborted or the error.
Its main thread keeps reading the trainer's messages meanwhile, so a stop can abort a periodic write.

A separate process, not a thread, so serialization and the upload's client work never hold the
training process's interpreter lock. It runs at niceness 19 (it takes the CPU training leaves), dies
with the trainer (PR_SET_PDEATHSIG: a vanished trainer leaves at most a checkpoint without its
manifest, which readers skip), ends when the trainer closes its socket, and ignores SIGTERM/SIGINT,
which a spot reclaim sends the whole process group: the trainer decides when writing stops.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import mmap
import os
import select
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from train.checkpoint import CheckpointStore, WriteCancelled
from train.checkpoint_wire import describe_error, rebuild, recv_message, send_message
from train.storage import open_store

NICE = 19
IGNORED_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the thread that started it ends (Linux); exit now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)


def _reply(sock: socket.socket, message) -> bool:
    """Send to the trainer; False when it has gone (it exited, e.g. on bad input): time to end."""
    try:
        send_message(sock, message)
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def serve(sock: socket.socket, checkpoints: CheckpointStore) -> None:
    """Write each checkpoint the trainer sends; abort the one being written when it says so; return
    when it closes the socket. The trainer sends a write only once the previous one has replied."""
    buffer: mmap.mmap | None = None
    writing, cancelled = None, threading.Event()
    # Wait in poll(POLLIN), not blocked in recv: each reply the trainer reads signals write space on
    # this socket, which would wake a reader blocked in recv (~50 us of the training thread's time
    # per checkpoint on a 2-core VM, where waking an idle vCPU exits to the host).
    readable = select.poll()
    readable.register(sock, select.POLLIN)
    with ThreadPoolExecutor(1, thread_name_prefix="ringtrain-checkpoint-write") as pool:
        while True:
            readable.poll()
            got = recv_message(sock, max_fds=1)
            if got is None:
                cancelled.set()  # nobody waits for it any more
                return
            (kind, step, skeleton), fds = got
            if kind == "abort":
                if step == writing:
                    cancelled.set()
                continue
            if fds:  # a new, larger buffer
                if buffer is not None:
                    with contextlib.suppress(BufferError):  # a tensor still over it: left to the GC
                        buffer.close()
                buffer = mmap.mmap(fds[0], os.fstat(fds[0]).st_size)
                os.close(fds[0])
            writing, cancelled = step, threading.Event()
            pool.submit(_write, sock, checkpoints, step, rebuild(skeleton, buffer), cancelled)


def _write(sock: socket.socket, checkpoints: CheckpointStore, step: int, state, cancelled) -> None:
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        nbytes = checkpoints.write(step, state, cancelled)
        reply = ("done", step, (time.perf_counter() - started, time.process_time() - cpu_started, nbytes))
    except WriteCancelled:
        reply = ("aborted", step, time.perf_counter() - started)
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which re-raises it
        reply = ("error", step, describe_error(e))
    del state
    _reply(sock, reply)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.checkpoint_process",
                                description="The trainer's checkpoint writer process (started by it).")
    p.add_argument("--fd", type=int, required=True, help="the trainer's end of a Unix socket pair")
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--uri", required=True)
    p.add_argument("--endpoint-url")
    p.add_argument("--keep", type=int, required=True)
    args = p.parse_args(argv)
    _die_with_parent(args.parent_pid)
    os.setpriority(os.PRIO_PROCESS, 0, NICE)  # threads started from now on inherit it
    torch.set_num_threads(1)  # its serialization stays on one core, not the trainer's too
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED_SIGNALS)  # blocked by the trainer across exec
    sock = socket.socket(fileno=args.fd)
    try:
        checkpoints = CheckpointStore(open_store(args.uri, args.endpoint_url), args.keep)
        # One request now: the client's first loads botocore's service model and opens the connection
        # (tens of ms of CPU), which would otherwise slow the first checkpoint.
        checkpoints.store.check(create=True)
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which re-raises it
        _reply(sock, ("error", None, describe_error(e)))
        return 1
    if _reply(sock, ("ready", None, None)):
        serve(sock, checkpoints)
    return 0


if __name__ == "__main__":
    sys.exit(main())
