"""What crosses from the trainer to its checkpoint writer process (train.checkpoint_writer).

The state's tensors are copied into one shared buffer (a memfd both processes map); the message
carries the state with each tensor replaced by its Slot there, so the writer rebuilds the same state
over the same memory without a second copy. Messages are length-prefixed pickles over a Unix socket,
with file descriptors (the buffer's) passed alongside.
"""

from __future__ import annotations

import array
import contextlib
import math
import os
import pickle
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ALIGN = 64  # byte alignment of each tensor in the buffer (any dtype's view needs its element size)
_LENGTH = struct.Struct("!Q")
NOT_READY = object()  # recv_message(block=False): no message yet


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


def map_tensors(x, leaf):
    """`x` with every leaf `v` replaced by `leaf(v)`: dicts, lists and plain tuples are rebuilt with their
    type and attributes (a state_dict's OrderedDict carries `_metadata`, which load_state_dict uses)."""
    if isinstance(x, dict):
        out = type(x)((k, map_tensors(v, leaf)) for k, v in x.items())
        if getattr(x, "__dict__", None):
            out.__dict__.update(vars(x))
        return out
    if isinstance(x, list):
        return [map_tensors(v, leaf) for v in x]
    if type(x) is tuple:
        return tuple(map_tensors(v, leaf) for v in x)
    return leaf(x)


def layout(state) -> tuple[object, list[tuple[torch.Tensor, Slot]], int]:
    """(skeleton, (tensor, slot) pairs to copy, buffer bytes). A tensor seen twice (tied weights) gets
    one slot, so it stays shared in the checkpoint; numbers, strings and None stay in the skeleton."""
    slots: dict[int, Slot] = {}
    tensors: list[tuple[torch.Tensor, Slot]] = []
    end = 0

    def slot_of(x):
        nonlocal end
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in slots:
            slots[id(x)] = slot = Slot(end, x.dtype, tuple(x.shape))
            tensors.append((x, slot))
            end += -(-slot.nbytes // ALIGN) * ALIGN
        return slots[id(x)]

    return map_tensors(state, slot_of), tensors, end


def rebuild(skeleton, buffer) -> object:
    """The state, each Slot replaced by a tensor over `buffer`. Each tensor gets a storage of its own,
    so torch.save writes each one separately, as it would the live tensors; one Slot object (a tied
    tensor, kept one object by pickling) is one tensor."""
    built: dict[int, torch.Tensor] = {}

    def tensor_of(x):
        if not isinstance(x, Slot):
            return x
        if id(x) not in built:  # by identity: an empty tensor's offset may equal the next one's
            built[id(x)] = (torch.empty(x.shape, dtype=x.dtype) if x.numel == 0 else
                            torch.frombuffer(buffer, dtype=x.dtype, count=x.numel, offset=x.offset)
                            .view(x.shape))
        return built[id(x)]

    return map_tensors(skeleton, tensor_of)


def send_message(sock: socket.socket, obj, fds: Sequence[int] = ()) -> None:
    """The length, the pickle and any descriptors in one sendmsg."""
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
    """(message, received fds); None once the other end has closed (a reset too: the other end closed
    with our message unread); NOT_READY when `block` is False and nothing has arrived yet."""
    fds: list[int] = []
    try:
        flags = 0 if block else socket.MSG_DONTWAIT
        if max_fds:
            head, fds, _flags, _addr = socket.recv_fds(sock, _LENGTH.size, max_fds, flags)
        else:
            head = sock.recv(_LENGTH.size, flags)
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


class CheckpointWriterError(RuntimeError):
    pass


def describe_error(e: BaseException) -> tuple[bytes | None, str]:
    """An error as the writer process sends it: pickled where it survives a round trip, and as text."""
    try:
        pickled = pickle.dumps(e)
        pickle.loads(pickled)  # some exceptions pickle but do not unpickle (extra required args)
    except Exception:  # noqa: BLE001 - the text still carries the error
        pickled = None
    return pickled, f"{type(e).__name__}: {e}"


def as_exception(error: tuple[bytes | None, str]) -> BaseException:
    pickled, text = error
    if pickled is not None:
        with contextlib.suppress(Exception):
            return pickle.loads(pickled)
    return CheckpointWriterError(text)
