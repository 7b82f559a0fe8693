"""A `kubectl` stand-in for tests: an executable on PATH that plays the API server and the MPI Operator.

The AWS backend (cluster/aws/backend.py) drives a cluster only through `kubectl`; with this on PATH the
whole path submit -> wait -> logs -> exit code -> resubmit runs offline, against a cluster whose
behaviour a test scripts per submitted job. API:

    from tests.cluster.kubectl_standin import FakeCluster, JobScript

    cluster = FakeCluster(tmp_path / "cluster")
    cluster.install(monkeypatch)                     # `kubectl` first on PATH (state in that directory)
    cluster.add_nodes("a10g-spot", 2, {"nvidia.com/gpu": 4})   # Ready nodes of a node group
    cluster.plan(JobScript(log=[...], exit_code=75),           # what each `kubectl apply` of an
                 JobScript(log=[...], exit_code=0))            # MPIJob runs, in order (default: JobScript())
    ... AwsBackend(...).submit(job) / logs / wait ...
    cluster.calls()          # every kubectl argv, in order
    cluster.mpijobs()        # the MPIJobs applied, with uid, script and deletion time
    cluster.pods()           # the pods as `kubectl get pods` shows them now

What it reproduces (each from its source):
- MPI Operator v0.8.2 (pkg/controller/mpi_job_controller.go): worker pods `<job>-worker-<i>` owned by
  the MPIJob; a batch Job `<job>-launcher` owned by the MPIJob, created at once (AtStartup) or once
  every worker is Ready (WaitForWorkersReady), whose pod the Job owns; the MPIJob's conditions Created,
  Running, Succeeded/Failed from the launcher Job; cleanPodPolicy Running deletes running workers at the
  end; an invalid name (`<job>-worker-<n-1>` not a DNS-1035 label, validation.go) gets a
  ValidationError event and nothing else. Pod names come from cluster/mpi_operator.py.
- The API server: uids, ownerReferences, deletionTimestamp; `delete` with `--cascade` background (the
  object goes at once, its pods stay Terminating for the script's `terminating_s`) or foreground (the
  object stays until its pods are gone) and `--wait` (kubectl's default: true) up to `--timeout`.
- The kubelet and scheduler: PodScheduled=False/Unschedulable, a failed init container (terminated with
  its exit code; the pod Failed under restartPolicy Never), ImagePullBackOff, container exit codes.
- kubectl: `get -o json` (with `-l k=v,...` selectors and `--ignore-not-found`), `apply -f - -o json`,
  `logs` of a pod or `job/NAME` (-f, -c, --tail, --since-time), its errors on stderr with exit 1 in
  its own words ("Error from server (NotFound): ...", "... is waiting to start: ..."), and a followed
  stream cut mid-run ("error: unexpected EOF", exit 1; kubernetes/kubectl#595, #1373).

Time is the wall clock: a JobScript's phases are offsets from the apply, so tests keep them short.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from .apiserver import STATE_ENV, JobScript, Store

__all__ = ["FakeCluster", "JobScript", "STATE_ENV"]

REPO_ROOT = Path(__file__).resolve().parents[3]


class FakeCluster:
    """The stand-in's state directory and the `kubectl` executable that reads it."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.store = Store(self.root)
        self.bin = self.root / "bin"

    def install(self, monkeypatch) -> FakeCluster:
        """Write `kubectl` into <root>/bin and put it first on PATH for this test (and its children)."""
        self.bin.mkdir(exist_ok=True)
        exe = self.bin / "kubectl"
        # -S: no site-packages (the stand-in needs only the standard library and this repository), so
        # each call starts in a fraction of the time: the backend polls it many times a second in tests.
        exe.write_text(f"#!{sys.executable} -S\n"
                       "import sys\n"
                       f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
                       "from tests.cluster.kubectl_standin.apiserver import main\n"
                       "sys.exit(main(sys.argv[1:]))\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.setenv(STATE_ENV, str(self.root))
        return self

    def add_nodes(self, pool: str, count: int, allocatable: dict[str, int] | None = None,
                  ready: bool = True) -> None:
        with self.store.locked() as state:
            for _ in range(count):
                i = len(state["nodes"])
                state["nodes"].append({
                    "metadata": {"name": f"ip-10-0-0-{i + 10}.ec2.internal",
                                 "labels": {"ringtrain.io/node-pool": pool}},
                    "spec": {},
                    "status": {"allocatable": {k: str(v) for k, v in (allocatable or {}).items()},
                               "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
                })

    def plan(self, *scripts: JobScript) -> None:
        with self.store.locked() as state:
            state["scripts"] += [s.to_json() for s in scripts]

    def calls(self) -> list[list[str]]:
        return self.store.read()["calls"]

    def mpijobs(self) -> list[dict[str, Any]]:
        return self.store.read()["mpijobs"]

    def pods(self) -> list[dict[str, Any]]:
        return json.loads(json.dumps(self.store.world().pods()))
