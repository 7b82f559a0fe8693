"""moto's AWS mock (S3 for the local backend; S3, EKS, ECR for the tests) served by cheroot.

`python -m cluster.local.moto_server -H HOST -p PORT`, started by ObjectStore. The application is
moto's own (moto.server's DomainDispatcherApplication); only the HTTP server around it differs from
`python -m moto.server`, for the CPU the local store takes from training on the same cores
(bench/, "trainer efficiency": a checkpoint every 50 steps is three requests to this server):

- werkzeug's development server, which `moto.server` runs, closes the connection after every
  response ("Connection: close"), so each request costs a TCP connection on both sides and a new
  server thread. cheroot keeps connections alive, and boto3 reuses them from its pool.
- moto looks a request's host up among its service modules by listing its own package directory
  (`moto.backends.list_of_moto_modules`: a listdir and ~170 stats per call, twice per request).
  The directory does not change while the server runs, so it is listed once here.

- moto answers a ranged GET by reading the whole object into memory and slicing it (moto 5.2.5:
  `S3Response.get_object` returns `key.value`, moto/s3/responses.py:2051, which reads the object's
  whole buffer, moto/s3/models.py:201-207; `_handle_range_header` slices it, responses.py:1830). A
  restore fetches a checkpoint in 16 MiB ranged GETs, 8 in flight: for a 4 GB state that was 256
  reads of 4 GB, 32 GB in memory at once. Here a single `bytes=a-b` range is read from the object's
  buffer alone (serve_ranges_from_the_buffer).

Measured (100 checkpoints of a 0.7 MB state: PUT state, PUT manifest, batch DELETE, moto 5.2.5):
server CPU per checkpoint 9.3 -> 5.4 ms, the writer's boto3 side 4.9 -> 4.2 ms, wall 15-19 -> 9 ms.

- moto joins a multipart upload's parts in memory, several times over (FakeMultipart.complete,
  moto/s3/models.py:473-510: a bytearray of the parts, the checksum builder's own bytearray of them,
  models.py:560-566, bytes() of each), then writes the object into its buffer through an in-memory
  file first (tempfile.SpooledTemporaryFile.write, then its rollover). A 4 GB checkpoint's upload
  took the machine's 23 GB and the server was killed. Here the parts are joined in a temporary file,
  the ETag and checksum are computed part by part, and a value larger than a key's in-memory buffer
  goes straight to its file (join_multipart_on_disk).

Where the bytes live: moto keeps every object and every multipart part in a SpooledTemporaryFile
whose in-memory size is MOTO_S3_DEFAULT_KEY_BUFFER_SIZE, by default 5 MiB - 1 KiB (moto/settings.py:
68-76, FakeKey.__init__ in moto/s3/models.py:169-172; issue getmoto/moto#395, fixed by #1999): larger
ones are on disk, in tempfile's directory ($TMPDIR, else /tmp). A completed upload keeps its parts
too (the key holds its FakeMultipart), so an object takes twice its size on disk.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

# Backlog of connections not yet accepted: tests run several trainers, writers and clients at once.
REQUEST_QUEUE_SIZE = 128


def list_moto_modules_once() -> None:
    """Replace moto's per-request listing of its service modules by one listing (see the module
    docstring). A moto without that function is left as it is: slower, never wrong."""
    import moto.backends as backends

    listing = getattr(backends, "list_of_moto_modules", None)
    if listing is None:
        return
    modules = frozenset(listing())
    backends.list_of_moto_modules = lambda: modules


# One byte range with both ends: what s3transfer's ranged GETs send (bytes=0-16777215).
_ONE_RANGE = re.compile(r"bytes=(\d+)-(\d+)$")


class _RangeSource:
    """An object's bytes as moto's range handling uses them, len() and a slice, read from its buffer
    on demand (under the key's lock, as FakeKey.value reads it) instead of copied whole."""

    def __init__(self, key):
        self._key = key

    def __len__(self) -> int:
        return self._key.size

    def __getitem__(self, window: slice) -> bytes:
        start, stop, _ = window.indices(self._key.size)
        with self._key.lock:
            self._key._value_buffer.seek(start)
            return self._key._value_buffer.read(max(0, stop - start))


class _RangedKey:
    """A FakeKey whose `value` is a _RangeSource; everything else is the key's own."""

    def __init__(self, key):
        self._key = key

    def __getattr__(self, name: str):
        return getattr(self._key, name)

    @property
    def value(self) -> _RangeSource:
        return _RangeSource(self._key)


def serve_ranges_from_the_buffer() -> None:
    """A GET of one byte range (and no partNumber, whose answer moto does not slice) reads that range
    only (see the module docstring). Everything else about the request (keys, versions, conditions,
    headers, the range's own checks and the 206) stays moto's. A moto without the internals used
    here is left as it is."""
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    whole = S3Response.get_object
    if getattr(whole, "ringtrain_ranged", False):
        return
    if not hasattr(S3Response, "_get_key") or "_value_buffer" not in FakeKey.__init__.__code__.co_names:
        return

    def get_object(self):
        match = _ONE_RANGE.match(self.headers.get("range", "") or "")
        if match is None or "partNumber" in self.querystring or int(match[1]) > int(match[2]):
            return whole(self)
        get_key = self._get_key
        self._get_key = lambda *a, **kw: (lambda key, not_modified: (_RangedKey(key), not_modified))(
            *get_key(*a, **kw))
        return whole(self)

    get_object.ringtrain_ranged = True
    S3Response.get_object = get_object


def _streaming_checksum(builder):
    """For a FULL_OBJECT checksum moto computes over the joined object: (update, width) to compute it
    part by part, as moto.s3.utils.compute_checksum does at once (CRC64NVME needs awscrt, else moto
    falls back to CRC32); None for one this does not know (then moto's own complete() runs)."""
    import binascii

    from moto.s3 import utils

    if builder.checksum_algorithm == "CRC64NVME" and utils.HAS_CRT:
        from awscrt import checksums

        return checksums.crc64nvme, 8
    if builder.checksum_algorithm in {"CRC64NVME", "CRC32"}:
        return binascii.crc32, 4
    return None


def join_multipart_on_disk() -> None:
    """FakeMultipart.complete with the parts joined in a temporary file, and FakeKey's value setter
    writing a value larger than the key's in-memory buffer straight to its file (see the module
    docstring). The checks and the results (ETag, checksum) are moto's, part by part."""
    import base64
    import codecs
    import mmap
    import tempfile

    from moto.s3 import models
    from moto.s3.exceptions import EntityTooSmall, InvalidPart, MalformedXML

    whole = models.FakeMultipart.complete
    if getattr(whole, "ringtrain_on_disk", False):
        return

    def complete(self, body):
        builder = models.MultipartChecksumBuilder(self.metadata.get("x-amz-checksum-algorithm"),
                                                  self.metadata.get("x-amz-checksum-type"))
        composite = builder.checksum_type == "COMPOSITE"
        streaming = None if composite else _streaming_checksum(builder)
        if not composite and streaming is None:
            return whole(self, body)
        decode_hex = codecs.getdecoder("hex_codec")
        md5s, crc, count, last = bytearray(), 0, 0, None
        with tempfile.TemporaryFile() as joined:
            for number, etag in body:  # moto's checks, in moto's order
                part = self.parts.get(number)
                part_etag = None
                if part is not None:
                    part_etag = part.etag.replace('"', "")
                    etag = etag.replace('"', "")
                if part is None or part_etag != etag:
                    raise InvalidPart()
                if last is not None and last.contentsize < models.S3_UPLOAD_PART_MIN_SIZE:
                    raise EntityTooSmall()
                md5s.extend(decode_hex(part_etag)[0])
                data = part.value  # one part in memory at a time
                joined.write(data)
                if composite:
                    builder.addPart(data)
                else:
                    crc = streaming[0](data, crc)
                last, count = part, count + 1
            if count == 0:
                raise MalformedXML
            joined.flush()
            # the mmap keeps the file (and its own descriptor) until the key has copied it
            value = mmap.mmap(joined.fileno(), 0, access=mmap.ACCESS_READ) if joined.tell() else b""
        full_etag = models.md5_hash()
        full_etag.update(bytes(md5s))
        checksum = builder.build() if composite else (
            builder.checksum_type, base64.b64encode(crc.to_bytes(streaming[1], "big")).decode(), 1)
        return value, f"{full_etag.hexdigest()}-{count}", checksum

    setter = models.FakeKey.value.fset

    def set_value(self, new_value) -> None:
        if len(new_value) > self._max_buffer_size:
            self._value_buffer.rollover()  # to its file now, not through memory
        setter(self, new_value)

    complete.ringtrain_on_disk = True
    models.FakeMultipart.complete = complete
    models.FakeKey.value = property(models.FakeKey.value.fget, set_value)


def moto_gateway():
    """cheroot's WSGI gateway, plus what moto's own request handler adds for werkzeug: the original
    spelling of S3 metadata headers with underscores (`x-amz-meta-my_key`), which the WSGI environ
    folds into dashes, so an object keeps the metadata names it was written with, as on S3."""
    from cheroot import wsgi
    from moto.core.request import (
        PRESERVED_HEADER_NAMES_ENVIRON_KEY,
        environ_key_for_header,
        should_preserve_original_header_name,
    )

    class MotoGateway(wsgi.Gateway_10):
        def get_environ(self):
            environ = super().get_environ()
            names: dict[str, str] = {}
            headers = self.req.inheaders
            underscored = [n.decode("latin-1") for n in headers if b"_" in n]
            if underscored:  # rare: most requests pay nothing more than cheroot's own environ
                dashed = {environ_key_for_header(n.decode("latin-1")): v.decode("latin-1")
                          for n, v in headers.items() if b"_" not in n}
                for name in underscored:
                    key = environ_key_for_header(name)
                    if key in dashed:
                        # Never let an underscored header stand in for a dashed one (moto's rule).
                        environ[key] = dashed[key]
                    elif should_preserve_original_header_name(name):
                        names.setdefault(key, name)
            environ[PRESERVED_HEADER_NAMES_ENVIRON_KEY] = names
            return environ

    return MotoGateway


def build_app():
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    list_moto_modules_once()
    serve_ranges_from_the_buffer()
    join_multipart_on_disk()
    return DomainDispatcherApplication(create_backend_app)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cluster.local.moto_server",
                                description="moto's AWS mock on loopback, served by cheroot")
    p.add_argument("-H", "--host", default="127.0.0.1", help="address to bind")
    p.add_argument("-p", "--port", type=int, required=True, help="port to bind")
    args = p.parse_args(argv)
    from cheroot import wsgi

    # As moto.server does: moto builds some URLs it returns (e.g. presigned) from this.
    os.environ.setdefault("MOTO_PORT", str(args.port))
    server = wsgi.Server((args.host, args.port), None, request_queue_size=REQUEST_QUEUE_SIZE,
                         server_name="ringtrain-moto")
    server.gateway = moto_gateway()
    try:
        server.prepare()  # binds first: a port in use ends here, before moto is loaded
    except OSError as e:
        print(f"moto_server: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    server.wsgi_app = build_app()
    # SIGTERM (ObjectStore.stop) ends the process at once: the store lives in memory only.
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
