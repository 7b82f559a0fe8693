"""One small interface over the two places the trainer reads and writes: an S3 prefix or a local directory.

S3 goes through boto3 with a configurable endpoint (AWS, or the local moto server), bounded retries and
timeouts, so a dead endpoint or rejected credentials turn into one BadInput message within seconds.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from train.errors import BadInput

# Bounded: `max_attempts` counts the first try. Connection refused fails in well under a second per
# attempt; a black-holed endpoint costs at most connect_timeout x attempts.
S3_MAX_ATTEMPTS = 3
S3_CONNECT_TIMEOUT_S = 5
S3_READ_TIMEOUT_S = 60

_CREDENTIAL_ERRORS = {
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId", "AccessDenied",
    "ExpiredToken", "InvalidToken", "UnrecognizedClientException", "403", "Forbidden",
}


def split_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/a/b' -> ('bucket', 'a/b') (prefix without leading/trailing slashes)."""
    rest = uri[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


class Store:
    """Keys are '/'-separated paths relative to the store's root."""

    uri: str

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError when it does not exist."""
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[str]:
        """Every key under `prefix` (recursively), sorted."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def delete_many(self, keys: list[str]) -> None:
        """Delete the keys (missing ones are fine); stores with a batch delete use one request."""
        for key in keys:
            self.delete(key)

    def check(self, *, create: bool) -> None:
        """Raise BadInput unless the root is reachable (and, with create, writable)."""
        raise NotImplementedError


@dataclass
class LocalStore(Store):
    root: Path

    @property
    def uri(self) -> str:  # type: ignore[override]
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename: a reader never sees a half-written file under the final name.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Drop directories left empty, up to the root.
        parent = path.parent
        while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    def check(self, *, create: bool) -> None:
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise BadInput(f"cannot create directory {self.root}: {e.strerror}") from None
            if not os.access(self.root, os.W_OK):
                raise BadInput(f"directory {self.root} is not writable")
        elif not self.root.is_dir():
            raise BadInput(f"{self.root}: no such directory")


class S3Store(Store):
    def __init__(self, uri: str, endpoint_url: str | None):
        import boto3
        from botocore.config import Config

        self.uri = uri
        self.endpoint_url = endpoint_url
        self.bucket, self.prefix = split_s3_uri(uri)
        self._client = boto3.client(
            "s3",
            endpoint_url=endpoint_url or None,
            config=Config(
                retries={"max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
                connect_timeout=S3_CONNECT_TIMEOUT_S,
                read_timeout=S3_READ_TIMEOUT_S,
                # No extra pass over the bytes of every upload, on the training node: neither
                # botocore's CRC32 (its default since 1.36) nor its SigV4 payload sha256 (made over
                # http always, and over https once no checksum header is sent). Checkpoints carry
                # their own sha256 in the manifest, checked on every read, and AWS traffic is TLS;
                # each pass cost 20-50 ms of client CPU per 35 MB checkpoint (bench/, checkpoint
                # stall). The request headers are still signed.
                request_checksum_calculation="when_required",
                s3={"payload_signing_enabled": False},
            ),
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self) -> str:
        return f"{self.uri} (endpoint {self.endpoint_url or 'AWS default'})"

    def _translate(self, e: Exception) -> Exception:
        """botocore's errors -> one BadInput naming the problem, or the original error."""
        from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

        if isinstance(e, EndpointConnectionError | ConnectionError) or type(e).__name__ in {
            "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
        }:
            return BadInput(f"cannot reach the S3 endpoint for {self._where()}: {e}; "
                            "check --s3-endpoint-url / AWS_ENDPOINT_URL")
        if isinstance(e, NoCredentialsError):
            return BadInput(f"no S3 credentials found for {self._where()}: set AWS_ACCESS_KEY_ID/"
                            "AWS_SECRET_ACCESS_KEY, a profile or an instance role")
        if isinstance(e, ClientError):
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in _CREDENTIAL_ERRORS:
                return BadInput(f"S3 rejected the credentials for {self._where()} ({code})")
            if code in {"NoSuchBucket"}:
                return BadInput(f"bucket {self.bucket!r} does not exist at {self._where()}")
        return e

    def _call(self, fn, **kwargs):
        try:
            return fn(**kwargs)
        except Exception as e:  # noqa: BLE001 - translated or re-raised unchanged
            raise self._translate(e) from None

    def put(self, key: str, data: bytes) -> None:
        self._call(self._client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data)

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            obj = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            return obj["Body"].read()
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code")) in {"NoSuchKey", "404"}:
                raise FileNotFoundError(f"{self.uri}/{key}") from None
            raise self._translate(e) from None
        except Exception as e:  # noqa: BLE001
            raise self._translate(e) from None

    def list(self, prefix: str = "") -> list[str]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(f"{self.prefix}/") if self.prefix else 0
        keys: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        except Exception as e:  # noqa: BLE001
            raise self._translate(e) from None
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._call(self._client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def delete_many(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = [{"Key": self._key(k)} for k in keys[i:i + 1000]]
            out = self._call(self._client.delete_objects, Bucket=self.bucket,
                             Delete={"Objects": chunk, "Quiet": True})
            errors = out.get("Errors", [])
            if errors:
                first = errors[0]
                raise OSError(f"{self.uri}: could not delete {len(errors)} object(s), e.g. "
                              f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}")

    def check(self, *, create: bool) -> None:
        # head_bucket proves endpoint, credentials and bucket in one request; it never creates the
        # bucket (buckets belong to the infrastructure, not to a training run).
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in {"404", "NoSuchBucket", "NotFound"}:
                raise BadInput(f"bucket {self.bucket!r} does not exist at {self._where()}") from None
            raise self._translate(e) from None
        except Exception as e:  # noqa: BLE001
            raise self._translate(e) from None


def open_store(uri: str, endpoint_url: str | None = None) -> Store:
    if uri.startswith("s3://"):
        return S3Store(uri, endpoint_url)
    return LocalStore(Path(uri).expanduser().absolute())
