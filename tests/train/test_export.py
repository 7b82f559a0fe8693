"""Exports (train/export.py) and --init-from (train/init_from.py), called directly: one process, no
Horovod. The trainer's end-to-end use of them: tests/train/test_export_run.py."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from cluster.local.objectstore import LOCAL_CREDENTIALS
from train import checksum, export, init_from
from train.errors import BadInput
from train.task import TaskContext, load_task

IMAGE_ARGS = ("--model", "shufflenet_v2_x0_5", "--image-size", "16", "--augment", "none",
              "--loader-workers", "0", "--readahead-shards", "1", "--num-classes", "10")


def _image_args(*extra: str) -> argparse.Namespace:
    """The image task's arguments as its own parser gives them (every default included)."""
    parser = argparse.ArgumentParser()
    load_task("image").add_arguments(parser)
    return parser.parse_args([*IMAGE_ARGS, *extra])




def _ctx(data: str, endpoint: str | None = None) -> TaskContext:
    return TaskContext(data=data, batch_size=64, seed=0, steps=1, device=torch.device("cpu"),
                       s3_endpoint_url=endpoint, local_rank=0, local_size=1)


def _image_task(digits):
    train, evaluation = digits
    task = load_task("image")(_image_args("--eval-data", evaluation), _ctx(train))
    task.prepare(0, 1)
    return task


def _evaluate(task, model) -> dict:
    """What the trainer's evaluate() computes, on one worker."""
    sums: dict[str, float] = {}
    model.eval()
    with torch.no_grad():
        for batch in task.eval_batches(0, 1):
            for k, v in task.eval_sums(model, batch).items():
                sums[k] = sums.get(k, 0.0) + float(v)
    return {f"eval_{k}": v for k, v in task.eval_metrics(sums).items()}


def _record(task, step: int, metrics: dict | None, data: str) -> dict:
    return export.model_record("image", task.args, task.model_info(), export.dataset_record(data, None),
                               metrics, step, export.provenance())


def test_an_export_loads_without_the_training_data_and_reproduces_its_evaluation(digits, tmp_path):
    task = _image_task(digits)
    torch.manual_seed(1)
    model = task.build_model()
    with torch.no_grad():  # a model that is not at chance: bias the head towards the labels' order
        model.fc.bias.copy_(torch.linspace(0, 1, 10))
    measured = _evaluate(task, model)
    record = _record(task, 42, measured, digits[0])
    written = export.write_export(str(tmp_path / "ex"), model.state_dict(), record)

    on_disk = json.loads((tmp_path / "ex" / "model.json").read_text())
    assert on_disk == written
    assert on_disk["task"] == "image" and on_disk["step"] == 42 and on_disk["eval"] == measured
    assert on_disk["task_args"]["model"] == "shufflenet_v2_x0_5"
    assert on_disk["model_info"]["classes"] == [str(i) for i in range(10)]
    index = Path(digits[0], "index.json").read_bytes()
    assert on_disk["dataset"] == {"uri": digits[0], "index_xxh3_128": checksum.of(index)["xxh3_128"]}
    assert on_disk["git_commit"] and on_disk["image_version"]

    loaded = export.load_export(str(tmp_path / "ex"))
    assert not loaded.model.training
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[k], v), k
    assert loaded.evaluate(digits[1]) == measured


def test_tied_weights_are_stored_once_and_tied_again_on_load(tmp_path):
    from train.tasks.lm import LanguageModelTask

    args = argparse.Namespace(model_preset=None, layers=1, heads=2, dim=8, seq_len=16, dropout=0.0,
                              activation_checkpointing=False, compile=False, eval_data=None,
                              readahead_blocks=1)
    task = LanguageModelTask(args, _ctx("unused"))
    info = {"vocab_size": 64, "eod_token": 0, "seq_len": 16, "tokenizer": None}
    task.use_model_info(info)
    model = task.build_model()
    record = export.model_record("lm", task.args, info, {"uri": "synthetic"}, None, 3, {})
    written = export.write_export(str(tmp_path), model.state_dict(), record)
    assert written["tied"], "the GPT's output layer is its token embedding"
    (name, first), = written["tied"].items()
    loaded = export.load_export(str(tmp_path)).model
    state = loaded.state_dict()
    assert state[name].data_ptr() == state[first].data_ptr()   # tied again
    assert torch.equal(state[first], model.state_dict()[first])


def test_an_export_whose_weights_changed_is_refused(tmp_path):
    model = nn.Linear(3, 2)
    export.write_export(str(tmp_path), model.state_dict(), {"format": export.FORMAT})
    data = bytearray((tmp_path / export.WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / export.WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(BadInput, match="model.safetensors fails its xxh3_128 check"):
        export.read_export(str(tmp_path))


def test_an_unwritable_export_destination_is_one_message(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(BadInput, match=r"--export-dir .*file/ex: cannot be written"):
        export.write_export(str(tmp_path / "file" / "ex"), nn.Linear(2, 2).state_dict(), {})


def test_the_default_destination_is_exports_beside_checkpoints():
    assert (export.default_export_uri("s3://p-checkpoints/checkpoints/image")
            == "s3://p-checkpoints/exports/image")
    assert export.default_export_uri("/data/checkpoints/j1/") == "/data/exports/j1"
    assert export.default_export_uri("/tmp/ck") is None
    assert export.default_export_uri(None) is None


# ---- --init-from ------------------------------------------------------------------------------
def _net(out: int = 2) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, out))


def test_init_from_reads_safetensors_state_dicts_checkpoints_and_exports(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    source = _net()
    state = source.state_dict()
    save_file(state, str(tmp_path / "w.safetensors"))
    torch.save(state, tmp_path / "w.pt")
    torch.save({"step": 5, "model": state, "optimizer": {}}, tmp_path / "state.pt")  # a checkpoint's
    export.write_export(str(tmp_path / "ex"), state, {"format": export.FORMAT})
    for uri in ("w.safetensors", "w.pt", "state.pt", "ex", "ex/"):
        target = _net()
        report = init_from.init_from(target, str(tmp_path / uri))
        assert report.loaded == 4 and not (report.missing or report.unexpected or report.mismatched)
        for k, v in state.items():
            assert torch.equal(target.state_dict()[k], v), (uri, k)


def test_init_from_an_s3_object(object_store, s3_bucket, monkeypatch):
    for k, v in LOCAL_CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    source = _net()
    buf = io.BytesIO()
    torch.save(source.state_dict(), buf)
    object_store.client().put_object(Bucket=s3_bucket, Key="weights/resnet.pth", Body=buf.getvalue())
    export.write_export(f"s3://{s3_bucket}/exports/j", source.state_dict(), {"format": export.FORMAT},
                        object_store.endpoint_url)
    for uri in (f"s3://{s3_bucket}/weights/resnet.pth", f"s3://{s3_bucket}/exports/j"):
        target = _net()
        init_from.init_from(target, uri, object_store.endpoint_url)
        assert torch.equal(target[2].weight, source[2].weight), uri
    with pytest.raises(BadInput, match=r"--init-from s3://.*/weights/nope.pth: no such weights file"):
        init_from.init_from(_net(), f"s3://{s3_bucket}/weights/nope.pth", object_store.endpoint_url)


def test_strict_loading_names_the_first_mismatching_key_and_partial_loads_what_fits(tmp_path):
    torch.save(_net(out=1000).state_dict(), tmp_path / "imagenet.pt")
    with pytest.raises(BadInput, match=r"--init-from .*imagenet.pt: 2.weight has shape \[1000, 8\], "
                                       r"the model's is \[2, 8\] \(2 key\(s\) differ"):
        init_from.init_from(_net(), str(tmp_path / "imagenet.pt"))
    target = _net()
    before = target[2].weight.clone()
    report = init_from.init_from(target, str(tmp_path / "imagenet.pt"), partial=True)
    assert report.mismatched == ["2.weight", "2.bias"] and report.loaded == 2
    assert torch.equal(target[2].weight, before), "a mismatched head stays as built"
    saved = torch.load(tmp_path / "imagenet.pt")
    assert torch.equal(target[0].weight, saved["0.weight"])

    torch.save({"0.weight": saved["0.weight"], "extra": torch.ones(1)}, tmp_path / "some.pt")
    with pytest.raises(BadInput, match=r"some.pt: missing 0.bias \(3 missing, 1 unexpected key\(s\)"):
        init_from.init_from(_net(), str(tmp_path / "some.pt"))
    report = init_from.init_from(_net(), str(tmp_path / "some.pt"), partial=True)
    assert report.missing == ["0.bias", "2.weight", "2.bias"]
    assert (report.unexpected, report.loaded) == (["extra"], 1)


def test_a_missing_file_or_one_that_holds_no_weights_is_one_message(tmp_path):
    with pytest.raises(BadInput, match=r"--init-from .*nope.pt: no such weights file"):
        init_from.init_from(_net(), str(tmp_path / "nope.pt"))
    (tmp_path / "text.pt").write_text("not weights")
    torch.save({"lr": 0.1}, tmp_path / "dict.pt")
    torch.save([torch.ones(1)], tmp_path / "list.pt")
    for name in ("text.pt", "dict.pt", "list.pt"):
        with pytest.raises(BadInput, match=rf"{name}: neither a safetensors file nor a torch state_dict"):
            init_from.init_from(_net(), str(tmp_path / name))



def test_provenance_comes_from_the_image_or_the_checkout(tmp_path):
    image_file = tmp_path / "VERSION"
    image_file.write_text("0.4.1\n")
    assert export.provenance({"RINGTRAIN_GIT_COMMIT": "abc123"}, tmp_path / "no-repo", image_file) == {
        "git_commit": "abc123", "image_version": "0.4.1"}
    assert export.provenance({}, tmp_path / "no-repo", tmp_path / "none") == {
        "git_commit": None, "image_version": None}
    local = export.provenance({}, export.REPO_ROOT, tmp_path / "none")
    assert len(local["git_commit"]) == 40 and local["image_version"].endswith("(local checkout)")
