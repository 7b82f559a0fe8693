"""The image task's input pipeline (train/tasks/image.py, train/decode.py, train/prefetch.py): DataLoader
workers reading their own shards, uint8 batches normalised on the device, `--decode`, the recipe's
task-side pieces, and a resume that is bitwise with 2 ranks x 2 loader workers, also after a change of
world size (every sample once per epoch)."""

from __future__ import annotations

import argparse
import io

import numpy as np
import pytest
import torch

from train import decode, shards
from train.errors import BadInput
from train.task import TaskContext
from train.tasks.image import MEAN, STD, ImageTask, convert_sync_batchnorm, loader_error, normalize


def _photo_jpegs(n: int) -> list[bytes]:
    """Photo-like JPEGs: crops of scikit-learn's sample photographs, quality 90."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        img = photos[i % len(photos)]
        y, x = rng.integers(0, img.shape[0] - 150), rng.integers(0, img.shape[1] - 200)
        buf = io.BytesIO()
        Image.fromarray(img[y:y + 150, x:x + 200]).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _id_png(i: int) -> bytes:
    """A solid image whose colour is its id: any crop and resize of it keeps the colour, so a batch
    says which samples it holds."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (20, 14), (i % 256, i // 256, 7)).save(buf, "PNG")
    return buf.getvalue()


def _ids(x: torch.Tensor) -> list[int]:
    return (x[:, 0, 0, 0].int() + 256 * x[:, 1, 0, 0].int()).tolist()


@pytest.fixture(scope="module")
def id_set(tmp_path_factory):
    """16 shards of 12 (the last 10) solid images, labels 0/1."""
    uri = str(tmp_path_factory.mktemp("ids") / "ds")
    n, per = 190, 12
    samples = [{"__key__": f"{i:06d}", "png": _id_png(i), "cls": str(i % 2).encode()} for i in range(n)]
    shards.write_dataset(uri, iter([samples[i:i + per] for i in range(0, n, per)]),
                         {"kind": "image", "classes": ["a", "b"]})
    return uri


def _task(data: str, *flags: str, batch: int = 4, seed: int = 3, device: str = "cpu") -> ImageTask:
    parser = argparse.ArgumentParser()
    ImageTask.add_arguments(parser)
    args = parser.parse_args(list(flags))
    problems = ImageTask.check_arguments(args)
    assert not problems, problems
    ctx = TaskContext(data=data, batch_size=batch, seed=seed, steps=100, device=torch.device(device),
                      s3_endpoint_url=None, local_rank=0, local_size=1)
    return ImageTask(args, ctx)


def _rank_run(data, rank, size, position, steps, *flags, eval_data=None):
    task = _task(data, "--model", "shufflenet_v2_x0_5", "--image-size", "8", "--loader-workers", "2",
                 "--shuffle-buffer", "20",
                 "--prefetch", "1", *flags, *(("--eval-data", eval_data) if eval_data else ()))
    task.prepare(rank, size)
    task.build_model()
    batches, positions = [], []
    it = task.train_batches(position, rank, size)
    for _ in range(steps):
        (x, y), pos = next(it)
        assert x.dtype == torch.uint8 and x.shape == (4, 3, 8, 8) and y.dtype == torch.int64
        batches.append(x)
        positions.append(pos)
    evaluated = [] if eval_data is None else [i for x, _ in task.eval_batches(rank, size) for i in _ids(x)]
    it.close()
    task.close()
    return batches, positions, evaluated


@pytest.mark.slow
def test_image_task_resumes_bitwise_with_two_loader_workers_and_after_a_world_change(id_set):
    """2 ranks x 2 loader workers (DataLoader worker processes, forkserver): a run resumed at a
    position equals the uninterrupted run to the bit; resumed on 1 rank instead (an elastic shrink),
    every sample not yet read is read exactly once in the rest of the epoch. Evaluation runs through
    the same workers and covers each evaluation sample once."""
    straight = [_rank_run(id_set, r, 2, None, 9, eval_data=id_set) for r in range(2)]
    batches, positions, _ = straight[1]
    resumed, _, _ = _rank_run(id_set, 1, 2, positions[4], 4)  # mid shuffle block, loader worker 1's turn
    assert all(torch.equal(a, b) for a, b in zip(resumed, batches[5:], strict=True))
    assert sorted(straight[0][2] + straight[1][2]) == list(range(190))  # eval: each sample once

    seen = [i for batches, _, _ in straight for x in batches[:5] for i in _ids(x)]
    position = straight[0][1][4]
    assert position == straight[1][1][4]  # the position does not depend on the rank
    ds = shards.open_dataset(id_set, None, "image")
    per_rank = shards.Plan.from_state(position, 2).for_world(ds, 3, 4, 1, 2, 20).rank_length(ds, 3, 4)
    batches, positions, _ = _rank_run(id_set, 0, 1, position, per_rank)
    rest = [i for x in batches for i in _ids(x)]
    assert positions[-1]["epoch"] == 1
    assert len(set(seen)) == len(seen) and len(set(rest)) == len(rest) and not set(seen) & set(rest)
    assert len(seen) + len(rest) >= 190 - 2 * 4  # at most one short tail per loader worker dropped


def test_uint8_batches_normalised_on_the_device_equal_the_float_path():
    """The workers' uint8 crop, normalised by `normalize`, against the float pipeline it replaces
    (decode, to float in [0, 1], the same crop and resize in float, Normalize): equal to within one
    uint8 step (the uint8 resize rounds its result, and its fixed-point weights), half a step on
    average."""
    from train.tasks.vision import import_torchvision

    import_torchvision()
    from torchvision.transforms.v2 import functional as TF

    for i, data in enumerate(_photo_jpegs(6)):
        image = decode.decode_rgb(data, "pil")
        c = decode.crop_params(image.shape[2], image.shape[1], i, True, "standard", 32)
        ours = normalize(decode.sample_tensor(data, i, "pil", True, "standard", 32)[None])[0]
        floats = TF.resized_crop(image.float() / 255, c.top, c.left, c.height, c.width, [32, 32],
                                 antialias=True)
        floats = (floats.flip(-1) if c.flip else floats)
        ref = TF.normalize(floats, list(MEAN), list(STD))
        step = 1 / 255 / min(STD)
        assert (ours - ref).abs().max() <= step and (ours - ref).abs().mean() < step / 2
    x = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    same = TF.normalize(TF.to_dtype(x, torch.float32, scale=True), list(MEAN), list(STD))
    torch.testing.assert_close(normalize(x), same)
    assert normalize(x, torch.channels_last).is_contiguous(memory_format=torch.channels_last)
    floats = torch.randn(2, 3, 4, 4)
    assert normalize(floats) is floats  # synthetic data is normalised already


def test_decode_choices_are_accepted_or_refused_as_stated():
    assert decode.resolve("auto", cuda=False) == "simplejpeg"  # the fastest measured (docs/DATA.md)
    assert decode.resolve("pil", cuda=False) == "pil"
    assert decode.resolve("simplejpeg", cuda=False) == "simplejpeg"
    with pytest.raises(BadInput, match=r"--decode nvjpeg decodes on the GPU .* no CUDA device"):
        decode.resolve("nvjpeg", cuda=False)
    assert decode.resolve("nvjpeg", cuda=True) == "nvjpeg"
    if decode._torchvision_image_ops_problem():  # torch's CPU build: the extension does not load
        with pytest.raises(BadInput, match=r"--decode torchvision: torchvision's image extension does not"):
            decode.resolve("torchvision", cuda=False)
    else:
        assert decode.resolve("torchvision", cuda=False) == "torchvision"
    with pytest.raises(SystemExit):
        _task("synthetic", "--decode", "dali")
    # the CPU decoders give the same crop of a JPEG (libjpeg-turbo both; up to IDCT rounding)
    data = _photo_jpegs(1)[0]
    a, b = (decode.sample_tensor(data, 5, d, True, "standard", 64).int() for d in ("pil", "simplejpeg"))
    assert (a - b).abs().float().mean() < 1.0


def test_a_task_on_cpu_refuses_nvjpeg_and_sync_bn_in_one_line(id_set):
    for flags, says in ((("--decode", "nvjpeg"), "--decode nvjpeg decodes on the GPU"),
                        (("--sync-bn",), "--sync-bn uses hvd.SyncBatchNorm, which Horovod implements "
                                         "for GPU tensors only")):
        with pytest.raises(BadInput, match=says) as e:
            _task(id_set, *flags).prepare(0, 1)
        assert "\n" not in str(e.value)


def test_sync_bn_converts_every_batchnorm_keeping_its_state():
    import horovod.torch as hvd

    from train.tasks.vision import import_torchvision

    model = import_torchvision().models.get_model("resnet18", weights=None, num_classes=3)
    bn = model.bn1
    bn.running_mean.fill_(0.25)
    converted = convert_sync_batchnorm(model, hvd.SyncBatchNorm)
    kinds = [type(m) for m in converted.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert len(kinds) == 20 and set(kinds) == {hvd.SyncBatchNorm}
    assert torch.equal(converted.bn1.running_mean, torch.full((64,), 0.25))
    assert torch.equal(converted.bn1.weight, bn.weight)


def test_the_loss_smooths_labels_and_the_crop_is_the_standard_one():
    task = _task("synthetic", "--image-size", "8", "--num-classes", "4")
    assert task.args.label_smoothing == 0.1 and decode.CROP_SCALE == (0.08, 1.0)
    logits = torch.tensor([[2.0, 0.0, 0.0, -1.0]])

    class Fixed(torch.nn.Module):
        def forward(self, x):
            return logits

    y = torch.tensor([0])
    logp = logits.log_softmax(1)
    expected = -(0.9 * logp[0, 0] + 0.1 * logp[0].mean())
    torch.testing.assert_close(task.loss(Fixed(), (torch.zeros(1, 3, 8, 8), y)), expected)
    # crops over many seeds reach the small end of the standard area range
    areas = [(c.height * c.width) / (500 * 375) for c in
             (decode.crop_params(500, 375, s, True, "standard", 224) for s in range(400))]
    assert min(areas) < 0.15 and max(areas) > 0.9


def test_a_bad_input_raised_in_a_loader_worker_comes_back_as_its_one_line():
    wrapped = BadInput("Caught BadInput in DataLoader worker process 0.\nOriginal Traceback (most recent "
                       "call last):\n  File \"x.py\", line 1\ntrain.errors.BadInput: sample 7 in shard s.tar "
                       "cannot be decoded: OSError: truncated")
    assert str(loader_error(wrapped)) == "sample 7 in shard s.tar cannot be decoded: OSError: truncated"
