"""The few cluster reads and writes the AWS backend needs, through `kubectl` (no client library to pin),
plus the pure functions that interpret what kubectl returns."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator, Mapping
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

    def _base(self) -> list[str]:
        return [self.binary, "--kubeconfig", str(self.kubeconfig)]

    def run(self, *args: str, stdin: str | None = None) -> str:
        try:
            proc = subprocess.run([*self._base(), *args], input=stdin, capture_output=True, text=True,
                                  timeout=self.request_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise BackendError(f"kubectl {' '.join(args[:2])} did not answer within "
                               f"{self.request_timeout_s:g} s: is the cluster endpoint reachable from here?"
                               ) from None
        if proc.returncode != 0:
            detail = proc.stderr.strip() or proc.stdout.strip()
            raise BackendError(f"kubectl {' '.join(args[:3])} failed: {detail}")
        return proc.stdout

    def get_json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.run("get", *args, "-o", "json"))

    def apply(self, manifest: Mapping[str, Any]) -> str:
        return self.run("apply", "-f", "-", stdin=json.dumps(manifest))

    def follow_logs(self, namespace: str, target: str) -> Iterator[str]:
        """Lines of `kubectl logs -f` until the container ends (or the caller stops iterating)."""
        proc = subprocess.Popen([*self._base(), "logs", "-f", "-n", namespace, target],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                yield line.rstrip("\n")
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


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


def ready_nodes(nodes: Mapping[str, Any]) -> int:
    """How many nodes of a `kubectl get nodes -o json` list are Ready and schedulable."""
    count = 0
    for node in nodes.get("items") or []:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        for cond in (node.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                count += 1
                break
    return count


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
