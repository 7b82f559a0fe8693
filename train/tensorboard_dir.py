"""`--tensorboard-dir`: a directory, or an S3 prefix (s3://bucket/prefix) on AWS or the local store.

torch.utils.tensorboard writes through TensorBoard's own file layer (tensorboard.compat.tensorflow_stub
.io.gfile, TensorBoard 2.20, without TensorFlow), which has an S3 filesystem over boto3: S3 has no
append, so each flush (every 120 s, and at the end) rewrites the whole event file with one PUT;
scalars are a few KB, so that costs little. That filesystem takes its endpoint from $S3_ENDPOINT
(tensorflow/tensorboard#3014), read once when the module is imported, so the endpoint is set before
the first import (in check_tensorboard_dir, which the trainer calls before it opens the writer). The
prefix is checked first, so a missing bucket or rejected credentials are one message (train.storage),
not a traceback from the writer's thread.
"""

from __future__ import annotations

import os
import sys

from train.errors import BadInput
from train.storage import open_store

S3_ENDPOINT_ENV = "S3_ENDPOINT"  # what TensorBoard's S3 filesystem reads
_GFILE = "tensorboard.compat.tensorflow_stub.io.gfile"


def check_tensorboard_dir(uri: str, endpoint_url: str | None, environ=os.environ) -> None:
    """BadInput unless TensorBoard is installed and `uri` can be written; for s3:// also point
    TensorBoard's S3 filesystem at `endpoint_url`."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise BadInput("--tensorboard-dir needs the 'tensorboard' package (pip install tensorboard); "
                       "omit the flag to log JSON lines only") from None
    if not uri.startswith("s3://"):
        return
    try:
        open_store(uri, endpoint_url).check(create=True)
    except BadInput as e:
        raise BadInput(f"--tensorboard-dir {uri}: {e}") from None
    if endpoint_url:
        if _GFILE in sys.modules and environ.get(S3_ENDPOINT_ENV) != endpoint_url:
            raise BadInput(f"--tensorboard-dir {uri}: TensorBoard's S3 filesystem was loaded before the "
                           f"endpoint {endpoint_url} could be set; set {S3_ENDPOINT_ENV}={endpoint_url}")
        environ[S3_ENDPOINT_ENV] = endpoint_url
