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

Measured (100 checkpoints of a 0.7 MB state: PUT state, PUT manifest, batch DELETE, moto 5.2.5):
server CPU per checkpoint 9.3 -> 5.4 ms, the writer's boto3 side 4.9 -> 4.2 ms, wall 15-19 -> 9 ms.
"""

from __future__ import annotations

import argparse
import os
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
