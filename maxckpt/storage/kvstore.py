"""The TensorStore kvstore spec for a local path or a bucket URL.

TensorStore has one driver per store: ``file``, ``gcs`` and ``s3``. The gcs
driver finds credentials the way every Google client does (Application
Default Credentials; ``TENSORSTORE_GCS_HTTP_URL`` points it at an emulator).
The s3 driver finds credentials like the AWS SDKs (env, ``~/.aws``, instance
roles) but does **not** read ``AWS_ENDPOINT_URL``: for MinIO, R2, Ceph or a
test server the endpoint must be in the spec, so it is taken here from the
variables users already set for the AWS CLI and boto3
(``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``), with the region from
``AWS_REGION`` / ``AWS_DEFAULT_REGION``.

Both bucket drivers get maxckpt's bounded retry policy
(:func:`maxckpt.storage.retry.tensorstore_retries`).

>>> kvstore_spec("gs://bucket/run/checkpoints/5/items")["path"]
'run/checkpoints/5/items/'
"""

from __future__ import annotations

import os
from typing import Any

from maxckpt.storage.retry import tensorstore_retries
from maxckpt.storage.urls import split_url


def s3_endpoint() -> str | None:
    """The S3 endpoint users configured for the AWS SDKs, or None for AWS itself."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def kvstore_spec(path: str | os.PathLike, *, directory: bool = True) -> dict[str, Any]:
    """The kvstore spec of `path`: a ``file``, ``gcs`` or ``s3`` driver dict.

    With `directory=True` the path is a key prefix and ends in ``/`` (what
    TensorStore wants for a folder of keys).
    """
    loc = split_url(path)
    if not loc.scheme:
        text = os.path.abspath(os.fspath(path))
        return {"driver": "file", "path": text + "/" if directory else text}
    key = loc.key + "/" if directory and loc.key else loc.key
    if loc.scheme == "gs":
        return {"driver": "gcs", "bucket": loc.bucket, "path": key, **tensorstore_retries("gcs")}
    spec: dict[str, Any] = {"driver": "s3", "bucket": loc.bucket, "path": key, **tensorstore_retries("s3")}
    endpoint, region = s3_endpoint(), s3_region()
    if endpoint:
        spec["endpoint"] = endpoint
    if region:
        spec["aws_region"] = region
    elif endpoint:
        spec["aws_region"] = "us-east-1"  # S3-compatible stores accept any region name; the SDK needs one
    return spec
