"""The trainer's exports and --init-from end to end (issue 39's "done when"): a run of the image task ends
with an export; README's snippet loads it and gets the run's top-1 on the evaluation set again; a second
run with --init-from that export starts from its loss, not from scratch; a resume wins over
--init-from; bad weights or an unwritable destination are one line and exit 2."""

from __future__ import annotations

import json

import pytest

from tests.train.proc import run, train_cmd
from train.summary import parse_summary

pytestmark = pytest.mark.slow  # each test starts trainer processes

# the example's model (cluster/run_data.py) at half width, without augmentation: 60 steps reach a top-1
# of about 0.76 and a loss of about 0.9 from 2.3
IMAGE = ("--task", "image", "--model", "shufflenet_v2_x0_5", "--image-size", "32", "--loader-workers", "0",
         "--optimizer", "adam", "--lr", "0.005", "--batch-size", "32", "--augment", "none")




def _train(digits, *args: str):
    train, evaluation = digits
    r = run(train_cmd(*IMAGE, "--data", train, "--eval-data", evaluation, *args), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return parse_summary(r.stdout), r


def test_a_run_ends_with_an_export_that_reproduces_its_top1_and_seeds_a_second_run(digits, tmp_path):
    first, _ = _train(digits, "--steps", "60", "--checkpoint-dir", str(tmp_path / "checkpoints" / "image"))
    exported = tmp_path / "exports" / "image"   # the default: exports/<job> beside checkpoints/<job>
    assert first.export == str(exported)
    assert first.eval["eval_top1"] > 0.5, first.eval   # trained: well above chance (0.1)
    record = json.loads((exported / "model.json").read_text())
    assert record["step"] == 60 and record["eval"] == first.eval

    # README's snippet, exactly
    from train.export import load_export

    model = load_export(str(exported))
    assert model.evaluate(digits[1]) == first.eval

    second, out = _train(digits, "--steps", "5", "--init-from", str(exported),
                         "--checkpoint-dir", str(tmp_path / "checkpoints" / "again"))
    assert second.init_from["applied"] is True and second.init_from["loaded"] > 100
    assert second.resumed_from_step is None
    # starts from the export's loss, not from scratch's (~2.3 for 10 classes)
    assert second.initial_loss < 0.6 * first.initial_loss, (first, second)
    assert abs(second.initial_loss - first.final_loss) < 0.5, (first, second)

    # a resume from the first run's checkpoint wins over --init-from, and the summary says so
    third, _ = _train(digits, "--steps", "62", "--init-from", str(exported),
                      "--checkpoint-dir", str(tmp_path / "checkpoints" / "image"), "--no-export")
    assert third.resumed_from_step == 60 and third.export is None
    assert third.init_from == {"uri": str(exported), "applied": False}


@pytest.mark.parametrize("args,says", [
    (("--init-from", "MISSING"), "--init-from {tmp}/nope.safetensors: no such weights file"),
    (("--export-dir", "FILE/x"), "--export-dir {tmp}/file/x: cannot be written"),
])
def test_bad_weights_or_destination_is_one_line_and_exit_2(digits, tmp_path, args, says):
    (tmp_path / "file").write_text("")
    args = [a.replace("MISSING", str(tmp_path / "nope.safetensors")).replace("FILE", str(tmp_path / "file"))
            for a in args]
    r = run(train_cmd(*IMAGE, "--data", digits[0], "--steps", "1", *args), timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("train: error:")]
    assert len(errors) == 1 and errors[0].startswith("train: error: " + says.format(tmp=tmp_path)), r.stderr
