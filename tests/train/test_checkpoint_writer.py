"""The checkpoint writer process: same bytes as torch.save of the live state, copied at submit, errors
and deaths reported to the trainer, and a child that never outlives it."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections import OrderedDict
from multiprocessing import Pipe

import psutil
import pytest
import torch

from train.checkpoint import store as ckpt
from train.checkpoint.process import serve
from train.checkpoint.wire import CheckpointWriterError, layout, rebuild
from train.checkpoint.writer import CheckpointWriter
from train.storage import open_store

pytestmark = pytest.mark.slow  # each test starts a trainer or writer process of its own


def _state(step: int, width: int = 8) -> dict:
    """Odd cases together: tied tensors, an empty tensor before a non-empty one (same offset), bool,
    bf16, a 0-dim tensor, a state_dict's OrderedDict with its _metadata, plain values."""
    model = OrderedDict(w=torch.arange(width * 3, dtype=torch.float32).reshape(width, 3) + step,
                        empty=torch.zeros(0), mask=torch.tensor([True, False, True]),
                        half=torch.full((5,), 1.5 + step, dtype=torch.bfloat16))
    model._metadata = OrderedDict({"": {"version": 1}})
    model["tied"] = model["w"]
    return {"step": step, "model": model, "optimizer": {"state": {0: {"step": torch.tensor(float(step))}},
                                                      "param_groups": [{"lr": 0.1, "params": [0]}]},
            "sampler": {"epoch": 1, "offset": 64}, "loss": None, "pair": (3, "x")}


def _saved(state: dict) -> bytes:
    buf = io.BytesIO()
    ckpt.save(state, buf)
    return buf.getvalue()


def _assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), (a, b)
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b


def test_layout_and_rebuild_round_trip_in_memory():
    state = _state(2)
    skeleton, tensors, nbytes = layout(state)
    buffer = bytearray(nbytes)
    view = torch.frombuffer(buffer, dtype=torch.uint8)
    for tensor, slot in tensors:
        if slot.numel:
            view[slot.offset:slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape).copy_(tensor)
    assert len(tensors) == 5  # w, empty, mask, half, step: the tied tensor has no slot of its own
    assert all(slot.offset % 64 == 0 for _, slot in tensors)
    rebuilt = rebuild(skeleton, buffer)
    _assert_same(state, rebuilt)
    assert rebuilt["model"]["tied"] is rebuilt["model"]["w"]
    assert rebuilt["model"]._metadata == {"": {"version": 1}}
    # without a buffer (train.checkpoint.resume: a rank that receives the state): new tensors, laid out alike
    fresh = rebuild(skeleton)
    assert fresh["model"]["tied"] is fresh["model"]["w"] and fresh["model"]["w"].shape == (8, 3)
    assert [slot for _, slot in layout(fresh)[1]] == [slot for _, slot in tensors]


@pytest.mark.filterwarnings("ignore::train.checkpoint.store.CheckpointWarning")  # back-to-back submits wait
def test_writes_what_torch_save_writes_of_the_state_at_submit(tmp_path):
    checkpoints = ckpt.CheckpointStore(open_store(str(tmp_path)), keep=2)
    writer = CheckpointWriter(str(tmp_path), None, keep=2)
    try:
        live = _state(1)
        expected = _saved(_state(1))
        writer.submit(1, live)
        writer.copied()
        live["model"]["w"].add_(100)  # training changes the state in place as soon as copied() returns
        live["model"]["mask"].fill_(False)
        writer.submit(2, _state(2, width=4096))  # a bigger state: the child gets a new buffer
        writer.submit(3, _state(3))
        writer.wait()
        assert writer.written == 3
        writer.submit(4, _state(1))
    finally:
        writer.close()
    writer.close()  # a second close is harmless
    assert checkpoints.valid_steps() == [3, 4]  # keep=2: the child pruned (after each reply) before it ended
    assert (tmp_path / "step-000000004" / "state.pt").read_bytes() == expected
    found = checkpoints.latest_valid()
    assert found.step == 4
    _assert_same(_state(1), found.state)


class _Unreadable(torch.Tensor):
    """A tensor whose copy fails, as one on a device that has failed would."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            raise RuntimeError("unreadable on purpose")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_failed_copy_is_raised_and_the_next_checkpoint_still_reaches_the_child(tmp_path):
    """An error in the copy comes back from submit, nothing is in flight then, and the child's new
    buffer, never sent, goes with the next checkpoint."""
    writer = CheckpointWriter(str(tmp_path), None, keep=1)
    try:
        bad = _state(1)
        bad["model"]["w"] = bad["model"]["tied"] = torch.ones(8, 3).as_subclass(_Unreadable)
        with pytest.raises(RuntimeError, match="unreadable on purpose"):
            writer.submit(1, bad)
        assert not writer.busy()
        writer.submit(2, _state(2))
        writer.wait()
        assert writer.written == 1
    finally:
        writer.close()
    assert ckpt.CheckpointStore(open_store(str(tmp_path)), keep=1).valid_steps() == [2]


def test_errors_come_back_with_their_type_and_the_writer_carries_on(tmp_path):
    root = tmp_path / "ck"
    writer = CheckpointWriter(str(root), None, keep=1)
    try:
        writer.wait_ready()
        root.rmdir()
        root.write_text("the store broke after start: a file where its directory was")
        writer.submit(1, _state(1))
        with pytest.raises((NotADirectoryError, FileExistsError)):
            writer.wait()
        writer.submit(2, _state(2))  # the next checkpoint is tried afresh (and fails the same way)
        with pytest.raises((NotADirectoryError, FileExistsError)):
            writer.wait()
        assert writer.written == 0
        root.unlink()
        root.mkdir()
        writer.submit(3, _state(3))
        writer.wait()
        assert writer.written == 1
    finally:
        writer.close()


def test_a_prune_that_fails_warns_and_the_next_one_deletes_what_it_left(tmp_path, capfd):
    """The checkpoint is safe once its manifest is there: the trainer hears "done" (no error), the
    failed delete is a warning, and the older checkpoint goes with the next prune."""
    writer = CheckpointWriter(str(tmp_path), None, keep=1)
    try:
        writer.submit(1, _state(1))
        writer.wait()
        (tmp_path / "step-000000001" / "state.pt").unlink()  # a directory: the local delete fails
        (tmp_path / "step-000000001" / "state.pt").mkdir()
        (tmp_path / "step-000000001" / "state.pt" / "x").write_text("")
        writer.submit(2, _state(2))
        writer.wait()  # no error
        assert writer.written == 2
        deadline = time.monotonic() + 30
        while "could not delete" not in (err := capfd.readouterr().err) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"could not delete checkpoints older than step 2 under {tmp_path}: IsADirectoryError" in err
        (tmp_path / "step-000000001" / "state.pt" / "x").unlink()
        (tmp_path / "step-000000001" / "state.pt").rmdir()
        writer.submit(3, _state(3))
    finally:
        writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000003"]


def test_a_submit_that_finds_the_previous_write_going_waits_for_it_and_counts_the_wait(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.FAULT_DELAY_ENV, "0.5")  # each write takes at least half a second
    writer = CheckpointWriter(str(tmp_path), None, keep=3)
    try:
        writer.submit(1, _state(1))
        writer.wait()  # done before the next is due: no wait counted
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the trainer says when it defers; a wait here is wanted
            writer.submit(2, _state(2))
            assert writer.busy()  # written for half a second yet
            writer.submit(3, _state(3))  # waits for 2
            writer.submit(4, _state(4))  # and for 3
    finally:
        writer.close()
    assert writer.written == 4 and writer.waits == 2
    assert 0.8 < writer.waited_s < 1.5
    assert ckpt.CheckpointStore(open_store(str(tmp_path)), keep=3).valid_steps() == [2, 3, 4]


def _reply_arrived(writer: CheckpointWriter) -> None:
    assert writer._conn.poll(30), "no reply from the writer in 30 s"


def test_a_submit_after_the_previous_write_is_done_counts_no_wait(tmp_path):
    writer = CheckpointWriter(str(tmp_path), None, keep=3)
    try:
        writer.submit(1, _state(1))
        _reply_arrived(writer)  # done, its reply unread
        writer.submit(2, _state(2))
        writer.wait()
    finally:
        writer.close()
    assert writer.written == 2 and writer.waits == 0 and writer.waited_s == 0


def test_reading_a_reply_does_not_wake_the_idle_child(tmp_path):
    """The child waits for work in poll(POLLIN). Blocked in recv, it was woken each time the trainer
    read a reply (the reply's memory is the child's socket's, and freeing it signals write space),
    a cross-core wakeup paid on the training thread (train.checkpoint.process.serve)."""
    writer = CheckpointWriter(str(tmp_path), None, keep=3)
    try:
        child = psutil.Process(writer._proc.pid)
        for step in (1, 2, 3):
            writer.submit(step, _state(step))
            _reply_arrived(writer)
            time.sleep(0.2)  # the child back waiting
            before = child.num_ctx_switches().voluntary
            writer.wait()
            time.sleep(0.2)
            assert child.num_ctx_switches().voluntary == before, f"checkpoint {step}: the child woke"
    finally:
        writer.close()


def test_a_writer_killed_mid_write_is_an_error_not_a_hang(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.FAULT_DELAY_ENV, "60")  # the child waits before the manifest
    writer = CheckpointWriter(str(tmp_path), None, keep=1)
    child = psutil.Process(writer._proc.pid)
    try:
        writer.submit(1, _state(1))
        deadline = 60
        while not (tmp_path / "step-000000001" / "state.pt").exists() and deadline > 0:
            psutil.wait_procs([child], timeout=0.1)
            deadline -= 0.1
        child.send_signal(signal.SIGKILL)
        with pytest.raises(CheckpointWriterError, match=r"exited \(exit status -9\) while writing "
                                                        r"checkpoint step 1"):
            writer.wait()
        with pytest.raises(CheckpointWriterError, match="writer process is gone"):
            writer.submit(2, _state(2))
    finally:
        writer.close()
    assert not (tmp_path / "step-000000001" / "manifest.json").exists()


def test_the_child_is_niced_placed_ignores_sigterm_and_times_its_writes(object_store, s3_bucket, monkeypatch):
    for k, v in object_store.env().items():
        monkeypatch.setenv(k, v)
    uri = f"s3://{s3_bucket}/ck"
    last_core = max(os.sched_getaffinity(0))
    writer = CheckpointWriter(uri, object_store.endpoint_url, keep=3, cpus=[last_core])
    try:
        child = psutil.Process(writer._proc.pid)
        # Its start-up (importing torch: ~1 s), which the trainer waits for, at normal priority; then 19.
        assert child.nice() == 0 or writer._conn.poll(), "niced before it was ready"
        writer.wait_ready()
        assert [psutil.Process(t.id).nice() for t in child.threads()] == [19] * child.num_threads()
        assert child.cpu_affinity() == [last_core]
        started = time.perf_counter()
        writer.submit(5, _state(5))
        child.send_signal(signal.SIGTERM)  # a spot reclaim signals the whole process group
        writer.wait()
        writer.submit(6, _state(6))
        writer.wait()
        # the child's own timing of its writes: real (an S3 put takes time) and inside what we saw
        assert 0 < writer.write_s_max < time.perf_counter() - started
        # and its CPU time for both (one thread serializes, hashes and uploads: no more than the wall)
        assert 0 < writer.write_cpu_s < 2 * writer.write_s_max
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    finally:
        writer.close()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert ckpt.CheckpointStore(open_store(uri, object_store.endpoint_url), keep=3).valid_steps() == [5, 6]


def test_the_child_dies_with_a_killed_trainer_even_mid_write(tmp_path):
    # Mid-write the child is not reading its socket, so only PR_SET_PDEATHSIG can end it in time.
    script = textwrap.dedent(f"""
        import sys, time, torch
        from train.checkpoint.writer import CheckpointWriter
        w = CheckpointWriter({str(tmp_path)!r}, None, keep=1)
        w.submit(1, {{"w": torch.ones(4)}})
        print(w._proc.pid, flush=True)
        time.sleep(120)
    """)
    env = {**os.environ, ckpt.FAULT_DELAY_ENV: "120"}
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        child = psutil.Process(int(trainer.stdout.readline()))
        for _ in range(600):  # the child is in its write: the state is there, the manifest is not
            if (tmp_path / "step-000000001" / "state.pt").exists():
                break
            psutil.wait_procs([child], timeout=0.1)
        assert (tmp_path / "step-000000001" / "state.pt").exists()
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
        gone, alive = psutil.wait_procs([child], timeout=30)
        assert gone and not alive, "the writer process outlived its trainer"
    finally:
        trainer.kill()
        trainer.wait()
    assert not (tmp_path / "step-000000001" / "manifest.json").exists()


def test_a_writer_that_cannot_start_says_why_before_training():
    writer = CheckpointWriter("s3://bucket/ck", "not a url", keep=1)
    try:
        with pytest.raises(ValueError, match="Invalid endpoint: not a url"):
            writer.wait_ready()
    finally:
        writer.close()


def test_a_trainer_gone_with_ready_unread_ends_the_writer_quietly(tmp_path):
    # A trainer that stops on bad input (a checkpoint that does not fit) can close its end before it
    # reads the writer's "ready"; on a Unix socket the writer's next read is then a reset, which once
    # printed a traceback under the trainer's clean error message.
    trainer, child = Pipe()
    child.send(("ready", None, None))
    trainer.close()
    try:
        serve(child, ckpt.CheckpointStore(open_store(str(tmp_path)), keep=1))  # returns: the trainer has gone
    finally:
        child.close()


def test_the_pinned_mode_is_refused_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: scripts/gpu-check runs the pinned mode")
    with pytest.raises(CheckpointWriterError, match="async_with_pinned_mem needs a GPU"):
        CheckpointWriter(str(tmp_path), None, keep=1, mode="async_with_pinned_mem")
    with pytest.raises(ValueError, match="use one of async, async_with_pinned_mem"):
        CheckpointWriter(str(tmp_path), None, keep=1, mode="sync")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (pinned staging); scripts/gpu-check")
def test_pinned_copies_run_beside_the_next_kernels_and_keep_the_state_at_submit(tmp_path):
    """A buffer changed by the next queued kernel (BatchNorm statistics) is still written as it was at
    submit, and so is a parameter changed after copied()."""
    writer = CheckpointWriter(str(tmp_path), None, keep=1, mode="async_with_pinned_mem")
    try:
        param = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        stats = torch.zeros(4, device="cuda")
        writer.submit(1, {"param": param, "stats": stats}, forward_changes=[stats])
        stats.add_(1)  # the next forward pass, queued after submit
        writer.copied()
        param.add_(1)  # the optimizer step
        writer.wait()
    finally:
        writer.close()
    found = ckpt.CheckpointStore(open_store(str(tmp_path)), keep=1).latest_valid()
    assert torch.equal(found.state["stats"], torch.zeros(4))
    assert torch.equal(found.state["param"], torch.arange(1 << 20, dtype=torch.float32))


def test_abort_stops_the_write_in_flight_at_once_and_the_next_one_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.FAULT_DELAY_ENV, "3")  # each write waits 3 s before its manifest
    writer = CheckpointWriter(str(tmp_path), None, keep=3)
    try:
        writer.submit(1, _state(1))
        for _ in range(300):  # uploaded, waiting before the manifest
            if (tmp_path / "step-000000001" / "state.pt").exists():
                break
            time.sleep(0.05)
        started = time.perf_counter()
        writer.abort()
        took = time.perf_counter() - started
        writer.abort()  # nothing in flight: nothing to do
        writer.submit(2, _state(2))
        writer.wait()
    finally:
        writer.close()
    assert took < 1.5, f"abort took {took:.1f} s: it waited for the write"
    assert writer.aborted == 1 and writer.written == 1
    assert not (tmp_path / "step-000000001").exists()
    assert ckpt.CheckpointStore(open_store(str(tmp_path)), keep=3).valid_steps() == [2]
    assert writer.write_rate > 0  # bytes/s of step 2's write
