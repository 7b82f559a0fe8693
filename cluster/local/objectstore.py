"""An S3-compatible object store for the local backend and the tests: moto in server mode
(cluster.local.moto_server: moto's application behind cheroot).

It runs as its own process (not a thread of the caller) so training processes, which may live in
other network namespaces, talk to it over real HTTP exactly as they would talk to S3, and so a
crash of the caller never leaves a half-dead server thread behind.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import boto3
from botocore.config import Config

from cluster.local.procs import stop_popen_tree

# Credentials the local store accepts (moto accepts any); exported to trainer processes so boto3
# finds them the way it finds real ones.
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "ringtrain-local",
    "AWS_SECRET_ACCESS_KEY": "ringtrain-local-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


SERVER_MODULE = "cluster.local.moto_server"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ObjectStore:
    """A running moto server. Use as a context manager, or call start()/stop()."""

    host: str = "127.0.0.1"
    port: int = 0
    startup_timeout_s: float = 30.0
    _proc: subprocess.Popen | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (the benchmarks lower its priority and count its CPU)."""
        return None if self._proc is None else self._proc.pid

    def env(self) -> dict[str, str]:
        """Environment for a process that should use this store through boto3."""
        return {**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint_url}

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=LOCAL_CREDENTIALS["AWS_DEFAULT_REGION"],
            config=Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30),
        )

    def start(self) -> ObjectStore:
        if self._proc is not None:
            return self
        if not self.port:
            self.port = free_port(self.host)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, "-H", self.host, "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **LOCAL_CREDENTIALS},
            start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"object store exited at start (code {self._proc.returncode}) on {self.endpoint_url}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"object store did not answer on {self.endpoint_url} within {self.startup_timeout_s}s"
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        stop_popen_tree(proc, grace_s=10)

    def __enter__(self) -> ObjectStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
