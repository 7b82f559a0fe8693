"""AwsBackend: the Backend interface over a Pulumi stack, an EKS cluster and the Kubeflow MPI Operator.

    up()        stack up (compute on), kubeconfig written 0600
    storage(j)  s3://<datasetsBucket>/datasets/<dataset>, s3://<checkpointsBucket>/checkpoints/<j>
    submit(job) scale the GPU node group to the job's hosts (EKS API; the stack ignores desiredSize
                changes, the cost guard scales idle groups back down), wait for Ready nodes, apply the
                rendered MPIJob
                (after deleting the previous MPIJob of that name and waiting until its pods are gone).
                Given several node groups (`--node-group a,b,c`), a group whose nodes are not Ready
                within the capacity timeout is scaled back and the next one is tried
                (cluster/aws/capacity.py); the log says where the job runs and at what price
    logs(h)     wait until the job has started, then follow the launcher's output; fails at once,
                naming the pod and the reason, when a pod cannot be scheduled, its self-test (init
                container) fails, its image cannot be pulled, or pods are still Pending at the
                startup deadline (the operator fails an MPIJob only for a failed launcher or evicted
                workers: mpi-operator v0.8.2 mpi_job_controller.go updateMPIJobStatus)
    wait(h)     poll the MPIJob's conditions; the job's exit code from the launcher pod's exit code and
                log, read again once it ended, through cluster.exit_codes (the mapping the local
                executor uses: a reclaimed worker's 75 comes back as 75, so `run` resubmits), the
                trainer's summary from the log
    cancel(h)   delete the MPIJob (a timeout or an interrupt ends the job on the cluster too)
    The job's pods are those the MPIJob's uid owns, never a Terminating pod of an earlier job.
    down()      compute off (data stays): the teardown `run` guarantees

Needs the Pulumi CLI, AWS credentials, kubectl and the AWS CLI; each missing piece is one clear error.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cluster import mpi_operator
from cluster.backend import Backend, BackendError, JobHandle, JobResult, Storage
from cluster.exit_codes import failure_message, job_exit_code
from cluster.job import JobSpec
from cluster.mpijob import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    JOB_LABEL,
    LAUNCHER_CONTAINER,
    NODE_POOL_LABEL,
    SELFTEST_CONTAINER,
    SYSTEM_NODES,
    read_image_version,
    render_mpijob,
    worker_container,
    worker_hostnames,
    worker_nodes,
)
from infra.catalog import InstanceType, load_catalog
from infra.storage_layout import checkpoint_uri, dataset_uri
from train.metrics import metrics_from_log
from train.summary import last_summary

from .capacity import (
    CapacityWait,
    choose_groups,
    exhausted_message,
    fallback_message,
    node_wait_s,
    parse_node_groups,
    running_message,
)
from .kubectl import (
    Kubectl,
    LogStreamError,
    is_unschedulable,
    job_pods,
    launcher_exit_code,
    mpijob_state,
    owned_by,
    pending_reason,
    pod_name,
    pod_nodes,
    pod_phase,
    pod_problem,
    ready_nodes,
)
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
# From the scale-up of the node group the job gets (the last one tried) until it runs: nodes Ready, the
# previous job's pods gone, every pod scheduled, its image pulled, the self-test passed, the launcher
# started. Past it the job fails naming the pods still Pending. Spot capacity and a multi-GB image pull
# on fresh nodes take minutes, not half an hour.
STARTUP_TIMEOUT_S = 1800.0
LOG_RECONNECTS = 20           # `kubectl logs -f` streams opened again while the launcher runs
FINAL_LOG_LINES = 2000        # the launcher's log read once it ended: the summary and exit lines
# The preflight's floor as a share of the catalog's reference busbw (two such nodes, nccl-tests at
# 2 GiB, the size the trainer's preflight uses on GPUs). Half: NCCL fallen back to TCP, or EFA at a
# quarter of its bandwidth (skypilot issue 8391: ~20 GB/s on 2 x p4de where ~78 was expected), fail
# clearly; a healthy pair (its in-place and out-of-place runs a few GB/s apart in the reference) and
# Horovod's overhead on top of NCCL stay well clear of it.
PREFLIGHT_FLOOR_SHARE = 0.5


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


def busbw_floor(instance_types: Iterable[str], hosts: int,
                catalog: Mapping[str, InstanceType]) -> float | None:
    """The allreduce busbw (bytes/s) a job on these types must reach in its preflight (pure), or None
    (measure and report only): a single-node job (the reference is a two-node, network figure), or a
    type without a reference in the catalog. Several types (fallback groups, a group's types): the
    lowest, since the job may land on any of them."""
    types = list(instance_types)
    if hosts < 2 or not types:
        return None
    references = [catalog[t].allreduce_busbw_gbps if t in catalog else None for t in types]
    if any(r is None for r in references):
        return None
    return min(r for r in references if r is not None) * PREFLIGHT_FLOOR_SHARE * 1e9


def image_reference(outputs: StackOutputs, version: str) -> str:
    return f"{outputs.ecr_repository_url}:{version}"


def storage_for(outputs: StackOutputs, job_name: str, dataset: str | None) -> Storage:
    """The buckets, and the region for the clients that reach them. The pods get the region in their
    environment: with the node's IMDS hop limit 1 a pod cannot ask the instance for it, and boto3 reads
    AWS_DEFAULT_REGION (botocore configprovider), the other AWS SDKs and the CLI AWS_REGION."""
    region = outputs.region
    return Storage(
        dataset_uri=dataset_uri(outputs.datasets_bucket, dataset or job_name),
        checkpoint_uri=checkpoint_uri(outputs.checkpoints_bucket, job_name),
        env={"AWS_REGION": region, "AWS_DEFAULT_REGION": region},
    )


class AwsBackend(Backend):
    name = "aws"

    def __init__(
        self,
        stack: str,
        *,
        node_group: str | Sequence[str] | None = None,
        capacity_timeout_s: float | None = None,
        dataset: str | None = None,
        image: str | None = None,
        worker_memory: str | None = None,
        kubeconfig: Path | None = None,
        repo_root: Path = REPO_ROOT,
        ops_factory: Callable[[str], StackOps] = AutomationStack,
        kubectl_factory: Callable[[Path], Kubectl] = Kubectl,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        log: Callable[[str], Any] = print,
    ):
        self.stack = stack
        self.node_groups = parse_node_groups(node_group)   # in order of preference; (): the only one
        self.capacity_timeout_s = capacity_timeout_s
        self.dataset = dataset
        self.image = image
        self.worker_memory = worker_memory
        self.kubeconfig = Path(kubeconfig) if kubeconfig else default_kubeconfig_path(stack)
        self.repo_root = Path(repo_root)
        self._ops_factory = ops_factory
        self._kubectl_factory = kubectl_factory
        self.startup_timeout_s = startup_timeout_s
        self._log = log
        self._ops: StackOps | None = None
        self._outputs: StackOutputs | None = None
        self._kubectl: Kubectl | None = None
        self._scaled: dict[str, int] = {}   # node group -> its desired size before this backend scaled it

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

    def candidate_groups(self) -> tuple[NodeGroupOutput, ...]:
        """The node groups a job may run on, in the order tried; every one named must be in the stack."""
        outputs = self.outputs()
        outputs.require_compute()
        return choose_groups(self.node_groups, outputs.node_groups, self.stack)

    def preflight_floor(self, job: JobSpec) -> float | None:
        """The busbw floor for the job's node types (train/preflight.py; the flow passes it on as the
        trainer's --preflight-min-busbw)."""
        types = [t for g in self.candidate_groups() for t in g.instance_types]
        return busbw_floor(types, job.num_hosts, load_catalog().instance_types)

    def render(self, job: JobSpec, group: NodeGroupOutput | None = None) -> dict[str, Any]:
        """The MPIJob this backend would submit for `job` on `group` (default: the first candidate; no
        cluster access beyond the stack outputs)."""
        outputs = self.outputs()
        group = group or self.candidate_groups()[0]
        workers = worker_nodes(group.name, group.instance_types, group.capacity_type, group.efa_interfaces,
                               load_catalog().instance_types, memory_limit=self.worker_memory)
        image = self.image or image_reference(outputs, read_image_version(self.repo_root))
        return render_mpijob(with_metrics_lines(job), image=image, storage=self.storage(job.name),
                             namespace=str(outputs.training_namespace),
                             service_account=str(outputs.training_service_account),
                             workers=workers, launcher=SYSTEM_NODES)

    def submit(self, job: JobSpec) -> JobHandle:
        groups = self.candidate_groups()
        # All input checks before anything is scaled or applied: the manifest and size on every group.
        manifests = {g.name: self.render(job, g) for g in groups}
        outputs = self.outputs()
        eks = self._eks()
        sizes = {g.name: self._scaling(eks, outputs, g) for g in groups}
        for g in groups:
            check_fits_group(job, g, sizes[g.name].get("maxSize"))
        group, started = self._capacity(eks, outputs, groups, sizes, job, manifests)
        manifest = manifests[group.name]
        namespace = manifest["metadata"]["namespace"]
        # A resubmission (after exit 75) reuses the name: the operator never reruns a finished MPIJob,
        # so the old one goes first, with all its pods; the new one resumes from the checkpoints in S3.
        self._delete_job(job.name, namespace, deadline=started + self.startup_timeout_s)
        applied = self._k().apply(manifest)
        uid = str((applied.get("metadata") or {}).get("uid") or "")
        if not uid:
            raise BackendError(f"kubectl apply returned MPIJob {namespace}/{job.name} without a uid")
        self._log(f"submitted MPIJob {namespace}/{job.name} on node group {group.name}")
        hosts = worker_hostnames(job, namespace)
        # The node group's types and capacity type price the run's node-hours (cluster/run_cost.py).
        return JobHandle(name=job.name, backend=self.name,
                         details={"namespace": namespace, "uid": uid, "log": [], "hosts": hosts,
                                  "needed": nodes_needed(job), "startup_deadline": started +
                                  self.startup_timeout_s, "node_group": group.name,
                                  "instance_types": list(group.instance_types),
                                  "capacity_type": group.capacity_type})

    def logs(self, handle: JobHandle) -> Iterator[str]:
        """The launcher's output, once the job has started (BackendError naming the pod and the reason
        if it cannot); a stream that ends while the launcher still runs is opened again."""
        namespace = handle.details["namespace"]
        launcher = self._wait_for_start(handle)
        name = pod_name(launcher)
        since: str | None = None
        for reconnect in range(LOG_RECONNECTS + 1):
            cut_at = _utc_now()
            try:
                for line in self._k().follow_logs(namespace, name, LAUNCHER_CONTAINER, since_time=since):
                    handle.details.setdefault("log", []).append(line)
                    yield line
                    cut_at = _utc_now()
                problem = ""
            except LogStreamError as e:
                problem = str(e)
            if problem:   # kubectl's own error: said here, never taken for the job's output
                self._log(f"the log stream of {name} ended: {problem}")
            current = self._launcher(handle)
            if current is None or pod_phase(current) != "Running" or reconnect == LOG_RECONNECTS:
                return
            self._log(f"{name} still runs: following its log again")
            since = cut_at   # lines after the last one seen; kubectl's resolution is one second
            time.sleep(min(POLL_S, 1.0))

    def wait(self, handle: JobHandle, timeout_s: float | None = None) -> JobResult:
        namespace = handle.details["namespace"]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        started = False
        while True:
            mpijob = self._k().get_optional("mpijob", handle.name, namespace)
            if mpijob is None or (mpijob.get("metadata") or {}).get("uid") != handle.details["uid"]:
                raise BackendError(f"MPIJob {namespace}/{handle.name} was deleted while it ran")
            state, message = mpijob_state(mpijob)
            if state in ("Succeeded", "Failed"):
                break
            if not started:   # wait() without logs(): the same fail-fast checks until the job runs
                started = self._started(handle) is not None
            if deadline is not None and time.monotonic() >= deadline:
                raise BackendError(f"job {handle.name} still {state} after {timeout_s:g} s")
            time.sleep(POLL_S)
        launcher = self._launcher(handle)
        pods = {"items": [launcher] if launcher else []}
        final = self._final_log(handle, launcher)
        result = job_result(handle.name, state, message, launcher_exit_code(pods), final)
        # the metrics records: from the followed log, whole; the final one is its last lines only
        return dataclasses.replace(result, metrics=metrics_from_log(handle.details.get("log") or final))

    def progress(self, handle: JobHandle) -> dict[str, Any] | None:
        """The trainer's latest metrics record in the log followed so far (the flow's progress bar)."""
        return _latest_step(handle.details.get("log") or [])

    def cancel(self, handle: JobHandle) -> None:
        """End the job on the cluster: its MPIJob and pods are deleted (a timeout, an interrupt, an error)."""
        namespace = handle.details["namespace"]
        self._k().run("delete", "mpijob", handle.name, "-n", namespace, "--ignore-not-found", "--wait=false")
        self._k().close_streams()
        self._log(f"deleted MPIJob {namespace}/{handle.name}: its pods stop")

    def handle_for(self, job_name: str) -> JobHandle:
        """A handle on an MPIJob submitted earlier (`ringtrain logs`, `status --job`), from the object."""
        outputs = self.outputs()
        outputs.require_compute()
        namespace = str(outputs.training_namespace)
        mpijob = self._k().get_optional("mpijob", job_name, namespace)
        if mpijob is None:
            raise BackendError(f"no MPIJob {namespace}/{job_name}: submit it first (`ringtrain submit`)")
        spec = mpijob["spec"]
        workers = int(spec["mpiReplicaSpecs"]["Worker"]["replicas"])
        # A static job's launcher starts once every worker is Ready; an elastic one needs one to begin.
        needed = workers if spec.get("launcherCreationPolicy") != "AtStartup" else 1
        hosts = [mpi_operator.pod_fqdn(mpi_operator.worker_pod_name(job_name, i), job_name, namespace)
                 for i in range(workers)]
        return JobHandle(name=job_name, backend=self.name,
                         details={"namespace": namespace, "uid": mpijob["metadata"]["uid"], "log": [],
                                  "hosts": hosts, "needed": needed,
                                  "startup_deadline": time.monotonic() + self.startup_timeout_s})

    def job_status(self, job_name: str) -> dict[str, Any]:
        """State of a submitted MPIJob (Pending, Running, Succeeded, Failed) and its launcher's exit code."""
        handle = self.handle_for(job_name)
        namespace = handle.details["namespace"]
        state, message = mpijob_state(self._k().get_json("mpijob", job_name, "-n", namespace))
        launcher = self._launcher(handle)
        progress = None
        if launcher is not None:   # how far it got: the newest metrics record in its log's tail
            try:
                progress = _latest_step(self._k().run("logs", "-n", namespace, pod_name(launcher), "-c",
                                                      LAUNCHER_CONTAINER, "--tail=200").splitlines())
            except BackendError:
                progress = None
        return {"job": job_name, "namespace": namespace, "state": state, "message": message,
                "exitCode": launcher_exit_code({"items": [launcher] if launcher else []}),
                "progress": progress}

    def down(self) -> None:
        if self._ops is None:
            # Nothing was reached (no CLI, no credentials, bad stack name): nothing of ours to tear down.
            return
        stack_down(self._ops)
        self._outputs = None
        self._kubectl = None
        self._log(f"stack {self.stack}: compute down (data layer kept)")

    # -- steps --------------------------------------------------------------------------------

    @staticmethod
    def _eks() -> Any:
        import boto3

        return boto3.client("eks")

    def _scaling(self, eks: Any, outputs: StackOutputs, group: NodeGroupOutput) -> dict[str, Any]:
        if not group.eks_name:
            raise BackendError(
                f"stack {self.stack!r} does not export the EKS name of node group {group.name!r}")
        current = eks.describe_nodegroup(clusterName=outputs.cluster_name, nodegroupName=group.eks_name)
        return dict(current["nodegroup"]["scalingConfig"])

    def _capacity(self, eks: Any, outputs: StackOutputs, groups: Sequence[NodeGroupOutput],
                  sizes: dict[str, dict[str, Any]], job: JobSpec,
                  manifests: dict[str, dict[str, Any]]) -> tuple[NodeGroupOutput, float]:
        """The first group, in order, whose nodes are Ready in time, and when it was scaled; the others
        tried are scaled back. BackendError when none has them (each scaled back, nothing submitted)."""
        catalog = load_catalog().instance_types
        needed = nodes_needed(job)
        wait_s = node_wait_s(self.capacity_timeout_s, self.startup_timeout_s)
        waits: list[CapacityWait] = []
        for i, group in enumerate(groups):
            started = time.monotonic()
            self._scale(eks, outputs, group, sizes[group.name].get("desiredSize", 0), job.num_hosts)
            resources = _node_resources(manifests[group.name])
            ready = self._wait_for_nodes(group, needed, resources, started + wait_s)
            if ready >= needed:
                # A group an earlier attempt ran on is not needed now: its nodes would idle, billed.
                for other in groups:
                    if other.name != group.name and other.name in self._scaled:
                        self._scale_back(eks, outputs, other)
                self._log(running_message(group, job.num_hosts, waits, catalog))
                return group, started
            waits.append(CapacityWait(group.name, ready, needed, time.monotonic() - started,
                                      self._scale_back(eks, outputs, group)))
            if len(groups) == 1:
                raise BackendError(f"node group {group.name!r}: {ready} of {needed} nodes Ready with "
                                   f"{_describe(resources)} after {wait_s:g} s (spot capacity or quota?)"
                                   + _scaled_back(waits[-1]) + "; nothing was submitted")
            if i + 1 < len(groups):
                self._log(fallback_message(waits[-1], groups[i + 1], catalog, job.num_hosts))
        raise BackendError(exhausted_message(waits))

    def _scale(self, eks: Any, outputs: StackOutputs, group: NodeGroupOutput, before: int,
               hosts: int) -> None:
        if before < hosts:
            eks.update_nodegroup_config(clusterName=outputs.cluster_name, nodegroupName=group.eks_name,
                                        scalingConfig={"desiredSize": hosts})
            self._scaled.setdefault(group.name, before)
            self._log(f"node group {group.name}: desired size {before} -> {hosts}")

    def _scale_back(self, eks: Any, outputs: StackOutputs, group: NodeGroupOutput) -> int | None:
        """The group back at the desired size it had before this backend scaled it (None: not scaled)."""
        before = self._scaled.pop(group.name, None)
        if before is not None:
            eks.update_nodegroup_config(clusterName=outputs.cluster_name, nodegroupName=group.eks_name,
                                        scalingConfig={"desiredSize": before})
            self._log(f"node group {group.name}: desired size back to {before}")
        return before

    def _wait_for_nodes(self, group: NodeGroupOutput, needed: int, resources: dict[str, int],
                        deadline: float) -> int:
        """Ready nodes of the group once `needed` are, or at the deadline (then fewer)."""
        while True:
            nodes = self._k().get_json("nodes", "-l", f"{NODE_POOL_LABEL}={group.name}")
            ready = ready_nodes(nodes, resources)
            if ready >= needed or time.monotonic() >= deadline:
                return ready
            self._log(f"node group {group.name}: {ready}/{needed} nodes Ready")
            time.sleep(POLL_S)

    def _delete_job(self, name: str, namespace: str, deadline: float) -> None:
        """Delete the previous MPIJob of this name and wait until every pod of it is gone.

        Foreground cascade: the API server keeps the MPIJob (deletionTimestamp, finalizer
        foregroundDeletion) until the garbage collector has deleted every dependent whose owner reference
        has blockOwnerDeletion, as the operator's controller references do (the worker pods, the launcher
        Job and its pod), and `--wait` returns once the MPIJob is gone (kubernetes.io/docs "Garbage
        Collection" and "Use Cascading Deletion in a Cluster"; kubectl delete --help). kubectl's default,
        background, removes the MPIJob at once and leaves its pods Terminating while the next one
        starts. The pods are then checked by label, for one that lost its owner or a timed-out wait."""
        left = max(1.0, deadline - time.monotonic())
        self._k().run("delete", "mpijob", name, "-n", namespace, "--ignore-not-found",
                      "--cascade=foreground", "--wait=true", f"--timeout={int(left)}s",
                      timeout_s=left + 30)
        while True:
            pods = self._k().get_json("pods", "-n", namespace, "-l", f"{JOB_LABEL}={name}")
            names = [pod_name(p) for p in pods.get("items") or []]
            if not names:
                return
            if time.monotonic() >= deadline:
                raise BackendError(f"the previous pods of job {name!r} ({', '.join(names)}) are still "
                                   f"terminating after {self.startup_timeout_s:g} s; nothing was submitted")
            time.sleep(POLL_S)

    def _pods(self, handle: JobHandle) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        namespace = handle.details["namespace"]
        pods = self._k().get_json("pods", "-n", namespace, "-l", f"{JOB_LABEL}={handle.name}")
        launcher_job = handle.details.get("launcher_job")
        if launcher_job is None:   # created by the operator, maybe later; the same object for the job's life
            name = mpi_operator.launcher_pod_name(handle.name)
            launcher_job = self._k().get_optional("job", name, namespace)
            if launcher_job is not None and owned_by(launcher_job, handle.details["uid"]):
                handle.details["launcher_job"] = launcher_job
        return job_pods(pods, handle.details["uid"], launcher_job)

    def _launcher(self, handle: JobHandle) -> dict[str, Any] | None:
        launchers, _ = self._pods(handle)
        return launchers[-1] if launchers else None

    def _started(self, handle: JobHandle) -> dict[str, Any] | None:
        """The launcher pod once the job has started (launcher running or done, with the workers it
        needs running); None before. BackendError as soon as a pod cannot start (kubectl.pod_problem)
        or the startup deadline has passed with pods still Pending."""
        launchers, workers = self._pods(handle)
        launcher = launchers[-1] if launchers else None
        handle.details.setdefault("nodes", {}).update(pod_nodes(workers))
        running = sum(1 for w in workers if pod_phase(w) == "Running")
        phase = pod_phase(launcher) if launcher is not None else None
        if phase in ("Succeeded", "Failed") or (phase == "Running" and running >= handle.details["needed"]):
            return launcher
        # An elastic job needs only `needed` workers: the others may wait for nodes still coming.
        spare = len(handle.details["hosts"]) - handle.details["needed"]
        unschedulable = [p for p in workers if is_unschedulable(p)]
        for pod in [*workers, *launchers]:
            problem = pod_problem(pod)
            if problem and not (pod in unschedulable and len(unschedulable) <= spare):
                raise BackendError(f"job {handle.name} cannot start: {problem}"
                                   + self._init_log(handle, pod, problem))
        if time.monotonic() >= handle.details["startup_deadline"]:
            waiting = [f"{pod_name(p)} ({pending_reason(p)})" for p in [*workers, *launchers]
                       if pod_phase(p) == "Pending"] or ["the launcher was not created"]
            raise BackendError(f"job {handle.name} did not start within {self.startup_timeout_s:g} s: "
                               f"{'; '.join(waiting)}")
        return None

    def _init_log(self, handle: JobHandle, pod: dict[str, Any], problem: str) -> str:
        """The failed self-test's last lines, which say what it found missing."""
        if ": init container " not in problem:
            return ""
        try:
            tail = self._k().run("logs", "-n", handle.details["namespace"], pod_name(pod), "-c",
                                 SELFTEST_CONTAINER, "--tail=20", "--previous=false")
        except BackendError:
            return ""
        lines = [ln for ln in tail.splitlines() if ln.strip()]
        return "".join(f"\n  | {ln}" for ln in lines)

    def _wait_for_start(self, handle: JobHandle) -> dict[str, Any]:
        while True:
            launcher = self._started(handle)
            if launcher is not None:
                return launcher
            time.sleep(POLL_S)

    def _final_log(self, handle: JobHandle, launcher: dict[str, Any] | None) -> list[str]:
        """The launcher's log read again once it ended: a followed stream may have been cut, and its
        end must not decide the exit code. The followed lines where the pod is already gone."""
        if launcher is not None:
            try:
                text = self._k().run("logs", "-n", handle.details["namespace"], pod_name(launcher), "-c",
                                     LAUNCHER_CONTAINER, f"--tail={FINAL_LOG_LINES}")
                return text.splitlines()
            except BackendError as e:
                self._log(f"could not read the launcher's final log ({e}); using the followed lines")
        return list(handle.details.get("log") or [])


def with_metrics_lines(job: JobSpec) -> JobSpec:
    """The job with the trainer's --metrics-lines (pure): on EKS the launcher's log is all that comes
    back, so the metrics records ride in it (train/metrics.py) and the flow draws the same report."""
    metrics = dataclasses.replace(job.trainer.metrics, lines=True)
    return dataclasses.replace(job, trainer=dataclasses.replace(job.trainer, metrics=metrics))


def _latest_step(lines: list[str]) -> dict[str, Any] | None:
    records = [r for r in metrics_from_log(lines[-200:]) if "loss" in r]
    return records[-1] if records else None


def _node_resources(manifest: dict[str, Any]) -> dict[str, int]:
    """The extended resources (GPUs, EFA) one worker requests: a node must advertise them first."""
    requests = worker_container(manifest)["resources"]["requests"]
    return {k: int(v) for k, v in requests.items() if k in (GPU_RESOURCE, EFA_RESOURCE)}


def _describe(resources: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in resources.items()) or "no extended resources"


def _scaled_back(wait: CapacityWait) -> str:
    return "" if wait.scaled_back_to is None else f"; scaled back to {wait.scaled_back_to}"


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
