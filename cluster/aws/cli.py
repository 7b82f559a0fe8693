"""`ringtrain plan|up|down|status|submit|logs`: the operator's commands for an AWS stack.

cluster/cli.py puts them into the one `ringtrain` command (add_parsers); scripts/plan, up, down and
submit call them. One training run from stand-up to teardown is `ringtrain run --backend aws`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cluster.job import JobSpec, trainer_config
from cluster.mpi_operator import check_job_name
from cluster.usage import EXIT_FAILED, UsageError


def _positive_hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of hours") from None
    if not value >= 0 or value > 24 * 366:
        raise argparse.ArgumentTypeError(f"{text}: allowed are 0 .. {24 * 366} hours")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be > 0 seconds")
    return value


def add_capacity_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--node-group and --capacity-timeout, the same for `submit` and `run --backend aws`."""
    p.add_argument("--node-group", metavar="GROUP[,GROUP...]",
                   help="GPU node group, or several in the order to try them, e.g. a10g-spot,l4-spot,"
                        "a10g-ondemand: a group whose nodes are not Ready in time is scaled back and the "
                        "next is tried (default: the stack's only GPU group)")
    p.add_argument("--capacity-timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="how long each node group gets to have the job's nodes Ready before the next "
                        "is tried (default: the startup timeout, 1800)")


def _add(sub: argparse._SubParsersAction, name: str, help: str, examples: str) -> argparse.ArgumentParser:
    sp = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n" + examples)
    sp.add_argument("--stack", required=True, help="the Pulumi stack (Pulumi.<stack>.yaml), e.g. dev")
    return sp


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The AWS stack's subcommands, each dispatching to its cmd_* through `set_defaults(command_fn=)`."""
    plan = _add(sub, "plan", "offline: node groups and cost of a stack (no AWS, no Pulumi)",
                "  ringtrain plan --stack dev                  table\n"
                "  ringtrain plan --stack prod --hours 48      price a 48-hour run at full scale\n"
                "  ringtrain plan --stack dev --json           for machines")
    plan.add_argument("--hours", type=_positive_hours, default=24.0,
                      help="length of a run at full scale to price (default 24)")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.set_defaults(command_fn=cmd_plan)

    up = _add(sub, "up", "stand the stack's compute up (Pulumi CLI + AWS credentials)",
              "  ringtrain up --stack dev\n"
              "  ringtrain up --stack dev --kubeconfig ~/.kube/dev.yaml")
    up.add_argument("--kubeconfig", type=Path,
                    help="where to write the kubeconfig (default ~/.kube/ringtrain-<stack>.yaml)")
    up.add_argument("--force", action="store_true",
                    help="apply even if it replaces the nodes of GPU groups that have nodes (running jobs)")
    up.set_defaults(command_fn=cmd_up)

    down = _add(sub, "down", "remove the compute; the data layer stays",
                "  ringtrain down --stack dev\n"
                "  ringtrain down --stack dev --delete-data --confirm dev   everything, data included")
    down.add_argument("--delete-data", action="store_true",
                      help="remove EVERYTHING including buckets, images and the KMS key "
                           "(asks for the stack name)")
    down.add_argument("--confirm", metavar="STACK",
                      help="with --delete-data: the stack name, for non-interactive use")
    down.set_defaults(command_fn=cmd_down)

    status = _add(sub, "status", "the stack's switches, last update and outputs, or a job's state",
                  "  ringtrain status --stack dev\n"
                  "  ringtrain status --stack dev --job resnet --json")
    status.add_argument("--job", metavar="NAME",
                        help="the state of this submitted job instead (needs kubectl)")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(command_fn=cmd_status)

    submit = _add(sub, "submit", "render the job as an MPIJob and submit it",
                  "  ringtrain submit --stack dev --job-name resnet --hosts 2 --follow \\\n"
                  "      -- --model cnn --steps 1000\n"
                  "  ringtrain submit --stack dev --job-name j --hosts 2 --dry-run --outputs outputs.json\n"
                  "    (--dry-run with --outputs FILE needs no AWS at all: it prints the manifest)\n"
                  "  ringtrain submit --stack dev --job-name j --hosts 2 --node-group a10g-spot,l4-spot \\\n"
                  "      --capacity-timeout 600     spot A10G; without nodes in 10 minutes, spot L4")
    submit.add_argument("--job-name", required=True,
                        help="lower-case letters, digits and '-', a letter first; at most 54 characters "
                             "with up to 10 hosts (the operator's pod names <name>-worker-<i>)")
    submit.add_argument("--hosts", type=int, default=1, help="worker nodes (default 1)")
    submit.add_argument("--slots-per-host", type=int, default=None,
                        help="processes (GPUs) per node (default: every GPU of the node type)")
    submit.add_argument("--elastic", action="store_true",
                        help="elastic Horovod via the operator's discovery script")
    submit.add_argument("--min-hosts", type=int, default=None, help="elastic: fewest hosts to keep training")
    add_capacity_arguments(submit)
    submit.add_argument("--dataset", help="dataset name under s3://<datasets>/datasets/ (default: job name)")
    submit.add_argument("--image",
                        help="full worker image reference (default <ecrRepositoryUrl>:<image/VERSION>); the "
                             "launcher runs <image>-launcher, which scripts/image-build pushes beside it")
    submit.add_argument("--worker-memory", metavar="QUANTITY",
                        help="each worker pod's memory limit, e.g. 160Gi (default: most of the node's "
                             "allocatable memory, from infra/catalog.yaml)")
    submit.add_argument("--outputs", type=Path,
                        help="stack outputs as JSON (`pulumi stack output --json --show-secrets`) instead of "
                             "asking Pulumi; with --dry-run nothing else is needed")
    submit.add_argument("--dry-run", action="store_true", help="print the MPIJob manifest (JSON) and stop")
    submit.add_argument("--follow", action="store_true",
                        help="stream the launcher's output and wait for the end")
    submit.add_argument("trainer_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    submit.set_defaults(command_fn=cmd_submit)

    logs = _add(sub, "logs", "stream a submitted job's output (its launcher's log) until it ends",
                "  ringtrain logs --stack dev --job resnet")
    logs.add_argument("--job", metavar="NAME", required=True, help="the submitted job's name")
    logs.add_argument("--run-dir", type=Path, default=None,
                      help="also draw the run's report from the log into this directory (report.png, "
                           "summary.txt, metrics.jsonl)")
    logs.set_defaults(command_fn=cmd_logs)


# ---------------------------------------------------------------------------------------------


def cmd_plan(a: argparse.Namespace) -> int:
    from cluster.aws.plan import offline_plan, plan_to_json, plan_to_table

    plan = offline_plan(a.stack, a.hours)
    print(plan_to_json(plan) if a.json else plan_to_table(plan))
    return 0


def cmd_up(a: argparse.Namespace) -> int:
    from cluster.aws.stack import (
        AutomationStack,
        default_kubeconfig_path,
        require_aws_credentials,
        require_pulumi_cli,
        stack_up,
        write_kubeconfig,
    )

    require_pulumi_cli()
    require_aws_credentials()
    outputs = stack_up(AutomationStack(a.stack, force=a.force))
    path = write_kubeconfig(outputs, a.kubeconfig or default_kubeconfig_path(a.stack), stack=a.stack)
    print(f"stack {a.stack} is up; kubeconfig written to {path} (mode 0600): export KUBECONFIG={path}")
    return 0


def cmd_down(a: argparse.Namespace) -> int:
    from cluster.aws.stack import (
        AutomationStack,
        delete_data,
        require_aws_credentials,
        require_pulumi_cli,
        stack_down,
    )

    if a.confirm is not None and not a.delete_data:
        raise UsageError("--confirm: only with --delete-data")
    require_pulumi_cli()
    require_aws_credentials()
    if a.delete_data:
        ask = input if sys.stdin.isatty() else None
        ops = AutomationStack(a.stack, create=False)
        delete_data(ops, confirm=a.confirm, ask=ask)
        print(f"stack {a.stack}: everything deleted, data layer included")
    else:
        stack_down(AutomationStack(a.stack, create=False))
        print(f"stack {a.stack}: compute removed; datasets, checkpoints and images kept")
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    from cluster.aws.stack import AutomationStack, stack_status

    if a.job:
        from cluster.aws.backend import AwsBackend

        job = AwsBackend(a.stack, ops_factory=lambda s: AutomationStack(s, create=False)).job_status(a.job)
        if a.json:
            print(json.dumps(job, indent=2))
        else:
            code = "" if job["exitCode"] is None else f", launcher exit code {job['exitCode']}"
            print(f"job {job['namespace']}/{job['job']}: {job['state']}{code}"
                  + (f" ({job['message']})" if job["message"] else ""))
            if job.get("progress"):
                p = job["progress"]
                print(f"  step {p['step']}, loss {p['loss']:.4f}, "
                      f"{p.get('samples_per_sec', 0):.1f} samples/s, {p.get('world_size', '?')} workers")
        return 0 if job["state"] != "Failed" else EXIT_FAILED
    status = stack_status(AutomationStack(a.stack, create=False))
    if a.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    print(f"stack {status['stack']}: compute={status['compute']} dataProtection={status['dataProtection']}")
    last = status["lastUpdate"]
    print("last update: " + (f"{last['kind']} {last['result']} at {last['end']}" if last else "never"))
    for key, value in status["outputs"].items():
        print(f"  {key}: {json.dumps(value) if not isinstance(value, str) else value}")
    return 0


def job_from_args(a: argparse.Namespace, gpus_per_node: int | None) -> JobSpec:
    extra = list(a.trainer_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    elif extra:
        raise UsageError(f"unexpected arguments {' '.join(extra)!r}: trainer arguments go after `--`")
    if a.min_hosts is not None and not a.elastic:
        raise UsageError("--min-hosts: only with --elastic")
    slots = a.slots_per_host if a.slots_per_host is not None else (gpus_per_node or 1)
    try:
        return JobSpec(name=a.job_name, num_hosts=a.hosts, slots_per_host=slots, elastic=a.elastic,
                       min_hosts=(a.min_hosts or 1) if a.elastic else None, trainer=trainer_config(extra))
    except ValueError as e:
        raise UsageError(str(e)) from None


class _OutputsFile:
    """StackOps reading outputs from a JSON file (`pulumi stack output --json --show-secrets`)."""

    def __init__(self, stack: str, path: Path):
        self.name = stack
        try:
            self._outputs = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(f"--outputs {path}: no such file") from None
        except json.JSONDecodeError as e:
            raise UsageError(f"--outputs {path}: not JSON ({e})") from None
        if not isinstance(self._outputs, dict):
            raise UsageError(f"--outputs {path}: expected a JSON object of stack outputs")

    def outputs(self) -> dict:
        return dict(self._outputs)

    def _no(self, *args, **kwargs):
        raise UsageError("--outputs gives stack outputs only; drop it to change the stack")

    set_config = get_config = up = destroy = last_update = _no


def cmd_submit(a: argparse.Namespace) -> int:
    from cluster.aws.backend import AwsBackend
    from cluster.aws.stack import AutomationStack
    from infra.catalog import load_catalog

    try:
        check_job_name(a.job_name, a.hosts)   # the MPI Operator's rule for its pod names, before any work
    except ValueError as e:
        raise UsageError(str(e)) from None
    factory = (lambda s: _OutputsFile(s, a.outputs)) if a.outputs else \
        (lambda s: AutomationStack(s, create=False))
    backend = AwsBackend(stack=a.stack, node_group=a.node_group, capacity_timeout_s=a.capacity_timeout,
                         dataset=a.dataset, image=a.image, worker_memory=a.worker_memory, ops_factory=factory)
    group = backend.candidate_groups()[0]   # slots default to its GPUs; every group must have as many
    catalog = load_catalog()
    gpus = catalog[group.instance_types[0]].gpus if group.instance_types[0] in catalog else None
    job = job_from_args(a, gpus)
    if a.dry_run:
        print(json.dumps(backend.render(job), indent=2))
        return 0
    handle = backend.submit(job)
    print(f"submitted MPIJob {handle.details['namespace']}/{job.name}")
    if not a.follow:
        print(f"follow it with: kubectl --kubeconfig {backend.kubeconfig} logs -f -n "
              f"{handle.details['namespace']} job/{job.name}-launcher")
        return 0
    for line in backend.logs(handle):
        print(line, flush=True)
    result = backend.wait(handle)
    print(f"job {job.name}: {'succeeded' if result.succeeded else 'FAILED'} (exit code {result.exit_code})"
          + (f": {result.message}" if result.message else ""))
    return 0 if result.succeeded else EXIT_FAILED


def cmd_logs(a: argparse.Namespace) -> int:
    from cluster.aws.backend import AwsBackend
    from cluster.aws.stack import AutomationStack

    try:
        JobSpec(name=a.job, num_hosts=1)
    except ValueError as e:
        raise UsageError(f"--job {a.job!r}: {e}") from None
    backend = AwsBackend(a.stack, ops_factory=lambda s: AutomationStack(s, create=False))
    handle = backend.handle_for(a.job)
    lines = []
    for line in backend.logs(handle):   # waits for the job to start, then follows its launcher to the end
        print(line, flush=True)
        lines.append(line)
    if a.run_dir is not None:   # the run's report rebuilt from the log (its metrics lines, its summary)
        from cluster.report import result_from_log, write_run_report

        files = write_run_report(result_from_log(a.job, lines), a.run_dir)
        print(f"report {files.picture} (summary and metrics beside it)")
    return 0
