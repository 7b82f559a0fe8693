"""Checkpoints serialized, checksummed and uploaded by a child process, off the training process.

A writer *thread* (the previous design) shared the interpreter lock with the training thread: while
torch.save pickled and boto3 built, signed and sent its requests, each step waited for the lock
whenever it needed it, which cost 3-31 ms per checkpoint even with a core to spare (bench/,
"checkpoint stall"). Here the training process copies the state's tensors into a shared-memory buffer
(a memcpy per tensor) and sends a small message; a child process at the lowest CPU priority rebuilds
the state over the same memory, serializes it, checksums and uploads it (CheckpointStore.write).

Priority: niceness 19, not SCHED_IDLE. SCHED_IDLE hands a waking training thread its core back
sooner, but on a node whose cores training fills it leaves the write less CPU still, and training
waits for it at the next checkpoint: 0.24 and 0.65 s per run for 9 and 35 MB checkpoints against
0.01 and 0.04 s at niceness 19 (bench/, checkpoint stall, 2 workers on 2 cores, writer and local S3
server under the same policy, one run each; the server's session group not yet niced, see
lowest_priority). Its gain in trainer efficiency was inside the noise
(0.983 against 0.977, median of 9 interleaved repeats).

Lifetime: the child starts with the writer and ends when the writer is closed, or when its socket
closes because the trainer exited. If the trainer is killed, the kernel kills the child too
(PR_SET_PDEATHSIG), so a vanished node leaves at most a checkpoint without its manifest, which readers
skip. The child ignores SIGTERM and SIGINT: a spot reclaim signals the whole process group, and the
trainer waits for the checkpoint in flight before it exits.

The copy of a large state runs on a thread of the training process, beside the next step's forward
and backward passes, which only read the parameters (CheckFreq's pipelined snapshot, Mohan et al.,
FAST '21): `submit` starts it and returns, and the trainer calls `copied()` before anything changes
the state's tensors (its optimizer step). The thread then sends the child its message, so the write
starts as soon as the bytes are there. On GPUs the copy is a device-to-host transfer on a stream of
its own, beside the step's kernels (not measured here: no GPU). In host memory it pays only where
the state outgrows the cores' shared cache (bench/, checkpoint stall, a core to spare, 2 runs of 6
repeats): 35 MB cost the step after a checkpoint +1.6 ms with the thread against +3.5 ms copied on
the training thread; at 9 MB it made no clear difference (+1.1 and +1.8 against +1.6 and +1.3),
likely because the copy evicts training's cache-sized working set from the shared cache whichever
core runs it; at 0.7 MB the hand-over cost more than the copy (+0.8 against +0.5). So smaller
states in host memory are copied in `submit` itself.

Where the state lives on the CPU and only the optimizer step changes it, the trainer keeps it in
shared memory this process maps (train.resident) and hands over with `submit_resident`: the message
carries the step and the state's small values, this process copies the state itself while the next
step's forward and backward passes run, and replies "copied" before the optimizer step
(`copied()`), then "done" once it is written. With a core to spare that took the loss per 0.7 MB
checkpoint from 0.9-1.0 ms to 0.45 ms, against a 0.7 ms step (bench/, the checkpoint-stall section
alone, 84 checkpoints a run, two runs of each tree).

One checkpoint is in flight at a time: `submit` first waits for the previous one (and re-raises its
error), so the buffer is never overwritten while the child reads it. A caller that would rather not
wait asks `busy()` first (the trainer defers a periodic checkpoint while the previous one is written).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import errno
import math
import mmap
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from train.checkpoint import CheckpointStore, serialize
from train.storage import open_store

if TYPE_CHECKING:
    from train.resident import ResidentState

NICE = 19  # the child's Linux niceness: on a node whose cores are full it takes what training leaves
ALIGN = 64  # byte alignment of each tensor in the buffer (any dtype's view needs its element size)
_LENGTH = struct.Struct("!Q")
NOT_READY = object()  # recv_message(block=False): no message yet
_CLOSE_TIMEOUT_S = 60
_CHILD_IGNORES = {signal.SIGTERM, signal.SIGINT}
# States in host memory smaller than this are copied on the calling thread (see the module's doc).
OVERLAP_MIN_BYTES = 16 << 20
# Fault injection for tests: seconds the copy thread waits before it copies, so a test can see that
# nothing changes the state before copied() returns.
FAULT_COPY_DELAY_ENV = "RINGTRAIN_FAULT_CHECKPOINT_COPY_DELAY_S"


class CheckpointWriterError(RuntimeError):
    pass


def lowest_priority(pid: int) -> None:
    """Give process `pid` niceness NICE: every thread it has now and, since a thread inherits its
    creator's, every one it starts later. Where that is not permitted, it runs as it is.

    Linux keeps niceness per thread, and setpriority(PRIO_PROCESS, pid) sets only the thread whose id
    is `pid`: a server that started its worker threads before this call (the local S3 store's request
    threads) would otherwise do all its work at normal priority.

    Under autogroup scheduling (kernel.sched_autogroup_enabled, on by default in many distributions'
    kernels) the CPU is shared between sessions first, and niceness only weighs threads against
    others of their own session: a process leading a session of its own (the local S3 store, started
    with start_new_session) took half of a core it shared with a process of another session, niced
    or not, and 1.7 % once its session's group was niced too (two spinning processes, this machine).
    So a process leading a session other than the caller's gets its session niced as well. One in
    the caller's session (the checkpoint writer) does not: that would lower the caller with it."""
    with contextlib.suppress(OSError):  # gone, no autogroup support, or not permitted
        if os.getsid(pid) == pid != os.getsid(0) and in_autogroup(pid):
            _nice_autogroup(pid)
    done: set[str] = set()
    for _ in range(5):  # again for threads started meanwhile by threads not yet lowered
        try:
            tids = set(os.listdir(f"/proc/{pid}/task")) - done
        except OSError:  # no /proc (not Linux) or the process has gone
            tids = set() if done else {str(pid)}
        if not tids:
            return
        for tid in tids:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), NICE)
        done |= tids


def in_autogroup(pid: int) -> bool:
    """Whether `pid` is scheduled in a session group. The kernel shows "/autogroup-<id> nice <n>" when
    it is, and nothing when the process runs in a cgroup of its own (a container, a CI runner):
    there autogroups do not apply, niceness per thread is all there is, and nicing the group would
    only spend the machine's one change a second. Raises OSError where there is no such file."""
    with open(f"/proc/{pid}/autogroup") as f:
        return bool(f.read().strip())


def _nice_autogroup(pid: int) -> None:
    """Set the niceness of `pid`'s session group. Without CAP_SYS_ADMIN the kernel allows one such
    change a second across the whole machine (EAGAIN otherwise): then once more, a second later."""
    for attempt in range(2):
        try:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(NICE))
            return
        except OSError as e:
            if e.errno != errno.EAGAIN or attempt:
                raise
            time.sleep(1.0)


@dataclass(frozen=True)
class Slot:
    """Where a tensor's bytes lie in the shared buffer."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class RegionSlot(Slot):
    """Where a tensor's bytes lie in a resident state's region (train.resident), not in the buffer."""


def map_tensors(x, leaf):
    """`x` with every leaf `leaf` claims replaced: containers (dicts, lists, plain tuples) are rebuilt
    with their type and attributes (a state_dict's OrderedDict carries `_metadata`, which
    load_state_dict uses); `leaf(v)` returns the replacement, or v itself for anything it leaves."""
    if isinstance(x, dict):
        out = type(x)((k, map_tensors(v, leaf)) for k, v in x.items())
        if getattr(x, "__dict__", None):
            out.__dict__.update(vars(x))  # no copy needed: the skeleton is pickled at once
        return out
    if isinstance(x, list):
        return [map_tensors(v, leaf) for v in x]
    if type(x) is tuple:
        return tuple(map_tensors(v, leaf) for v in x)
    return leaf(x)


def layout(state) -> tuple[object, list[tuple[torch.Tensor, Slot]], int]:
    """(skeleton, tensors, bytes): the state with every tensor replaced by its Slot in a buffer of
    `bytes` bytes, and the (tensor, slot) pairs to copy. A tensor that appears twice (tied weights)
    gets one slot, so it stays shared in the checkpoint. Numbers, strings and None stay as they are
    (pickled with the skeleton)."""
    slots: dict[int, Slot] = {}
    tensors: list[tuple[torch.Tensor, Slot]] = []
    end = 0

    def slot_of(x):
        nonlocal end
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in slots:
            slot = Slot(end, x.dtype, tuple(x.shape))
            slots[id(x)] = slot
            tensors.append((x, slot))
            end += -(-slot.nbytes // ALIGN) * ALIGN
        return slots[id(x)]

    skeleton = map_tensors(state, slot_of)
    return skeleton, tensors, end


def rebuild(skeleton, buffer, region=None) -> object:
    """The state, each Slot replaced by a tensor over `buffer` (a writable buffer, e.g. an mmap), each
    RegionSlot by one over `region`.

    Each tensor gets a storage of its own over its bytes, so torch.save writes each one separately,
    exactly as it would the live tensors; one Slot object seen twice is one tensor."""
    built: dict[int, torch.Tensor] = {}

    def tensor_of(x):
        if not isinstance(x, Slot):
            return x
        # By identity: pickling keeps a tied tensor's one Slot one object; an empty tensor's offset
        # may equal the next tensor's.
        if id(x) not in built:
            if x.numel == 0:
                built[id(x)] = torch.empty(x.shape, dtype=x.dtype)
            else:
                source = region if isinstance(x, RegionSlot) else buffer
                flat = torch.frombuffer(source, dtype=x.dtype, count=x.numel, offset=x.offset)
                built[id(x)] = flat.view(x.shape)
        return built[id(x)]

    return map_tensors(skeleton, tensor_of)


def overlay(state, values: dict):
    """`state` with `values` put in: each entry of `values` replaces the state's, except a dict over a
    dict that holds tensors, which is overlaid in turn (a resident state's template holds the tensors;
    each checkpoint sends the rest: {"optimizer": {"param_groups": ...}} replaces the param groups
    and keeps the optimizer's tensors). Changes `state` in place and returns it."""
    for key, value in values.items():
        current = state.get(key)
        if isinstance(value, dict) and isinstance(current, dict) and _holds_tensors(current):
            overlay(current, value)
        else:
            state[key] = value
    return state


def _holds_tensors(x) -> bool:
    if isinstance(x, torch.Tensor | Slot):
        return True
    if isinstance(x, dict):
        return any(_holds_tensors(v) for v in x.values())
    if isinstance(x, list | tuple):
        return any(_holds_tensors(v) for v in x)
    return False


# ---- messages: a length-prefixed pickle, with file descriptors riding on the length ------------

def send_message(sock: socket.socket, obj, fds: Sequence[int] = ()) -> None:
    """The length, the pickle and any descriptors in one sendmsg (one system call on the training
    thread, not two)."""
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = _LENGTH.pack(len(payload)) + payload
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = sock.sendmsg([data], ancillary)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


def _recv_exactly(sock: socket.socket, n: int, head: bytes = b"") -> bytes | None:
    data = bytearray(head)
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def recv_message(sock: socket.socket, max_fds: int = 0, block: bool = True):
    """(message, received fds), or None once the other end has closed, or NOT_READY when `block` is
    False and nothing has arrived yet (one system call where a select before it took two). The
    writer process takes descriptors (`max_fds`, its buffer's); the trainer never receives any.

    A reset is a close too: on a Unix socket it means the other end closed with our message unread,
    as a trainer that stops on bad input before reading the writer's "ready" does."""
    fds: list[int] = []
    try:
        if max_fds:
            head, fds, _flags, _addr = socket.recv_fds(sock, _LENGTH.size, max_fds,
                                                       0 if block else socket.MSG_DONTWAIT)
        else:
            head = sock.recv(_LENGTH.size, 0 if block else socket.MSG_DONTWAIT)
        header = _recv_exactly(sock, _LENGTH.size, head) if head else None
        payload = header and _recv_exactly(sock, _LENGTH.unpack(header)[0])
    except BlockingIOError:
        return NOT_READY
    except ConnectionResetError:
        payload = None
    if payload is None:
        for fd in fds:
            os.close(fd)
        return None
    return pickle.loads(payload), fds


# ---- the training side ----------------------------------------------------------------------------

class CheckpointWriter:
    """Starts the writer process; `submit` hands it one checkpoint at a time."""

    def __init__(self, uri: str, endpoint_url: str | None, keep: int, cpus: Sequence[int] | None = None,
                 overlap_min_bytes: int = OVERLAP_MIN_BYTES):
        """`cpus`: the cores the child may run on (default: the caller's). A pinned worker passes the
        node's cores, so the child's work fills whichever core is idle, not only its worker's.
        `overlap_min_bytes`: a state in host memory smaller than this is copied in `submit` itself."""
        self.uri = uri
        self.overlap_min_bytes = overlap_min_bytes
        self.written = 0
        self.write_s_max = 0.0  # the longest write (the child's wall time from receiving it to done)
        # The child's CPU time over all its writes: serialization, hashing and the upload's client side
        # run beside training, on the node's cores, whatever the store is.
        self.write_cpu_s = 0.0
        # Submits that found the previous checkpoint still being written, and the time they waited
        # (training time lost; a caller that asks busy() first, as the trainer does for its periodic
        # checkpoints, waits only for those that must be written then).
        self.waits = 0
        self.waited_s = 0.0
        self._ready = False
        self._in_flight: int | None = None
        self._buffer: mmap.mmap | None = None
        self._view: torch.Tensor | None = None  # uint8 tensor over _buffer
        # Typed views of _view, one per tensor of the last layout: a state's layout is the same at
        # every checkpoint, and making the views costs three torch calls per tensor each time.
        self._targets: list[torch.Tensor] = []
        self._targets_for: list[Slot] | None = None
        self._new_buffer_fd: int | None = None  # a buffer the child has not been sent yet
        # One thread copies each checkpoint into the buffer and hands it to the child (see above);
        # its threads inherit the caller's cores and niceness, the training worker's own.
        self._copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ringtrain-checkpoint-copy")
        self._copy: Future | None = None  # the copy (and hand-over) of the checkpoint in flight
        self._awaiting_copy: int | None = None  # a resident checkpoint the child has not copied yet
        self._relocations_sent = 0  # the resident layout the child has (ResidentState.relocations)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [sys.executable, "-m", "train.checkpoint_writer", "--fd", str(theirs.fileno()),
               "--parent-pid", str(os.getpid()), "--uri", uri, "--keep", str(keep)]
        if endpoint_url:
            cmd += ["--endpoint-url", endpoint_url]
        # The child starts with SIGTERM/SIGINT blocked (a signal mask survives exec) until it ignores
        # them: one that arrives while it starts up must not kill it. Blocked here, not ignored, so
        # the trainer still receives one sent meanwhile once this returns.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _CHILD_IGNORES)
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            theirs.close()
        self._sock = ours
        lowest_priority(self._proc.pid)  # now, not once the child gets round to it
        if cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self._proc.pid, cpus)

    def wait_ready(self) -> None:
        """Block until the child has started (imported torch, opened the store): ~1-2 s of CPU that
        should be spent before training starts, not while the first checkpoints queue behind it."""
        if self._ready:
            return
        got = recv_message(self._sock)
        if got is None:
            raise CheckpointWriterError(f"the checkpoint writer process for {self.uri} exited at start "
                                        f"({self._exit_status()})")
        (kind, _step, error), _fds = got
        if kind != "ready":
            raise _as_exception(error) if error is not None else CheckpointWriterError(
                f"unexpected first message from the checkpoint writer: {kind}")
        self._ready = True

    def _drop_views(self) -> None:
        """Release the tensors over the buffer: it cannot close while they export its memory."""
        self._view = None
        self._targets, self._targets_for = [], None

    def _ensure_capacity(self, nbytes: int) -> None:
        if self._buffer is not None and len(self._buffer) >= nbytes:
            return
        self._drop_views()
        if self._buffer is not None:
            self._buffer.close()
        if self._new_buffer_fd is not None:
            os.close(self._new_buffer_fd)
        size = max(nbytes, 1)
        # A memfd, not a file in /dev/shm: containers often cap /dev/shm at 64 MB (Docker's default),
        # while a memfd counts against the pod's memory limit only; and it vanishes with its last
        # user, so a killed trainer leaks nothing.
        fd = os.memfd_create("ringtrain-checkpoint", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            self._buffer = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._new_buffer_fd = fd
        self._view = torch.frombuffer(self._buffer, dtype=torch.uint8)

    def submit(self, step: int, state: dict) -> None:
        """Start copying `state`'s tensors and have the child write them as checkpoint `step`; returns
        at once. The caller must not change those tensors before `copied()` returns (reading them is
        fine). Waits for the previous checkpoint first."""
        self.wait_ready()
        self._wait_for_previous()
        skeleton, tensors, nbytes = layout(state)
        self._ensure_capacity(nbytes)
        copies = [(tensor, slot) for tensor, slot in tensors if slot.numel]
        slots = [slot for _, slot in copies]
        if slots != self._targets_for:
            self._targets = [self._view[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape)
                             for s in slots]
            self._targets_for = slots
        sources = [tensor for tensor, _ in copies]
        self._in_flight = step
        device = next((t.device for t in sources if t.is_cuda), None)
        stream = torch.cuda.current_stream(device) if device is not None else None
        job = (step, skeleton, sources, self._targets, self._new_buffer_fd, stream)
        if stream is not None or nbytes >= self.overlap_min_bytes:
            self._copy = self._copier.submit(self._copy_and_hand_over, *job)
            return
        self._copy = Future()  # copied here and now; copied() still reports how it went
        try:
            self._copy.set_result(self._copy_and_hand_over(*job))
        except BaseException as e:  # noqa: BLE001 - raised by copied(), as the copy thread's would be
            self._copy.set_exception(e)

    def submit_resident(self, step: int, values: dict, resident: ResidentState) -> None:
        """Have the child copy `resident`'s region and write it, with `values` put in, as checkpoint
        `step` (train.resident); returns at once. As with submit, the caller must not change the
        state's tensors before `copied()` returns. Waits for the previous checkpoint first."""
        self.wait_ready()
        self._wait_for_previous()
        fds, template = [], None
        if not resident.current() or resident.relocations != self._relocations_sent:
            # Moved tensors, or a region this child never got (whose descriptor is closed): a new one.
            fds, template = [resident.relocate(values)], resident.template
        try:
            send_message(self._sock, ("snapshot", step, (template, values)), fds)
        except OSError as e:
            raise CheckpointWriterError(f"the checkpoint writer process is gone ({self._exit_status()}); "
                                        f"checkpoint step {step} was not written: {e}") from None
        finally:
            for fd in fds:
                os.close(fd)  # the child holds its own copy of the descriptor now
        self._relocations_sent = resident.relocations
        self._in_flight = self._awaiting_copy = step

    def _copy_and_hand_over(self, step: int, skeleton, sources: list[torch.Tensor],
                            targets: list[torch.Tensor], fd: int | None, stream) -> None:
        """On the copy thread: the tensors into the buffer, then the write's message to the child."""
        delay = float(os.environ.get(FAULT_COPY_DELAY_ENV, "0") or 0)
        if delay > 0:
            time.sleep(delay)
        side = None
        if stream is not None:
            # A stream of its own, after the work the training thread had queued when it submitted: the
            # copy overlaps the next step's kernels instead of queueing behind them, and is synchronized
            # before copied() lets the optimizer step.
            side = torch.cuda.Stream(device=stream.device)
            side.wait_stream(stream)
        with torch.no_grad(), torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            for target, source in zip(targets, sources, strict=True):
                target.copy_(source)
        if side is not None:
            side.synchronize()
        try:
            send_message(self._sock, ("write", step, skeleton), [fd] if fd is not None else [])
        except OSError as e:
            raise CheckpointWriterError(f"the checkpoint writer process is gone ({self._exit_status()}); "
                                        f"checkpoint step {step} was not written: {e}") from None

    def copied(self) -> None:
        """Block until the checkpoint in flight is copied out of the live tensors (re-raising the
        copy's or the hand-over's error); from then on the caller may change them."""
        if self._awaiting_copy is not None:
            self._take_copied()
        if self._copy is None:
            return
        copy, self._copy = self._copy, None
        try:
            copy.result()
        except BaseException:
            self._in_flight = None  # never handed over: nothing to wait for; a new buffer stays unsent,
            raise                   # and the next submit sends it
        if self._new_buffer_fd is not None:
            os.close(self._new_buffer_fd)  # the child holds its own copy of the descriptor now
            self._new_buffer_fd = None

    def _take_copied(self) -> None:
        """The child's reply that it has copied the resident region (or why it could not)."""
        step, self._awaiting_copy = self._awaiting_copy, None
        got = recv_message(self._sock)
        if got is None:
            self._in_flight = None
            raise CheckpointWriterError(f"the checkpoint writer process exited ({self._exit_status()}) "
                                        f"while copying checkpoint step {step}")
        (kind, copied_step, detail), _fds = got
        if kind == "copied" and copied_step == step:
            return
        self._in_flight = None  # no write follows an error here
        raise _as_exception(detail) if kind == "error" else CheckpointWriterError(
            f"unexpected reply from the checkpoint writer: {kind} {copied_step} (expected copied {step})")

    def _wait_for_previous(self) -> None:
        """wait(), counting the time when the previous write is not done yet. No warning: the trainer
        defers a periodic checkpoint rather than wait (and says so); what still waits here is a
        checkpoint that must be written now (the final one, the one before a spot exit)."""
        if not self.busy():  # nothing in flight, or its reply was there: the write was done
            return
        start = time.perf_counter()
        self.wait()
        self.waits += 1
        self.waited_s += time.perf_counter() - start

    def wait(self) -> None:
        """Block until the checkpoint in flight is written; re-raise its error."""
        self._collect(block=True)

    def busy(self) -> bool:
        """Whether a checkpoint is still being written, without waiting for it (a reply that is there
        is taken now, and its error re-raised)."""
        return not self._collect(block=False)

    def _collect(self, block: bool) -> bool:
        """Take the reply for the checkpoint in flight, if any, re-raising its error. False only when
        `block` is False and the reply has not come yet (the write goes on)."""
        if self._in_flight is None:
            return True
        step, self._in_flight = self._in_flight, None
        self.copied()
        got = recv_message(self._sock, block=block)
        if got is NOT_READY:
            self._in_flight = step  # still being written
            return False
        if got is None:
            raise CheckpointWriterError(f"the checkpoint writer process exited ({self._exit_status()}) "
                                        f"while writing checkpoint step {step} to {self.uri}")
        (kind, done_step, detail), _fds = got
        if kind == "done" and done_step == step:
            wall_s, cpu_s = detail
            self.written += 1
            self.write_s_max = max(self.write_s_max, wall_s)
            self.write_cpu_s += cpu_s
            return True
        raise _as_exception(detail) if kind == "error" else CheckpointWriterError(
            f"unexpected reply from the checkpoint writer: {kind} {done_step} (expected step {step})")

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
            self._copier.shutdown(wait=True)  # a copy whose wait() raised may still be running
            if self._sock.fileno() != -1:
                self._sock.close()  # the child's next read sees the end and it exits
            try:
                self._proc.wait(timeout=_CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._drop_views()
            if self._buffer is not None:
                self._buffer.close()
                self._buffer = None
            if self._new_buffer_fd is not None:
                os.close(self._new_buffer_fd)
                self._new_buffer_fd = None


def _as_exception(error: tuple[bytes | None, str]) -> BaseException:
    pickled, text = error
    if pickled is not None:
        with contextlib.suppress(Exception):
            return pickle.loads(pickled)
    return CheckpointWriterError(text)


def _describe(e: BaseException) -> tuple[bytes | None, str]:
    try:
        pickled = pickle.dumps(e)
        pickle.loads(pickled)  # some exceptions pickle but do not unpickle (extra required args)
    except Exception:  # noqa: BLE001 - the text below still carries the error
        pickled = None
    return pickled, f"{type(e).__name__}: {e}"


# ---- the writer process -------------------------------------------------------------------------

def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the thread that started it ends (Linux); exit now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
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
    """Write each checkpoint the trainer sends, reply done or the error; return when it closes."""
    buffer: mmap.mmap | None = None
    # Wait for work in poll(POLLIN), not blocked in recv: the replies' memory is charged to this end,
    # so each time the trainer reads one the kernel signals write space on this socket, which wakes a
    # reader blocked in recv but not a poller that asked for input only. Waking this process on its
    # idle core cost the training thread ~50 us a checkpoint (the reply's read: 59 -> 10 us, median of
    # 76 checkpoints of a 0.7 MB state, this 2-core VM, where waking an idle vCPU exits to the host).
    readable = select.poll()
    readable.register(sock, select.POLLIN)
    resident = ResidentCopy()
    while True:
        readable.poll()
        got = recv_message(sock, max_fds=1)
        if got is None:
            return
        (kind, step, payload), fds = got
        started, cpu_started = time.perf_counter(), time.process_time()
        if kind == "snapshot":
            # The trainer waits for this reply before its optimizer step: copy and reply first.
            template, values = payload
            try:
                if fds:
                    resident.map(fds[0], template)
                resident.take()
            except BaseException as e:  # noqa: BLE001 - reported to the trainer, which re-raises it
                if not _reply(sock, ("error", step, _describe(e))):
                    return
                continue
            finally:
                for fd in fds:
                    os.close(fd)
            if not _reply(sock, ("copied", step, None)):
                return
        elif fds:
            if buffer is not None:
                with contextlib.suppress(BufferError):  # a tensor still over it: left to the GC
                    buffer.close()
            size = os.fstat(fds[0]).st_size
            buffer = mmap.mmap(fds[0], size)
            for fd in fds:
                os.close(fd)
        try:
            state = resident.state(values) if kind == "snapshot" else rebuild(payload, buffer)
            checkpoints.write(step, serialize(state))
            del state
            reply = ("done", step, (time.perf_counter() - started, time.process_time() - cpu_started))
        except BaseException as e:  # noqa: BLE001 - reported to the trainer, which re-raises it
            reply = ("error", step, _describe(e))
        if not _reply(sock, reply):
            return


class ResidentCopy:
    """The writer process's side of a resident state (train.resident): the region the trainer's
    tensors live in, mapped here too, and a copy of it of this process's own, taken at each
    checkpoint while the trainer's next forward and backward passes run."""

    def __init__(self) -> None:
        self.region: mmap.mmap | None = None
        self.copy: mmap.mmap | None = None
        self.template = None
        self._source: torch.Tensor | None = None
        self._target: torch.Tensor | None = None

    def map(self, fd: int, template) -> None:
        """A new region (the trainer relocated its tensors) and the state's template over it."""
        self._source = self._target = None  # the views first: an mmap cannot close under them
        for old in (self.region, self.copy):
            if old is not None:
                with contextlib.suppress(BufferError):  # a tensor still over it: left to the GC
                    old.close()
        size = os.fstat(fd).st_size
        self.region = mmap.mmap(fd, size)
        self.copy = mmap.mmap(-1, size)
        self._source = torch.frombuffer(self.region, dtype=torch.uint8)
        self._target = torch.frombuffer(self.copy, dtype=torch.uint8)
        self.template = template

    def take(self) -> None:
        if self._source is None:
            raise CheckpointWriterError("a resident checkpoint before its region was sent")
        delay = float(os.environ.get(FAULT_COPY_DELAY_ENV, "0") or 0)
        if delay > 0:
            time.sleep(delay)
        self._target.copy_(self._source)

    def state(self, values: dict):
        """The checkpoint's state: the template over the copy, with the checkpoint's values put in."""
        return overlay(rebuild(self.template, None, self.copy), values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.checkpoint_writer",
                                description="The trainer's checkpoint writer process (started by it).")
    p.add_argument("--fd", type=int, required=True, help="the trainer's end of a Unix socket pair")
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--uri", required=True)
    p.add_argument("--endpoint-url")
    p.add_argument("--keep", type=int, required=True)
    args = p.parse_args(argv)
    _die_with_parent(args.parent_pid)
    torch.set_num_threads(1)  # its copies and serialization stay on one core, not the trainer's too
    for sig in _CHILD_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHILD_IGNORES)  # (its niceness the trainer set)
    sock = socket.socket(fileno=args.fd)
    try:
        checkpoints = CheckpointStore(open_store(args.uri, args.endpoint_url), args.keep)
        # One request now: the client's first one loads botocore's service model and opens the
        # connection (tens of ms of CPU), which would otherwise make the first checkpoint slow
        # enough for the second to wait on it.
        checkpoints.store.check(create=True)
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which re-raises it
        _reply(sock, ("error", None, _describe(e)))
        return 1
    if _reply(sock, ("ready", None, None)):
        serve(sock, checkpoints)
    return 0


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: the trainer pickles
    # train.checkpoint_writer.Slot, which must be the class serve() checks for.
    from train.checkpoint_writer import main as module_main

    sys.exit(module_main())
