"""What `ringtrain run` trains on when the trainer gets no --data (cluster/run_data.py): which data the
flow writes into the datasets bucket, which flags the trainer gets, and the refusal for a task it has no
data for. Planning only: no cluster; one test writes the lm example into the session's object store."""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap
from pathlib import Path

import pytest

from cluster import cli
from cluster.backend import Storage
from cluster.example_data import stdlib_source
from cluster.flow import ensure_dataset, trainer_config_for
from cluster.run_data import DatasetSpec, TaskExample, plan_run_data
from cluster.usage import UsageError
from train.config import parse_args, to_argv
from train.tasks.image import ImageTask
from train.tasks.lm import LanguageModelTask

REPO = Path(__file__).resolve().parents[2]
PARITY = f"{REPO / 'tests' / 'train' / 'user_task.py'}:ParityTask"
STORAGE = Storage("s3://p-datasets/datasets/demo", "s3://p-checkpoints/checkpoints/j", "http://e:1")


def _run_args(*argv: str):
    a = cli.build_parser().parse_args(["run", *argv])
    cli.check_args(a)
    return a


def _value(args, flag: str) -> str:
    args = list(args)
    assert args.count(flag) == 1, args
    return args[args.index(flag) + 1]


def _job_and_options(a):
    job = cli.job_from_args(a)
    return job, cli.options_from_args(a, job)


def test_image_without_data_trains_on_the_digits_with_the_examples_small_model():
    a = _run_args("--task", "image", "--steps", "40")
    job, opts = _job_and_options(a)
    assert opts.dataset == TaskExample(ImageTask.example())
    cfg = trainer_config_for(job, STORAGE, opts.dataset)
    assert cfg.data.source == "s3://p-datasets/datasets/digits/train"
    assert cfg.task.args.eval_data == "s3://p-datasets/datasets/digits/eval"
    assert (cfg.task.args.model, cfg.task.args.image_size) == ("shufflenet_v2_x1_0", 32)
    assert cfg.task.name == "image" and cfg.steps == 40 and (cfg.optim.name, cfg.optim.lr) == ("adam", 0.002)
    assert parse_args(to_argv(cfg)) == cfg  # what the workers will parse


def test_lm_without_data_trains_on_the_stdlib_source_with_a_small_decoder():
    a = _run_args("--task", "lm", "--", "--dim", "32", "--lr=0.002")
    job, opts = _job_and_options(a)
    assert opts.dataset == TaskExample(LanguageModelTask.example())
    cfg = trainer_config_for(job, STORAGE, opts.dataset)
    assert cfg.data.source.endswith("/stdlib-bpe2048/train")
    assert cfg.task.args.eval_data.endswith("/stdlib-bpe2048/eval")
    assert (cfg.task.args.dim, cfg.task.args.layers, cfg.optim.lr) == (32, 2, 0.002)  # the user's flags win
    assert cfg.task.argv.count("--dim") == 1  # only the user's --dim, not the example's as well
    assert parse_args(to_argv(cfg)) == cfg


@pytest.mark.parametrize("task", ["demo", "image", "lm", PARITY])
@pytest.mark.parametrize("data", [["--data", "s3://mine/photos"], ["--data=/shared/photos"]])
def test_a_given_data_is_used_as_is_and_nothing_is_written(task, data):
    evaluation = ["--eval-data", "s3://mine/eval"] if task in ("image", "lm") else []
    a = _run_args("--task", task, "--", *data, *evaluation)
    job, opts = _job_and_options(a)
    assert opts.dataset is None
    cfg = trainer_config_for(job, STORAGE, None)
    assert cfg.data.source == data[-1].removeprefix("--data=")
    assert "--model" not in cfg.named  # the example's sizes go with the example's data only
    assert getattr(cfg.task.args, "eval_data", None) == (evaluation[1] if evaluation else None)


def test_the_demo_keeps_its_generated_dataset_at_the_backends_dataset_uri():
    assert _job_and_options(_run_args())[1].dataset == DatasetSpec(shards=4, samples_per_shard=1024)
    a = _run_args("--dataset-shards", "2", "--samples-per-shard", "64", "--seed", "5")
    job, opts = _job_and_options(a)
    assert opts.dataset == DatasetSpec(shards=2, samples_per_shard=64, seed=5)
    with pytest.raises(UsageError) as e:  # the generated dataset's sizes mean nothing to another task
        _run_args("--task", "image", "--dataset-shards", "2")
    assert "--dataset-shards/--samples-per-shard: the demo's generated dataset; --task image" in str(e.value)
    cfg = trainer_config_for(job, STORAGE, opts.dataset)
    assert cfg.data.source == STORAGE.dataset_uri and "--eval-data" not in to_argv(cfg)


def test_the_examples_are_written_by_the_commands_that_pack_them(tmp_path):
    digits = TaskExample(ImageTask.example())
    uris = digits.uris(STORAGE)
    write_pngs, pack = digits.commands(uris, tmp_path)
    assert write_pngs[1:] == ["-m", "cluster.example_data", "digits", "--out", str(tmp_path / "digits")]
    assert pack[1:6] == ["-m", "train.data", "pack", "images", "--src"]
    assert _value(pack, "--out") == uris.train and _value(pack, "--eval-out") == uris.eval
    text = TaskExample(LanguageModelTask.example())
    uris = text.uris(STORAGE)
    parquet, train_bpe, pack_tokens = text.commands(uris, tmp_path)
    packages = parquet[parquet.index("--packages") + 1:]
    assert packages and all((stdlib_source() / p).is_dir() for p in packages)
    corpus = _value(parquet, "--out")
    assert corpus.startswith(str(tmp_path))
    assert train_bpe[3:5] == ["tokenizer", "train"] and _value(train_bpe, "--src") == corpus
    assert pack_tokens[3:5] == ["pack", "tokens"] and _value(pack_tokens, "--src") == corpus
    assert _value(pack_tokens, "--tokenizer") == _value(train_bpe, "--out")
    assert _value(pack_tokens, "--out") == uris.train and _value(pack_tokens, "--eval-out") == uris.eval


def test_a_task_of_the_users_own_with_an_example_trains_on_it_with_nothing_changed_in_cluster(tmp_path):
    """The example data and its flags come from the task (Task.example), so a task, built in or not,
    brings its own: nothing in cluster/ names it."""
    task = tmp_path / "my_task.py"
    task.write_text((REPO / "tests" / "train" / "user_task.py").read_text() + textwrap.dedent("""

        class ParityWithExample(ParityTask):
            @classmethod
            def example(cls):
                from train.task import Example

                return Example("parity", "demo data for parity",
                               (("{python}", "-m", "train.data", "generate", "--out", "{train}"),),
                               (("--hidden", "8"),))
        """))
    a = _run_args("--task", f"{task}:ParityWithExample", "--", "--lr", "0.1")
    job, opts = _job_and_options(a)
    assert opts.dataset.describe() == "demo data for parity"
    cfg = trainer_config_for(job, STORAGE, opts.dataset)
    assert cfg.data.source == "s3://p-datasets/datasets/parity/train"
    assert cfg.task.args.hidden == 8 and cfg.optim.lr == 0.1
    assert "--eval-data" not in to_argv(cfg)  # the task takes no evaluation data: the workers would refuse it
    [generate] = opts.dataset.commands(opts.dataset.uris(STORAGE), tmp_path)
    assert generate[1:] == ["-m", "train.data", "generate", "--out", "s3://p-datasets/datasets/parity/train"]


def test_a_task_without_data_that_the_command_cannot_prepare_is_refused_before_anything_starts(
        tmp_path, monkeypatch, capsys):
    task = tmp_path / "my_task.py"
    shutil.copy(REPO / "tests" / "train" / "user_task.py", task)
    with pytest.raises(UsageError) as e:
        plan_run_data(f"{task}:ParityTask", parse_args(["--task", f"{task}:ParityTask", "--hidden", "8"]),
                      DatasetSpec())
    assert "no --data after `--`" in str(e.value)

    def no_cluster(_a):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(cli, "make_backend", no_cluster)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--task", f"{task}:ParityTask", "--", "--hidden", "8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"run: error: --task {task}:ParityTask: no --data")
    assert "(demo, image, lm)" in err and "-- --data synthetic" in err


def test_a_task_file_relative_to_here_reaches_the_workers_as_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "tasks").mkdir()
    shutil.copy(REPO / "tests" / "train" / "user_task.py", tmp_path / "tasks" / "my_task.py")
    monkeypatch.chdir(tmp_path)
    job = cli.job_from_args(_run_args("--task", "tasks/my_task.py:ParityTask", "--", "--data", "synthetic"))
    assert to_argv(job.trainer)[:2] == ["--task", f"{tmp_path}/tasks/my_task.py:ParityTask"]
    assert to_argv(cli.job_from_args(_run_args("--task", "lm")).trainer)[:2] == ["--task", "lm"]


def test_the_lm_example_is_written_once_into_the_store_and_reads_as_a_token_dataset(object_store, s3_bucket,
                                                                                     monkeypatch):
    from train import tokens

    for name, value in object_store.env().items():  # what the workers get, to read it back here
        monkeypatch.setenv(name, value)
    storage = Storage(f"s3://{s3_bucket}/datasets/demo", f"s3://{s3_bucket}/checkpoints/j",
                      object_store.endpoint_url, object_store.env())
    full = LanguageModelTask.example()
    parquet, train_bpe, pack = (list(c) for c in full.commands)
    parquet[parquet.index("--packages") + 1:] = ["json"]  # one package, a 300-token BPE: a quick test
    train_bpe[train_bpe.index("--vocab-size") + 1] = "300"
    pack[pack.index("--eval-fraction") + 1] = "0.3"
    pack[pack.index("--block-tokens") + 1] = "1024"
    small = TaskExample(dataclasses.replace(full, commands=(tuple(parquet), tuple(train_bpe), tuple(pack))))
    said: list[str] = []
    assert ensure_dataset(storage, small, out=said.append) is True
    uris = small.uris(storage)
    train = tokens.open_dataset(uris.train, object_store.endpoint_url)
    held_out = tokens.open_dataset(uris.eval, object_store.endpoint_url)
    assert train.index["vocab_size"] == 300 and held_out.index["tokens"] > 0
    assert ensure_dataset(storage, small, out=said.append) is False  # there already: not written again
    assert said[-1] == f"dataset already there: {uris.train} and {uris.eval}"
    assert json.loads(object_store.client().get_object(
        Bucket=s3_bucket, Key="datasets/stdlib-bpe2048/train/index.json")["Body"].read())["kind"] == "tokens"


@pytest.mark.parametrize(("argv", "name"), [
    ([], "demo"), (["--task", "image"], "image"), (["--task", "lm"], "lm"),
    (["--task", PARITY, "--", "--data", "synthetic"], "paritytask"),
    (["--task", "image", "--job-name", "digits-1"], "digits-1"),
])
def test_each_task_is_its_own_job_so_it_never_resumes_from_another_tasks_checkpoints(argv, name):
    assert cli.job_from_args(_run_args(*argv)).name == name
