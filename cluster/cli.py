"""`ringtrain`: the project's one command (the package's console script; scripts/ wrap it).

    ringtrain run                                the main job on a local 2-host cluster: train, a spot-style
                                                 reclaim mid-run, the resume, a summary and a report picture
    ringtrain run --backend aws --stack dev      the same flow on an AWS stack
    ringtrain plan --stack dev                   offline: what the stack creates and costs
    ringtrain up|down|status --stack dev         the stack's compute on, off, and its state
    ringtrain submit --stack dev --job-name j --hosts 2 -- --steps 1000   an MPIJob on the stack
    ringtrain logs --stack dev --job j           a submitted job's output
    ringtrain runs [--stack dev] [--json]        past runs: when, where, steps, loss, evaluation, cost, export
    ringtrain export --job j --stack dev         a job's model (safetensors + model.json) from a checkpoint
    ringtrain data pack images --src photos/ --out s3://b/datasets/photos   your data as shards

`ringtrain COMMAND --help` says more about each. `python -m cluster` is the same command.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import re
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cluster import export_cli
from cluster import runs as runs_cli
from cluster.aws import cli as aws_cli
from cluster.aws.plan import PlanError
from cluster.backend import Backend, BackendError
from cluster.flow import FAULTS, FlowInterrupted, FlowOptions, FlowResult, format_summary, run_job
from cluster.job import JobSpec, trainer_config
from cluster.mpi_operator import check_job_name
from cluster.run_data import DatasetSpec, RunData, plan_run_data
from cluster.usage import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from train.config import TrainConfig, with_flags
from train.contract import EXIT_BAD_INPUT, FAULT_STEP_SLEEP_ENV
from train.task import DEFAULT_TASK
from train.tasks.demo import MODELS as DEMO_MODELS  # (imports no torch)

if TYPE_CHECKING:
    from cluster.local.backend import LocalBackend

RUNS_DIR = Path("runs")   # run directories, relative to where `ringtrain run` is started


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ringtrain",
                                description="Stand a GPU training cluster up, train on it with Horovod, "
                                            "tear it down: locally or on AWS.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_parser(sub)
    aws_cli.add_parsers(sub)
    runs_cli.add_parser(sub)
    export_cli.add_parser(sub)
    add_passthrough(sub, "data", "datasets: generate the demo's, pack your own (python -m train.data)",
                    "ringtrain data generate --out /tmp/ds --shards 4 --samples-per-shard 1024",
                    _data_main)
    return p


def add_passthrough(sub: argparse._SubParsersAction, name: str, help: str, example: str,
                    main: Callable[[list[str]], int]) -> None:
    """A subcommand whose arguments (--help included) go to the module's own parser unchanged."""
    sp = sub.add_parser(name, help=help, add_help=False, description=help,
                        epilog=f"example: {example}")
    sp.set_defaults(command_fn=None, passthrough=main)


def _data_main(argv: list[str]) -> int:
    from train.data import main

    return main(argv, prog="ringtrain data")


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "run", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="stand a cluster up, train on it, show a spot reclaim and the resume, tear it down",
        description=(
            "Stand a cluster up, write the task's data into its datasets bucket (demo: a small generated\n"
            "dataset; image: scikit-learn's digits; lm: the standard library's source; nothing when --data\n"
            "is given after `--`), run Horovod data-parallel training on it (the job is rendered as the\n"
            "MPIJob EKS would run, and locally executed the way the MPI Operator runs it: worker pods,\n"
            "/etc/mpi, the launcher's horovodrun),\n"
            "reclaim one host mid-run the way spot does (SIGTERM to its workers, then the host goes away),\n"
            "resume from the checkpoint (or continue elastically), print a summary and tear down. The run's\n"
            "directory (--run-dir) gets a picture of the run (report.png), the summary and the metrics.\n\n"
            "Local backend: as root each worker host is a Linux network namespace with its own address and\n"
            "sshd; without root the hosts are processes on localhost (said at start-up). The object store\n"
            "is a moto S3 server with the AWS stack's bucket layout. Teardown always runs (Ctrl-C too).\n\n"
            "Arguments after `--` go to the trainer unchanged (see `python -m train --help`)."
        ),
        epilog="examples:\n"
               "  ringtrain run                                  2 local hosts, reclaim at step 150, resume\n"
               "  ringtrain run --hosts 3 --steps 400 --model cnn -- --lr 0.02\n"
               "  ringtrain run --task image                     digits, a small torchvision model\n"
               "  ringtrain run --task my_task.py:MyTask -- --data s3://bucket/prefix --my-flag 3\n"
               "  ringtrain run --elastic --hosts 3              elastic Horovod: no resubmit\n"
               "  ringtrain run --backend aws --stack dev        the same flow on AWS",
    )
    r.set_defaults(command_fn=cmd_run)

    where = r.add_argument_group("where it runs")
    where.add_argument("--backend", choices=("local", "aws"), default="local",
                       help="local: this machine (default); aws: the Pulumi stack named by --stack")
    where.add_argument("--stack", help="AWS backend: the Pulumi stack to use (e.g. dev)")
    where.add_argument("--hosts", type=int, default=2, help="worker hosts (default 2)")
    where.add_argument("--slots-per-host", type=int, default=1, help="worker processes per host (default 1)")
    where.add_argument("--isolation", choices=("auto", "netns", "localhost"), default="auto",
                       help="local hosts as network namespaces (needs root) or localhost processes; "
                            "auto: namespaces when possible (default)")
    where.add_argument("--keep-up", action="store_true",
                       help="leave the cluster up after the run (local: until you press Ctrl-C); on AWS "
                            "a job that timed out or was interrupted is left running too")
    where.add_argument("--job-timeout", type=float, default=None, metavar="SECONDS",
                       help="stop the job (and fail the run) when it runs longer than this, counted from its "
                            "first output (default: no limit)")
    where.add_argument("--startup-timeout", type=float, default=None, metavar="SECONDS",
                       help="AWS: fail when the job has not started this long after its node group was "
                            "scaled up: nodes Ready, pods scheduled, images pulled, self-test passed "
                            "(default 1800)")
    aws_cli.add_capacity_arguments(where)

    train = r.add_argument_group("training")
    train.add_argument("--job-name", default=None,
                       help="job name: lower-case letters, digits, '-'; it names the job's checkpoints, "
                            "which a later job of that name resumes from (default: the task's name)")
    train.add_argument("--steps", type=int, default=300, help="optimizer steps in total (default 300)")
    train.add_argument("--task", default=DEFAULT_TASK,
                       help="what to train (default demo): a built-in task (demo, image, lm: each with "
                            "example data written for it and, image and lm, a small model) or "
                            "pkg.module:Class or path/to/file.py:Class (give its --data); the task's own "
                            "flags and --data go after `--` (see `python -m train --task X --help`)")
    train.add_argument("--model", choices=DEMO_MODELS, default=None,
                       help="the demo task's model (default: the task's, mlp)")
    train.add_argument("--batch-size", type=int, default=32, help="samples per worker per step (default 32)")
    train.add_argument("--checkpoint-every", type=int, default=25,
                       help="steps between checkpoints (default 25); 0: no periodic checkpoints, only the "
                            "one at the end and the one a stop (SIGTERM, a reclaim) writes, so a job that "
                            "crashes starts over from step 0")
    train.add_argument("--elastic", action="store_true",
                       help="elastic Horovod: a discovery script lists the live hosts, training goes on "
                            "with the survivors and lets a returning host rejoin")
    train.add_argument("--min-hosts", type=int, default=None,
                       help="elastic: keep training while at least this many hosts live (default 1)")
    train.add_argument("--max-resubmits", type=int, default=3,
                       help="resubmit an interrupted (exit 75) job at most this often (default 3)")
    train.add_argument("--max-restarts", type=int, default=2,
                       help="restart a failed job (a worker killed or hung, any exit but bad input) from its "
                            "newest checkpoint at most this often; counted apart from resubmits (default 2)")
    train.add_argument("--dataset-shards", type=int, default=None,
                       help="the demo's generated dataset: shards (default 4)")
    train.add_argument("--samples-per-shard", type=int, default=None,
                       help="the demo's generated dataset: samples per shard (default 1024)")
    train.add_argument("--seed", type=int, default=0, help="dataset and training seed (default 0)")

    fault = r.add_argument_group("fault injection (local backend)")
    fault.add_argument("--fault", choices=tuple(FAULTS), default="reclaim",
                       help="what happens to the host: " + "; ".join(f"{k}: {v}" for k, v in FAULTS.items())
                            + " (default reclaim)")
    fault.add_argument("--reclaim-at-step", type=int, default=None,
                       help="inject the fault once training reaches this step; --steps itself is a late "
                            "reclaim, after the last step (default: half of --steps)")
    fault.add_argument("--no-reclaim", action="store_true", help="inject no fault")
    fault.add_argument("--reclaim-host", default=None,
                       help="host the fault hits, e.g. host-1 (default: the last)")
    # 30 s: room for the stop checkpoint of `--task image`'s example at the local store's rate on a
    # loaded machine. Workers that exit sooner end it sooner; a pod on EKS gets 120 s.
    fault.add_argument("--reclaim-grace", type=float, default=30.0,
                       help="at most this many seconds between SIGTERM and the host going away; the "
                            "workers' stop checkpoint must be written within it (default 30)")
    fault.add_argument("--reclaim-notice", type=float, default=None,
                       help="seconds the host is out of discovery before its workers get SIGTERM, like "
                            "EC2's interruption notice (default: elastic 3, static 0)")
    fault.add_argument("--step-pace", type=float, default=None,
                       help="sleep this many seconds after every training step, so that a demo on a fast "
                            "machine lasts long enough to show its fault, shrink and rejoin "
                            f"(default: elastic {ELASTIC_DEMO_STEP_PACE_S:g}, else 0)")
    fault.add_argument("--hang-timeout", type=float, default=None,
                       help="with --fault hang: the trainer's watchdog limit in seconds, passed as its "
                            f"--hang-timeout (default {HANG_DEMO_TIMEOUT_S:g})")
    fault.add_argument("--restore-after", type=float, default=None,
                       help="bring the reclaimed host back this many seconds after the reclaim "
                            "(default: elastic 5; static: before the job is resubmitted)")

    out = r.add_argument_group("output")
    out.add_argument("--verbose", action="store_true", help="show every line of the job's output")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_argument("--run-dir", type=Path, default=None,
                     help="where the run's report goes: report.png, summary.txt, metrics.jsonl "
                          "(default runs/<job-name>-<UTC time>)")
    r.add_argument("trainer_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def check_args(a: argparse.Namespace) -> None:
    """Raise UsageError naming what is wrong and what is allowed (pure)."""
    problems = []
    if not 1 <= a.hosts <= 32:
        problems.append(f"--hosts {a.hosts}: must be between 1 and 32")
    if a.slots_per_host < 1:
        problems.append(f"--slots-per-host {a.slots_per_host}: must be >= 1")
    if a.steps < 1:
        problems.append(f"--steps {a.steps}: must be >= 1")
    if a.batch_size < 1:
        problems.append(f"--batch-size {a.batch_size}: must be >= 1")
    if a.checkpoint_every < 0:
        problems.append(f"--checkpoint-every {a.checkpoint_every}: must be >= 0 (0: only at the end)")
    if a.max_resubmits < 0:
        problems.append(f"--max-resubmits {a.max_resubmits}: must be >= 0")
    sizes = [v for v in (a.dataset_shards, a.samples_per_shard) if v is not None]
    if any(v < 1 for v in sizes):
        problems.append("--dataset-shards and --samples-per-shard: must be >= 1")
    if sizes and a.task != DEFAULT_TASK:
        problems.append("--dataset-shards/--samples-per-shard: the demo's generated dataset; "
                        f"--task {a.task} trains on its own data")
    if a.model is not None and a.task != DEFAULT_TASK:
        problems.append(f"--model {a.model}: the demo task's model; --task {a.task} takes its own flags "
                        f"after `--` (see `python -m train --task {a.task} --help`)")
    if a.min_hosts is not None and not a.elastic:
        problems.append("--min-hosts: only with --elastic")
    if a.min_hosts is not None and not 1 <= a.min_hosts <= a.hosts:
        problems.append(f"--min-hosts {a.min_hosts}: must be between 1 and --hosts ({a.hosts})")
    if a.max_restarts < 0:
        problems.append(f"--max-restarts {a.max_restarts}: must be >= 0")
    if a.reclaim_at_step is not None and not 1 <= a.reclaim_at_step <= a.steps:
        problems.append(f"--reclaim-at-step {a.reclaim_at_step}: must be between 1 and --steps ({a.steps})")
    if a.step_pace is not None and a.step_pace < 0:
        problems.append(f"--step-pace {a.step_pace}: must be >= 0 seconds")
    if a.hang_timeout is not None and (a.fault != "hang" or a.hang_timeout <= 0):
        problems.append("--hang-timeout: only with --fault hang, and > 0 seconds")
    if a.fault != "reclaim" and a.no_reclaim:
        problems.append(f"--fault {a.fault} and --no-reclaim: choose one")
    if a.reclaim_grace < 0 or any(v is not None and v < 0 for v in (a.restore_after, a.reclaim_notice)):
        problems.append("--reclaim-grace, --reclaim-notice and --restore-after: must be >= 0 seconds")
    if a.reclaim_host is not None and a.reclaim_host not in [f"host-{i}" for i in range(a.hosts)]:
        problems.append(f"--reclaim-host {a.reclaim_host!r}: must be one of host-0 .. host-{a.hosts - 1}")
    if any(v is not None and not v > 0 for v in (a.job_timeout, a.startup_timeout)):
        problems.append("--job-timeout and --startup-timeout: must be > 0 seconds")
    if a.backend == "aws":
        if not a.stack:
            problems.append("--backend aws needs --stack NAME (the Pulumi stack, e.g. dev)")
        if a.reclaim_at_step is not None or a.reclaim_host is not None or a.fault != "reclaim":
            problems.append("--fault/--reclaim-at-step/--reclaim-host: "
                            "fault injection exists on the local backend only")
        if a.isolation != "auto":
            problems.append("--isolation: local backend only")
    elif a.stack:
        problems.append("--stack: only with --backend aws")
    elif a.startup_timeout is not None:
        problems.append("--startup-timeout: only with --backend aws")
    if a.backend != "aws" and (a.node_group is not None or a.capacity_timeout is not None):
        problems.append("--node-group/--capacity-timeout: only with --backend aws")
    try:  # the name alone: --hosts is checked above, in its own words
        JobSpec(name=job_name_of(a), num_hosts=1)
        check_job_name(job_name_of(a), max(a.hosts, 1))   # the MPI Operator's rule for its pod names
    except ValueError as e:
        problems.append(f"--job-name: {e}")
    if a.trainer_args and a.trainer_args[0] != "--":
        problems.append(f"unexpected arguments {' '.join(a.trainer_args)!r}: trainer arguments go after `--`")
    if problems:
        raise UsageError("; ".join(problems))


def _extra_trainer_args(a: argparse.Namespace) -> list[str]:
    return list(a.trainer_args[1:]) if a.trainer_args else []


def run_data_from_args(a: argparse.Namespace, trainer: TrainConfig) -> RunData:
    """What the run trains on (cluster/run_data.py); UsageError for a task with no data."""
    demo = DatasetSpec(seed=a.seed)
    if a.dataset_shards is not None:
        demo = dataclasses.replace(demo, shards=a.dataset_shards)
    if a.samples_per_shard is not None:
        demo = dataclasses.replace(demo, samples_per_shard=a.samples_per_shard)
    return plan_run_data(a.task, trainer, demo)


def job_name_of(a: argparse.Namespace) -> str:
    """--job-name, else the task's name: a built-in's, or its class's in lower case (pure). Per task, so
    that a run of one task does not resume from another's checkpoints (checkpoints/<job-name>)."""
    if a.job_name is not None:
        return a.job_name
    name = a.task if ":" not in a.task else a.task.rpartition(":")[2]
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40].strip("-") or "task"


def task_spec_for_workers(spec: str) -> str:
    """A task file given relative to where this command runs, made absolute: the workers start in the
    repository, not here (built-in names and modules pass unchanged)."""
    where, sep, attr = spec.rpartition(":")
    if sep and (where.endswith(".py") or "/" in where) and not Path(where).expanduser().is_absolute():
        return f"{Path(where).resolve()}:{attr}"
    return spec


def job_from_args(a: argparse.Namespace) -> JobSpec:
    """The job, its trainer configuration parsed once, here: bad trainer arguments and a task without
    data are refused (UsageError) before anything is stood up."""
    # --task and the task's flags travel in the trainer's argv (a task file path must be where the
    # workers can read it: the same path on the local backend's hosts; in the image on AWS).
    task_args = ((["--model", a.model] if a.model else []) if a.task == DEFAULT_TASK
                 else ["--task", task_spec_for_workers(a.task)])
    trainer = trainer_config([*task_args, "--steps", str(a.steps), "--batch-size", str(a.batch_size),
                              "--checkpoint-every", str(a.checkpoint_every), "--seed", str(a.seed),
                              *_extra_trainer_args(a)])
    trainer = with_flags(trainer, run_data_from_args(a, trainer).trainer_flags)
    return JobSpec(name=job_name_of(a), num_hosts=a.hosts, slots_per_host=a.slots_per_host, elastic=a.elastic,
                   min_hosts=(a.min_hosts or 1) if a.elastic else None, trainer=trainer)


def options_from_args(a: argparse.Namespace, job: JobSpec) -> FlowOptions:
    reclaim_at = None
    if a.backend == "local" and not a.no_reclaim:
        reclaim_at = a.reclaim_at_step if a.reclaim_at_step is not None else max(1, a.steps // 2)
    restore_after = a.restore_after
    if restore_after is None and a.elastic:
        restore_after = 5.0
    return FlowOptions(
        dataset=run_data_from_args(a, job.trainer).dataset,
        max_resubmits=a.max_resubmits, max_restarts=a.max_restarts, reclaim_at_step=reclaim_at,
        fault=a.fault, reclaim_host=a.reclaim_host,
        restore_after_s=restore_after, keep_up=a.keep_up, progress_bar=not a.no_progress,
        echo_logs=a.verbose, job_timeout_s=a.job_timeout,
    )


def make_backend(a: argparse.Namespace) -> Backend:
    if a.backend == "aws":
        # imported lazily: needs pulumi and boto3 only then
        from cluster.aws.backend import STARTUP_TIMEOUT_S, AwsBackend

        return AwsBackend(stack=a.stack, node_group=a.node_group, capacity_timeout_s=a.capacity_timeout,
                          startup_timeout_s=a.startup_timeout or STARTUP_TIMEOUT_S)
    from tqdm import tqdm

    from cluster.local.backend import LocalBackend

    isolated = {"auto": None, "netns": True, "localhost": False}[a.isolation]
    notice = a.reclaim_notice if a.reclaim_notice is not None else (3.0 if a.elastic else 0.0)
    return LocalBackend(a.hosts, slots_per_host=a.slots_per_host, isolated=isolated,
                        reclaim_grace_s=a.reclaim_grace, reclaim_notice_s=notice,
                        log=tqdm.write)  # messages go above the progress bar, not through it


def check_environment(backend: str) -> None:
    missing = [m for m in ("horovod", "torch") if importlib.util.find_spec(m) is None]
    if backend == "local":
        if shutil.which("horovodrun") is None and importlib.util.find_spec("horovod.runner") is None:
            missing.append("horovodrun")
        # the local S3 store: moto's application, served by cheroot (cluster/local/moto_server.py)
        missing += [m for m in ("moto", "cheroot") if importlib.util.find_spec(m) is None]
    if missing:
        raise BackendError(f"missing {', '.join(missing)}: run scripts/setup first (it installs the pinned "
                           "environment into .venv)")


def _wait_for_ctrl_c(backend: LocalBackend) -> None:
    """Keep the local cluster up (its processes are ours) until Ctrl-C or SIGTERM, then tear down."""
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        print(backend.describe())
        print("cluster is up (--keep-up); press Ctrl-C to tear it down", flush=True)
        signal.sigwait(stop)
    finally:
        backend.down()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)
        print("cluster torn down")


def default_run_dir(job_name: str, now: datetime.datetime | None = None) -> Path:
    now = now or datetime.datetime.now(datetime.UTC)
    return RUNS_DIR / f"{job_name}-{now:%Y%m%d-%H%M%S}"


def write_report(result: FlowResult, run_dir: Path, backend: str, stack: str | None = None) -> None:
    """The run's report and record (`ringtrain runs`) beside the printed summary; on AWS with node-hours
    and their cost."""
    from cluster.report import write_run_report
    from cluster.run_cost import format_costs, node_group_costs
    from cluster.runs import keep_in_bucket, run_record, write_run_record

    costs = None
    if backend == "aws":
        from infra.catalog import load_catalog

        costs = node_group_costs(result.attempts, load_catalog().instance_types)
        if costs:
            print(format_costs(costs))
    files = write_run_report(result, run_dir, costs)
    record = run_record(result, backend, stack, run_dir, costs)
    write_run_record(run_dir, record)
    print(f"  report             {files.picture} (summary and metrics beside it)")
    if backend == "aws" and result.storage is not None:  # the run directory stays on this machine
        try:
            keep_in_bucket(result.storage.checkpoint_uri, result.storage.endpoint_url, record)
        except Exception as e:  # noqa: BLE001 - the run is done; its record in the bucket is a convenience
            print(f"run: warning: could not keep the run record in the checkpoints bucket: {e}",
                  file=sys.stderr)


# The elastic demo's pace: at 0.15 s a step the half of --steps after the reclaim lasts ~20 s, longer
# than the notice (3 s), the worker's exit and the restore (5 s) that the shrink and rejoin take.
ELASTIC_DEMO_STEP_PACE_S = 0.15
# The watchdog's limit for `--fault hang`: long enough for the demo's slowest step under load.
HANG_DEMO_TIMEOUT_S = 20.0


def with_fault_settings(job: JobSpec, a: argparse.Namespace) -> JobSpec:
    """The job as the fault demo runs it (pure): paced steps (--step-pace) and, for --fault hang, the
    watchdog's limit as a trainer flag unless the trainer's own arguments set it."""
    pace = a.step_pace if a.step_pace is not None else (ELASTIC_DEMO_STEP_PACE_S if a.elastic else 0.0)
    env = dict(job.env)
    if pace > 0 and a.backend == "local":
        env[FAULT_STEP_SLEEP_ENV] = f"{pace:g}"
    trainer = job.trainer
    if a.fault == "hang":
        limit = a.hang_timeout if a.hang_timeout is not None else HANG_DEMO_TIMEOUT_S
        trainer = with_flags(trainer, [("--hang-timeout", f"{limit:g}")])
    return dataclasses.replace(job, env=env, trainer=trainer)


def cmd_run(a: argparse.Namespace) -> int:
    check_args(a)
    job = with_fault_settings(job_from_args(a), a)
    if a.backend == "aws":   # before anything is stood up: every group named is in the stack
        from cluster.aws.capacity import check_against_stack_config, parse_node_groups

        check_against_stack_config(parse_node_groups(a.node_group), a.stack)
    check_environment(a.backend)
    backend = make_backend(a)
    opts = options_from_args(a, job)
    run_dir = a.run_dir or default_run_dir(job.name)
    if a.backend == "local":  # the local store goes with the cluster: keep the export in the run's directory
        opts = dataclasses.replace(opts, keep_export_in=run_dir / "export")
    try:
        from tqdm import tqdm

        result = run_job(backend, job, opts, out=tqdm.write)
    except FlowInterrupted:
        print("run: interrupted; the cluster was torn down", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(format_summary(result))
    try:
        write_report(result, run_dir, a.backend, a.stack)
    except OSError as e:   # the run itself is done: say so, and keep its exit code
        print(f"run: warning: could not write the report into {run_dir}: {e}", file=sys.stderr)
    if a.keep_up:
        from cluster.local.backend import LocalBackend

        if isinstance(backend, LocalBackend):
            _wait_for_ctrl_c(backend)
        else:
            print(f"stack {a.stack} stays up (--keep-up): "
                  f"tear it down with `ringtrain down --stack {a.stack}`")
    if result.succeeded:
        return 0
    return EXIT_USAGE if result.exit_code == EXIT_BAD_INPUT else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a, rest = parser.parse_known_args(argv)
    if a.command_fn is None:
        return a.passthrough(rest)   # data: its own parser takes the rest, --help included
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return a.command_fn(a)
    except UsageError as e:
        parser.exit(EXIT_USAGE, f"{a.command}: error: {e}\n")
    except PlanError as e:  # an unknown stack or a bad stack file: bad input
        print(f"{a.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BackendError as e:
        print(f"{a.command}: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{a.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_USAGE
