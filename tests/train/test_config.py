"""The trainer's configuration written back as its command line (train/config.py to_argv), the flags a
command names (TrainConfig.named) and adding flags a command leaves to the default (with_flags): what a
launcher (cluster/) builds the job's command from. Pure: no Horovod, no torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from train.config import build_parser, parse_args, to_argv, with_flags
from train.errors import BadInput

PARITY = f"{Path(__file__).parent / 'user_task.py'}:ParityTask"
# Every trainer flag at a value that is not its default (--adasum and --preflight-only apart: they
# exclude some of these).
EVERY_FLAG = [
    "--steps", "7", "--batch-size", "4", "--lr", "0.01", "--optimizer", "adamw", "--momentum", "0.5",
    "--betas", "0.8", "0.99", "--lr-scaling", "linear",
    "--warmup-steps", "3", "--lr-schedule", "step", "--lr-step-every", "2", "--lr-step-factor", "0.5",
    "--weight-decay", "0.01", "--seed", "9", "--data", "s3://b/d", "--checkpoint-dir", "/ck",
    "--checkpoint-every", "5", "--keep-checkpoints", "2", "--checkpoint-mode", "async_with_pinned_mem",
    "--s3-endpoint-url", "http://h:1", "--precision", "bf16", "--compression", "fp16",
    "--backward-passes-per-step", "2", "--fusion-threshold-mb", "32.5", "--cycle-time-ms", "0.25",
    "--gradient-groups", "0", "--nccl-algo", "tree", "--cpu-affinity", "off", "--clip-grad-norm", "1.5",
    "--elastic", "--commit-every", "4", "--no-tf32", "--metrics-file", "/m.jsonl", "--metrics-lines",
    "--tensorboard-dir", "/tb", "--log-every", "3", "--eval-every", "6", "--no-progress",
    "--hang-timeout", "20", "--hang-factor", "5", "--no-preflight", "--preflight-min-busbw", "12.5",
    "--preflight-mib", "64", "--init-from", "/w.safetensors", "--init-partial", "--export-dir", "/ex",
    "--no-export",
]


def _round_trip(argv: list[str]):
    cfg = parse_args(argv, environ={})
    again = parse_args(to_argv(cfg), environ={})
    assert again == cfg and again.named == cfg.named, to_argv(cfg)
    return cfg


def test_every_trainer_flag_survives_the_round_trip():
    cfg = _round_trip(EVERY_FLAG)
    trainer_options = ({a.option_strings[0] for a in build_parser()._actions}
                       - {"-h", "--task", "--adasum", "--preflight-only"})
    # A flag added to the parser and not to to_argv (or to this list) fails here.
    assert {part for part in to_argv(cfg) if part.startswith("--")} == trainer_options
    assert cfg.named == trainer_options
    adasum = _round_trip(["--adasum", "--steps", "3"])
    assert adasum.horovod.adasum and to_argv(adasum) == ["--steps", "3", "--adasum"]
    only = _round_trip(["--preflight-only", "--steps", "3"])
    assert only.health.preflight_only and to_argv(only) == ["--steps", "3", "--preflight-only"]


def test_defaults_render_nothing_and_a_default_named_on_purpose_is_kept():
    assert to_argv(parse_args([], environ={})) == []
    cfg = _round_trip(["--data", "synthetic", "--seed", "0"])
    assert cfg.named == {"--data", "--seed"}
    assert to_argv(cfg) == ["--seed", "0", "--data", "synthetic"]


@pytest.mark.parametrize(("argv", "rendered"), [
    # the parser's order, each flag by its full name, numbers as they read
    (["--lr=1e-3", "--step", "5", "--hang-timeout", "20.0"],
     ["--steps", "5", "--lr", "0.001", "--hang-timeout", "20"]),
    # the task's flags after the trainer's, in the order given, spelled out
    (["--wid=16", "--model", "cnn", "--steps", "2"], ["--steps", "2", "--width", "16", "--model", "cnn"]),
    (["--task", PARITY, "--hidden", "8", "--lr", "0.1"], ["--task", PARITY, "--lr", "0.1", "--hidden", "8"]),
    (["--task", "demo"], ["--task", "demo"]),
    # a default that follows from another flag is not written out: adam scales --lr by the square root
    (["--optimizer", "adam"], ["--optimizer", "adam"]),
    (["--optimizer", "adam", "--lr-scaling", "sqrt"], ["--optimizer", "adam", "--lr-scaling", "sqrt"]),
])
def test_the_rendered_command_line(argv, rendered):
    cfg = _round_trip(argv)
    assert to_argv(cfg) == rendered


def test_the_task_keeps_its_own_flags_as_given():
    cfg = _round_trip(["--model", "cnn", "--width", "16", "--dropout", "0.1", "--steps", "2"])
    assert cfg.task.argv == ("--model", "cnn", "--width", "16", "--dropout", "0.1")
    assert (cfg.task.args.model, cfg.task.args.width, cfg.task.args.dropout) == ("cnn", 16, 0.1)


def test_the_environment_default_stays_out_of_a_launchers_config():
    env = {"AWS_ENDPOINT_URL": "http://here:9000"}
    assert parse_args([], environ=env).s3_endpoint_url == "http://here:9000"  # the trainer's own reading
    assert parse_args([], environ={}).s3_endpoint_url is None
    assert to_argv(parse_args([], environ={})) == []


def test_with_flags_adds_what_the_command_leaves_to_the_default_and_keeps_what_it_names():
    cfg = parse_args(["--data", "synthetic", "--model", "mlp"], environ={})
    added = with_flags(cfg, [("--data", "s3://stack/d"), ("--checkpoint-dir", "s3://stack/c"),
                             ("--model", "cnn"), ("--width", "16"), ("--lr", "0.2")])
    assert added.data.source == "synthetic" and added.task.args.model == "mlp"  # named: kept
    assert added.checkpoint.uri == "s3://stack/c" and added.task.args.width == 16 and added.optim.lr == 0.2
    assert {"--checkpoint-dir", "--width", "--lr"} <= added.named
    assert with_flags(cfg, [("--data", "s3://x")]) is cfg
    with pytest.raises(BadInput, match="--image-size"):  # a flag the task does not take: refused, named
        with_flags(cfg, [("--image-size", "32")])
