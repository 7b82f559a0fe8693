"""AwsBackend: the Backend interface over a Pulumi stack, an EKS cluster and the Kubeflow MPI Operator.

    up()        stack up (compute on), kubeconfig written 0600
    storage(j)  s3://<datasetsBucket>/datasets/<dataset>, s3://<checkpointsBucket>/checkpoints/<j>
    submit(job) scale the GPU node group to the job's hosts (EKS API; the stack ignores desiredSize
                changes, the cost guard scales idle groups back down), wait for Ready nodes, apply the
                rendered MPIJob
    logs(h)     follow the launcher's output
    wait(h)     poll the MPIJob's conditions; the job's exit code from the launcher pod's exit code and
                log through cluster.exit_codes (the mapping the local executor uses: a reclaimed
                worker's 75 comes back as 75, so `run` resubmits), the trainer's summary from the log
    down()      compute off (data stays): the teardown `run` guarantees

Needs the Pulumi CLI, AWS credentials, kubectl and the AWS CLI; each missing piece is one clear error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cluster.backend import Backend, BackendError, JobHandle, JobResult, Storage
from cluster.exit_codes import failure_message, job_exit_code
from cluster.job import JobSpec
from cluster.mpijob import (
    JOB_LABEL,
    NODE_POOL_LABEL,
    ROLE_LABEL,
    SYSTEM_NODES,
    read_image_version,
    render_mpijob,
    worker_hostnames,
    worker_nodes,
)
from infra.storage_layout import checkpoint_uri, dataset_uri
from train.summary import last_summary

from .kubectl import Kubectl, launcher_exit_code, mpijob_state, ready_nodes
from .outputs import NodeGroupOutput, StackOutputs, parse_outputs
from .stack import (
    REPO_ROOT,
    AutomationStack,
    StackOps,
    default_kubeconfig_path,
    require_aws_credentials,
    stack_down,
    stack_up,
    write_kubeconfig,
)

POLL_S = 10.0


def nodes_needed(job: JobSpec) -> int:
    """Ready nodes before the job can start: all hosts for a static job, min_hosts for an elastic one."""
    if job.elastic:
        return job.min_hosts if job.min_hosts is not None else 1
    return job.num_hosts


def check_fits_group(job: JobSpec, group: NodeGroupOutput, max_size: int | None) -> None:
    if max_size is not None and job.num_hosts > max_size:
        raise BackendError(f"job {job.name!r} needs {job.num_hosts} hosts but node group {group.name!r} "
                           f"has maxSize {max_size}: allowed are 1..{max_size} "
                           "(raise maxSize in the stack config)")


def image_reference(outputs: StackOutputs, version: str) -> str:
    return f"{outputs.ecr_repository_url}:{version}"


def storage_for(outputs: StackOutputs, job_name: str, dataset: str | None) -> Storage:
    return Storage(
        dataset_uri=dataset_uri(outputs.datasets_bucket, dataset or job_name),
        checkpoint_uri=checkpoint_uri(outputs.checkpoints_bucket, job_name),
    )


class AwsBackend(Backend):
    name = "aws"

    def __init__(
        self,
        stack: str,
        *,
        node_group: str | None = None,
        dataset: str | None = None,
        image: str | None = None,
        worker_memory: str | None = None,
        kubeconfig: Path | None = None,
        repo_root: Path = REPO_ROOT,
        ops_factory: Callable[[str], StackOps] = AutomationStack,
        kubectl_factory: Callable[[Path], Kubectl] = Kubectl,
        node_timeout_s: float = 1800.0,
        log: Callable[[str], Any] = print,
    ):
        self.stack = stack
        self.node_group = node_group
        self.dataset = dataset
        self.image = image
        self.worker_memory = worker_memory
        self.kubeconfig = Path(kubeconfig) if kubeconfig else default_kubeconfig_path(stack)
        self.repo_root = Path(repo_root)
        self._ops_factory = ops_factory
        self._kubectl_factory = kubectl_factory
        self.node_timeout_s = node_timeout_s
        self._log = log
        self._ops: StackOps | None = None
        self._outputs: StackOutputs | None = None
        self._kubectl: Kubectl | None = None

    # -- plumbing -----------------------------------------------------------------------------

    def _stack_ops(self) -> StackOps:
        if self._ops is None:
            self._ops = self._ops_factory(self.stack)
        return self._ops

    def outputs(self) -> StackOutputs:
        if self._outputs is None:
            self._outputs = parse_outputs(self.stack, self._stack_ops().outputs())
        return self._outputs

    def _k(self) -> Kubectl:
        if self._kubectl is None:
            # Rewritten from the current outputs: a cluster recreated by down/up has a new endpoint and CA.
            outputs = self._stack_ops().outputs()
            if outputs.get("kubeconfig") or not self.kubeconfig.exists():
                write_kubeconfig(outputs, self.kubeconfig, stack=self.stack)
            self._kubectl = self._kubectl_factory(self.kubeconfig)
        return self._kubectl

    # -- Backend ------------------------------------------------------------------------------

    def up(self) -> None:
        require_aws_credentials()
        raw = stack_up(self._stack_ops())
        self._outputs = parse_outputs(self.stack, raw)
        self._outputs.require_compute()
        write_kubeconfig(raw, self.kubeconfig, stack=self.stack)
        self._log(f"stack {self.stack}: compute up; kubeconfig {self.kubeconfig} (mode 0600)")

    def storage(self, job_name: str) -> Storage:
        return storage_for(self.outputs(), job_name, self.dataset)

    def render(self, job: JobSpec) -> dict[str, Any]:
        """The MPIJob this backend would submit for `job` (no cluster access beyond the stack outputs)."""
        from infra.catalog import load_catalog

        outputs = self.outputs()
        outputs.require_compute()
        group = outputs.node_group(self.node_group)
        workers = worker_nodes(group.name, group.instance_types, group.capacity_type, group.efa_interfaces,
                               load_catalog().instance_types, memory_limit=self.worker_memory)
        image = self.image or image_reference(outputs, read_image_version(self.repo_root))
        return render_mpijob(job, image=image, storage=self.storage(job.name),
                             namespace=str(outputs.training_namespace),
                             service_account=str(outputs.training_service_account),
                             workers=workers, launcher=SYSTEM_NODES)

    def submit(self, job: JobSpec) -> JobHandle:
        manifest = self.render(job)   # all input checks before anything is scaled or applied
        outputs = self.outputs()
        group = outputs.node_group(self.node_group)
        self._scale(outputs, group, job)
        self._wait_for_nodes(group, nodes_needed(job))
        namespace = manifest["metadata"]["namespace"]
        # A resubmission (after exit 75) reuses the name: the operator never reruns a finished MPIJob,
        # so the old one goes first; the new one resumes from the checkpoints in S3.
        self._k().run("delete", "mpijob", job.name, "-n", namespace, "--ignore-not-found", "--wait=true")
        self._k().apply(manifest)
        self._log(f"submitted MPIJob {namespace}/{job.name} on node group {group.name}")
        hosts = worker_hostnames(job, namespace)
        # The node group's types and capacity type price the run's node-hours (cluster/run_cost.py).
        return JobHandle(name=job.name, backend=self.name,
                         details={"namespace": namespace, "log": [], "hosts": hosts,
                                  "node_group": group.name, "instance_types": list(group.instance_types),
                                  "capacity_type": group.capacity_type})

    def logs(self, handle: JobHandle) -> Iterator[str]:
        namespace = handle.details["namespace"]
        self._wait_for_launcher(handle)
        for line in self._k().follow_logs(namespace, f"job/{handle.name}-launcher"):
            handle.details.setdefault("log", []).append(line)
            yield line

    def wait(self, handle: JobHandle, timeout_s: float | None = None) -> JobResult:
        namespace = handle.details["namespace"]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            state, message = mpijob_state(self._k().get_json("mpijob", handle.name, "-n", namespace))
            if state in ("Succeeded", "Failed"):
                break
            if deadline is not None and time.monotonic() >= deadline:
                return JobResult(name=handle.name, succeeded=False, exit_code=None,
                                 message=f"MPIJob still {state} after {timeout_s:g} s")
            time.sleep(POLL_S)
        pods = self._k().get_json("pods", "-n", namespace, "-l",
                                  _launcher_selector(handle.name))
        log = handle.details.get("log") or self._k().run(
            "logs", "-n", namespace, f"job/{handle.name}-launcher", "--tail=500").splitlines()
        return job_result(handle.name, state, message, launcher_exit_code(pods), log)

    def job_status(self, job_name: str) -> dict[str, Any]:
        """State of a submitted MPIJob (Pending, Running, Succeeded, Failed) and its launcher's exit code."""
        outputs = self.outputs()
        outputs.require_compute()
        namespace = str(outputs.training_namespace)
        state, message = mpijob_state(self._k().get_json("mpijob", job_name, "-n", namespace))
        pods = self._k().get_json("pods", "-n", namespace, "-l", _launcher_selector(job_name))
        return {"job": job_name, "namespace": namespace, "state": state, "message": message,
                "exitCode": launcher_exit_code(pods)}

    def down(self) -> None:
        if self._ops is None:
            # Nothing was reached (no CLI, no credentials, bad stack name): nothing of ours to tear down.
            return
        stack_down(self._ops)
        self._outputs = None
        self._kubectl = None
        self._log(f"stack {self.stack}: compute down (data layer kept)")

    # -- steps --------------------------------------------------------------------------------

    def _scale(self, outputs: StackOutputs, group: NodeGroupOutput, job: JobSpec) -> None:
        import boto3

        if not group.eks_name:
            raise BackendError(
                f"stack {self.stack!r} does not export the EKS name of node group {group.name!r}")
        eks = boto3.client("eks")
        current = eks.describe_nodegroup(clusterName=outputs.cluster_name, nodegroupName=group.eks_name)
        scaling = current["nodegroup"]["scalingConfig"]
        check_fits_group(job, group, scaling.get("maxSize"))
        if scaling.get("desiredSize", 0) < job.num_hosts:
            eks.update_nodegroup_config(clusterName=outputs.cluster_name, nodegroupName=group.eks_name,
                                        scalingConfig={"desiredSize": job.num_hosts})
            before = scaling.get("desiredSize", 0)
            self._log(f"node group {group.name}: desired size {before} -> {job.num_hosts}")

    def _wait_for_nodes(self, group: NodeGroupOutput, needed: int) -> None:
        deadline = time.monotonic() + self.node_timeout_s
        while True:
            ready = ready_nodes(self._k().get_json("nodes", "-l", f"{NODE_POOL_LABEL}={group.name}"))
            if ready >= needed:
                return
            if time.monotonic() >= deadline:
                raise BackendError(f"node group {group.name!r}: {ready} of {needed} nodes Ready after "
                                   f"{self.node_timeout_s:g} s (spot capacity or quota?); "
                                   "nothing was submitted")
            self._log(f"node group {group.name}: {ready}/{needed} nodes Ready")
            time.sleep(POLL_S)

    def _wait_for_launcher(self, handle: JobHandle) -> None:
        namespace = handle.details["namespace"]
        deadline = time.monotonic() + self.node_timeout_s
        while time.monotonic() < deadline:
            pods = self._k().get_json("pods", "-n", namespace, "-l",
                                      _launcher_selector(handle.name))
            for pod in pods.get("items") or []:
                if (pod.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed"):
                    return
            time.sleep(POLL_S)
        raise BackendError(f"the launcher of {handle.name!r} did not start within {self.node_timeout_s:g} s")


def _launcher_selector(job_name: str) -> str:
    # The labels render_mpijob puts on the launcher's pod template (the operator keeps template labels).
    return f"{JOB_LABEL}={job_name},{ROLE_LABEL}=launcher"


def job_result(name: str, state: str, message: str, launcher_rc: int | None, log: list[str]) -> JobResult:
    """The finished MPIJob's result (pure): its exit code through the shared mapping, so a job whose
    workers stopped on a spot reclaim after a checkpoint reads 75 although horovodrun exited 1."""
    code = job_exit_code(launcher_rc, log)
    if code is None:
        code = 0 if state == "Succeeded" else 1   # the launcher pod is gone (TTL): trust the condition
    if code != 0:
        message = failure_message(code, log) + (f" (MPIJob: {message})" if message else "")
    return JobResult(name=name, succeeded=code == 0, exit_code=code, summary=last_summary(log),
                     message="" if code == 0 else message)
