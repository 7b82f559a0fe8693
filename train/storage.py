"""One small interface over the two places the trainer reads and writes: an S3 prefix or a local directory.

S3 goes through boto3 with a configurable endpoint (AWS, or the local moto server), bounded retries and
timeouts, so a dead endpoint or rejected credentials turn into one BadInput message within seconds.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from train.errors import BadInput

# Bounded: `max_attempts` counts the first try. Connection refused fails in well under a second per
# attempt; a black-holed endpoint costs at most connect_timeout x attempts.
S3_MAX_ATTEMPTS = 3
S3_CONNECT_TIMEOUT_S = 5
S3_READ_TIMEOUT_S = 60
# Large objects (checkpoints) go up in parallel multipart parts and come down in parallel ranged GETs
# through boto3's transfer manager (s3transfer). AWS recommends multipart from ~100 MB and refuses a
# single PUT over 5 GB (https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpuoverview.html); parts
# are 5 MiB to 5 GiB, at most 10,000 of them. 16 MiB parts, a typical byte-range size that restores
# should align with (https://docs.aws.amazon.com/whitepapers/latest/s3-optimizing-performance-best-
# practices/use-byte-range-fetches.html), x 8 in flight; larger for states over ~140 GiB (a stream's
# size is not known up front, so the writer passes the state's tensor bytes as a hint).
# RINGTRAIN_S3_PART_MIB sets another part size (5 to 5120).
S3_PART_BYTES = 16 << 20
S3_MAX_PARTS = 9_000  # of S3's 10,000: room for what torch.save adds to the tensors' bytes
S3_PART_ENV = "RINGTRAIN_S3_PART_MIB"
S3_CONCURRENCY = 8
_COPY_CHUNK = 8 << 20

_CREDENTIAL_ERRORS = {
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId", "AccessDenied",
    "ExpiredToken", "InvalidToken", "UnrecognizedClientException", "403", "Forbidden",
}


def split_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/a/b' -> ('bucket', 'a/b') (prefix without leading/trailing slashes)."""
    rest = uri[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


class Digest(Protocol):
    """What a hashlib or xxhash hash object offers (hashlib's own type is private)."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


class Store:
    """Keys are '/'-separated paths relative to the store's root."""

    uri: str

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError when it does not exist."""
        raise NotImplementedError

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object (fewer where it ends sooner); FileNotFoundError when it
        does not exist. One ranged GET on S3: a reader takes the parts it needs, not the object."""
        raise NotImplementedError

    def size(self, key: str) -> int:
        """The object's size in bytes; FileNotFoundError when it does not exist."""
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[str]:
        """Every key under `prefix` (recursively), sorted."""
        raise NotImplementedError

    def upload(self, key: str, source: BinaryIO, size_hint: int = 0) -> None:
        """Store everything `source` yields until EOF under `key`, streaming: a failure (an error
        `source.read` raises included) leaves no object and nothing half-uploaded behind."""
        raise NotImplementedError

    def mapped_file(self, key: str, digest: Digest) -> contextlib.AbstractContextManager[str]:
        """A context with the object as a file path to map (torch.load(path, mmap=True) then uses its
        pages instead of copying them twice), its bytes fed to
        `digest` on the way: a local store's own file; an S3 object fetched in parallel ranged GETs
        into an in-memory file (memfd), hashed in order as the parts arrive, whose pages stay as long as
        a mapping of them does. FileNotFoundError when it does not exist; ValueError when it is empty
        (an mmap cannot be)."""
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
        self._write(key, lambda f: f.write(data))

    def upload(self, key: str, source: BinaryIO, size_hint: int = 0) -> None:
        self._write(key, lambda f: shutil.copyfileobj(source, f, _COPY_CHUNK))

    def _write(self, key: str, fill: Callable[[BinaryIO], object]) -> None:
        # Write then rename: a reader never sees a half-written file under the final name.
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with open(self._path(key), "rb") as f:
            return os.pread(f.fileno(), max(end - start, 0), start)

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    @contextlib.contextmanager
    def mapped_file(self, key: str, digest: Digest) -> Iterator[str]:
        # (written by rename, never in place: a mapping of it keeps the bytes it verified)
        path = self._path(key)
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise ValueError(f"{self.uri}/{key} is empty")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                digest.update(data)
        yield str(path)

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


def s3_client(endpoint_url: str | None):
    """The boto3 S3 client every S3Store uses: bounded retries and timeouts, no extra pass over the
    bytes (below)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or None,
        config=Config(
            retries={"max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
            connect_timeout=S3_CONNECT_TIMEOUT_S,
            read_timeout=S3_READ_TIMEOUT_S,
            # No extra pass over the bytes of every upload, on the training node: neither
            # botocore's CRC32 (its default since 1.36) nor its SigV4 payload sha256 (made over
            # http always, and over https once no checksum header is sent). Checkpoints carry
            # their own checksum in the manifest, checked on every read, and AWS traffic is TLS;
            # each pass is client CPU taken from training (bench/, checkpoint stall). The request
            # headers are still signed.
            request_checksum_calculation="when_required",
            s3={"payload_signing_enabled": False},
        ),
    )


class _HashedWrites:
    """A download target without seek: s3transfer then puts the ranged GETs' parts in order (its
    DeferQueue, DownloadNonSeekableOutputManager in s3transfer/download.py) and writes them from its one
    IO thread, so the bytes are checksummed as they arrive, beside the transfers still in flight instead
    of in a pass after them. Into the file by write(2), not through a mapping, whose page faults cost
    more than the copy (bench/, checkpoint_throughput)."""

    def __init__(self, fd: int, digest: Digest):
        self._fd, self._digest = fd, digest

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        self._digest.update(data)


class S3Store(Store):
    def __init__(self, uri: str, endpoint_url: str | None):
        self.uri = uri
        self.endpoint_url = endpoint_url
        self.bucket, self.prefix = split_s3_uri(uri)
        self.part_bytes = _part_bytes(os.environ.get(S3_PART_ENV))
        self._client = s3_client(endpoint_url)

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

    def part_size(self, size_hint: int = 0) -> int:
        """The configured part size, or a larger one (whole MiB) where the hint needs more than
        S3_MAX_PARTS of it."""
        return max(self.part_bytes, -(-size_hint // S3_MAX_PARTS // (1 << 20)) << 20)

    def _transfers(self, part_bytes: int):
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        config = TransferConfig(multipart_threshold=part_bytes, multipart_chunksize=part_bytes,
                                max_concurrency=S3_CONCURRENCY)
        return create_transfer_manager(self._client, config)

    def upload(self, key: str, source: BinaryIO, size_hint: int = 0) -> None:
        # s3transfer reads a non-seekable source a part at a time, uploads the parts in parallel and,
        # when anything fails, aborts the multipart upload (its CreateMultipartUploadTask registers
        # abort_multipart_upload as the transfer's failure cleanup, run before result() returns).
        with self._transfers(self.part_size(size_hint)) as transfers:
            future = transfers.upload(source, self.bucket, self._key(key))
            try:
                future.result()
            except BaseException:
                future.cancel()  # (done already where the transfer failed; not where we were interrupted)
                raise

    def get(self, key: str) -> bytes:
        return self._call_missing(key, lambda: self._client.get_object(Bucket=self.bucket,
                                                                          Key=self._key(key))["Body"].read())

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        # An HTTP byte range is inclusive at both ends (RFC 9110 14.1.2), as S3's GetObject Range takes it:
        # https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html#API_GetObject_RequestSyntax
        return self._call_missing(key, lambda: self._client.get_object(
            Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{end - 1}")["Body"].read())

    def size(self, key: str) -> int:
        return int(self._call_missing(key, lambda: self._client.head_object(
            Bucket=self.bucket, Key=self._key(key))["ContentLength"]))

    @contextlib.contextmanager
    def mapped_file(self, key: str, digest: Digest) -> Iterator[str]:
        fd = os.memfd_create("ringtrain-" + key.replace("/", "-")[-200:])
        try:
            with self._transfers(self.part_bytes) as transfers:  # (its HeadObject finds the size)
                target = _HashedWrites(fd, digest)
                self._call_missing(key, transfers.download(self.bucket, self._key(key), target).result)
            if not os.fstat(fd).st_size:
                raise ValueError(f"{self.uri}/{key} is empty")
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)

    def _call_missing(self, key: str, fn):
        """fn(), with a missing object as FileNotFoundError and other errors translated."""
        from botocore.exceptions import ClientError

        try:
            return fn()
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code")) in {"NoSuchKey", "404", "NotFound"}:
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


def _part_bytes(mib: str | None) -> int:
    if mib is None:
        return S3_PART_BYTES
    if not mib.isdigit() or not 5 <= int(mib) <= 5120:
        raise BadInput(f"{S3_PART_ENV}={mib!r}: S3 multipart parts are 5 to 5120 MiB")
    return int(mib) << 20


def open_store(uri: str, endpoint_url: str | None = None) -> Store:
    if uri.startswith("s3://"):
        return S3Store(uri, endpoint_url)
    return LocalStore(Path(uri).expanduser().absolute())
