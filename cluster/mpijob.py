"""Render a JobSpec as a Kubeflow MPIJob (`kubeflow.org/v2beta1`): a pure function, no cluster access.

The job is rendered once, here; both executors run this object: the MPI Operator on EKS
(cluster/aws/backend.py applies it) and the local executor (cluster/local/executor.py), which runs the
launcher container's command and environment as they stand in it. What the operator adds to the object
(pod names, /etc/mpi files, environment) is in cluster/mpi_operator.py.

Shape (docs/field-notes.md §1, §5, §6):
- one launcher on the on-demand system nodes (Horovod's driver is not fault tolerant, so it must not
  sit on a spot node, horovod#2653) running `cluster.launch.horovodrun_command` through the image's
  entrypoint (`entrypoint.py launcher -- CMD`, which applies the image's NCCL/EFA defaults first):
  static jobs read the workers from the operator's /etc/mpi/hostfile, elastic jobs from its
  /etc/mpi/discover_hosts.sh, which lists the running workers;
  The launcher runs the image's slim `launcher` target (`<image>-launcher`: no CUDA), so the small
  system nodes never pull the multi-GB worker image;
- one worker per GPU node (`entrypoint.py sshd`; horovodrun reaches it over ssh) requesting the
  node's GPUs and, on EFA groups, all its EFA interfaces; the node's memory and CPUs less what the node
  keeps for itself and its DaemonSets (cluster/node_room.py, from the instance catalog), a
  memory-backed /dev/shm with a size limit, a readiness probe on sshd's port,
  the GPU taint tolerated, and a termination grace period that fits a checkpoint (the entrypoint
  forwards the pod's SIGTERM to the trainer ranks). Before sshd starts, an init container runs the
  image's self-test with the GPUs and EFA interfaces the pod requests: a node whose GPUs are missing
  or whose NCCL would not use EFA fails the job at once instead of training over TCP;
- both pods run as the stack's training service account, whose IAM role (EKS Pod Identity) gives
  them S3 access: no credentials travel in the manifest.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cluster import mpi_operator
from cluster.backend import BackendError, Storage
from cluster.job import JobSpec
from cluster.launch import horovodrun_command
from cluster.node_room import worker_cpu_request, worker_memory_limit_gib
from train.config import with_flags
from train.contract import (
    LAUNCHER_TAG_SUFFIX,
    NODE_POOL_LABEL,
    STOP_GRACE_ENV,
    SYSTEM_POOL,
    WORKER_TERMINATION_GRACE_S,
    stop_grace_s,
)

API_VERSION = "kubeflow.org/v2beta1"
KIND = "MPIJob"
SSH_AUTH_MOUNT_PATH = "/root/.ssh"
SSH_PORT = 22                 # the image's sshd (image/entrypoint.py sshd)
# The pod network interface: the VPC CNI gives every pod one interface, eth0, in its own network
# namespace (EFA devices reach the pod as /dev/infiniband devices, not as interfaces); Horovod's
# controller traffic and Gloo go over it. The local executor names its hosts' interface the same.
POD_INTERFACE = "eth0"
# Modes of the image's ENTRYPOINT (image/entrypoint.py); pods set `args`, so the entrypoint stays.
LAUNCHER_ARGS = ("launcher", "--")
WORKER_ARGS = ("sshd",)
SELFTEST_ARGS = ("selftest",)
# The pods' container names (the backend reads their logs and statuses by name).
LAUNCHER_CONTAINER = "launcher"
WORKER_CONTAINER = "worker"
SELFTEST_CONTAINER = "selftest"
# What the self-test must find (image/entrypoint.py): at least this many GPUs and EFA devices, and with
# EFA devices expected, NCCL reporting the EFA provider (AWS's own health check greps the same line).
EXPECT_GPUS_ENV = "RINGTRAIN_EXPECT_GPUS"
EXPECT_EFA_ENV = "RINGTRAIN_EXPECT_EFA"
# The entrypoint's old self-test switch, which reached the GPU-less launcher too; it now refuses it.
# Which section of the image's NCCL settings (image/nccl-efa.env) a GPU worker applies: efa where the node
# group has EFA interfaces (the aws-ofi-nccl plugin), socket elsewhere (NCCL's own TCP transport). Worker
# pods only: horovodrun exports the launcher's environment to every rank, so it carries none of them.
NETWORK_ENV = "RINGTRAIN_NETWORK"
SELFTEST_SWITCH_ENV = "RINGTRAIN_SELFTEST"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# Labels EKS managed node groups put on every node (EKS user guide, managed node groups).
CAPACITY_TYPE_LABEL = "eks.amazonaws.com/capacityType"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HOSTNAME_LABEL = "kubernetes.io/hostname"
JOB_LABEL = "ringtrain.io/job"
ROLE_LABEL = "ringtrain.io/role"

class MPIJobError(BackendError):
    """The job cannot be rendered for this stack; the message says what is wrong and what is allowed."""


class InstanceRecord(Protocol):
    """What the renderer reads of a catalog entry (infra/catalog.py InstanceType)."""

    gpus: int
    vcpus: int
    memory_gib: int


@dataclass(frozen=True)
class WorkerNodes:
    """What one worker pod asks of its node: taken from a node group and the instance catalog."""

    node_group: str
    instance_types: tuple[str, ...]
    gpus_per_node: int            # 0: CPU workers (the local executor's hosts)
    efa_interfaces: int
    capacity_type: str
    memory_limit: str             # a Kubernetes quantity, e.g. "170Gi": requested and the limit
    cpu_request: str              # e.g. "46"; no CPU limit (CFS throttling would stall the ranks)
    shm_size_limit: str           # the memory-backed /dev/shm's sizeLimit (it counts against the limit)


@dataclass(frozen=True)
class LauncherNodes:
    """Where the launcher goes: the on-demand system nodes (no GPU taint, never spot)."""

    node_selector: Mapping[str, str]
    cpu: str = "500m"
    memory: str = "1Gi"


SYSTEM_NODES = LauncherNodes(node_selector={NODE_POOL_LABEL: SYSTEM_POOL, CAPACITY_TYPE_LABEL: "ON_DEMAND"})


def parse_gib(quantity: str) -> float:
    """A memory quantity in GiB; accepts the binary suffixes Ki..Ti and plain bytes (for limits we write)."""
    units = {"Ki": 2 ** -20, "Mi": 2 ** -10, "Gi": 1.0, "Ti": 2 ** 10}
    text = quantity.strip()
    suffix = text[-2:]
    number, factor = (text[:-2], units[suffix]) if suffix in units else (text, 2 ** -30)
    try:
        value = float(number)
    except ValueError:
        raise MPIJobError(f"memory {quantity!r}: expected a quantity like 170Gi or 512Mi") from None
    if not value > 0:
        raise MPIJobError(f"memory {quantity!r}: must be more than 0")
    return value * factor


def worker_nodes(node_group: str, instance_types: Sequence[str], capacity_type: str, efa_interfaces: int,
                 catalog: Mapping[str, InstanceRecord], memory_limit: str | None = None) -> WorkerNodes:
    """WorkerNodes for a node group whose types the catalog describes; `memory_limit` overrides the
    catalog-derived limit (it must fit the group's smallest node)."""
    unknown = [t for t in instance_types if t not in catalog]
    if unknown:
        raise MPIJobError(f"instance types {', '.join(unknown)} of node group {node_group!r} are not in "
                          "infra/catalog.yaml")
    records = {t: catalog[t] for t in instance_types}
    counts = {t: r.gpus for t, r in records.items()}
    if len(set(counts.values())) != 1:
        detail = ", ".join(f"{t}={n}" for t, n in counts.items())
        raise MPIJobError(
            f"node group {node_group!r} mixes GPU counts ({detail}): a worker pod needs one count"
        )
    gpus = next(iter(counts.values()))
    if gpus < 1:
        raise MPIJobError(f"node group {node_group!r} has no GPUs ({', '.join(instance_types)}): "
                          "workers need a GPU node group")
    # A pod must fit every node type of the group: size it for the smallest.
    most_gib = min(worker_memory_limit_gib(r.memory_gib) for r in records.values())
    if memory_limit is None:
        memory_gib = float(most_gib)
        memory_limit = f"{most_gib}Gi"
    else:
        memory_gib = parse_gib(memory_limit)
        if memory_gib > most_gib:
            raise MPIJobError(f"worker memory {memory_limit}: node group {node_group!r} leaves at most "
                              f"{most_gib}Gi per worker ({', '.join(instance_types)}); allowed are up to "
                              f"{most_gib}Gi")
    cpus = min(worker_cpu_request(r.vcpus) for r in records.values())
    return WorkerNodes(node_group=node_group, instance_types=tuple(instance_types), gpus_per_node=gpus,
                       efa_interfaces=efa_interfaces, capacity_type=capacity_type, memory_limit=memory_limit,
                       cpu_request=str(cpus), shm_size_limit=shm_size_limit(memory_gib))


def shm_size_limit(memory_gib: float) -> str:
    """Half the worker's memory for /dev/shm (pure): room for NCCL's and the data loaders' shared
    buffers, while a runaway writer gets ENOSPC instead of the whole pod being OOM-killed."""
    return f"{max(1, math.floor(memory_gib * 1024 / 2))}Mi"


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


# A node selector term's requirement on a node's fields: the key must be metadata.name, and In and NotIn
# take exactly one value each (kubernetes pkg/apis/core/validation validateNodeFieldSelectorRequirement:
# "must be only one value when `operator` is 'In' or 'NotIn' for node field selector"). The requirements
# of one term are ANDed, so each excluded node gets its own.
NODE_NAME_FIELD = "metadata.name"


def exclude_nodes_fields(nodes: Sequence[str]) -> list[dict[str, Any]]:
    """The nodeSelectorTerm matchFields that keep a pod off `nodes` (pure)."""
    return [{"key": NODE_NAME_FIELD, "operator": "NotIn", "values": [node]} for node in sorted(set(nodes))]


def excluded_nodes(pod_spec: Mapping[str, Any]) -> set[str]:
    """The nodes a pod spec's required node affinity keeps it off by name (pure): what
    exclude_nodes_fields wrote, as the scheduler reads it."""
    terms = (pod_spec.get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
    return {req["values"][0] for term in terms for req in term.get("matchFields", ())
            if req.get("key") == NODE_NAME_FIELD and req.get("operator") == "NotIn"}


def worker_hostnames(job: JobSpec, namespace: str) -> list[str]:
    """The names the MPI Operator gives the workers, `<job>-worker-<i>.<job>.<ns>.svc` (mpi_operator)."""
    return [mpi_operator.pod_fqdn(mpi_operator.worker_pod_name(job.name, i), job.name, namespace)
            for i in range(job.num_hosts)]


def with_storage_args(job: JobSpec, storage: Storage) -> JobSpec:
    """The job with the stack's dataset and checkpoint locations in the trainer's configuration (unless
    it names its own: `--data synthetic` too), and elastic for an elastic job (the trainer must run under
    hvd.elastic to survive lost hosts)."""
    cfg = with_flags(job.trainer, [("--data", storage.dataset_uri),
                                   ("--checkpoint-dir", storage.checkpoint_uri)])
    if job.elastic:
        cfg = dataclasses.replace(cfg, horovod=dataclasses.replace(cfg.horovod, elastic=True))
    return dataclasses.replace(job, trainer=cfg)


# Elastic on EKS: a host Horovod blacklisted (its worker failed) stays out at least this long. A worker pod
# being drained keeps phase Running through its termination grace period, and the operator lists every
# Running worker pod in discover_hosts.sh (mpi_job_controller.go getRunningWorkerPods: phase only, no
# deletionTimestamp check); Horovod re-admits a blacklisted host once its cooldown ends
# (horovod/runner/elastic/discovery.py HostState: cooldown = clamp(lower * 2^n + U(0,1) * lower, lower,
# upper)). A lower bound below the grace period lets the draining host back in, to fail again.
EKS_BLACKLIST_COOLDOWN_S = (WORKER_TERMINATION_GRACE_S, 600)


def launcher_command(job: JobSpec, network_interface: str = POD_INTERFACE,
                     blacklist_cooldown_s: tuple[int, int] = EKS_BLACKLIST_COOLDOWN_S) -> list[str]:
    """horovodrun as the launcher runs it: hosts from the operator's /etc/mpi files."""
    if job.elastic:
        return horovodrun_command(job, discovery_script=mpi_operator.DISCOVER_HOSTS_PATH,
                                  network_interface=network_interface,
                                  blacklist_cooldown_s=blacklist_cooldown_s)
    return horovodrun_command(job, hostfile=mpi_operator.HOSTFILE_PATH, network_interface=network_interface)


def _env(job: JobSpec, storage: Storage) -> list[dict[str, str]]:
    env = {**storage.env, **job.env}
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def check_stop_grace(env: list[dict[str, str]]) -> None:
    """A RINGTRAIN_STOP_GRACE_S the job sets must leave the entrypoint time to finish before the SIGKILL."""
    for item in env:
        if item["name"] == STOP_GRACE_ENV:
            try:
                stop_grace_s({STOP_GRACE_ENV: item["value"]})
            except ValueError as e:
                raise MPIJobError(str(e)) from None


def launcher_image_for(image: str) -> str:
    """The launcher image built with the worker image `image` (`<repository>:<tag>`)."""
    return image + LAUNCHER_TAG_SUFFIX


def check_no_selftest_switch(env: list[dict[str, str]]) -> None:
    if any(item["name"] == SELFTEST_SWITCH_ENV for item in env):
        raise MPIJobError(f"{SELFTEST_SWITCH_ENV}: not allowed in a job's environment: every worker runs the "
                          "image's self-test as its init container (with the node's GPU and EFA counts), and "
                          "the launcher, which has no GPU, never does")


def _labels(job: JobSpec, role: str) -> dict[str, str]:
    return {JOB_LABEL: job.name, ROLE_LABEL: role}


def launcher_container(mpijob: Mapping[str, Any]) -> dict[str, Any]:
    """The launcher pod's (only) container, as rendered."""
    return mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]


def worker_container(mpijob: Mapping[str, Any]) -> dict[str, Any]:
    """The worker pods' main container (the first: the operator runs sshd in it)."""
    return mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]


def worker_selftest_container(mpijob: Mapping[str, Any]) -> dict[str, Any] | None:
    """The worker pods' self-test init container; None for CPU workers (the local executor's hosts)."""
    init = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"].get("initContainers", [])
    return next((c for c in init if c["name"] == SELFTEST_CONTAINER), None)


def render_mpijob(
    job: JobSpec,
    *,
    image: str,
    storage: Storage,
    namespace: str,
    service_account: str,
    workers: WorkerNodes,
    launcher: LauncherNodes,
    launcher_image: str | None = None,
    network_interface: str = POD_INTERFACE,
    ssh_port: int = SSH_PORT,
    clean_pod_policy: str = "Running",
    backoff_limit: int = 0,
    ttl_seconds_after_finished: int = 3600,
    blacklist_cooldown_s: tuple[int, int] = EKS_BLACKLIST_COOLDOWN_S,
) -> dict[str, Any]:
    """The MPIJob manifest (a plain dict, ready for `kubectl apply -f -` as JSON). The launcher runs
    `launcher_image`, by default the launcher target built with `image` (launcher_image_for). An elastic
    job's `blacklist_cooldown_s` must start at the worker pods' termination grace period on EKS
    (EKS_BLACKLIST_COOLDOWN_S); the local executor, whose hosts leave discovery before their workers
    are stopped, passes its own."""
    try:
        mpi_operator.check_job_name(job.name, job.num_hosts)
    except ValueError as e:
        raise MPIJobError(str(e)) from None
    if blacklist_cooldown_s[0] < 1 or blacklist_cooldown_s[1] > 3600 or \
            blacklist_cooldown_s[0] > blacklist_cooldown_s[1]:
        raise MPIJobError(f"blacklist cooldown {blacklist_cooldown_s}: allowed is a range within 1..3600 s "
                          "(horovod/runner/elastic/discovery.py)")
    if workers.gpus_per_node and job.slots_per_host > workers.gpus_per_node:
        raise MPIJobError(
            f"slots_per_host={job.slots_per_host} but node group {workers.node_group!r} "
            f"({', '.join(workers.instance_types)}) has {workers.gpus_per_node} GPUs per node: "
            f"allowed are 1..{workers.gpus_per_node} (one process per GPU)"
        )
    if clean_pod_policy not in ("None", "Running", "All"):
        raise MPIJobError(f"cleanPodPolicy {clean_pod_policy!r}: allowed are None, Running, All")
    if backoff_limit < 0 or ttl_seconds_after_finished < 0:
        raise MPIJobError("backoffLimit and ttlSecondsAfterFinished must be >= 0")
    launcher_image = launcher_image or (launcher_image_for(image) if image else "")
    for what, ref in (("image", image), ("launcher image", launcher_image)):
        if not ref or ":" not in ref.rsplit("/", 1)[-1]:
            raise MPIJobError(f"{what} {ref!r}: expected <repository>:<tag>")
    job = with_storage_args(job, storage)
    env = _env(job, storage)
    check_stop_grace(env)
    check_no_selftest_switch(env)

    launcher_pod = {
        "metadata": {"labels": _labels(job, "launcher")},
        "spec": {
            "serviceAccountName": service_account,
            "nodeSelector": dict(launcher.node_selector),
            "containers": [{
                "name": LAUNCHER_CONTAINER,
                "image": launcher_image,
                "args": [*LAUNCHER_ARGS, *launcher_command(job, network_interface, blacklist_cooldown_s)],
                **({"env": env} if env else {}),
                "resources": {"requests": {"cpu": launcher.cpu, "memory": launcher.memory}},
            }],
        },
    }

    requests: dict[str, str | int] = {"cpu": workers.cpu_request, "memory": workers.memory_limit}
    limits: dict[str, str | int] = {"memory": workers.memory_limit}
    if workers.gpus_per_node:
        # Extended resources need requests == limits; stating both keeps the manifest explicit.
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = job.slots_per_host
    if workers.efa_interfaces:
        # No hugepages-2Mi: image/nccl-efa.env sets FI_EFA_USE_HUGE_PAGE=0, and a request for them keeps
        # the pod Pending forever on a node that has not reserved any.
        requests[EFA_RESOURCE] = limits[EFA_RESOURCE] = workers.efa_interfaces
    resources = {"requests": requests, "limits": limits}
    worker_env = env
    if workers.gpus_per_node and not any(item["name"] == NETWORK_ENV for item in env):  # a job may override
        worker_env = [*env, {"name": NETWORK_ENV, "value": "efa" if workers.efa_interfaces else "socket"}]
    init_containers = []
    if workers.gpus_per_node:
        # The self-test sees what the worker will see: the same image, environment and devices (the
        # kubelet hands an init container's GPUs and EFA interfaces on to the app containers). It expects
        # the GPUs and EFA interfaces requested above, which come from the catalog and the node group.
        expect = [{"name": EXPECT_GPUS_ENV, "value": str(requests[GPU_RESOURCE])},
                  {"name": EXPECT_EFA_ENV, "value": str(requests.get(EFA_RESOURCE, 0))}]
        init_containers.append({
            "name": SELFTEST_CONTAINER,
            "image": image,
            "args": list(SELFTEST_ARGS),
            "env": worker_env + expect,
            "resources": resources,
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        })
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
                    **({"matchFields": exclude_nodes_fields(job.exclude_nodes)} if job.exclude_nodes else {}),
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
            **({"initContainers": init_containers} if init_containers else {}),
            "containers": [{
                "name": WORKER_CONTAINER,
                "image": image,
                # Host keys, then sshd as the entrypoint's child: horovodrun reaches the workers over ssh,
                # and the entrypoint stays PID 1 to forward the pod's SIGTERM to the trainers.
                "args": list(WORKER_ARGS),
                **({"env": worker_env} if worker_env else {}),
                "ports": [{"name": "ssh", "containerPort": ssh_port, "protocol": "TCP"}],
                # Ready only once sshd accepts connections: the job's headless Service publishes only
                # ready pods' addresses and the operator starts a static job's launcher only when all
                # workers are ready (WaitForWorkersReady), so without it horovodrun's ssh check races sshd.
                "readinessProbe": {"tcpSocket": {"port": ssh_port}, "periodSeconds": 2,
                                   "failureThreshold": 3, "timeoutSeconds": 1},
                "resources": resources,
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }],
            "volumes": [{"name": "dshm",
                         "emptyDir": {"medium": "Memory", "sizeLimit": workers.shm_size_limit}}],
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
