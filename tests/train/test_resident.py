"""A resident state: the model's parameters and the optimizer's state moved into one shared region,
training on unchanged, moves detected, and checkpoints through the writer process that are the state
at submit even though training changes it right after copied()."""

from __future__ import annotations

import copy
import os
import signal
import time

import psutil
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from train import checkpoint as ckpt
from train.checkpoint_writer import FAULT_COPY_DELAY_ENV, CheckpointWriter, CheckpointWriterError, RegionSlot
from train.resident import ResidentState
from train.storage import open_store

X = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(2))


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _step(model, opt) -> None:
    opt.zero_grad()
    F.cross_entropy(model(X), Y).backward()
    opt.step()


def _values(step: int, opt) -> dict:
    return {"step": step, "optimizer": {"param_groups": opt.state_dict()["param_groups"]},
            "sampler": {"epoch": 0, "offset": step * 16}, "loss": None}


def _resident(model, opt) -> ResidentState:
    def state_of(values):
        return {"step": values["step"], "model": model.state_dict(), "optimizer": opt.state_dict(),
                "sampler": values["sampler"], "loss": values["loss"]}
    return ResidentState(model, opt, state_of)


def _in_region(resident: ResidentState, t: torch.Tensor) -> bool:
    start = torch.frombuffer(resident.region, dtype=torch.uint8, count=1).data_ptr()
    return start <= t.data_ptr() < start + len(resident.region)


def test_relocated_tensors_live_in_the_region_and_train_exactly_as_before():
    model, opt = _model()
    twin, twin_opt = _model()
    for m, o in ((model, opt), (twin, twin_opt)):
        _step(m, o)
    resident = _resident(model, opt)
    fd = resident.relocate(_values(1, opt))
    try:
        tensors = list(model.parameters()) + [s["momentum_buffer"] for s in opt.state.values()]
        assert len(tensors) == 8 and all(_in_region(resident, t) for t in tensors)
        assert resident.current()
        for _ in range(5):
            _step(model, opt)
            _step(twin, twin_opt)
        assert resident.current()  # the optimizer changes them in place
        for a, b in zip(model.parameters(), twin.parameters(), strict=True):
            assert torch.equal(a, b)
        # The template: every tensor a RegionSlot, the state dict's structure kept.
        assert isinstance(resident.template["model"]["0.weight"], RegionSlot)
        assert isinstance(resident.template["optimizer"]["state"][0]["momentum_buffer"], RegionSlot)
        assert resident.template["sampler"] == {"epoch": 0, "offset": 16}
    finally:
        os.close(fd)


@pytest.mark.parametrize("move", ["rebind a parameter", "load the optimizer's state", "first optimizer step"])
def test_a_moved_tensor_makes_the_state_not_current(move):
    model, opt = _model()
    if move != "first optimizer step":
        _step(model, opt)
    resident = _resident(model, opt)
    os.close(resident.relocate(_values(1, opt)))
    assert resident.current()
    if move == "rebind a parameter":
        p = next(model.parameters())
        p.data = p.data.clone()
    elif move == "load the optimizer's state":
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    else:
        _step(model, opt)  # the momentum buffers are made now, outside the region
    assert not resident.current()
    os.close(resident.relocate(_values(2, opt)))
    assert resident.current() and resident.relocations == 2


def test_tensors_sharing_a_storage_are_refused_and_nothing_moves():
    flat = torch.zeros(20)
    model = nn.Linear(4, 4)
    model.weight = nn.Parameter(flat[:16].view(4, 4))
    model.bias = nn.Parameter(flat[16:])
    model.weight.data = flat[:16].view(4, 4)  # both parameters views of one storage
    model.bias.data = flat[16:]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.data_ptr() for p in model.parameters()]
    resident = _resident(model, opt)
    with pytest.raises(ValueError, match="share one"):
        resident.relocate(_values(0, opt))
    assert [p.data_ptr() for p in model.parameters()] == before and resident.template is None


def _expected(model, opt, step: int) -> bytes:
    return ckpt.serialize({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                           "sampler": {"epoch": 0, "offset": step * 16}, "loss": None})


def test_resident_checkpoints_are_what_torch_save_writes_of_the_state_at_submit(tmp_path):
    model, opt = _model()
    resident = _resident(model, opt)
    writer = CheckpointWriter(str(tmp_path), None, keep=5)
    expected = {}
    try:
        for step in (1, 2, 3):
            _step(model, opt)
            if step == 3:  # the optimizer's state replaced: relocated, and the new layout sent
                opt.load_state_dict(copy.deepcopy(opt.state_dict()))
            for group in opt.param_groups:
                group["lr"] = 0.1 / step  # a schedule: the checkpoint carries this step's value
            expected[step] = _expected(model, opt, step)
            writer.submit_resident(step, _values(step, opt), resident)
            writer.copied()
            _step(model, opt)  # training changes every tensor right after copied()
            writer.wait()
    finally:
        writer.close()
    assert writer.written == 3 and resident.relocations == 2
    for step, data in expected.items():
        assert (tmp_path / f"step-{step:09d}" / "state.pt").read_bytes() == data, step
    found = ckpt.CheckpointStore(open_store(str(tmp_path)), keep=5).latest_valid()
    assert found.state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.1 / 3)


def test_the_writer_process_copies_the_region_until_copied(tmp_path, monkeypatch):
    """The training thread only sends a message: the child copies (here after half a second) and
    copied() waits for that."""
    monkeypatch.setenv(FAULT_COPY_DELAY_ENV, "0.5")
    model, opt = _model()
    _step(model, opt)
    expected = _expected(model, opt, 1)
    resident = _resident(model, opt)
    writer = CheckpointWriter(str(tmp_path), None, keep=1)
    try:
        writer.wait_ready()
        start = time.perf_counter()
        writer.submit_resident(1, _values(1, opt), resident)
        submitted = time.perf_counter() - start
        writer.copied()
        copied = time.perf_counter() - start
        _step(model, opt)
        writer.wait()
    finally:
        writer.close()
    assert submitted < 0.25 and copied >= 0.5, (submitted, copied)
    assert (tmp_path / "step-000000001" / "state.pt").read_bytes() == expected


def test_a_copy_the_child_cannot_take_is_raised_by_copied_and_the_writer_carries_on(tmp_path):
    model, opt = _model()
    _step(model, opt)
    resident = _resident(model, opt)
    writer = CheckpointWriter(str(tmp_path), None, keep=1)
    try:
        os.close(resident.relocate(_values(1, opt)))
        writer._relocations_sent = resident.relocations  # as if the region had gone already: it has not
        writer.submit_resident(1, _values(1, opt), resident)
        with pytest.raises(CheckpointWriterError, match="before its region was sent"):
            writer.copied()
        writer.wait()  # nothing in flight after that error
        writer._relocations_sent = 0  # the child lacks the region: the next checkpoint relocates
        writer.submit_resident(2, _values(2, opt), resident)
        writer.wait()
    finally:
        writer.close()
    assert writer.written == 1 and resident.relocations == 2
    assert ckpt.CheckpointStore(open_store(str(tmp_path)), keep=1).valid_steps() == [2]


def test_a_writer_killed_before_it_copied_is_an_error_not_a_hang(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_COPY_DELAY_ENV, "60")
    model, opt = _model()
    _step(model, opt)
    resident = _resident(model, opt)
    writer = CheckpointWriter(str(tmp_path), None, keep=1)
    try:
        writer.submit_resident(1, _values(1, opt), resident)
        psutil.Process(writer._proc.pid).send_signal(signal.SIGKILL)
        with pytest.raises(CheckpointWriterError, match=r"exited \(exit status -9\) while copying checkpoint "
                                                        r"step 1"):
            writer.copied()
        writer.wait()  # nothing in flight
    finally:
        writer.close()
