"""The task interface: `--task` loads a built-in, a module or a file outside the repository; its flags
are parsed and checked with the trainer's (one message, exit 2); a user's task trains on 2 workers and
resumes from its data position."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.train.proc import REPO, horovodrun_cmd, run, train_cmd
from train.config import parse_args
from train.errors import BadInput
from train.summary import parse_summary
from train.task import BUILTIN_TASKS, load_task
from train.tasks.demo import DemoTask

USER_TASK = REPO / "tests" / "train" / "user_task.py"


@pytest.fixture
def outside_task(tmp_path):
    """The user's task file, copied to a directory outside the repository (nothing imports it by name)."""
    path = tmp_path / "elsewhere" / "my_task.py"
    path.parent.mkdir()
    shutil.copy(USER_TASK, path)
    return f"{path}:ParityTask"


def test_demo_is_the_default_and_keeps_todays_flags():
    cfg = parse_args(["--model", "cnn", "--width", "16", "--dropout", "0.1"])
    assert cfg.task.name == "demo"
    assert (cfg.task.args.model, cfg.task.args.width, cfg.task.args.dropout) == ("cnn", 16, 0.1)
    assert load_task("demo") is DemoTask and load_task("train.tasks.demo:DemoTask") is DemoTask


def test_a_task_file_outside_the_repository_loads_with_its_own_flags(outside_task):
    cfg = parse_args(["--task", outside_task, "--hidden", "7", "--steps", "3"])
    assert cfg.task.name == outside_task and cfg.task.args.hidden == 7 and cfg.steps == 3
    assert not hasattr(cfg.task.args, "steps")  # the trainer's flags stay the trainer's
    with pytest.raises(BadInput) as e:  # the demo task's flags belong to the demo task only
        parse_args(["--task", outside_task, "--model", "cnn"])
    assert "unrecognized arguments: --model cnn" in str(e.value)


@pytest.mark.parametrize(("task", "says"), [
    ("nope", f"use a built-in task ({', '.join(BUILTIN_TASKS)}), pkg.module:ClassName or path/to/file.py:"),
    ("/no/such/file.py:Task", "file /no/such/file.py not found"),
    ("no_such_pkg.tasks:Task", "no module named 'no_such_pkg.tasks'"),
    ("train.tasks.demo:Missing", "train.tasks.demo has no 'Missing'"),
    ("train.tasks.demo:MODELS", "MODELS is not a subclass of train.task.Task"),
])
def test_a_task_that_does_not_load_is_one_clear_message(task, says):
    with pytest.raises(BadInput) as e:
        parse_args(["--task", task])
    assert says in str(e.value)


def test_a_task_file_that_fails_to_import_names_the_file_and_the_error(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import torch\nraise RuntimeError('no GPU driver here')\n")
    with pytest.raises(BadInput) as e:
        parse_args(["--task", f"{bad}:Task"])
    assert f"importing {bad} failed: RuntimeError: no GPU driver here" in str(e.value)


def test_the_tasks_own_checks_join_the_trainers(outside_task):
    with pytest.raises(BadInput) as e:
        parse_args(["--task", outside_task, "--hidden", "1", "--steps", "0"])
    assert "--steps 0: must be >= 1" in str(e.value) and "--hidden 1: must be >= 2" in str(e.value)


def test_bad_task_arguments_exit_2_with_one_message(outside_task):
    r = run(train_cmd("--task", outside_task, "--hidden", "1"), timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "train: error: --hidden 1: must be >= 2"


BROKEN_TASK = """
from train.task import Task


class BrokenTask(Task):
    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--fail-in", choices=["init", "prepare"], default="init")
        parser.add_argument("--fail-on-rank", type=int, default=None)

    def __init__(self, args, ctx):
        super().__init__(args, ctx)
        if args.fail_in == "init":
            raise KeyError("weights_url")

    def prepare(self, rank, size):
        if self.args.fail_on_rank in (None, rank):
            open("/nonexistent/labels.csv")
"""


def _broken_line(code: str) -> str:
    """Where BrokenTask raises: its file and the line of `code` there."""
    return f"broken_task.py:{[ln.strip() for ln in BROKEN_TASK.splitlines()].index(code) + 1}"


RAISED_IN_INIT = ("its constructor raised KeyError: 'weights_url' "
                  f"""({_broken_line('raise KeyError("weights_url")')})""")
RAISED_IN_PREPARE = ("prepare() raised FileNotFoundError: [Errno 2] No such file or directory: "
                     f"""'/nonexistent/labels.csv' ({_broken_line('open("/nonexistent/labels.csv")')})""")


@pytest.fixture
def broken_task(tmp_path):
    path = tmp_path / "broken_task.py"
    path.write_text(BROKEN_TASK)
    return f"{path}:BrokenTask"


@pytest.mark.parametrize(("fail_in", "says"), [("init", RAISED_IN_INIT), ("prepare", RAISED_IN_PREPARE)])
def test_a_task_whose_own_code_raises_is_one_line_and_exit_2(broken_task, fail_in, says):
    r = run(train_cmd("--task", broken_task, "--fail-in", fail_in, "--steps", "2"), timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip() == f"train: error: --task {broken_task!r}: {says}"


@pytest.mark.slow
def test_a_task_that_fails_on_one_rank_fails_every_rank_with_its_cause_and_the_job_says_bad_input(
        broken_task):
    """Under horovodrun, as a job runs: the rank whose prepare raised names it, every rank exits 2, and
    the job's exit code (cluster.exit_codes, from the launcher's output) is bad input, not 1."""
    from cluster.exit_codes import failure_message, job_exit_code
    from train.contract import EXIT_BAD_INPUT

    r = run(horovodrun_cmd(2, "--task", broken_task, "--fail-in", "prepare", "--fail-on-rank", "1",
                           "--steps", "2"), timeout=300)
    lines = (r.stdout + r.stderr).splitlines()
    assert job_exit_code(r.returncode, lines) == EXIT_BAD_INPUT, r.stdout[-3000:] + r.stderr[-3000:]
    assert failure_message(EXIT_BAD_INPUT, lines) == \
        f"exit code 2: train: error: (rank 1) --task {broken_task!r}: {RAISED_IN_PREPARE}"
    # no worker printed a traceback (horovodrun's own, about the workers' exit, is horovodrun's)
    assert not [ln for ln in lines if ln.startswith(("[0]<", "[1]<")) and "Traceback" in ln], lines
    assert any(ln.startswith("[0]<stderr>:train: error: (rank 1)") for ln in lines), lines  # (the prefix)


def test_task_help_lists_the_tasks_flags(outside_task):
    r = subprocess.run([sys.executable, "-m", "train", "--task", outside_task, "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"task {outside_task}" in r.stdout and "--hidden HIDDEN" in r.stdout


@pytest.mark.parametrize(("argv", "says"), [
    (["--task", "image", "--model", "resnet5"], "--model 'resnet5': not a torchvision classification model"),
    (["--task", "image", "--loader-workers", "-1"], "--loader-workers -1: must be >= 0"),
    (["--task", "lm", "--dim", "30", "--heads", "4"], "--dim 30: must be a multiple of --heads 4"),
    (["--task", "lm", "--layers", "0"], "--layers 0: must be >= 1"),
    (["--task", "lm", "--model-preset", "gpt2-small", "--dim", "64"],
     "--model-preset gpt2-small sets the model's size: drop --dim"),
    (["--task", "lm", "--model-preset", "gpt3"], "argument --model-preset: invalid choice: 'gpt3'"),
    (["--task", "lm", "--seq-len", "0"], "--seq-len 0: must be >= 1"),
    (["--task", "lm", "--readahead-blocks", "-1"], "--readahead-blocks -1: must be >= 0"),
])
def test_the_built_in_tasks_check_their_flags(argv, says):
    with pytest.raises(BadInput) as e:
        parse_args(argv)
    assert says in str(e.value)


def test_lm_needs_packed_data_and_a_missing_dataset_is_one_message(tmp_path):
    r = run(train_cmd("--task", "lm"), timeout=120)
    assert r.returncode == 2 and "--task lm reads token shards: give --data" in r.stderr
    (tmp_path / "empty").mkdir()
    r = run(train_cmd("--task", "image", "--data", str(tmp_path / "empty")), timeout=120)
    assert r.returncode == 2
    assert "index.json not found (write one with `python -m train.data pack images" in r.stderr


@pytest.mark.slow
def test_image_task_synthetic_mode_is_horovods_synthetic_benchmark():
    r = run(train_cmd("--task", "image", "--data", "synthetic", "--model", "resnet18", "--image-size", "32",
                      "--num-classes", "10", "--batch-size", "8", "--steps", "3"), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = parse_summary(r.stdout)
    assert s.steps == 3 and s.samples_per_sec > 0 and s.eval is None


def test_image_decoding_is_a_function_of_the_sample_seed_and_the_workers_dataset_pickles(tmp_path):
    import io
    import itertools
    import pickle

    import numpy as np
    import torch
    from PIL import Image

    from train import decode, shards
    from train.tasks.image import ImageShards

    buf = io.BytesIO()
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8)).save(buf, "PNG")
    data = buf.getvalue()
    x = decode.sample_tensor(data, 7, "pil", True, "standard", 16)
    assert x.shape == (3, 16, 16) and x.dtype == torch.uint8
    assert torch.equal(decode.sample_tensor(data, 7, "pil", True, "standard", 16), x)  # same seed, same crop
    assert any(not torch.equal(decode.sample_tensor(data, s, "pil", True, "standard", 16), x)
               for s in range(8, 16))  # other seeds differ
    # DataLoader workers get the dataset pickled: its store (a boto3 client on S3) is made there
    samples = [{"__key__": f"{i}", "png": data, "cls": b"1"} for i in range(4)]
    shards.write_dataset(str(tmp_path), iter([samples]), {"kind": "image", "classes": ["a", "b"]})
    ds = shards.open_dataset(str(tmp_path), None, "image")
    _ = ds.store
    dataset = ImageShards(ds, 0, 2, 0, 1, shards.Plan.from_state(None, 1), "pil", 16, "standard", 1)
    clone = pickle.loads(pickle.dumps(dataset))
    assert "store" not in vars(clone.ds)
    pairs = itertools.islice(zip(clone, dataset, strict=False), 3)  # the stream is endless: 3 batches
    assert all(torch.equal(a[0], b[0]) for a, b in pairs)
