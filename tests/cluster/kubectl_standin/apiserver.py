"""The stand-in's cluster: state on disk, the objects derived from it at a moment, and kubectl's verbs.

Every `kubectl` invocation is a process that locks the state file, derives the cluster at the current
time from each MPIJob's apply time and JobScript (cluster state is a function of time, so concurrent
callers agree), answers, and records its argv. See __init__.py for what is reproduced and from where.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import mpi_operator

STATE_ENV = "KUBECTL_STANDIN_STATE"
MPIJOB_API = "kubeflow.org/v2beta1"
# The operator's labels on the pods it creates (v2beta1 constants.go) beside the template's own.
OPERATOR_LABELS = {"training.kubeflow.org/operator-name": "mpi-operator"}
LAUNCHER_START_S = 0.05      # launcher pod Pending (ContainerCreating) this long after its Job is created
FOLLOW_LIMIT_S = 300.0       # a `logs -f` never outlives this (tests are bounded)


@dataclass
class JobScript:
    """What one applied MPIJob does. Times are seconds after the apply."""

    log: list[str] = field(default_factory=list)  # the launcher's output, one line per `line_s`
    exit_code: int = 0                   # the launcher container's exit code
    line_s: float = 0.02
    start_s: float = 0.1                 # workers scheduled, self-tested and Ready after this
    unschedulable_workers: list[int] = field(default_factory=list)  # never scheduled (PodScheduled=False)
    unschedulable_message: str = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    init_failure: dict[str, Any] | None = None   # worker 0's self-test: {"exit_code": 1, "log": [...]}
    image_pull_error: str | None = None  # worker 0's image cannot be pulled (ImagePullBackOff, this message)
    cut_after_lines: int | None = None   # the first `logs -f` of the launcher is cut after this many lines
    cut_rc: int = 1                      # ... and kubectl exits so ("error: unexpected EOF" on stderr)
    terminating_s: float = 0.0           # once deleted, its pods stay Terminating this long

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _parse_rfc3339(text: str) -> float:
    import calendar

    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


class Store:
    """The state file (JSON) under an exclusive lock."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / "state.json"
        self.lock_path = self.root / "state.lock"
        if not self.path.exists():
            self.path.write_text(json.dumps({"nodes": [], "scripts": [], "mpijobs": [], "calls": []}))

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.path.read_text())
            yield state
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.path)

    def read(self) -> dict[str, Any]:
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)
            return json.loads(self.path.read_text())

    def world(self, now: float | None = None) -> World:
        return World(self.read(), time.time() if now is None else now)


class Job:
    """One applied MPIJob and everything the operator, the scheduler and the kubelet make of it."""

    def __init__(self, record: dict[str, Any], now: float, nodes: list[dict[str, Any]] | None = None):
        self.r = record
        self.s = JobScript(**record["script"])
        self.now = now
        m = record["manifest"]
        self.name, self.namespace = m["metadata"]["name"], m["metadata"]["namespace"]
        spec = m["spec"]
        self.replicas = int(spec["mpiReplicaSpecs"]["Worker"]["replicas"])
        self.at_startup = spec.get("launcherCreationPolicy") == "AtStartup"
        self.worker_policy = spec["mpiReplicaSpecs"]["Worker"].get("restartPolicy", "Never")
        self.clean_running = spec.get("runPolicy", {}).get("cleanPodPolicy", "Running") in ("Running", "All")
        # The scheduler: worker i on the i-th Ready node its node affinity allows, by labels (In) and by
        # name (the cluster's nodes, or made-up ones where the test added none); a worker with no node
        # left is Unschedulable.
        template = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
        pool = [n["metadata"]["name"] for n in nodes or [] if _schedulable(n, template)] if nodes else \
            [f"ip-10-0-1-{k + 10}.ec2.internal" for k in range(self.replicas)]
        self.placement = [n for n in pool if n not in _names_excluded(template)]
        t0 = record["t0"]
        self.valid = _valid_name(self.name, self.replicas)
        blocked = (self.s.unschedulable_workers or self.s.init_failure or self.s.image_pull_error
                   or len(self.placement) < self.replicas)
        self.ready_at = None if blocked or not self.valid else t0 + self.s.start_s
        self.job_created = (t0 if self.at_startup else self.ready_at) if self.valid else None
        self.running_at = None if self.job_created is None else self.job_created + LAUNCHER_START_S
        self.ended_at = None if self.running_at is None else \
            self.running_at + (len(self.s.log) + 1) * self.s.line_s
        self.deleted_at = record.get("deleted_at")
        self.pods_gone_at = None if self.deleted_at is None else self.deleted_at + self.s.terminating_s
        # Statuses freeze at deletion (the pods are being killed; the stand-in does not run them on).
        self.t = now if self.deleted_at is None else min(now, self.deleted_at)

    # -- objects -------------------------------------------------------------------------------
    def _owner_gone(self) -> bool:
        """Background cascade: the MPIJob and (by the garbage collector, which deletes dependents in
        the background too) its launcher Job go at once; foreground: once the pods are gone."""
        if self.deleted_at is None:
            return False
        gone = self.deleted_at if self.r.get("cascade") != "foreground" else self.pods_gone_at
        return self.now >= gone

    def mpijob(self) -> dict[str, Any] | None:
        if self._owner_gone():
            return None
        obj = json.loads(json.dumps(self.r["manifest"]))
        obj["metadata"].update(uid=self.r["uid"], creationTimestamp=_rfc3339(self.r["t0"]))
        if self.deleted_at is not None:
            obj["metadata"]["deletionTimestamp"] = _rfc3339(self.deleted_at)
            obj["metadata"]["finalizers"] = ["foregroundDeletion"]
        conditions = []
        if self.valid:
            conditions.append(_cond("Created", f"MPIJob {self.namespace}/{self.name} is created."))
        if self.running_at is not None and self.t >= self.running_at and \
                (self.ended_at is None or self.t < self.ended_at):
            conditions.append(_cond("Running", f"MPIJob {self.namespace}/{self.name} is running."))
        if self.ended_at is not None and self.t >= self.ended_at:
            if self.s.exit_code == 0:
                conditions.append(_cond("Succeeded", f"MPIJob {self.namespace}/{self.name} successfully "
                                                     "completed.", reason="MPIJobSucceeded"))
            else:
                conditions.append(_cond("Failed", "Job has reached the specified backoff limit",
                                        reason="BackoffLimitExceeded"))
        obj["status"] = {"conditions": conditions} if conditions else {}
        return obj

    def _present(self) -> bool:
        return self.pods_gone_at is None or self.now < self.pods_gone_at

    def launcher_job(self) -> dict[str, Any] | None:
        if self.job_created is None or self.t < self.job_created or self._owner_gone():
            return None
        meta = {"name": mpi_operator.launcher_pod_name(self.name), "namespace": self.namespace,
                "uid": self.r["job_uid"], "labels": {"app": self.name},
                "ownerReferences": [self._owner("MPIJob", MPIJOB_API, self.name, self.r["uid"])]}
        status: dict[str, Any] = {}
        if self.ended_at is not None and self.t >= self.ended_at:
            kind = "Complete" if self.s.exit_code == 0 else "Failed"
            status["conditions"] = [{"type": kind, "status": "True"}]
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "status": status}

    def pods(self) -> list[dict[str, Any]]:
        if not self.valid or not self._present():
            return []
        pods = [self._worker(i) for i in range(self.replicas)]
        launcher = self._launcher_pod()
        return [p for p in [*pods, launcher] if p is not None]

    def launcher_pod_name(self) -> str:
        return f"{mpi_operator.launcher_pod_name(self.name)}-{self.r['suffix']}"

    def lines_at(self, t: float) -> list[str]:
        """The launcher's output written by time t."""
        if self.running_at is None or t < self.running_at:
            return []
        done = int((min(t, self.t) - self.running_at) / self.s.line_s)
        return self.s.log[:max(0, min(done, len(self.s.log)))]

    def line_time(self, k: int) -> float:
        assert self.running_at is not None
        return self.running_at + (k + 1) * self.s.line_s

    # -- pods ------------------------------------------------------------------------------------
    def _owner(self, kind: str, api: str, name: str, uid: str) -> dict[str, Any]:
        return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True,
                "blockOwnerDeletion": True}

    def _meta(self, name: str, role: str, owner: dict[str, Any], uid: str) -> dict[str, Any]:
        spec = self.r["manifest"]["spec"]["mpiReplicaSpecs"]["Launcher" if role == "launcher" else "Worker"]
        labels = dict(spec["template"].get("metadata", {}).get("labels", {}))
        labels.update(OPERATOR_LABELS, **{"training.kubeflow.org/job-name": self.name,
                                          "training.kubeflow.org/job-role": role})
        meta = {"name": name, "namespace": self.namespace, "uid": uid, "labels": labels,
                "ownerReferences": [owner]}
        if self.deleted_at is not None:
            meta["deletionTimestamp"] = _rfc3339(self.deleted_at)
        return meta

    def _worker(self, i: int) -> dict[str, Any] | None:
        s, t0 = self.s, self.r["t0"]
        if self.clean_running and self.ended_at is not None and self.now >= self.ended_at:
            return None   # cleanPodPolicy Running: the operator deleted the running workers at the end
        name = mpi_operator.worker_pod_name(self.name, i)
        meta = self._meta(name, "worker", self._owner("MPIJob", MPIJOB_API, self.name, self.r["uid"]),
                          f"{self.r['uid']}-worker-{i}")
        meta["labels"]["training.kubeflow.org/replica-index"] = str(i)
        pod: dict[str, Any] = {"metadata": meta, "spec": {"hostname": name, "subdomain": self.name}}
        status: dict[str, Any] = {"phase": "Pending", "conditions": []}
        pod["status"] = status
        if i in s.unschedulable_workers or i >= len(self.placement):
            message = s.unschedulable_message if i in s.unschedulable_workers else (
                f"0/{len(self.placement)} nodes are available: node(s) didn't match Pod's node "
                "affinity/selector.")
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": message}]
            return pod
        pod["spec"]["nodeName"] = self.placement[i]
        status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        half = t0 + s.start_s / 2
        if self.t < half:
            status["initContainerStatuses"] = [_waiting("selftest", "PodInitializing")]
            return pod
        if i == 0 and s.init_failure is not None:
            term = {"exitCode": int(s.init_failure.get("exit_code", 1)), "reason": "Error"}
            if self.worker_policy == "Never":
                status["phase"] = "Failed"
                status["initContainerStatuses"] = [{"name": "selftest", "state": {"terminated": term}}]
            else:   # OnFailure: the kubelet restarts it, with back-off
                status["initContainerStatuses"] = [{"name": "selftest", "lastState": {"terminated": term},
                                                    **_waiting("selftest", "CrashLoopBackOff")}]
            return pod
        status["initContainerStatuses"] = [{"name": "selftest",
                                            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]
        if i == 0 and s.image_pull_error is not None:
            status["containerStatuses"] = [_waiting("worker", "ImagePullBackOff", s.image_pull_error)]
            return pod
        if self.t < t0 + s.start_s:
            status["containerStatuses"] = [_waiting("worker", "ContainerCreating")]
            return pod
        status["phase"] = "Running"
        status["conditions"].append({"type": "Ready", "status": "True"})
        status["containerStatuses"] = [{"name": "worker", "ready": True, "state": {"running": {}}}]
        return pod

    def _launcher_pod(self) -> dict[str, Any] | None:
        if self.job_created is None or self.t < self.job_created:
            return None
        job_name = mpi_operator.launcher_pod_name(self.name)
        meta = self._meta(self.launcher_pod_name(), "launcher",
                          self._owner("Job", "batch/v1", job_name, self.r["job_uid"]),
                          f"{self.r['job_uid']}-pod")
        meta["labels"].update({"batch.kubernetes.io/job-name": job_name,
                               "batch.kubernetes.io/controller-uid": self.r["job_uid"]})
        status: dict[str, Any] = {"phase": "Pending",
                                  "conditions": [{"type": "PodScheduled", "status": "True"}]}
        assert self.running_at is not None and self.ended_at is not None
        if self.t < self.running_at:
            status["containerStatuses"] = [_waiting("launcher", "ContainerCreating")]
        elif self.t < self.ended_at:
            status["phase"] = "Running"
            status["containerStatuses"] = [{"name": "launcher", "state": {"running": {}}}]
        else:
            status["phase"] = "Succeeded" if self.s.exit_code == 0 else "Failed"
            status["containerStatuses"] = [{"name": "launcher", "state": {"terminated": {
                "exitCode": self.s.exit_code, "finishedAt": _rfc3339(self.ended_at),
                "reason": "Completed" if self.s.exit_code == 0 else "Error"}}}]
        return {"metadata": meta, "spec": {"hostname": job_name, "subdomain": self.name}, "status": status}


def _names_excluded(pod_spec: dict[str, Any]) -> set[str]:
    """Node names a pod's required node affinity rules out (matchFields metadata.name NotIn), checked as
    the API server validates them: one value per requirement (kubernetes pkg/apis/core/validation
    validateNodeFieldSelectorRequirement)."""
    terms = (pod_spec.get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
    excluded = set()
    for term in terms:
        for req in term.get("matchFields", []):
            if req["key"] != "metadata.name" or req["operator"] not in ("In", "NotIn") or \
                    len(req["values"]) != 1:
                raise ValueError(f"invalid node field selector requirement {req}")
            if req["operator"] == "NotIn":
                excluded.add(req["values"][0])
    return excluded


def _schedulable(node: dict[str, Any], pod_spec: dict[str, Any]) -> bool:
    """A Ready node whose labels meet the pod's required node affinity's label requirements (In)."""
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
    labels = node["metadata"].get("labels", {})
    terms = (pod_spec.get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
    # the stand-in's nodes carry only the node-pool label: the other keys are taken as met
    wanted = [e for t in terms for e in t.get("matchExpressions", []) if e["operator"] == "In"]
    return ready and all(labels[e["key"]] in e["values"] for e in wanted if e["key"] in labels)


def _cond(kind: str, message: str, reason: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason or f"MPIJob{kind}", "message": message}


def _waiting(name: str, reason: str, message: str = "") -> dict[str, Any]:
    waiting = {"reason": reason, **({"message": message} if message else {})}
    return {"name": name, "ready": False, "state": {"waiting": waiting}}


def _valid_name(name: str, replicas: int) -> bool:
    try:
        mpi_operator.check_job_name(name, replicas)
    except ValueError:
        return False
    return True


class World:
    """The cluster at one moment."""

    def __init__(self, state: dict[str, Any], now: float):
        self.state, self.now = state, now
        self.jobs = [Job(r, now, state["nodes"]) for r in state["mpijobs"]]

    def pods(self) -> list[dict[str, Any]]:
        return [p for j in self.jobs for p in j.pods()]

    def mpijob(self, name: str, namespace: str) -> tuple[Job, dict[str, Any]] | None:
        return self._newest(lambda job: job.mpijob() if job.name == name else None, namespace)

    def launcher_job(self, name: str, namespace: str) -> tuple[Job, dict[str, Any]] | None:
        return self._newest(lambda job: job.launcher_job()
                            if mpi_operator.launcher_pod_name(job.name) == name else None, namespace)

    def _newest(self, pick: Callable[[Job], dict[str, Any] | None], namespace: str
                ) -> tuple[Job, dict[str, Any]] | None:
        for job in reversed(self.jobs):
            obj = pick(job) if job.namespace == namespace else None
            if obj is not None:
                return job, obj
        return None

    def pod(self, name: str, namespace: str) -> tuple[Job, dict[str, Any]] | None:
        for job in reversed(self.jobs):
            for pod in job.pods():
                if pod["metadata"]["name"] == name and job.namespace == namespace:
                    return job, pod
        return None


# ---------------------------------------------------------------------------------------------
# kubectl
# ---------------------------------------------------------------------------------------------


class Args:
    """kubectl's argv: positionals and flags (`--x=y`, `--x y` for the few that take a value)."""

    VALUED = {"-n", "--namespace", "-l", "--selector", "-o", "--output", "-c", "--container", "--kubeconfig"}

    def __init__(self, argv: list[str]):
        self.positional: list[str] = []
        self.flags: dict[str, str] = {}
        i = 0
        while i < len(argv):
            a = argv[i]
            if a.startswith("--") and "=" in a:
                k, v = a.split("=", 1)
                self.flags[k] = v
            elif a in self.VALUED or (a == "-f" and self.positional[:1] == ["apply"]):
                self.flags[a] = argv[i + 1]
                i += 1
            elif a.startswith("-"):
                self.flags[a] = "true"
            else:
                self.positional.append(a)
            i += 1

    def get(self, *names: str, default: str | None = None) -> str | None:
        return next((self.flags[n] for n in names if n in self.flags), default)


def _selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _out(obj: Any) -> int:
    sys.stdout.write(json.dumps(obj) + "\n")
    return 0


def _err(text: str) -> int:
    sys.stderr.write(text + "\n")
    return 1


def main(argv: list[str]) -> int:
    store = Store(Path(os.environ[STATE_ENV]))
    with store.locked() as state:
        state["calls"].append(argv)
    a = Args(argv)
    verb = a.positional[0] if a.positional else ""
    handler = {"get": _get, "apply": _apply, "delete": _delete, "logs": _logs}.get(verb)
    if handler is None:
        return _err(f'error: unknown command "{verb}" for "kubectl" (stand-in)')
    return handler(store, a)


def _get(store: Store, a: Args) -> int:
    kind = a.positional[1]
    name = a.positional[2] if len(a.positional) > 2 else None
    namespace = a.get("-n", "--namespace", default="default")
    world = store.world()
    if kind in ("nodes", "node"):
        items = [n for n in world.state["nodes"]
                 if _selector_matches(a.get("-l", "--selector"), n["metadata"]["labels"])]
        return _out({"apiVersion": "v1", "kind": "List", "items": items})
    if kind in ("pods", "pod") and name is None:
        items = [p for p in world.pods() if p["metadata"]["namespace"] == namespace
                 and _selector_matches(a.get("-l", "--selector"), p["metadata"]["labels"])]
        return _out({"apiVersion": "v1", "kind": "List", "items": items})
    found: tuple[Job, dict[str, Any]] | None
    if kind in ("mpijob", "mpijobs"):
        found, resource = world.mpijob(str(name), namespace), f'mpijobs.kubeflow.org "{name}"'
    elif kind in ("job", "jobs"):
        found, resource = world.launcher_job(str(name), namespace), f'jobs.batch "{name}"'
    elif kind in ("pod", "pods"):
        found, resource = world.pod(str(name), namespace), f'pods "{name}"'
    else:
        return _err(f'error: the server doesn\'t have a resource type "{kind}"')
    if found is None:
        if "--ignore-not-found" in a.flags:
            return 0
        return _err(f"Error from server (NotFound): {resource} not found")
    return _out(found[1])


def _apply(store: Store, a: Args) -> int:
    manifest = json.loads(sys.stdin.read())
    if manifest.get("kind") != "MPIJob":
        return _err(f"error: the stand-in applies MPIJobs only, not {manifest.get('kind')}")
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    with store.locked() as state:
        world = World(state, time.time())
        existing = world.mpijob(name, namespace)
        if existing is not None:   # apply patches the object; the operator does not rerun it
            existing[0].r["manifest"] = manifest
            obj = existing[0].mpijob()
            verb = "configured"
        else:
            script = state["scripts"].pop(0) if state["scripts"] else JobScript().to_json()
            record = {"manifest": manifest, "uid": str(uuid.uuid4()), "job_uid": str(uuid.uuid4()),
                      "suffix": uuid.uuid4().hex[:5], "t0": time.time(), "script": script,
                      "deleted_at": None, "cascade": None, "follows": 0}
            state["mpijobs"].append(record)
            obj = Job(record, time.time()).mpijob()
            verb = "created"
    if a.get("-o", "--output") == "json":
        return _out(obj)
    sys.stdout.write(f"mpijob.kubeflow.org/{name} {verb}\n")
    return 0


def _delete(store: Store, a: Args) -> int:
    kind, name = a.positional[1], a.positional[2]
    namespace = a.get("-n", "--namespace", default="default")
    if kind not in ("mpijob", "mpijobs"):
        return _err(f"error: the stand-in deletes MPIJobs only, not {kind}")
    cascade = a.get("--cascade", default="background")
    with store.locked() as state:
        found = World(state, time.time()).mpijob(name, namespace)
        if found is None:
            if "--ignore-not-found" in a.flags:
                return 0
            return _err(f'Error from server (NotFound): mpijobs.kubeflow.org "{name}" not found')
        job = found[0]
        if job.r["deleted_at"] is None:
            job.r["deleted_at"], job.r["cascade"] = time.time(), cascade
    sys.stdout.write(f'mpijob.kubeflow.org "{name}" deleted\n')
    if a.get("--wait", default="true") != "false":   # kubectl delete waits by default
        timeout = a.get("--timeout", default="0s") or "0s"
        limit = float(timeout.rstrip("s")) or FOLLOW_LIMIT_S
        deadline = time.time() + limit
        while store.world().mpijob(name, namespace) is not None:
            if time.time() >= deadline:
                return _err(f"error: timed out waiting for the condition on mpijobs/{name}")
            time.sleep(0.02)
    return 0


def _logs(store: Store, a: Args) -> int:
    target = a.positional[1]
    namespace = a.get("-n", "--namespace", default="default")
    container = a.get("-c", "--container")
    follow = "-f" in a.flags or a.get("--follow") == "true"
    world = store.world()
    if target.startswith("job/"):
        found = world.launcher_job(target[4:], namespace)
        if found is None:
            return _err(f'Error from server (NotFound): jobs.batch "{target[4:]}" not found')
        job = found[0]
        pod_name = job.launcher_pod_name()
        if world.pod(pod_name, namespace) is None:
            return _err("error: timed out waiting for the condition")
    else:
        pod_name = target.removeprefix("pod/")
        found_pod = world.pod(pod_name, namespace)
        if found_pod is None:
            return _err(f'Error from server (NotFound): pods "{pod_name}" not found')
        job = found_pod[0]
    if pod_name != job.launcher_pod_name():
        if container == "selftest" and job.s.init_failure is not None:
            sys.stdout.write("".join(f"{line}\n" for line in job.s.init_failure.get("log", [])))
            return 0
        return 0   # workers and passing self-tests say nothing the tests read
    pod = world.pod(pod_name, namespace)
    assert pod is not None
    if pod[1]["status"]["phase"] == "Pending":
        return _err(f'Error from server (BadRequest): container "launcher" in pod "{pod_name}" is '
                    "waiting to start: ContainerCreating")
    since = a.get("--since-time")
    first = 0
    if since:
        cutoff = _parse_rfc3339(since)
        first = next((k for k in range(len(job.s.log)) if job.line_time(k) >= cutoff), len(job.s.log))
    if not follow:
        lines = world.jobs[world.jobs.index(job)].lines_at(world.now)[first:]
        tail = a.get("--tail")
        if tail is not None and int(tail) >= 0:
            lines = lines[len(lines) - min(len(lines), int(tail)):]
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        return 0
    return _follow(store, job.r["uid"], first)


def _follow(store: Store, uid: str, first: int) -> int:
    with store.locked() as state:
        record = next(r for r in state["mpijobs"] if r["uid"] == uid)
        record["follows"] += 1
        cut = record["script"]["cut_after_lines"] if record["follows"] == 1 else None
    printed = first
    sent = 0
    deadline = time.time() + FOLLOW_LIMIT_S
    while time.time() < deadline:
        world = store.world()
        job = next(j for j in world.jobs if j.r["uid"] == uid)
        lines = job.lines_at(world.now)
        for line in lines[printed:]:
            if cut is not None and sent >= cut:
                sys.stdout.flush()
                if job.s.cut_rc:
                    sys.stderr.write("error: unexpected EOF\n")
                return job.s.cut_rc
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            printed += 1
            sent += 1
        ended = job.ended_at is not None and job.t >= job.ended_at
        if ended or job.deleted_at is not None or not job.pods():
            return 0
        time.sleep(0.05)
    return _err("error: the stand-in's follow limit was reached")
