"""bench/gpu_step.py, scripts/gpu-check's measurement of the trainer's own step: on this CPU machine its
code path runs for real at a tiny size through the single-process Horovod stand-in (the GPU figures
come from a machine with a GPU)."""

from __future__ import annotations

import pytest

from bench import gpu_step


@pytest.mark.slow  # 25-57 s on this loaded host (two ResNet-18 trainer builds), in one process
def test_the_trainers_step_runs_through_the_single_process_stand_in(tmp_path):
    hvd = gpu_step.SingleProcessHorovod()
    small = {"model": "resnet18", "batch": 4, "image_size": 32, "precision": "fp32", "steps": 2,
             "warmup": 1, "hvd": hvd}
    synthetic = gpu_step.trainer_images_per_sec("synthetic", **small)
    assert synthetic["images_per_sec"] > 0 and synthetic["data"] == "synthetic"
    data = gpu_step.packed_photos(tmp_path, images=24)
    packed = gpu_step.trainer_images_per_sec(data, **small)  # read in this process (--loader-workers 0)
    assert packed["images_per_sec"] > 0 and packed["data"] == "packed JPEGs" and packed["decode"] == "auto"


def test_where_horovod_is_missing_the_report_says_the_stand_in_ran(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_horovod(name, *args, **kwargs):
        if name.startswith("horovod"):
            raise ImportError("No module named 'horovod'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_horovod)
    hvd, note = gpu_step.horovod_or_stand_in()
    assert isinstance(hvd, gpu_step.SingleProcessHorovod)
    assert "single-process stand-in" in note and "No module named 'horovod'" in note


def test_nvjpeg_needs_a_gpu_and_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: scripts/gpu-check runs --decode nvjpeg")
    from train.errors import BadInput

    with pytest.raises(BadInput, match="--decode nvjpeg decodes on the GPU"):
        gpu_step.trainer_images_per_sec("synthetic", model="resnet18", batch=2, image_size=16, steps=1,
                                        warmup=0, decode="nvjpeg", hvd=gpu_step.SingleProcessHorovod())
