"""The trainer's side of checkpoint writing: copy the state out of the live tensors into a buffer the
writer process (train.checkpoint.process) maps, hand it over, and take the replies.

`--checkpoint-mode`, named as torchtitan names them, one code path each:
- `async`: `submit` copies every tensor into the buffer (a blocking device-to-host copy on a GPU) and
  hands over; training goes on once it returns.
- `async_with_pinned_mem` (GPU only): the buffer is page-locked (cudaHostRegister, as torch.distributed's
  `_create_cpu_state_dict(pin_memory=True, share_memory=True)` does); `submit` only queues `non_blocking`
  copies: module buffers on the current stream, ahead of the next forward pass that may change them
  (BatchNorm statistics), the rest on a side stream beside the next passes, which only read them.
  `copied()`, before the optimizer step, waits for them and hands over.
One checkpoint is in flight at a time: `submit` waits for the previous one (re-raising its error), `busy()`
asks first, and `abort()` (a stop) ends the write in flight (its multipart upload aborted, no manifest).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import time
import warnings
from collections.abc import Iterable, Sequence
from multiprocessing.reduction import send_handle

import torch

from train.checkpoint import process as checkpoint_process
from train.checkpoint.wire import CheckpointWriterError, layout
from train.config import CHECKPOINT_MODES

_CLOSE_TIMEOUT_S = 60


class CheckpointWriter:
    def __init__(self, uri: str, endpoint_url: str | None, keep: int, mode: str = "async",
                 cpus: Sequence[int] | None = None):
        """Start the writer process (checkpoint_process.start)."""
        if mode not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint mode {mode!r}: use one of {', '.join(CHECKPOINT_MODES)}")
        if mode == "async_with_pinned_mem" and not torch.cuda.is_available():
            raise CheckpointWriterError("checkpoint mode async_with_pinned_mem needs a GPU")
        self.uri, self.mode = uri, mode
        self.written = self.aborted = 0
        self.write_s_max = 0.0  # the longest write (the child's wall time from receiving it to done)
        self.write_cpu_s = 0.0  # the child's CPU time over all writes
        self.write_rate: float | None = None  # bytes/s of the last write, to predict the next one's time
        self.waits, self.waited_s = 0, 0.0  # submits that waited for the previous write, and how long
        self._ready = False
        self._in_flight: int | None = None
        self._handover = None  # (step, skeleton, events) of a pinned copy not yet handed over
        self._buffer: mmap.mmap | None = None
        self._view: torch.Tensor | None = None  # uint8 over _buffer
        self._new_fd: int | None = None  # a buffer the child has not been sent yet
        self._proc, self._conn = checkpoint_process.start(uri, endpoint_url, keep, cpus)

    def wait_ready(self) -> None:
        """Block until the child has started (imported torch, opened the store): ~1-2 s of CPU better
        spent before training than while the first checkpoints queue behind it."""
        if not self._ready:
            kind, _step, error = self._receive("at start")
            if kind != "ready":
                raise error
            self._ready = True

    def _receive(self, when: str):
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise CheckpointWriterError(f"the checkpoint writer process for {self.uri} exited "
                                        f"({self._exit_status()}) {when}") from None

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
            cudart = torch.cuda.cudart()
            torch.cuda.check_error(cudart.cudaHostRegister(self._view.data_ptr(), len(self._buffer), 0))

    def _release_buffer(self) -> None:
        if self._view is not None and self.mode == "async_with_pinned_mem":
            torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(self._view.data_ptr()))
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
        if self.busy():
            started = time.perf_counter()
            self.wait()
            self.waits += 1
            self.waited_s += time.perf_counter() - started
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
        try:
            self._conn.send(("write", step, skeleton, self._new_fd is not None))
            if self._new_fd is not None:
                send_handle(self._conn, self._new_fd, self._proc.pid)
        except OSError as e:
            self._in_flight = None
            raise CheckpointWriterError(f"the checkpoint writer process is gone ({self._exit_status()}); "
                                        f"checkpoint step {step} was not written: {e}") from None
        if self._new_fd is not None:
            os.close(self._new_fd)  # the child holds its own copy of the descriptor now
            self._new_fd = None

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
        if not block and not self._conn.poll():
            return False
        step, self._in_flight = self._in_flight, None
        kind, _step, detail = self._receive(f"while writing checkpoint step {step}")
        if kind == "error":
            raise detail
        if kind == "aborted":
            self.aborted += 1
            return True
        wall_s, cpu_s, nbytes = detail
        self.written += 1
        self.write_s_max = max(self.write_s_max, wall_s)
        self.write_cpu_s += cpu_s
        self.write_rate = nbytes / max(wall_s, 1e-6)
        return True

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
            self._conn.send(("abort", self._in_flight, None, False))
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
            self._conn.close()  # the child's next read sees the end and it exits (a second close: no-op)
            try:
                self._proc.wait(timeout=_CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._release_buffer()

