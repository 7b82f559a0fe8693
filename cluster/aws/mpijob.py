"""Render a JobSpec as a Kubeflow MPIJob (`kubeflow.org/v2beta1`): a pure function, no cluster access.

Shape (FIELD_NOTES §1, §5, §6):
- one launcher on the on-demand system nodes (Horovod's driver is not fault tolerant, so it must not
  sit on a spot node, horovod#2653) running exactly `cluster.launch.horovodrun_command(job, ...)`
  through the image's entrypoint (`entrypoint.py launcher -- CMD`, which applies the image's NCCL/EFA
  defaults first);
  static jobs name the worker hosts the operator writes into /etc/mpi/hostfile, elastic jobs use the
  operator's /etc/mpi/discover_hosts.sh, which lists the running workers;
- one worker per GPU node (`entrypoint.py sshd`; horovodrun reaches it over ssh) requesting the
  node's GPUs and, on EFA groups, all its EFA interfaces, 2 MiB hugepages and a memory-backed
  /dev/shm as the AWS reference jobs do, tolerating the GPU taint, with a termination grace period
  that fits a checkpoint (the entrypoint forwards the pod's SIGTERM to the trainer ranks);
- both pods run as the stack's training service account, whose IAM role (EKS Pod Identity) gives
  them S3 access: no credentials travel in the manifest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.backend import BackendError, Storage
from cluster.job import MPI_OPERATOR_DISCOVERY_SCRIPT, JobSpec
from cluster.launch import horovodrun_command

from .outputs import NodeGroupOutput, StackOutputs

API_VERSION = "kubeflow.org/v2beta1"
KIND = "MPIJob"
SSH_AUTH_MOUNT_PATH = "/root/.ssh"
# Modes of the image's ENTRYPOINT (image/entrypoint.py); pods set `args`, so the entrypoint stays.
LAUNCHER_ARGS = ("launcher", "--")
WORKER_ARGS = ("sshd",)
# A spot reclaim drains the worker's node: the kubelet sends SIGTERM to the pod's PID 1 (the image
# entrypoint, which forwards it to the trainer ranks) and SIGKILL when this grace period ends. The ranks
# need it to reach a step boundary and let rank 0 write a checkpoint; the instance itself goes two
# minutes after the interruption notice, so longer buys nothing. The entrypoint waits at most
# RINGTRAIN_STOP_GRACE_S (100 s by default) for the trainers, then up to 5 s for sshd: both must fit
# inside this, with slack, or the SIGKILL lands mid-checkpoint.
WORKER_TERMINATION_GRACE_S = 120
STOP_GRACE_ENV = "RINGTRAIN_STOP_GRACE_S"
STOP_GRACE_MARGIN_S = 10      # the entrypoint's time to stop sshd after the trainers, plus slack
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# AWS reference jobs (awsome-distributed-training, p5 examples) request this with EFA.
HUGEPAGES_RESOURCE = "hugepages-2Mi"
HUGEPAGES_AMOUNT = "5120Mi"
# The label infra/nodegroups.py puts on every node: the node group's config name ("system" for the
# on-demand CPU group).
NODE_POOL_LABEL = "ringtrain.io/node-pool"
SYSTEM_POOL = "system"
# Labels EKS managed node groups put on every node (EKS user guide, managed node groups).
CAPACITY_TYPE_LABEL = "eks.amazonaws.com/capacityType"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HOSTNAME_LABEL = "kubernetes.io/hostname"
JOB_LABEL = "ringtrain.io/job"
ROLE_LABEL = "ringtrain.io/role"
# The trainer's flags for its storage locations (train/config.py).
DATA_FLAG = "--data"
CHECKPOINT_FLAG = "--checkpoint-dir"
ELASTIC_FLAG = "--elastic"


class MPIJobError(BackendError):
    """The job cannot be rendered for this stack; the message says what is wrong and what is allowed."""


@dataclass(frozen=True)
class WorkerNodes:
    """What one worker pod asks of its node: taken from a node group and the instance catalog."""

    node_group: str
    instance_types: tuple[str, ...]
    gpus_per_node: int
    efa_interfaces: int
    capacity_type: str


@dataclass(frozen=True)
class LauncherNodes:
    """Where the launcher goes: the on-demand system nodes (no GPU taint, never spot)."""

    node_selector: Mapping[str, str]
    cpu: str = "500m"
    memory: str = "1Gi"


SYSTEM_NODES = LauncherNodes(node_selector={NODE_POOL_LABEL: SYSTEM_POOL, CAPACITY_TYPE_LABEL: "ON_DEMAND"})


def worker_nodes(group: NodeGroupOutput, gpus_of: Callable[[str], int]) -> WorkerNodes:
    """WorkerNodes for a stack node group; `gpus_of(instance_type)` reads the catalog."""
    counts = {t: gpus_of(t) for t in group.instance_types}
    if len(set(counts.values())) != 1:
        detail = ", ".join(f"{t}={n}" for t, n in counts.items())
        raise MPIJobError(
            f"node group {group.name!r} mixes GPU counts ({detail}): a worker pod needs one count"
        )
    gpus = next(iter(counts.values()))
    if gpus < 1:
        raise MPIJobError(f"node group {group.name!r} has no GPUs ({', '.join(group.instance_types)}): "
                          "workers need a GPU node group")
    return WorkerNodes(node_group=group.name, instance_types=group.instance_types, gpus_per_node=gpus,
                       efa_interfaces=group.efa_interfaces, capacity_type=group.capacity_type)


def read_image_version(repo_root: Path) -> str:
    """The image tag: image/VERSION, one line (written by the image build)."""
    path = Path(repo_root) / "image" / "VERSION"
    try:
        version = path.read_text().strip()
    except FileNotFoundError:
        raise MPIJobError(f"{path} is missing: it names the training image's tag; build and push the image "
                          "(image/README) or pass --image") from None
    if not version or any(c.isspace() for c in version) or len(version) > 128:
        raise MPIJobError(f"{path} holds {version!r}: expected one image tag (no spaces, at most 128 chars)")
    return version


def image_reference(outputs: StackOutputs, version: str) -> str:
    return f"{outputs.ecr_repository_url}:{version}"


def worker_hostnames(job: JobSpec, namespace: str) -> list[str]:
    """The names the MPI Operator gives worker i: `<job>-worker-<i>.<job>-worker.<ns>.svc`.

    These are the lines of the /etc/mpi/hostfile it mounts into the launcher (mpi-operator
    v2 controller newConfigMap/workerName); horovodrun wants them as -H, so they are named here.
    """
    return [f"{job.name}-worker-{i}.{job.name}-worker.{namespace}.svc" for i in range(job.num_hosts)]


def _has_flag(args: tuple[str, ...], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def with_storage_args(job: JobSpec, storage: Storage) -> JobSpec:
    """The job with the stack's dataset and checkpoint locations as trainer flags (unless it names its own),
    and `--elastic` for an elastic job (the trainer must run under hvd.elastic to survive lost hosts)."""
    args = tuple(job.trainer_args)
    extra: list[str] = []
    if not _has_flag(args, DATA_FLAG):
        extra += [DATA_FLAG, storage.dataset_uri]
    if not _has_flag(args, CHECKPOINT_FLAG):
        extra += [CHECKPOINT_FLAG, storage.checkpoint_uri]
    if job.elastic and ELASTIC_FLAG not in args:
        extra.append(ELASTIC_FLAG)
    return dataclasses.replace(job, trainer_args=args + tuple(extra))


def launcher_command(job: JobSpec, namespace: str) -> list[str]:
    if job.elastic:
        return horovodrun_command(job, discovery_script=MPI_OPERATOR_DISCOVERY_SCRIPT)
    return horovodrun_command(job, hosts=worker_hostnames(job, namespace))


def _env(job: JobSpec, storage: Storage) -> list[dict[str, str]]:
    env = {**storage.env, **job.env}
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def check_stop_grace(env: list[dict[str, str]]) -> None:
    """A RINGTRAIN_STOP_GRACE_S the job sets must leave the entrypoint time to finish before the SIGKILL."""
    limit = WORKER_TERMINATION_GRACE_S - STOP_GRACE_MARGIN_S
    for item in env:
        if item["name"] != STOP_GRACE_ENV:
            continue
        try:
            value = float(item["value"])
        except ValueError:
            value = -1.0
        if not 0 <= value <= limit:
            raise MPIJobError(
                f"{STOP_GRACE_ENV}={item['value']!r}: allowed are 0..{limit} seconds (the worker pod's "
                f"terminationGracePeriodSeconds is {WORKER_TERMINATION_GRACE_S}, the spot notice)"
            )


def _labels(job: JobSpec, role: str) -> dict[str, str]:
    return {JOB_LABEL: job.name, ROLE_LABEL: role}


def render_mpijob(
    job: JobSpec,
    *,
    image: str,
    storage: Storage,
    namespace: str,
    service_account: str,
    workers: WorkerNodes,
    launcher: LauncherNodes,
    worker_memory: str = "32Gi",
    clean_pod_policy: str = "Running",
    backoff_limit: int = 0,
    ttl_seconds_after_finished: int = 3600,
) -> dict[str, Any]:
    """The MPIJob manifest (a plain dict, ready for `kubectl apply -f -` as JSON)."""
    if job.slots_per_host > workers.gpus_per_node:
        raise MPIJobError(
            f"slots_per_host={job.slots_per_host} but node group {workers.node_group!r} "
            f"({', '.join(workers.instance_types)}) has {workers.gpus_per_node} GPUs per node: "
            f"allowed are 1..{workers.gpus_per_node} (one process per GPU)"
        )
    if clean_pod_policy not in ("None", "Running", "All"):
        raise MPIJobError(f"cleanPodPolicy {clean_pod_policy!r}: allowed are None, Running, All")
    if backoff_limit < 0 or ttl_seconds_after_finished < 0:
        raise MPIJobError("backoffLimit and ttlSecondsAfterFinished must be >= 0")
    if not image or ":" not in image.rsplit("/", 1)[-1]:
        raise MPIJobError(f"image {image!r}: expected <repository>:<tag>")
    job = with_storage_args(job, storage)
    env = _env(job, storage)
    check_stop_grace(env)

    launcher_pod = {
        "metadata": {"labels": _labels(job, "launcher")},
        "spec": {
            "serviceAccountName": service_account,
            "nodeSelector": dict(launcher.node_selector),
            "containers": [{
                "name": "launcher",
                "image": image,
                "args": [*LAUNCHER_ARGS, *launcher_command(job, namespace)],
                **({"env": env} if env else {}),
                "resources": {"requests": {"cpu": launcher.cpu, "memory": launcher.memory}},
            }],
        },
    }

    gpu_limits: dict[str, str | int] = {GPU_RESOURCE: job.slots_per_host, "memory": worker_memory}
    if workers.efa_interfaces:
        gpu_limits[EFA_RESOURCE] = workers.efa_interfaces
        gpu_limits[HUGEPAGES_RESOURCE] = HUGEPAGES_AMOUNT
    # Extended resources need requests == limits; stating both keeps the manifest explicit.
    resources = {"requests": dict(gpu_limits), "limits": dict(gpu_limits)}
    worker_pod = {
        "metadata": {"labels": _labels(job, "worker")},
        "spec": {
            "serviceAccountName": service_account,
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
                    "matchExpressions": [
                        {"key": NODE_POOL_LABEL, "operator": "In", "values": [workers.node_group]},
                        {"key": INSTANCE_TYPE_LABEL, "operator": "In",
                         "values": list(workers.instance_types)},
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": [workers.capacity_type]},
                    ],
                }]}},
                # One worker per node: each owns the node's GPUs and EFA interfaces.
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": _labels(job, "worker")},
                    "topologyKey": HOSTNAME_LABEL,
                }]},
            },
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            # Time for the trainers to checkpoint on a spot reclaim (see WORKER_TERMINATION_GRACE_S).
            "terminationGracePeriodSeconds": WORKER_TERMINATION_GRACE_S,
            "containers": [{
                "name": "worker",
                "image": image,
                # Host keys, then sshd as the entrypoint's child: horovodrun reaches the workers over ssh,
                # and the entrypoint stays PID 1 to forward the pod's SIGTERM to the trainers.
                "args": list(WORKER_ARGS),
                **({"env": env} if env else {}),
                "resources": resources,
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }

    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job.name, "namespace": namespace, "labels": {JOB_LABEL: job.name}},
        "spec": {
            "slotsPerWorker": job.slots_per_host,
            "runLauncherAsWorker": False,
            "sshAuthMountPath": SSH_AUTH_MOUNT_PATH,
            "mpiImplementation": "OpenMPI",
            # Static jobs need every worker's sshd up before horovodrun connects; elastic jobs start at
            # once and let the discovery script report workers as they come (spot nodes may never).
            "launcherCreationPolicy": "AtStartup" if job.elastic else "WaitForWorkersReady",
            "runPolicy": {
                "cleanPodPolicy": clean_pod_policy,
                "backoffLimit": backoff_limit,
                "ttlSecondsAfterFinished": ttl_seconds_after_finished,
            },
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": launcher_pod},
                # Elastic workers that die (spot reclaim) are recreated and rejoin via discovery.
                "Worker": {"replicas": job.num_hosts,
                           "restartPolicy": "OnFailure" if job.elastic else "Never",
                           "template": worker_pod},
            },
        },
    }
