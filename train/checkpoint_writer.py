"""The trainer's side of checkpoint writing: copy the state out of the live tensors, hand it to the
writer process (train.checkpoint_process), and take its replies.

Two modes (`--checkpoint-mode`, named as torchtitan names them), one code path each:
- `async`: `submit` copies every tensor into the shared buffer on the calling thread (a memcpy per
  tensor; a blocking device-to-host copy on a GPU), then hands over. Training resumes once it returns.
- `async_with_pinned_mem` (GPU only): the shared buffer is page-locked (cudaHostRegister, as
  torch.distributed's `_create_cpu_state_dict(pin_memory=True, share_memory=True)` does) and `submit`
  only queues `non_blocking` copies and records events: module buffers on the current stream, ahead
  of the next forward pass that may change them (BatchNorm statistics); the rest on a side stream,
  beside the next forward and backward passes, which only read them. `copied()`, before the optimizer
  step, waits for the events and hands over.
One checkpoint is in flight at a time: `submit` first waits for the previous one (re-raising its error);
a caller that would rather not wait asks `busy()` first, and one that must write now (a stop) calls
`abort()`, which stops the write in flight (its multipart upload aborted, no manifest).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable, Sequence

import torch

from train.checkpoint_process import IGNORED_SIGNALS, NICE
from train.checkpoint_wire import (
    NOT_READY,
    CheckpointWriterError,
    as_exception,
    layout,
    recv_message,
    send_message,
)

MODES = ("async", "async_with_pinned_mem")
_CLOSE_TIMEOUT_S = 60


class CheckpointWriter:
    """Starts the writer process; `submit` hands it one checkpoint at a time."""

    def __init__(self, uri: str, endpoint_url: str | None, keep: int, mode: str = "async",
                 cpus: Sequence[int] | None = None):
        """`cpus`: the cores the child may run on (a pinned worker passes the node's, so the child
        fills whichever core is idle)."""
        if mode not in MODES:
            raise ValueError(f"checkpoint mode {mode!r}: use one of {', '.join(MODES)}")
        if mode == "async_with_pinned_mem" and not torch.cuda.is_available():
            raise CheckpointWriterError("checkpoint mode async_with_pinned_mem needs a GPU")
        self.uri, self.mode = uri, mode
        self.written = 0
        self.write_s_max = 0.0  # the longest write (the child's wall time from receiving it to done)
        self.write_cpu_s = 0.0  # the child's CPU time over all writes
        self.write_rate: float | None = None  # bytes/s of the last write, to predict the next one's time
        self.aborted = 0
        self.waits, self.waited_s = 0, 0.0  # submits that waited for the previous write, and how long
        self._ready = False
        self._in_flight: int | None = None
        self._handover = None  # (step, skeleton, events) of a pinned copy not yet handed over
        self._buffer: mmap.mmap | None = None
        self._view: torch.Tensor | None = None  # uint8 over _buffer
        self._new_fd: int | None = None  # a buffer the child has not been sent yet
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [sys.executable, "-m", "train.checkpoint_process", "--fd", str(theirs.fileno()),
               "--parent-pid", str(os.getpid()), "--uri", uri, "--keep", str(keep)]
        if endpoint_url:
            cmd += ["--endpoint-url", endpoint_url]
        # Blocked (a mask survives exec) until the child ignores them: a SIGTERM during its start-up
        # must not kill it. Blocked here, not ignored, so the trainer still gets one sent meanwhile.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED_SIGNALS)
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            theirs.close()
        self._sock = ours
        with contextlib.suppress(OSError):  # now, not once the child gets round to it (it does too)
            os.setpriority(os.PRIO_PROCESS, self._proc.pid, NICE)
            if cpus:
                os.sched_setaffinity(self._proc.pid, cpus)

    def wait_ready(self) -> None:
        """Block until the child has started (imported torch, opened the store): ~1-2 s of CPU better
        spent before training than while the first checkpoints queue behind it."""
        if self._ready:
            return
        got = recv_message(self._sock)
        if got is None:
            raise CheckpointWriterError(f"the checkpoint writer process for {self.uri} exited at start "
                                        f"({self._exit_status()})")
        (kind, _step, error), _fds = got
        if kind != "ready":
            raise as_exception(error) if error is not None else CheckpointWriterError(
                f"unexpected first message from the checkpoint writer: {kind}")
        self._ready = True

    def _ensure_capacity(self, nbytes: int) -> None:
        if self._buffer is not None and len(self._buffer) >= nbytes:
            return
        self._release_buffer()
        # A memfd, not a file in /dev/shm: containers often cap /dev/shm at 64 MB, while a memfd counts
        # against the pod's memory limit only, and vanishes with its last user.
        fd = os.memfd_create("ringtrain-checkpoint", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(nbytes, 1))
            self._buffer = mmap.mmap(fd, max(nbytes, 1))
        except BaseException:
            os.close(fd)
            raise
        self._new_fd = fd
        self._view = torch.frombuffer(self._buffer, dtype=torch.uint8)
        if self.mode == "async_with_pinned_mem":
            _check_cuda(torch.cuda.cudart().cudaHostRegister(self._view.data_ptr(), len(self._buffer), 0))

    def _release_buffer(self) -> None:
        if self._view is not None and self.mode == "async_with_pinned_mem":
            _check_cuda(torch.cuda.cudart().cudaHostUnregister(self._view.data_ptr()))
        self._view = None  # the mmap cannot close while a tensor exports its memory
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None
        if self._new_fd is not None:
            os.close(self._new_fd)
            self._new_fd = None

    def submit(self, step: int, state: dict, forward_changes: Iterable[torch.Tensor] = ()) -> None:
        """Copy `state`'s tensors (or queue the copies) and have the child write them as checkpoint
        `step`. Until `copied()` returns the caller must not change those tensors, except those in
        `forward_changes` (module buffers), which may change from the next queued kernel on."""
        self.wait_ready()
        self._wait_for_previous()
        skeleton, tensors, nbytes = layout(state)
        self._ensure_capacity(nbytes)
        if self.mode == "async":
            with torch.no_grad():
                for tensor, slot in tensors:
                    if slot.numel:
                        self._target(slot).copy_(tensor)
            self._in_flight = step
            self._hand_over(step, skeleton)
            return
        ordered = {t.data_ptr() for t in forward_changes}  # state_dict() detaches: new objects
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)  # after the work queued so far: the step that made this state
        with torch.no_grad():
            for tensor, slot in tensors:
                if slot.numel:
                    with torch.cuda.stream(current if tensor.data_ptr() in ordered else side):
                        self._target(slot).copy_(tensor, non_blocking=True)
        self._in_flight = step
        self._handover = (step, skeleton, [current.record_event(), side.record_event()])

    def _target(self, slot) -> torch.Tensor:
        return self._view[slot.offset:slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)

    def copied(self) -> None:
        """Block until the checkpoint in flight is out of the live tensors; hand it over if not yet."""
        if self._handover is None:
            return
        (step, skeleton, events), self._handover = self._handover, None
        for event in events:
            event.synchronize()
        self._hand_over(step, skeleton)

    def _hand_over(self, step: int, skeleton) -> None:
        fds = [self._new_fd] if self._new_fd is not None else []
        try:
            send_message(self._sock, ("write", step, skeleton), fds)
        except OSError as e:
            self._in_flight = None
            raise CheckpointWriterError(f"the checkpoint writer process is gone ({self._exit_status()}); "
                                        f"checkpoint step {step} was not written: {e}") from None
        if self._new_fd is not None:
            os.close(self._new_fd)  # the child holds its own copy of the descriptor now
            self._new_fd = None

    def _wait_for_previous(self) -> None:
        """wait(), counting the time when the previous write is not done yet."""
        if not self.busy():
            return
        start = time.perf_counter()
        self.wait()
        self.waits += 1
        self.waited_s += time.perf_counter() - start

    def wait(self) -> None:
        """Block until the checkpoint in flight is written; re-raise its error."""
        self._collect(block=True)

    def busy(self) -> bool:
        """Whether a checkpoint is still being written (a reply already there is taken, its error
        re-raised)."""
        return not self._collect(block=False)

    def _collect(self, block: bool) -> bool:
        """Take the reply for the checkpoint in flight, if any; False only when `block` is False and
        the write goes on."""
        if self._in_flight is None:
            return True
        self.copied()
        step, self._in_flight = self._in_flight, None
        got = recv_message(self._sock, block=block)
        if got is NOT_READY:
            self._in_flight = step
            return False
        if got is None:
            raise CheckpointWriterError(f"the checkpoint writer process exited ({self._exit_status()}) "
                                        f"while writing checkpoint step {step} to {self.uri}")
        (kind, done_step, detail), _fds = got
        if kind == "done" and done_step == step:
            wall_s, cpu_s, nbytes = detail
            self.written += 1
            self.write_s_max = max(self.write_s_max, wall_s)
            self.write_cpu_s += cpu_s
            self.write_rate = nbytes / max(wall_s, 1e-6)
            return True
        if kind == "aborted" and done_step == step:
            self.aborted += 1
            return True
        raise as_exception(detail) if kind == "error" else CheckpointWriterError(
            f"unexpected reply from the checkpoint writer: {kind} {done_step} (expected step {step})")

    def abort(self) -> None:
        """Stop the checkpoint in flight, if any, and return once the child has (or the write was
        done first). Its error, if it failed meanwhile, is only warned about: a stop checkpoint
        replaces it."""
        if self._handover is not None:  # pinned copies never handed over: nothing to stop but them
            for event in self._handover[2]:
                event.synchronize()
            self._handover = self._in_flight = None
            self.aborted += 1
        if self._in_flight is None:
            return
        try:
            send_message(self._sock, ("abort", self._in_flight, None))
            self.wait()
        except Exception as e:  # noqa: BLE001 - see above; a dead child fails the next submit too
            self._in_flight = None
            warnings.warn(f"the checkpoint being aborted failed: {e}", stacklevel=2)

    def _exit_status(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        rc = self._proc.returncode
        return "still running" if rc is None else f"exit status {rc}"

    def close(self) -> None:
        """Wait for the checkpoint in flight, then end the child. Safe to call twice."""
        try:
            self.wait()
        finally:
            self._handover = None
            if self._sock.fileno() != -1:
                self._sock.close()  # the child's next read sees the end and it exits
            try:
                self._proc.wait(timeout=_CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._release_buffer()


def _check_cuda(status) -> None:
    if int(status) != 0:
        raise CheckpointWriterError(f"pinning the checkpoint buffer failed: CUDA error {int(status)}")
