"""What the Kubeflow MPI Operator does with an MPIJob: pod names, mounted files, the environment it adds.

Both executors need this: the renderer names the paths the launcher reads, and the local executor
(cluster/local/executor.py) reproduces the operator's side exactly. Everything here follows the pinned
release's controller, kubeflow/mpi-operator v0.8.2 `pkg/controller/mpi_job_controller.go`:

- `workerName`: worker i is the pod `<job>-worker-<i>`; `newWorker` sets `Hostname` to that name and
  `Subdomain = mpiJob.Name` (the job's headless Service), so it resolves as `<pod>.<job>.<ns>.svc`.
  The launcher pod is `<job>-launcher`, same subdomain (`newLauncherPodTemplate`).
- `newConfigMap`: `/etc/mpi/hostfile` holds `<pod>.<job>.<ns>.svc slots=<slotsPerWorker>` per worker
  (OpenMPI format; the launcher first only with `runLauncherAsWorker`), mode 0444.
- `updateDiscoverHostsInConfigMap`: `/etc/mpi/discover_hosts.sh` (mode 0555) is `#!/bin/sh` and one
  `echo <pod>.<job>.<ns>.svc` per *Running* worker pod (`getRunningWorkerPods`), sorted by pod name;
  no slot counts (horovodrun's `--slots-per-host` supplies them).
- `launcherEnvVars`/`ompiEnvVars`/`nvidiaDisableEnvVars` are appended to the launcher container's env,
  `workerEnvVars` to the worker's. The cluster domain suffix is empty unless the operator runs with
  `--cluster-domain` (the manifest infra/platform.py installs does not set it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# The release whose behaviour this module reproduces, whose CRD cluster/schemas/ holds and whose
# manifest infra/platform.py installs (a test keeps the three equal).
OPERATOR_VERSION = "v0.8.2"

CONFIG_MOUNT_PATH = "/etc/mpi"
HOSTFILE_PATH = f"{CONFIG_MOUNT_PATH}/hostfile"
DISCOVER_HOSTS_PATH = f"{CONFIG_MOUNT_PATH}/discover_hosts.sh"
HOSTFILE_MODE = 0o444
DISCOVER_HOSTS_MODE = 0o555


# apimachinery validation.IsDNS1035Label: at most 63 characters, a lower-case letter first, then lower-case
# letters, digits and '-', ending in a letter or digit.
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1035_MAX = 63


def check_job_name(job_name: str, workers: int) -> None:
    """ValueError unless the operator accepts an MPIJob of this name with this many workers.

    validation.go `validateMPIJobName`: `<name>-worker-<workers-1>`, the longest worker pod's hostname,
    must be a DNS-1035 label. An MPIJob that fails it is stored by the API server (the CRD does not
    check the name) and sits Pending with a ValidationError event (`syncHandler` does not requeue it).
    The launcher's `<name>-launcher` is never longer than `<name>-worker-0`."""
    longest = worker_pod_name(job_name, max(1, workers) - 1)
    limit = DNS1035_MAX - (len(longest) - len(job_name))
    if not DNS1035_LABEL.fullmatch(job_name) or len(longest) > DNS1035_MAX:
        raise ValueError(
            f"job name {job_name!r}: the MPI Operator names its pods <name>-worker-<i>, which must be "
            f"DNS-1035 labels: allowed are at most {limit} characters for {workers} worker(s), lower-case "
            "letters, digits and '-', starting with a letter and ending with a letter or digit")


def worker_pod_name(job_name: str, index: int) -> str:
    return f"{job_name}-worker-{index}"


def launcher_pod_name(job_name: str) -> str:
    return f"{job_name}-launcher"


def pod_fqdn(pod: str, job_name: str, namespace: str) -> str:
    """`<pod>.<job>.<ns>.svc`: the pod's hostname in the job's subdomain (its headless Service)."""
    return f"{pod}.{job_name}.{namespace}.svc"


def _job(mpijob: Mapping[str, Any]) -> tuple[str, str, int, int]:
    meta, spec = mpijob["metadata"], mpijob["spec"]
    if spec.get("runLauncherAsWorker"):
        raise ValueError("runLauncherAsWorker is not used by ringtrain (the launcher runs no ranks)")
    if spec.get("mpiImplementation", "OpenMPI") != "OpenMPI":
        raise ValueError(f"mpiImplementation {spec['mpiImplementation']!r}: only OpenMPI's file format is "
                         "reproduced here")
    workers = int(spec["mpiReplicaSpecs"]["Worker"]["replicas"])
    return meta["name"], meta["namespace"], workers, int(spec.get("slotsPerWorker", 1))


def worker_fqdns(mpijob: Mapping[str, Any]) -> list[str]:
    """The workers' names in index order, as the hostfile lists them."""
    name, namespace, workers, _ = _job(mpijob)
    return [pod_fqdn(worker_pod_name(name, i), name, namespace) for i in range(workers)]


def hostfile(mpijob: Mapping[str, Any]) -> str:
    """The operator's /etc/mpi/hostfile for this MPIJob (newConfigMap, OpenMPI)."""
    _, _, _, slots = _job(mpijob)
    return "".join(f"{fqdn} slots={slots}\n" for fqdn in worker_fqdns(mpijob))


def discover_hosts(mpijob: Mapping[str, Any], running_pods: Iterable[str]) -> str:
    """The operator's /etc/mpi/discover_hosts.sh listing `running_pods` (pod names, any order)."""
    name, namespace, _, _ = _job(mpijob)
    lines = ["#!/bin/sh\n"]
    lines += [f"echo {pod_fqdn(pod, name, namespace)}\n" for pod in sorted(running_pods)]
    return "".join(lines)


def launcher_env(mpijob: Mapping[str, Any]) -> list[dict[str, str]]:
    """The variables the operator appends to the launcher container's env (OpenMPI, launcher not a worker)."""
    _, _, _, slots = _job(mpijob)
    return [
        {"name": "K_MPI_JOB_ROLE", "value": "launcher"},
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
        {"name": "OMPI_MCA_orte_default_hostfile", "value": HOSTFILE_PATH},
        {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
        {"name": "OMPI_MCA_orte_set_default_slots", "value": str(slots)},
        # Emptied so the launcher never claims a GPU (nvidiaDisableEnvVars).
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": ""},
    ]


WORKER_ENV = ({"name": "K_MPI_JOB_ROLE", "value": "worker"},)


def container_env(container: Mapping[str, Any], added: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """A container's environment as the kubelet builds it: its `env` list, then what the operator appended
    (later entries win, as for duplicate names in a pod spec). Only literal `value`s are supported."""
    env: dict[str, str] = {}
    for item in [*container.get("env", []), *added]:
        if "valueFrom" in item:
            raise ValueError(f"env {item['name']}: valueFrom is not supported by the local executor")
        env[item["name"]] = item.get("value", "")
    return env
