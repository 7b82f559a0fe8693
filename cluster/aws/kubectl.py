"""The few cluster reads and writes the AWS backend needs, through `kubectl` (no client library to pin),
plus the pure functions that interpret what kubectl returns."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cluster.backend import BackendError

KUBECTL_HINT = ("install kubectl (https://kubernetes.io/docs/tasks/tools/) and the AWS CLI "
                "(its kubeconfig runs `aws eks get-token`)")


class Kubectl:
    def __init__(self, kubeconfig: Path, *, binary: str = "kubectl", request_timeout_s: float = 60):
        path = shutil.which(binary)
        if path is None:
            raise BackendError(f"`{binary}` is not on PATH: {KUBECTL_HINT}")
        self.binary = path
        self.kubeconfig = Path(kubeconfig)
        self.request_timeout_s = request_timeout_s
        self._streams: set[subprocess.Popen] = set()   # live `logs -f` processes (close_streams)
        self._closed: set[subprocess.Popen] = set()    # ... those close_streams ended: no error then

    def _base(self) -> list[str]:
        return [self.binary, "--kubeconfig", str(self.kubeconfig)]

    def run(self, *args: str, stdin: str | None = None, timeout_s: float | None = None) -> str:
        """kubectl's stdout; BackendError with kubectl's own message when it exits non-zero."""
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        try:
            proc = subprocess.run([*self._base(), *args], input=stdin, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise BackendError(f"kubectl {' '.join(args[:2])} did not answer within "
                               f"{timeout_s:g} s: is the cluster endpoint reachable from here?"
                               ) from None
        if proc.returncode != 0:
            detail = proc.stderr.strip() or proc.stdout.strip()
            raise BackendError(f"kubectl {' '.join(args[:3])} failed: {detail}")
        return proc.stdout

    def get_json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.run("get", *args, "-o", "json"))

    def get_optional(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        """One object, or None where it does not exist (`--ignore-not-found` prints nothing then)."""
        out = self.run("get", kind, name, "-n", namespace, "--ignore-not-found", "-o", "json")
        return json.loads(out) if out.strip() else None

    def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """The applied object as the API server stored it (its uid included)."""
        return json.loads(self.run("apply", "-f", "-", "-o", "json", stdin=json.dumps(manifest)))

    def follow_logs(self, namespace: str, pod: str, container: str,
                    since_time: str | None = None) -> Iterator[str]:
        """Lines of `kubectl logs -f` of one pod's container until the stream ends (or the caller stops).

        Only stdout is log text: kubectl's own errors go to stderr (kubectl/pkg/cmd/logs), and a non-zero
        exit raises LogStreamError with them once the lines are read. A stream can also end early with
        exit 0 (kubernetes/kubectl#1373: an idle or rotated stream is closed by the kubelet), so its end
        says nothing about the container's: callers check the pod."""
        args = ["logs", "-f", "-n", namespace, pod, "-c", container]
        if since_time:
            args.append(f"--since-time={since_time}")
        with tempfile.TemporaryFile(mode="w+") as errors:
            proc = subprocess.Popen([*self._base(), *args], stdout=subprocess.PIPE, stderr=errors, text=True)
            self._streams.add(proc)
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    yield line.rstrip("\n")
                rc = proc.wait(timeout=self.request_timeout_s)
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout=10)
                self._streams.discard(proc)
            if rc != 0 and proc not in self._closed:
                errors.seek(0)
                raise LogStreamError(f"kubectl logs -f {pod} exited {rc}: "
                                     f"{errors.read().strip() or '(no message)'}")


    def close_streams(self) -> None:
        """End every `logs -f` still open (from another thread: its reader sees the end of the stream)."""
        for proc in list(self._streams):
            if proc.poll() is None:
                self._closed.add(proc)
                proc.terminate()


class LogStreamError(BackendError):
    """`kubectl logs -f` ended with an error (its stderr in the message): the stream, not the job."""


# ---------------------------------------------------------------------------------------------
# Interpreting kubectl's JSON (pure)
# ---------------------------------------------------------------------------------------------


def mpijob_state(mpijob: Mapping[str, Any]) -> tuple[str, str]:
    """(state, message) of an MPIJob from its status conditions: Succeeded, Failed, Running or Pending."""
    conditions = {c.get("type"): c for c in (mpijob.get("status") or {}).get("conditions") or []}
    for state in ("Succeeded", "Failed", "Running"):
        cond = conditions.get(state)
        if cond and cond.get("status") == "True":
            return state, str(cond.get("message") or cond.get("reason") or "")
    suspended = conditions.get("Suspended")
    if suspended and suspended.get("status") == "True":
        return "Pending", "suspended"
    return "Pending", ""


def ready_nodes(nodes: Mapping[str, Any], resources: Mapping[str, int] | None = None) -> int:
    """How many nodes of a `kubectl get nodes -o json` list are Ready, schedulable and, with `resources`,
    advertise at least that much of each extended resource as allocatable. A GPU node turns Ready
    before the NVIDIA and EFA device plugins register their resources (the kubelet reports them only
    once a plugin has), and a worker bound for it meanwhile is Unschedulable."""
    count = 0
    for node in nodes.get("items") or []:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        status = node.get("status") or {}
        allocatable = status.get("allocatable") or {}
        if any(_count(allocatable.get(name)) < need for name, need in (resources or {}).items()):
            continue
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                count += 1
                break
    return count


def _count(quantity: Any) -> int:
    try:
        return int(str(quantity))
    except ValueError:
        return 0


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def is_terminating(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def job_pods(pods: Mapping[str, Any], mpijob_uid: str, launcher_job: Mapping[str, Any] | None
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(launcher pods, worker pods) of the MPIJob whose uid is `mpijob_uid`, none Terminating.

    Selected by owner, not by name or label: a resubmitted job has the same name and labels, and the
    previous job's pods may still be Terminating. MPI Operator v0.8.2 (`newWorker`, `newLauncherJob`)
    makes the MPIJob the controller of its worker pods and of the batch Job `<name>-launcher`, whose
    pods the Job controller owns."""
    items = [p for p in pods.get("items") or [] if not is_terminating(p)]
    workers = [p for p in items if owned_by(p, mpijob_uid)]
    launchers: list[dict[str, Any]] = []
    if launcher_job is not None and owned_by(launcher_job, mpijob_uid):
        job_uid = (launcher_job.get("metadata") or {}).get("uid", "")
        launchers = [p for p in items if job_uid and owned_by(p, job_uid)]
    return launchers, workers


def pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


def pod_phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


# Container waiting reasons that do not resolve by waiting (kubelet: images.ErrImagePull,
# ImagePullBackOff, InvalidImageName, ErrImageNeverPull; kuberuntime CreateContainerConfigError,
# CreateContainerError; CrashLoopBackOff after repeated failed starts).
FATAL_WAITING_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                         "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff")


def is_unschedulable(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable" for c in conditions)


def pod_problem(pod: Mapping[str, Any]) -> str | None:
    """Why `pod` will not start, or None while it may still: one line naming the pod and the reason (pure).

    - Unschedulable: the scheduler set PodScheduled=False with reason Unschedulable (its message says
      which resource or rule no node satisfies; kubernetes.io/docs Pod Lifecycle, "Pod conditions").
      The backend waits for nodes that advertise the GPUs and EFA interfaces first (ready_nodes), so
      this is not the device plugins' start-up;
    - a failed init container (the self-test): a terminated state, current or last, with a non-zero exit;
    - an image that cannot be pulled, a container that cannot be created or keeps crashing;
    - a pod that Failed (e.g. evicted) before the job ran."""
    name = pod_name(pod)
    status = pod.get("status") or {}
    if is_unschedulable(pod):
        message = next(c.get("message") for c in status["conditions"] if c.get("type") == "PodScheduled")
        return f"pod {name} cannot be scheduled: {message or 'Unschedulable'}"
    for init in status.get("initContainerStatuses") or []:
        for state in (init.get("state") or {}, init.get("lastState") or {}):
            term = state.get("terminated")
            if term and int(term.get("exitCode", 0)) != 0:
                detail = term.get("message") or term.get("reason") or ""
                return (f"pod {name}: init container {init.get('name')} failed with exit code "
                        f"{term.get('exitCode')}" + (f" ({detail})" if detail else ""))
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING_REASONS:
            detail = waiting.get("message") or ""
            return (f"pod {name}: container {container.get('name')} {waiting['reason']}"
                    + (f": {detail}" if detail else ""))
    if status.get("phase") == "Failed":
        detail = status.get("message") or status.get("reason") or "no reason given"
        return f"pod {name} failed before the job started: {detail}"
    return None


def pending_reason(pod: Mapping[str, Any]) -> str:
    """What a pod that has not started is waiting for, from its conditions and containers (pure)."""
    status = pod.get("status") or {}
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return f"container {container.get('name')} waiting: {waiting.get('reason', '?')}"
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and (cond.get("reason") or cond.get("message")):
            return f"{cond.get('type')}: {cond.get('reason', '')} {cond.get('message', '')}".strip()
    return f"phase {status.get('phase', 'Pending')}"


def pod_nodes(pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each scheduled pod's node (pure): spec.nodeName, which the scheduler sets when it binds the pod
    (Kubernetes PodSpec: "NodeName indicates in which node this pod is scheduled")."""
    return {pod_name(p): str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")}


def is_running(pod: Mapping[str, Any]) -> bool:
    return pod_phase(pod) in ("Running", "Succeeded", "Failed")


def launcher_exit_code(pods: Mapping[str, Any]) -> int | None:
    """Exit code of the most recent terminated launcher container, or None while none has ended."""
    latest: tuple[str, int] | None = None
    for pod in pods.get("items") or []:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (status.get("state") or {}).get("terminated")
            if term is None:
                continue
            finished = str(term.get("finishedAt") or "")
            if latest is None or finished >= latest[0]:
                latest = (finished, int(term.get("exitCode", 1)))
    return None if latest is None else latest[1]
